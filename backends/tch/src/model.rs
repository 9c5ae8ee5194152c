//! The Llama forward pass on libtorch: [`ModelBackend`] for [`TchBackend`] (MODEL-8 ..
//! MODEL-11), the same math as the f64 reference (`specdec_models::reference`) in f32.
//!
//! Role: weights are uploaded once as f32 tensors on the backend's device ([`TchModel`]);
//! a [`TchModelCache`] holds every layer's keys and values for a batch of sequences in
//! preallocated `[batch, kv_heads, capacity, head_dim]` tensors on the same device, and
//! the host-side lengths. One forward call embeds the new tokens of every sequence,
//! runs each decoder layer on all of them at once (RMSNorm, projections, rotate-half
//! RoPE, SwiGLU are row-wise), and runs attention sequence by sequence, because each
//! sequence attends to its own cache prefix of its own length. MODEL-17's architectures
//! add to the attention alone: Qwen2's q/k/v biases and Qwen3's per-head RMSNorm of q
//! and k, both before RoPE.
//!
//! Invariants:
//! - Validation before the device (MODEL-8): [`forward::plan`] and
//!   [`forward::check_cache_shape`] / [`forward::check_trim`] run on the host first, so
//!   every bad input is a typed [`ModelError`], never a device error or a panic.
//! - One code path: a one-token decode, a `(k+1)`-token verify window and a ragged prefill
//!   are the same call; new tokens at positions `start .. start + c` of their sequence
//!   attend causally to positions `0 ..= pos` of that sequence only (an explicit mask
//!   on the `[c, start + c]` score block), so cache slots past a sequence's length
//!   (stale after a trim, or never written) are never read.
//! - The cache is written in place (`narrow(..).copy_(..)`) before attention reads it;
//!   lengths advance only after the whole call succeeded, so a failed call leaves every
//!   sequence at its old length (what it wrote sits past the length and is never read).
//! - Trimming (KV-3, strict KV-4) only decrements lengths: slots past a length are dead.
//! - Outputs stay on the device; hidden states (MODEL-9) are the residual stream after
//!   each requested layer, concatenated in request order; logits come from the final
//!   norm and `lm_head` (or the tied embedding).
//! - No RNG anywhere: the forward is a pure function of weights, cache and tokens.
//!
//! Precision (MODEL-11): weights, activations, softmax and accumulation are f32 (libtorch
//! GEMMs accumulate in f32); RoPE angles are computed in f64 on the host
//! ([`forward::rope_angles`], MODEL-10) and rounded once to f32. See
//! [`TchBackend::model_precision`] for the measured error and the stated bound.

use specdec_backend::model::check_cache_index;
use specdec_backend::{Backend, BackendError, ForwardOutput, ModelBackend, ModelPrecision, Result};
use specdec_models::forward::{self, ForwardPlan, ForwardRequest, LogitRows};
use specdec_models::{LlamaConfig, LlamaWeights, Matrix, ModelError};
use tch::{Device, Kind, Tensor};

use crate::kernels::TResult;
use crate::{TchBackend, TchTensor};

/// One decoder layer's weights on the device, `[out, in]` as on the host.
struct TchLayer {
    attn_norm: Tensor,
    wq: Tensor,
    wk: Tensor,
    wv: Tensor,
    /// Qwen2's q, k and v biases (MODEL-17).
    qkv_bias: Option<(Tensor, Tensor, Tensor)>,
    /// Qwen3's per-head RMSNorm weights of q and of k, each `[head_dim]`.
    qk_norm: Option<(Tensor, Tensor)>,
    wo: Tensor,
    mlp_norm: Tensor,
    w_gate: Tensor,
    w_up: Tensor,
    w_down: Tensor,
}

/// A Llama model resident on the backend's device (f32 weights).
pub struct TchModel {
    config: LlamaConfig,
    device: Device,
    /// `[vocab, hidden]`.
    embed: Tensor,
    layers: Vec<TchLayer>,
    /// `[hidden]`.
    final_norm: Tensor,
    /// `[vocab, hidden]`: `lm_head`, or a shallow clone of `embed` when tied.
    output: Tensor,
}

