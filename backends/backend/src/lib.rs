//! The Backend contract every specdec port implements, and the reference
//! wrapped as the canonical backend.
//!
//! A backend owns a device tensor type and implements the spec's operations
//! on it. Inputs are uploaded once; outputs stay on the device until the
//! caller downloads them, so a decode loop only moves accepted tokens and
//! counts to the host. Invariants: every operation returns the same typed
//! [`SpecError`] kinds as the reference for the same bad input (the contract
//! is checked by `specdec-conformance`); an operation a backend lacks answers
//! [`BackendError::NotSupported`], which reports never count as a pass;
//! randomness is an explicit input except in [`Backend::rejection_verify_seeded`].
//! The model forward pass (embedding, attention over a per-layer batched KV
//! cache, MLP, lm_head, hidden states of chosen layers) is the second trait,
//! [`ModelBackend`], which shares this trait's device tensor type.
//! The glue operations (GLUE-1 .. GLUE-5: reshape, row gather and concatenation,
//! checked i64 arithmetic, f32 uploads) connect the two on the device, and the
//! unchecked verify variants (GLUE-6) let a decoder's hot path skip the
//! validity read-back on input it has already validated.
//!
//! Modules: this file holds [`Backend`] (the device tensor and KV cache
//! types, one method per operation, `NotSupported` by default, the glue ops
//! and the unchecked verifies), [`Precision`] (what a port states, capped by
//! its dtype) and [`BackendError`]; `reference.rs` is [`ReferenceBackend`],
//! the reference behind the trait; [`glue`] the host semantics of the glue
//! ops; [`processors`] the processors beyond temperature, top-k and top-p
//! (logit bias, penalties, min-p) around a port's own kernel, written once: a
//! port gives three device kernels ([`processors::ProcessorKernels`]) and the
//! flow keeps the spec's order; [`model`] the [`ModelBackend`] trait (load
//! weights, a per-layer batched KV cache, preallocated and trimmed by moving
//! per-sequence lengths, as a GPU allocation would be; one forward call;
//! per-sequence trim) and the reference forward behind it. The glue ops are
//! checked like every op (a gather's row range and an i64 overflow are one
//! read-back each); an unchecked or fused glue path is future work.
//!
//! How a port names a defect: its fast device check says only "invalid";
//! the inputs are then downloaded and run through the reference, whose error
//! is returned unchanged ([`BackendError::named_by_reference`]; a reference
//! that accepts them makes a `Device` error naming the port). So a port's
//! errors are the reference's by construction (`tests/named_by_reference.rs`).
//! Besides that, ports take from `specdec-reference` its host types, the
//! n-gram policy, the host KV cache, its tolerance constants and (ndarray)
//! its thread split, never an output.
//!
//! The ports are laid out alike: `lib.rs` (the crate doc, the backend's
//! types), `backend.rs` (constructors and the `Backend` methods: host shape
//! checks, one device check, a kernel), `check.rs` (value checks),
//! `kernels.rs` (device primitives; tch keeps its verify, sampling and n-gram
//! kernels here too), `kv.rs`, `glue.rs`, `model.rs` (the `ModelBackend`
//! forward), and where a port splits them out `sampling.rs`, `verify.rs`,
//! `ngram.rs` (ndarray, candle), `noise.rs` (candle's seeded noise),
//! `tensor.rs` (ndarray's tensor type).

pub mod glue;
pub mod model;
pub mod processors;
mod reference;

pub use model::{ForwardOutput, ModelBackend, ModelPrecision};
pub use reference::{RefTensor, ReferenceBackend, seeded_noise};
pub use specdec_reference::ngram::NgramConfig;
pub use specdec_reference::{Comparator, DrawMethod, ErrorKind, PAD, PenaltyScope, SamplingParams, SpecError, Tensor as HostTensor};

use serde::{Deserialize, Serialize};

/// Why a backend operation did not produce a result.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum BackendError {
    /// The input violates the spec; the same error the reference gives.
    #[error(transparent)]
    Invalid(#[from] SpecError),
    /// The backend does not implement this operation.
    #[error("backend `{backend}` does not support `{op}`")]
    NotSupported { op: Op, backend: String },
    /// A model file or a model input was rejected (MODEL-16).
    #[error(transparent)]
    Model(specdec_models::ModelError),
    /// The device or library failed (allocation, kernel launch, dtype).
    #[error("backend `{backend}` device error: {message}")]
    Device { backend: String, message: String },
}

