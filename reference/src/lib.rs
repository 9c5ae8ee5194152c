//! The pure-CPU reference of every algorithm in `spec/SPEC.md`, and the
//! source of truth every backend is checked against.
//!
//! Invariants: no tensor library and no backend is used (plain loops over
//! [`Tensor`], f64 throughout, sums in index order, CONV-9); no function owns
//! randomness, every draw consumes noise given by the caller (CONV-10); every
//! public function validates all of its input before computing anything and
//! reports the first defect as a typed [`SpecError`] (ERR-1), never a panic;
//! rule IDs in doc comments name the spec rule a function implements.
//! Threads ([`parallel`]) only split work whose result cannot depend on the
//! split: the host forwards' output rows, the n-gram index's tables.

pub mod accept;
pub mod controller;
pub mod dflash;
pub mod error;
pub mod greedy;
pub mod kvcache;
pub mod logits;
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
pub use rejection::{RejectionInputs, rejection_verify, residual_distribution};
pub use sampling::{DrawMethod, DrawNoise, Drawn};
pub use tensor::Tensor;
pub use validate::{MAX_EXPONENTIAL, MIN_EXPONENTIAL, SUM_TOLERANCE};

/// The token id that marks an unused slot in padded token tensors (CONV-1).
pub const PAD: i64 = -1;