impl TchModel {
    /// The model's configuration.
    pub fn config(&self) -> &LlamaConfig {
        &self.config
    }
}

impl std::fmt::Debug for TchModel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Geometry only: printing tensors could mean a device download.
        let c = &self.config;
        write!(
            f,
            "TchModel {{ vocab: {}, hidden: {}, layers: {}, heads: {}, kv_heads: {}, device: {:?} }}",
            c.vocab_size, c.hidden_size, c.num_hidden_layers, c.num_attention_heads, c.num_key_value_heads, self.device
        )
    }
}

/// Every layer's keys and values for a batch of sequences, on the device (MODEL-8).
pub struct TchModelCache {
    /// Per layer, `[batch, kv_heads, capacity, head_dim]`; slots past `lens[b]` are dead.
    keys: Vec<Tensor>,
    values: Vec<Tensor>,
    /// Cached positions per sequence (host-side: `plan` needs them before the device).
    lens: Vec<usize>,
    capacity: usize,
    kv_heads: usize,
    head_dim: usize,
    device: Device,
}

impl std::fmt::Debug for TchModelCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "TchModelCache {{ layers: {}, lens: {:?}, capacity: {}, kv_heads: {}, head_dim: {}, device: {:?} }}",
            self.keys.len(),
            self.lens,
            self.capacity,
            self.kv_heads,
            self.head_dim,
            self.device
        )
    }
}

/// A size as a libtorch dimension. Every size reaching here is bounded by a validated
/// config (dimensions at most 2^24) or by `check_cache_shape` (at most 2^36 values), so
/// the conversion cannot fail; saturating keeps it panic-free regardless (libtorch would
/// then refuse the absurd size with an error).
fn dim(n: usize) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// Uploads a host matrix (row-major) with its shape.
fn upload_matrix(m: &Matrix, device: Device) -> TResult<Tensor> {
    let shape: Vec<i64> = m.shape.iter().map(|&d| dim(d)).collect();
    Tensor::f_from_slice(&m.data)?.f_reshape(shape.as_slice())?.f_to_device(device)
}

/// RMSNorm over the last axis: `x / sqrt(mean(x²) + eps) · w`.
fn rms_norm(x: &Tensor, w: &Tensor, eps: f64) -> TResult<Tensor> {
    let ms = x.f_square()?.f_mean_dim(-1, true, Kind::Float)?;
    x.f_mul(&ms.f_add_scalar(eps)?.f_rsqrt()?)?.f_mul(w)
}

/// Rotate-half RoPE (MODEL-10) on `x [T, heads, head_dim]` with `cos`/`sin`
/// `[T, 1, head_dim]` (each half-table repeated twice): the first half becomes
/// `a·cos − b·sin`, the second `b·cos + a·sin`, as in the reference.
fn rope(x: &Tensor, cos: &Tensor, sin: &Tensor) -> TResult<Tensor> {
    let half = x.size()[2] / 2;
    let (a, b) = (x.f_narrow(2, 0, half)?, x.f_narrow(2, half, half)?);
    let rotated = Tensor::f_cat(&[b.f_neg()?, a], 2)?;
    x.f_mul(cos)?.f_add(&rotated.f_mul(sin)?)
}

/// Checks that host weights agree with their config before anything is uploaded (the
/// fields are public, so a hand-built `LlamaWeights` may not have gone through `new`).
fn check_weights(w: &LlamaWeights) -> std::result::Result<(), ModelError> {
    w.config.validate("weights")?;
    let named = w.named();
    let expected = w.config.tensor_shapes();
    if named.len() != expected.len() {
        return Err(ModelError::InvalidInput { arg: "weights", reason: format!("{} tensors for a config implying {}", named.len(), expected.len()) });
    }
    for ((name, m), (_, shape)) in named.iter().zip(&expected) {
        if &m.shape != shape {
            return Err(ModelError::TensorShape { file: "weights".into(), tensor: name.clone(), expected: shape.clone(), actual: m.shape.clone() });
        }
        if shape.iter().product::<usize>() != m.data.len() {
            return Err(ModelError::InvalidInput { arg: "weights", reason: format!("`{name}`: {} values cannot fill shape {shape:?}", m.data.len()) });
        }
    }
    Ok(())
}