impl BackendError {
    pub fn device(backend: &str, message: impl std::fmt::Display) -> Self {
        BackendError::Device { backend: backend.to_string(), message: message.to_string() }
    }

    /// The error for an input a port's fast device check rejected. Ports
    /// check validity with a few fused reductions that only say yes or no (one
    /// read-back, not one per condition); on a no they run the reference on
    /// host copies, and its error names the first defect (kind, argument,
    /// index) exactly as the spec's checking order does. If the reference
    /// accepts the input, the port's check is stricter than the spec: that
    /// disagreement is the port's own bug, a device error naming `backend`.
    pub fn named_by_reference<T>(backend: &str, reference: Result<T>) -> Self {
        match reference {
            Err(e) => e,
            Ok(_) => BackendError::device(backend, "the fast device check rejected an input the reference accepts"),
        }
    }

    /// Whether the backend lacks what was asked (an operation), as against an
    /// input or device failing.
    pub fn is_not_supported(&self) -> bool {
        matches!(self, BackendError::NotSupported { .. })
    }

    /// The spec error kind, when the input was invalid.
    pub fn kind(&self) -> Option<ErrorKind> {
        match self {
            BackendError::Invalid(e) => Some(e.kind()),
            _ => None,
        }
    }
}

pub type Result<T, E = BackendError> = std::result::Result<T, E>;

/// Every operation of the contract, by its case-file name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Op {
    GreedyVerify,
    DflashAccept,
    RejectionVerify,
    RejectionVerifySeeded,
    Residual,
    ProcessLogits,
    Draw,
    NgramPropose,
    KvCache,
    PagedGather,
    /// GLUE-1.
    Reshape,
    /// GLUE-2.
    GatherRows,
    /// GLUE-3.
    ConcatRows,
    /// GLUE-4.
    AddI64,
    /// GLUE-4.
    SubI64,
}

impl Op {
    pub const ALL: [Op; 15] = [
        Op::GreedyVerify,
        Op::DflashAccept,
        Op::RejectionVerify,
        Op::RejectionVerifySeeded,
        Op::Residual,
        Op::ProcessLogits,
        Op::Draw,
        Op::NgramPropose,
        Op::KvCache,
        Op::PagedGather,
        Op::Reshape,
        Op::GatherRows,
        Op::ConcatRows,
        Op::AddI64,
        Op::SubI64,
    ];

    /// The glue operations (GLUE-1 .. GLUE-4): exact data movement and
    /// integer arithmetic, checked by golden cases only (no decision margin,
    /// nothing for a differential generator to aim at).
    pub const GLUE: [Op; 5] = [Op::Reshape, Op::GatherRows, Op::ConcatRows, Op::AddI64, Op::SubI64];

    pub fn is_glue(self) -> bool {
        Op::GLUE.contains(&self)
    }

    pub fn name(self) -> &'static str {
        match self {
            Op::GreedyVerify => "greedy_verify",
            Op::DflashAccept => "dflash_accept",
            Op::RejectionVerify => "rejection_verify",
            Op::RejectionVerifySeeded => "rejection_verify_seeded",
            Op::Residual => "residual",
            Op::ProcessLogits => "process_logits",
            Op::Draw => "draw",
            Op::NgramPropose => "ngram_propose",
            Op::KvCache => "kv_cache",
            Op::PagedGather => "paged_gather",
            Op::Reshape => "reshape",
            Op::GatherRows => "gather_rows",
            Op::ConcatRows => "concat_rows",
            Op::AddI64 => "add_i64",
            Op::SubI64 => "sub_i64",
        }
    }

    pub fn from_name(name: &str) -> Option<Op> {
        Op::ALL.into_iter().find(|op| op.name() == name)
    }
}

impl std::fmt::Display for Op {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// The numeric contract a backend states (CONV-9, SAMPLE-3, BACKEND-4).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Precision {
    /// The dtype probabilities and scores are computed in, e.g. `"f32"`.
    pub float_dtype: &'static str,
    /// The dtype cumulative sums are accumulated in.
    pub accumulate_dtype: &'static str,
    /// Decisions whose reference margin is below this may differ from the
    /// reference; such cases are excused and counted, never hidden.
    pub margin_epsilon: f64,
    /// Absolute tolerance on float outputs (distributions, gathered K/V).
    pub value_tolerance: f64,
}

