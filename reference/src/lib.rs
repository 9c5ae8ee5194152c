//! The pure-CPU reference of every algorithm in `spec/SPEC.md`, and the
//! source of truth every backend is checked against.
//!
//! Contents: greedy and DFlash verification ([`greedy`]), the accept test
//! ([`accept`]), rejection sampling with its residual and bonus
//! ([`rejection`]), draws ([`sampling`]), temperature, top-k, top-p and the
//! processors around them ([`logits`]) and the logprobs reported of them
//! ([`logprob`]), lossy verifiers ([`lossy`]), the
//! n-gram proposer and its incremental index ([`ngram`]: its per-n tables
//! filled on the cores for a long append), the batched KV cache and paged
//! gather ([`kvcache`]), the dynamic controller ([`controller`]), DFlash
//! drafting pieces ([`dflash`]) and the theory's formulas ([`theory`]);
//! typed errors ([`error`]) and all input validation (`validate.rs`).
//!
//! Invariants: no tensor library and no backend is used (plain loops over
//! [`Tensor`], f64 throughout, sums in index order, CONV-9); the only
//! dependencies are `thiserror` and `serde`; no function owns randomness,
//! every draw consumes noise given by the caller (CONV-10); every public
//! function validates all of its input before computing anything and
//! reports the first defect as a typed [`SpecError`] (ERR-1), never a panic
//! (`tests/robustness.rs`); rule IDs in doc comments name the spec rule a
//! function implements.
//!
//! Threads: [`parallel`] splits host work across the cores (the core count
//! read once, whole output rows per thread) for the n-gram index, the f64
//! reference forward of `specdec-models` and the ndarray port's row kernels;
//! it splits only work whose result cannot depend on the split.

pub mod accept;
pub mod controller;
pub mod dflash;
pub mod error;
pub mod greedy;
pub mod kvcache;
pub mod logits;
pub mod logprob;
pub mod lossy;
pub mod ngram;
pub mod parallel;
pub mod rejection;
pub mod sampling;
pub mod tensor;
pub mod theory;
pub(crate) mod validate;

pub use accept::{Comparator, accept_test, speculative_accept};
pub use error::{ErrorKind, Result, SpecError};
pub use greedy::{DflashOutput, VerifyOutput, dflash_accept, greedy_verify};
pub use logits::{BatchInputs, PenaltyScope, RowInputs, SamplingParams, bias_row, penalty_counts, process_logits, process_logits_batch, process_logits_batch_with, process_logits_with, window_counts};
pub use logprob::{LOGPROB_FLOOR, LogprobMode, LogprobRequest, MAX_TOP_LOGPROBS, TokenLogprob, logprob_row};
pub use rejection::{RejectionInputs, rejection_verify, residual_distribution};
pub use sampling::{DrawMethod, DrawNoise, Drawn};
pub use tensor::Tensor;
pub use validate::{MAX_EXPONENTIAL, MIN_EXPONENTIAL, SUM_TOLERANCE};

/// The token id that marks an unused slot in padded token tensors (CONV-1).
pub const PAD: i64 = -1;