impl TchBackend {
    fn upload_model(&self, w: &LlamaWeights) -> TResult<TchModel> {
        let up = |m: &Matrix| upload_matrix(m, self.tch_device());
        let embed = up(&w.embed)?;
        let layers = w
            .layers
            .iter()
            .map(|l| {
                Ok(TchLayer {
                    attn_norm: up(&l.attn_norm)?,
                    wq: up(&l.wq)?,
                    wk: up(&l.wk)?,
                    wv: up(&l.wv)?,
                    qkv_bias: match (&l.attn.q_bias, &l.attn.k_bias, &l.attn.v_bias) {
                        (Some(q), Some(k), Some(v)) => Some((up(q)?, up(k)?, up(v)?)),
                        _ => None,
                    },
                    qk_norm: match (&l.attn.q_norm, &l.attn.k_norm) {
                        (Some(q), Some(k)) => Some((up(q)?, up(k)?)),
                        _ => None,
                    },
                    wo: up(&l.wo)?,
                    mlp_norm: up(&l.mlp_norm)?,
                    w_gate: up(&l.w_gate)?,
                    w_up: up(&l.w_up)?,
                    w_down: up(&l.w_down)?,
                })
            })
            .collect::<TResult<Vec<_>>>()?;
        // Tied heads share the embedding's storage rather than holding a second copy.
        let output = match &w.lm_head {
            Some(head) => up(head)?,
            None => embed.shallow_clone(),
        };
        Ok(TchModel { config: w.config.clone(), device: self.tch_device(), embed, layers, final_norm: up(&w.final_norm)?, output })
    }

    /// Rejects a cache built for another geometry or device (the caller paired them).
    fn check_pair(&self, model: &TchModel, cache: &TchModelCache) -> Result<()> {
        let c = &model.config;
        let fits = cache.keys.len() == c.num_hidden_layers && cache.kv_heads == c.num_key_value_heads && cache.head_dim == c.head_dim();
        if !fits {
            let reason = format!("{cache:?} was not built for {model:?}");
            return Err(ModelError::InvalidInput { arg: "cache", reason }.into());
        }
        if model.device != self.tch_device() || cache.device != self.tch_device() {
            return Err(BackendError::device(&self.name(), format!("model on {:?} and cache on {:?}, backend on {:?}", model.device, cache.device, self.tch_device())));
        }
        Ok(())
    }