/// The most a backend may state for its float dtype (BACKEND-6): a margin epsilon
/// and a value tolerance a few orders of magnitude above that dtype's rounding of
/// a probability (binary64 2.2e-16, binary32 1.2e-7, f16 9.8e-4, bf16 7.8e-3), so
/// an honest port has room and a wrong one cannot state its way to a pass.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PrecisionCap {
    pub margin_epsilon: f64,
    pub value_tolerance: f64,
}

/// The cap of a float dtype name, `None` for a name the spec does not know.
pub fn precision_cap(float_dtype: &str) -> Option<PrecisionCap> {
    let (margin_epsilon, value_tolerance) = match float_dtype {
        "f64" => (1e-9, 1e-9),
        "f32" => (1e-5, 1e-4),
        "f16" => (1e-2, 1e-2),
        "bf16" => (5e-2, 5e-2),
        _ => return None,
    };
    Some(PrecisionCap { margin_epsilon, value_tolerance })
}

impl Precision {
    /// What the judge uses (BACKEND-6): the stated margin epsilon and value
    /// tolerance, each capped by the float dtype's cap. A statement that is not a
    /// number, is negative, or names an unknown dtype buys no slack at all.
    pub fn judged(&self) -> Precision {
        let cap = precision_cap(self.float_dtype).unwrap_or(PrecisionCap { margin_epsilon: 0.0, value_tolerance: 0.0 });
        let bounded = |stated: f64, cap: f64| if stated.is_finite() && stated >= 0.0 { stated.min(cap) } else { 0.0 };
        Precision { margin_epsilon: bounded(self.margin_epsilon, cap.margin_epsilon), value_tolerance: bounded(self.value_tolerance, cap.value_tolerance), ..*self }
    }

    /// Why this statement breaks BACKEND-6, if it does.
    pub fn cap_violation(&self) -> Option<String> {
        for (field, dtype) in [("float_dtype", self.float_dtype), ("accumulate_dtype", self.accumulate_dtype)] {
            if precision_cap(dtype).is_none() {
                return Some(format!("{field} `{dtype}` is not a dtype the spec knows (f64, f32, f16, bf16)"));
            }
        }
        let cap = precision_cap(self.float_dtype)?;
        for (field, stated, cap) in [("margin_epsilon", self.margin_epsilon, cap.margin_epsilon), ("value_tolerance", self.value_tolerance, cap.value_tolerance)] {
            if !(stated.is_finite() && stated >= 0.0) {
                return Some(format!("{field} {stated:e} is not a finite number >= 0"));
            }
            if stated > cap {
                return Some(format!("{field} {stated:e} exceeds the {} cap {cap:e}; the judge uses the cap", self.float_dtype));
            }
        }
        None
    }
}

/// Draw noise on the device: `[R]`/`[B, k+1]` uniforms or `[.., V]` exponentials.
#[derive(Debug)]
pub enum DrawNoiseArg<'a, T> {
    InverseCdf(&'a T),
    ExponentialRace(&'a T),
}

impl<T> DrawNoiseArg<'_, T> {
    pub fn method(&self) -> DrawMethod {
        match self {
            DrawNoiseArg::InverseCdf(_) => DrawMethod::InverseCdf,
            DrawNoiseArg::ExponentialRace(_) => DrawMethod::ExponentialRace,
        }
    }
}

/// The probabilities and drafts of a rejection-sampling verify (REJECT-1).
#[derive(Debug)]
pub struct RejectionArgs<'a, T> {
    /// `[B, k+1, V]`.
    pub target_probs: &'a T,
    /// `[B, k, V]`, or `None` for drafts without probabilities (RESID-2).
    pub draft_probs: Option<&'a T>,
    /// `[B, k]` i64, PAD beyond each proposal.
    pub draft_tokens: &'a T,
    /// `[B]` i64.
    pub proposal_lens: &'a T,
}

/// Explicit noise of a rejection-sampling verify.
#[derive(Debug)]
pub struct RejectionNoise<'a, T> {
    /// `[B, k]` uniforms.
    pub accept_uniforms: &'a T,
    pub draw: DrawNoiseArg<'a, T>,
}

// The argument structs hold only references: copyable whatever `T` is
// (a derive would demand `T: Copy`, which device tensors are not).
macro_rules! copy_without_bounds {
    ($($t:ident),*) => {$(
        impl<T> Clone for $t<'_, T> {
            fn clone(&self) -> Self {
                *self
            }
        }
        impl<T> Copy for $t<'_, T> {}
    )*};
}
copy_without_bounds!(DrawNoiseArg, RejectionArgs, RejectionNoise, LogitsParams, Penalties);

