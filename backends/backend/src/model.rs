//! The model half of the contract: a Llama-family forward pass over a
//! per-layer batched KV cache, beside the kernel operations of [`Backend`].
//!
//! Why a second trait rather than more `Backend` methods: a model needs
//! handles the kernels never see (resident weights, a cache of every layer),
//! and a port of the verify kernels alone (an external adapter, a vendor
//! kernel) must not have to stub them out. `ModelBackend: Backend` shares the
//! device tensor type, so logits from [`ModelBackend::forward`] feed
//! `process_logits`, `greedy_verify` or `rejection_verify` without a host
//! round trip, and one backend-generic decoder drives any backend.
//!
//! Invariants (MODEL-8): a call's inputs are validated on the host before
//! the device is touched ([`specdec_models::forward::plan`]); each sequence's
//! new tokens sit at its own positions and attend causally among themselves
//! and to its cached positions only; a one-token decode, a `(k+1)`-token
//! verify window and a ragged prefill take the same code path; outputs stay
//! on the device. Trimming is per sequence and strict (KV-4).

pub use specdec_models::forward::{ForwardPlan, ForwardRequest, LogitRows, SeqRows};
pub use specdec_models::{LlamaConfig, LlamaWeights, ModelError, RefCache, RefModel};

use crate::{Backend, RefTensor, ReferenceBackend, Result};
use specdec_reference::Tensor;

/// The numeric contract of a backend's forward pass (MODEL-11).
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct ModelPrecision {
    /// The dtype weights are held in on the device.
    pub weight_dtype: &'static str,
    /// The dtype activations and attention are computed in.
    pub compute_dtype: &'static str,
    /// Largest allowed `|logit - reference logit|` per unit of the
    /// reference row's largest `|logit|` (a relative bound: f32 rounding grows
    /// with the size of the values).
    pub logit_rel_tolerance: f64,
    /// Largest allowed `|hidden - reference hidden|` per unit of the
    /// reference row's largest `|value|` (MODEL-9 rows, per layer). The same
    /// as the logit bound where the forward rounds like f32 everywhere; an
    /// 8-bit activation product errs most on the residual stream's few
    /// huge values, so a quantized forward states its own.
    pub hidden_rel_tolerance: f64,
    /// An argmax may differ from the reference's only where the reference's
    /// top-2 logit margin is below this (counted, never hidden).
    pub argmax_margin_epsilon: f64,
    /// Within this backend: a `(k+1)`-token verify window's argmax may
    /// differ from one-token decodes' (so speculative greedy output from
    /// plain greedy output) only where the plain top-2 margin is below this
    /// (MODEL-13, DECODE-2). It bounds how far the backend's own windows and
    /// decodes round apart, which can be far less than its distance from the
    /// reference: a reduced-precision format must not borrow that distance to
    /// excuse a lossy decoder. 0 claims batch invariance: windows equal
    /// decodes bit for bit, values included, and the model section checks
    /// exactly that ([`ModelPrecision::window_value_tolerance`]).
    pub window_margin_epsilon: f64,
}

impl ModelPrecision {
    /// How far (relative to the row's scale) a window's logits may differ
    /// from one-token decodes': 0 for a batch-invariant backend (window
    /// epsilon 0, MODEL-13), else the logit tolerance.
    pub fn window_value_tolerance(&self) -> f64 {
        if self.window_margin_epsilon == 0.0 { 0.0 } else { self.logit_rel_tolerance }
    }
}

/// Outputs of one forward call, on the device.
#[derive(Debug, Clone)]
pub struct ForwardOutput<T> {
    pub plan: ForwardPlan,
    /// `[plan.logit_rows, vocab]`, or `None` when no logits were asked.
    pub logits: Option<T>,
    /// `[plan.total_tokens, K·hidden]`, or `None` when no layer was asked.
    pub hidden: Option<T>,
}