    /// The forward of a validated request (MODEL-8); writes the cache but leaves the
    /// lengths to the caller, which advances them only on success.
    fn run_forward(&self, model: &TchModel, cache: &mut TchModelCache, req: &ForwardRequest<'_>, plan: &ForwardPlan) -> TResult<(Option<Tensor>, Option<Tensor>)> {
        let cfg = &model.config;
        let dev = self.tch_device();
        let (h, hd, nh, nkv) = (cfg.hidden_size, cfg.head_dim(), cfg.num_attention_heads, cfg.num_key_value_heads);
        let (t_all, hd_i, half) = (dim(plan.total_tokens), dim(hd), hd / 2);
        let group = dim(nh / nkv);
        let scale = 1.0 / (hd as f64).sqrt();

        // Token ids and RoPE tables, in output-row order, built on the host and uploaded
        // once per call. Angles in f64 (MODEL-10), rounded once to f32; each half-table
        // is repeated so the rotation is two elementwise products.
        let mut ids = Vec::with_capacity(plan.total_tokens);
        let (mut cos, mut sin) = (Vec::with_capacity(plan.total_tokens * hd), Vec::with_capacity(plan.total_tokens * hd));
        let rotary = forward::config_rope(cfg);
        for r in &plan.rows {
            for (i, &tok) in req.tokens[r.seq].iter().enumerate() {
                ids.push(i64::from(tok));
                let (c, s) = forward::rope_angles_of(r.start_pos + i, hd, &rotary);
                for _ in 0..2 {
                    cos.extend(c.iter().take(half).map(|&v| v as f32));
                    sin.extend(s.iter().take(half).map(|&v| v as f32));
                }
            }
        }
        let ids = Tensor::f_from_slice(&ids)?.f_to_device(dev)?;
        let cos = Tensor::f_from_slice(&cos)?.f_reshape([t_all, 1, hd_i])?.f_to_device(dev)?;
        let sin = Tensor::f_from_slice(&sin)?.f_reshape([t_all, 1, hd_i])?.f_to_device(dev)?;

        let mut x = model.embed.f_index_select(0, &ids)?; // [T, hidden]
        let mut kept: Vec<Option<Tensor>> = req.hidden_layers.iter().map(|_| None).collect();
        for (li, layer) in model.layers.iter().enumerate() {
            let normed = rms_norm(&x, &layer.attn_norm, cfg.rms_norm_eps)?;
            // MODEL-17: Qwen2's biases, then Qwen3's per-head norms, before RoPE.
            let bias = |i: usize| layer.qkv_bias.as_ref().map(|b| [&b.0, &b.1, &b.2][i]);
            let project = |w: &Tensor, i: usize, heads: usize| normed.f_linear(w, bias(i))?.f_view([t_all, dim(heads), hd_i]);
            let (mut q, mut k) = (project(&layer.wq, 0, nh)?, project(&layer.wk, 1, nkv)?);
            if let Some((q_norm, k_norm)) = &layer.qk_norm {
                (q, k) = (rms_norm(&q, q_norm, cfg.rms_norm_eps)?, rms_norm(&k, k_norm, cfg.rms_norm_eps)?);
            }
            let (q, k) = (rope(&q, &cos, &sin)?, rope(&k, &cos, &sin)?);
            let v = project(&layer.wv, 2, nkv)?;

            let mut attended = Vec::with_capacity(plan.rows.len());
            for r in &plan.rows {
                let (seq, start, c, row) = (dim(r.seq), dim(r.start_pos), dim(r.count), dim(r.token_row));
                // Append this sequence's new keys/values at start .. start + c, in place.
                let (keys, values) = (cache.keys[li].f_select(0, seq)?, cache.values[li].f_select(0, seq)?); // [kv_heads, capacity, hd]
                keys.f_narrow(1, start, c)?.f_copy_(&k.f_narrow(0, row, c)?.f_transpose(0, 1)?)?;
                values.f_narrow(1, start, c)?.f_copy_(&v.f_narrow(0, row, c)?.f_transpose(0, 1)?)?;
                // Read back exactly its L = start + c live positions; GQA: query head j
                // uses kv head j / group, which is what repeat_interleave lays out.
                let len = start + c;
                let kc = keys.f_narrow(1, 0, len)?.f_repeat_interleave_self_int(group, 0, None)?; // [heads, L, hd]
                let vc = values.f_narrow(1, 0, len)?.f_repeat_interleave_self_int(group, 0, None)?;
                let qs = q.f_narrow(0, row, c)?.f_transpose(0, 1)?; // [heads, c, hd]
                let scores = qs.f_matmul(&kc.f_transpose(1, 2)?)?.f_mul_scalar(scale)?; // [heads, c, L]
                // Causal: new token i sits at start + i and sees positions 0 ..= start + i;
                // position 0 is always visible, so no row is all -inf.
                let key_pos = Tensor::f_arange(len, (Kind::Int64, dev))?.f_unsqueeze(0)?;
                let query_pos = Tensor::f_arange_start(start, len, (Kind::Int64, dev))?.f_unsqueeze(1)?;
                let future = key_pos.f_gt_tensor(&query_pos)?; // [c, L]
                let probs = scores.f_masked_fill(&future, f64::NEG_INFINITY)?.f_softmax(-1, Kind::Float)?;
                let out = probs.f_matmul(&vc)?; // [heads, c, hd]
                attended.push(out.f_transpose(0, 1)?.f_reshape([c, dim(nh * hd)])?);
            }
            let attended = Tensor::f_cat(&attended, 0)?; // [T, heads·hd], plan row order
            x = x.f_add(&attended.f_linear::<Tensor>(&layer.wo, None)?)?;

            let normed = rms_norm(&x, &layer.mlp_norm, cfg.rms_norm_eps)?;
            let gate = normed.f_linear::<Tensor>(&layer.w_gate, None)?;
            let up = normed.f_linear::<Tensor>(&layer.w_up, None)?;
            x = x.f_add(&gate.f_silu()?.f_mul(&up)?.f_linear::<Tensor>(&layer.w_down, None)?)?;
            // MODEL-9: the residual stream after this layer, for every slot that asks it.
            for (slot, &l) in req.hidden_layers.iter().enumerate() {
                if l == li {
                    kept[slot] = Some(x.shallow_clone());
                }
            }
        }

        let hidden = if req.hidden_layers.is_empty() {
            None
        } else {
            // `plan` checked every requested layer exists, so every slot is filled.
            let kept: Vec<Tensor> = kept.into_iter().flatten().collect();
            debug_assert_eq!(kept.len(), req.hidden_layers.len());
            Some(Tensor::f_cat(&kept, 1)?) // [T, K·hidden]
        };
        let rows = match req.logits {
            LogitRows::None => None,
            LogitRows::All => Some(x),
            LogitRows::Last => {
                let last: Vec<i64> = plan.rows.iter().map(|r| dim(r.token_row + r.count - 1)).collect();
                Some(x.f_index_select(0, &Tensor::f_from_slice(&last)?.f_to_device(dev)?)?)
            }
        };
        let logits = match rows {
            Some(rows) => Some(rms_norm(&rows, &model.final_norm, cfg.rms_norm_eps)?.f_linear::<Tensor>(&model.output, None)?),
            None => None,
        };
        debug_assert!(hidden.as_ref().is_none_or(|t| t.size() == [t_all, dim(req.hidden_layers.len() * h)]));
        Ok((logits, hidden))
    }
}