/// Verify outputs, still on the device.
#[derive(Debug, Clone)]
pub struct Verified<T> {
    /// `[B, k+1]` i64: accepted drafts, the next token, PAD.
    pub tokens: T,
    /// `[B]` i64.
    pub num_accepted: T,
}

/// DFlash outputs, still on the device.
#[derive(Debug, Clone)]
pub struct DflashAccepted<T> {
    /// `[bs]` i64.
    pub accept_len: T,
    /// `[bs]` i64.
    pub bonus: T,
}

/// Per-row sampling parameters on the device (LOGITS-1). The processors
/// beyond temperature, top-k and top-p are optional; `None` is off.
#[derive(Debug)]
pub struct LogitsParams<'a, T> {
    /// `[R]` float.
    pub temperature: &'a T,
    /// `[R]` i64, 0 disables.
    pub top_k: &'a T,
    /// `[R]` float in (0, 1].
    pub top_p: &'a T,
    /// `[R]` float in [0, 1] (LOGITS-10).
    pub min_p: Option<&'a T>,
    /// LOGITS-8/9 with each row's counts (LOGITS-12/13).
    pub penalties: Option<Penalties<'a, T>>,
    /// `[R, V]` float (LOGITS-7).
    pub logit_bias: Option<&'a T>,
}

impl<'a, T> LogitsParams<'a, T> {
    /// Temperature, top-k and top-p; every other processor off.
    pub fn new(temperature: &'a T, top_k: &'a T, top_p: &'a T) -> Self {
        LogitsParams { temperature, top_k, top_p, min_p: None, penalties: None, logit_bias: None }
    }

    /// Whether only LOGITS-1 .. LOGITS-6 are asked for.
    pub fn is_basic(&self) -> bool {
        self.min_p.is_none() && self.penalties.is_none() && self.logit_bias.is_none()
    }

    /// The same temperature, top-k and top-p, every other processor off.
    pub fn basic(&self) -> Self {
        LogitsParams::new(self.temperature, self.top_k, self.top_p)
    }
}

/// Penalties on the device (LOGITS-8/9): each row's token counts `[R, V]`
/// (float, non-negative integers: the row's penalty context plus its drafts
/// before it, LOGITS-12/13) and three `[R]` float parameters.
#[derive(Debug)]
pub struct Penalties<'a, T> {
    pub counts: &'a T,
    /// Finite, `> 0`; 1 is off.
    pub repetition: &'a T,
    /// Finite; 0 is off.
    pub presence: &'a T,
    /// Finite; 0 is off.
    pub frequency: &'a T,
}

/// How `kv_trim` treats amounts beyond a sequence's length.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TrimMode {
    /// KV-4: an error, nothing trimmed.
    Strict,
    /// KV-5: clamp to the length and report what was trimmed.
    Clamped,
}

/// Implements the four transfers of a backend whose tensors are
/// [`RefTensor`]s by delegating to the reference: for test doubles and
/// mutants that change one operation and nothing else.
#[macro_export]
macro_rules! reference_transfers {
    () => {
        fn upload_f64(&self, t: &$crate::HostTensor<f64>) -> $crate::Result<$crate::RefTensor> {
            $crate::ReferenceBackend.upload_f64(t)
        }
        fn upload_i64(&self, t: &$crate::HostTensor<i64>) -> $crate::Result<$crate::RefTensor> {
            $crate::ReferenceBackend.upload_i64(t)
        }
        fn download_f64(&self, t: &$crate::RefTensor) -> $crate::Result<$crate::HostTensor<f64>> {
            $crate::ReferenceBackend.download_f64(t)
        }
        fn download_i64(&self, t: &$crate::RefTensor) -> $crate::Result<$crate::HostTensor<i64>> {
            $crate::ReferenceBackend.download_i64(t)
        }
    };
}

/// A speculative-decoding backend (BACKEND-1): operations on the backend's
/// own device tensors, outputs left on the device until downloaded. Every
/// method but the transfers has a default that answers `NotSupported`
/// (BACKEND-3). Bad input gets the reference's error kind and argument
/// (BACKEND-2).
pub trait Backend {
    /// A device-resident tensor: floats in the backend's dtype, or i64 ids.
    type Tensor: Clone + std::fmt::Debug;
    /// A batched KV cache living on the device (KV-1).
    type KvCache;