/// A backend that runs a Llama-family model (MODEL-8 .. MODEL-11).
pub trait ModelBackend: Backend + 'static {
    /// Weights resident on the device.
    type Model;
    /// Every layer's keys and values for a batch of sequences, on the device.
    type ModelCache;

    fn model_precision(&self) -> ModelPrecision;

    /// Uploads host weights once; the model is then shared by any number of caches.
    fn load_model(&self, weights: &LlamaWeights) -> Result<Self::Model>;

    /// Bytes of weights one forward step reads, in the formats the loaded
    /// model holds them in, where the backend knows them (a report's byte
    /// roofline); `None` leaves the report to estimate them from the
    /// parameter count and [`ModelPrecision::weight_dtype`].
    fn weight_bytes(&self, _model: &Self::Model) -> Option<usize> {
        None
    }

    /// An empty cache for `batch` sequences of at most `capacity` positions.
    fn new_model_cache(&self, model: &Self::Model, batch: usize, capacity: usize) -> Result<Self::ModelCache>;

    /// One forward call (MODEL-8): appends every sequence's new tokens to
    /// the cache and returns the requested logits and hidden states.
    fn forward(&self, model: &Self::Model, cache: &mut Self::ModelCache, req: &ForwardRequest<'_>) -> Result<ForwardOutput<Self::Tensor>>;

    /// Each sequence's cached length.
    fn cache_lens(&self, cache: &Self::ModelCache) -> Vec<usize>;

    /// Removes the last `amounts[b]` positions of each sequence from every
    /// layer (KV-3; strict, KV-4).
    fn cache_trim(&self, cache: &mut Self::ModelCache, amounts: &[usize]) -> Result<()>;

    /// One layer's keys and values of one sequence, `[len, kv_heads, head_dim]`,
    /// copied to the host (for conformance, not for the hot path).
    fn cache_contents(&self, cache: &Self::ModelCache, layer: usize, seq: usize) -> Result<(Vec<f64>, Vec<f64>)>;
}

impl From<ModelError> for crate::BackendError {
    fn from(e: ModelError) -> Self {
        crate::BackendError::Model(e)
    }
}

/// The reference forward behind the trait: the oracle, exact f64.
impl ModelBackend for ReferenceBackend {
    type Model = RefModel;
    type ModelCache = RefCache;

    fn model_precision(&self) -> ModelPrecision {
        ModelPrecision { weight_dtype: "f32", compute_dtype: "f64", logit_rel_tolerance: 0.0, hidden_rel_tolerance: 0.0, argmax_margin_epsilon: 0.0, window_margin_epsilon: 0.0 }
    }

    fn load_model(&self, weights: &LlamaWeights) -> Result<RefModel> {
        Ok(RefModel::new(weights.clone()))
    }

    fn new_model_cache(&self, model: &RefModel, batch: usize, capacity: usize) -> Result<RefCache> {
        Ok(model.new_cache(batch, capacity)?)
    }

    fn forward(&self, model: &RefModel, cache: &mut RefCache, req: &ForwardRequest<'_>) -> Result<ForwardOutput<RefTensor>> {
        let out = model.forward(cache, req)?;
        let cfg = model.config();
        let logits = (req.logits != LogitRows::None).then(|| RefTensor::F64(Tensor::new(vec![out.plan.logit_rows, cfg.vocab_size], out.logits).expect("the reference lays out its rows")));
        let width = req.hidden_layers.len() * cfg.hidden_size;
        let hidden = (width > 0).then(|| RefTensor::F64(Tensor::new(vec![out.plan.total_tokens, width], out.hidden).expect("the reference lays out its rows")));
        Ok(ForwardOutput { plan: out.plan, logits, hidden })
    }

    fn cache_lens(&self, cache: &RefCache) -> Vec<usize> {
        cache.lens().to_vec()
    }

    fn cache_trim(&self, cache: &mut RefCache, amounts: &[usize]) -> Result<()> {
        Ok(cache.trim(amounts)?)
    }

    fn cache_contents(&self, cache: &RefCache, layer: usize, seq: usize) -> Result<(Vec<f64>, Vec<f64>)> {
        check_cache_index(cache.lens().len(), cache.layers(), layer, seq)?;
        Ok((cache.keys(layer, seq).to_vec(), cache.values(layer, seq).to_vec()))
    }
}

/// Checks `layer`/`seq` of a [`ModelBackend::cache_contents`] call.
pub fn check_cache_index(batch: usize, layers: usize, layer: usize, seq: usize) -> Result<()> {
    if seq >= batch || layer >= layers {
        return Err(ModelError::InvalidInput { arg: "cache index", reason: format!("layer {layer}, sequence {seq} is outside {layers} layers x batch {batch}") }.into());
    }
    Ok(())
}