/// MODEL-8 .. MODEL-11 on libtorch.
impl ModelBackend for TchBackend {
    type Model = TchModel;
    type ModelCache = TchModelCache;

    /// MODEL-11. Measured worst `|logit − ref| / max|ref logit of the row|` on the CPU
    /// (libtorch 2.13, f32) over ragged prefills, 6-token verify windows, trims and
    /// decodes (`tests/model.rs`, `measured_precision`): tiny-v16-l1 2.3e-7, tiny-v12-l2
    /// 2.6e-7, tiny-v32-l2 3.1e-7, and a seeded deeper model (vocab 256, hidden 64,
    /// 6 layers, 8 heads over 2 kv heads, contexts up to 126 positions) 6.4e-7; variants
    /// of that model with query weights scaled up to 1.5x (sharper attention) gave
    /// 4.8e-7 .. 6.0e-7. The bound 5e-6 is about 8x the worst of them: f32 rounding (unit
    /// roundoff 6e-8) over a few dozen dependent operations per layer, with room for
    /// other GEMM kernels (CUDA, other CPUs) and somewhat deeper models. The argmax
    /// epsilon is twice the largest absolute logit error the bound allows on logits of
    /// magnitude up to 50: two candidates can swap only if each moves by that much.
    ///
    /// On CUDA (cuBLAS picks its GEMM kernel, and its split of the inner
    /// dimension, by the number of rows) the CPU bound does not hold: on an
    /// H100 (libtorch 2.11, 2026-11-25) SmolLM2's hidden states after a
    /// rollback differed from a fresh prefill's by 5.04e-6 of the row scale
    /// (layer 27, `e2e/smollm2/*/rollback`), just over 5e-6, while its logits
    /// stayed within it. CUDA states candle-cuda's bound, 2e-5 (4x that), with
    /// the argmax and window epsilons that follow from it (2 · 2e-5 · 50).
    fn model_precision(&self) -> ModelPrecision {
        match self.tch_device() {
            Device::Cpu => {
                ModelPrecision { weight_dtype: "f32", compute_dtype: "f32", logit_rel_tolerance: 5e-6, hidden_rel_tolerance: 5e-6, argmax_margin_epsilon: 5e-4, window_margin_epsilon: 5e-4 }
            }
            _ => ModelPrecision { weight_dtype: "f32", compute_dtype: "f32", logit_rel_tolerance: 2e-5, hidden_rel_tolerance: 2e-5, argmax_margin_epsilon: 2e-3, window_margin_epsilon: 2e-3 },
        }
    }