    /// A short stable name, e.g. `"candle-cpu"`.
    fn name(&self) -> String;
    /// The device, e.g. `"cpu"` or `"cuda:0"`.
    fn device(&self) -> String;
    fn precision(&self) -> Precision;

    /// Copies host floats to the device, converting to the backend's dtype.
    fn upload_f64(&self, t: &HostTensor<f64>) -> Result<Self::Tensor>;
    fn upload_i64(&self, t: &HostTensor<i64>) -> Result<Self::Tensor>;
    fn download_f64(&self, t: &Self::Tensor) -> Result<HostTensor<f64>>;
    fn download_i64(&self, t: &Self::Tensor) -> Result<HostTensor<i64>>;

    /// GLUE-5: copies host f32 values to the device. Every f32 is exact in
    /// f64, so the default widens and calls [`Backend::upload_f64`]; a
    /// backend storing f32 overrides it to skip the f64 copy (and its
    /// rounding back, which must give the same values).
    fn upload_f32(&self, t: &HostTensor<f32>) -> Result<Self::Tensor> {
        self.upload_f64(&t.map(|&x| f64::from(x)))
    }

    /// GREEDY-1 .. GREEDY-4.
    fn greedy_verify(&self, _target_scores: &Self::Tensor, _draft_tokens: &Self::Tensor, _proposal_lens: &Self::Tensor) -> Result<Verified<Self::Tensor>> {
        Err(self.unsupported(Op::GreedyVerify))
    }

    /// GLUE-6: [`Backend::greedy_verify`] for input the caller has already
    /// validated (e.g. a decoder's own drafts and the model's logits): the
    /// same result on valid input, without the value check's device
    /// read-back. Shapes are still checked (they are host metadata). On
    /// input that is *not* valid the result is unspecified: wrong tokens or
    /// an error, never a panic. The default is the checked op.
    fn greedy_verify_unchecked(&self, target_scores: &Self::Tensor, draft_tokens: &Self::Tensor, proposal_lens: &Self::Tensor) -> Result<Verified<Self::Tensor>> {
        self.greedy_verify(target_scores, draft_tokens, proposal_lens)
    }

    /// DFLASH-1 .. DFLASH-3.
    fn dflash_accept(&self, _candidates: &Self::Tensor, _target_predict: &Self::Tensor, _vocab: usize) -> Result<DflashAccepted<Self::Tensor>> {
        Err(self.unsupported(Op::DflashAccept))
    }

    /// REJECT-1 .. REJECT-5 with explicit noise.
    fn rejection_verify(&self, _args: RejectionArgs<'_, Self::Tensor>, _noise: RejectionNoise<'_, Self::Tensor>, _comparator: Comparator) -> Result<Verified<Self::Tensor>> {
        Err(self.unsupported(Op::RejectionVerify))
    }

    /// GLUE-6: [`Backend::rejection_verify`] without the validity read-back,
    /// under the contract of [`Backend::greedy_verify_unchecked`]. The
    /// default is the checked op.
    fn rejection_verify_unchecked(&self, args: RejectionArgs<'_, Self::Tensor>, noise: RejectionNoise<'_, Self::Tensor>, comparator: Comparator) -> Result<Verified<Self::Tensor>> {
        self.rejection_verify(args, noise, comparator)
    }

    /// REJECT-1 .. REJECT-5 with the backend's own generator seeded by `seed`
    /// (BACKEND-5, the exception of CONV-10; checked statistically). Each sequence's
    /// noise must be independent of every other sequence's.
    fn rejection_verify_seeded(&self, _args: RejectionArgs<'_, Self::Tensor>, _method: DrawMethod, _comparator: Comparator, _seed: u64) -> Result<Verified<Self::Tensor>> {
        Err(self.unsupported(Op::RejectionVerifySeeded))
    }

    /// RESID-1 .. RESID-3 as normalised rows: `target [R, V]`, `draft [R, V]`
    /// or `None` with `drafted [R]`.
    fn residual(&self, _target: &Self::Tensor, _draft: Option<&Self::Tensor>, _drafted: &Self::Tensor) -> Result<Self::Tensor> {
        Err(self.unsupported(Op::Residual))
    }

    /// LOGITS-1 .. LOGITS-13 on `logits [R, V]`.
    fn process_logits(&self, _logits: &Self::Tensor, _params: LogitsParams<'_, Self::Tensor>) -> Result<Self::Tensor> {
        Err(self.unsupported(Op::ProcessLogits))
    }