    fn load_model(&self, weights: &LlamaWeights) -> Result<TchModel> {
        check_weights(weights)?;
        self.dev(tch::no_grad(|| self.upload_model(weights)))
    }

    fn new_model_cache(&self, model: &TchModel, batch: usize, capacity: usize) -> Result<TchModelCache> {
        let cfg = &model.config;
        forward::check_cache_shape(cfg, batch, capacity)?;
        let (nkv, hd) = (cfg.num_key_value_heads, cfg.head_dim());
        let shape = [dim(batch), dim(nkv), dim(capacity), dim(hd)];
        let device = self.tch_device();
        let layer = || Tensor::f_zeros(shape, (Kind::Float, device));
        let (keys, values) = self.dev(tch::no_grad(|| -> TResult<_> {
            let keys = (0..cfg.num_hidden_layers).map(|_| layer()).collect::<TResult<Vec<_>>>()?;
            let values = (0..cfg.num_hidden_layers).map(|_| layer()).collect::<TResult<Vec<_>>>()?;
            Ok((keys, values))
        }))?;
        Ok(TchModelCache { keys, values, lens: vec![0; batch], capacity, kv_heads: nkv, head_dim: hd, device })
    }

    fn forward(&self, model: &TchModel, cache: &mut TchModelCache, req: &ForwardRequest<'_>) -> Result<ForwardOutput<TchTensor>> {
        // MODEL-8: every input defect is named on the host before the device is touched.
        let plan = forward::plan(&model.config, &cache.lens, cache.capacity, req)?;
        self.check_pair(model, cache)?;
        let (logits, hidden) = self.dev(tch::no_grad(|| self.run_forward(model, cache, req, &plan)))?;
        for r in &plan.rows {
            cache.lens[r.seq] += r.count;
        }
        Ok(ForwardOutput { plan, logits: logits.map(TchTensor::new), hidden: hidden.map(TchTensor::new) })
    }

    fn cache_lens(&self, cache: &TchModelCache) -> Vec<usize> {
        cache.lens.clone()
    }

    fn cache_trim(&self, cache: &mut TchModelCache, amounts: &[usize]) -> Result<()> {
        Ok(forward::trim_lens(&mut cache.lens, amounts)?)
    }

    fn cache_contents(&self, cache: &TchModelCache, layer: usize, seq: usize) -> Result<(Vec<f64>, Vec<f64>)> {
        check_cache_index(cache.lens.len(), cache.keys.len(), layer, seq)?;
        let len = dim(cache.lens[seq]);
        let host = |t: &Tensor| -> TResult<Vec<f64>> {
            // [kv_heads, len, hd] -> [len, kv_heads, hd], row-major, f64 on the host.
            let t = t.f_select(0, dim(seq))?.f_narrow(1, 0, len)?.f_transpose(0, 1)?.f_to_kind(Kind::Double)?.f_to_device(Device::Cpu)?.f_contiguous()?;
            let n = t.numel();
            let mut out = vec![0.0; n];
            t.f_copy_data(&mut out, n)?;
            Ok(out)
        };
        self.dev(tch::no_grad(|| Ok((host(&cache.keys[layer])?, host(&cache.values[layer])?))))
    }
}