    /// SAMPLE-1/2 row-wise: `weights [R, V]` and `[R]` uniforms or `[R, V]`
    /// exponentials give `[R]` i64 ids.
    fn draw(&self, _weights: &Self::Tensor, _noise: DrawNoiseArg<'_, Self::Tensor>) -> Result<Self::Tensor> {
        Err(self.unsupported(Op::Draw))
    }

    /// NGRAM-7: `contexts [B, L]`, `context_lens [B]` give drafts `[B, k]`
    /// and proposal lengths `[B]`.
    fn ngram_propose(&self, _contexts: &Self::Tensor, _context_lens: &Self::Tensor, _vocab: usize, _config: &NgramConfig) -> Result<(Self::Tensor, Self::Tensor)> {
        Err(self.unsupported(Op::NgramPropose))
    }

    /// KV-1: an empty cache.
    fn kv_new(&self, _batch: usize, _heads: usize, _head_dim: usize, _capacity: usize) -> Result<Self::KvCache> {
        Err(self.unsupported(Op::KvCache))
    }

    /// KV-2.
    fn kv_append(&self, _cache: &mut Self::KvCache, _keys: &Self::Tensor, _values: &Self::Tensor, _counts: &Self::Tensor) -> Result<()> {
        Err(self.unsupported(Op::KvCache))
    }

    /// KV-3 .. KV-5: returns the trimmed amounts `[B]` i64.
    fn kv_trim(&self, _cache: &mut Self::KvCache, _amounts: &Self::Tensor, _mode: TrimMode) -> Result<Self::Tensor> {
        Err(self.unsupported(Op::KvCache))
    }

    /// The lengths `[B]` i64.
    fn kv_lens(&self, _cache: &Self::KvCache) -> Result<Self::Tensor> {
        Err(self.unsupported(Op::KvCache))
    }

    /// The valid keys and values, each `[B, H, max len, D]`, zero past each length.
    fn kv_contents(&self, _cache: &Self::KvCache) -> Result<(Self::Tensor, Self::Tensor)> {
        Err(self.unsupported(Op::KvCache))
    }

    /// KV-8/9.
    fn paged_gather(&self, _pages: &Self::Tensor, _block_table: &Self::Tensor, _context_lens: &Self::Tensor) -> Result<Self::Tensor> {
        Err(self.unsupported(Op::PagedGather))
    }

    /// GLUE-1: the same elements, row-major, under `shape` (same element
    /// count, else `ShapeMismatch` naming `shape`). Floats or ids.
    fn reshape(&self, _t: &Self::Tensor, _shape: &[usize]) -> Result<Self::Tensor> {
        Err(self.unsupported(Op::Reshape))
    }

    /// GLUE-2: `t [N, ...]`, `rows [M]` i64 -> `[M, ...]` along axis 0; a PAD
    /// row index gives a zero row (padding, never read: CONV-7), any other
    /// index outside `[0, N)` is `TokenOutOfRange` naming `rows`. This lays
    /// out the ragged logits rows of a forward call as the padded
    /// `[B * (k+1), V]` that a reshape turns into a verify op's `[B, k+1, V]`.
    fn gather_rows(&self, _t: &Self::Tensor, _rows: &Self::Tensor) -> Result<Self::Tensor> {
        Err(self.unsupported(Op::GatherRows))
    }

    /// GLUE-3: `parts` stacked along axis 0 (same dtype and trailing dims,
    /// else `ShapeMismatch` naming `parts`; an empty list is `EmptyBatch`).
    fn concat_rows(&self, _parts: &[&Self::Tensor]) -> Result<Self::Tensor> {
        Err(self.unsupported(Op::ConcatRows))
    }

    /// GLUE-4: `a + b` on same-shape i64 tensors; an overflow is
    /// `InvalidParameter` naming `b`, never a wrap.
    fn add_i64(&self, _a: &Self::Tensor, _b: &Self::Tensor) -> Result<Self::Tensor> {
        Err(self.unsupported(Op::AddI64))
    }

    /// GLUE-4: `a - b`, as [`Backend::add_i64`] (e.g. trim amounts
    /// `proposal_lens - num_accepted`, KV-6, without the host).
    fn sub_i64(&self, _a: &Self::Tensor, _b: &Self::Tensor) -> Result<Self::Tensor> {
        Err(self.unsupported(Op::SubI64))
    }

    /// The `NotSupported` error for `op`, named after this backend.
    fn unsupported(&self, op: Op) -> BackendError {
        BackendError::NotSupported { op, backend: self.name() }
    }
}
