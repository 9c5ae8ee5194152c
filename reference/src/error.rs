//! Typed errors for invalid input (spec rule ERR-1).
//!
//! Every public function of the reference, and every backend, reports bad
//! input with one of these variants. Each variant names the argument and,
//! where there is one, the offending index and value, so that a vendor can
//! find the defect in a case file without a debugger. [`ErrorKind`] is the
//! stable, language-neutral name used in conformance case files.

use serde::{Deserialize, Serialize};

/// Result alias used throughout specdec.
pub type Result<T, E = SpecError> = std::result::Result<T, E>;

/// Every way an input can be rejected.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum SpecError {
    #[error("`{arg}`: expected shape {expected}, got {actual:?}")]
    ShapeMismatch { arg: &'static str, expected: String, actual: Vec<usize> },

    #[error("`{arg}`: {len} values cannot fill shape {shape:?}")]
    DataLength { arg: &'static str, shape: Vec<usize>, len: usize },

    #[error("`{arg}`: non-finite value {value} at {index:?}")]
    NonFinite { arg: &'static str, index: Vec<usize>, value: f64 },

    #[error("`{arg}`: negative probability {value} at {index:?}")]
    NegativeProbability { arg: &'static str, index: Vec<usize>, value: f64 },

    #[error("`{arg}`: row {row:?} sums to {sum}, not 1 within {tolerance}")]
    NotNormalized { arg: &'static str, row: Vec<usize>, sum: f64, tolerance: f64 },

    #[error("`{arg}`: row {row:?} has zero total weight; nothing can be drawn")]
    ZeroMass { arg: &'static str, row: Vec<usize> },

    #[error("`{arg}`: token id {token} at {index:?} is outside [0, {vocab})")]
    TokenOutOfRange { arg: &'static str, index: Vec<usize>, token: i64, vocab: usize },

    #[error("`{arg}`: slot {index:?} holds {token}, expected {expected}")]
    PaddingMismatch { arg: &'static str, index: Vec<usize>, token: i64, expected: &'static str },

    #[error("`{arg}`: sequence {seq} has length {len}, outside [0, {max}]")]
    LengthOutOfRange { arg: &'static str, seq: usize, len: i64, max: usize },

    #[error("`{arg}`: the draft width k is 0; at least one draft slot is required")]
    EmptyDraft { arg: &'static str },

    #[error("`{arg}`: the batch is empty")]
    EmptyBatch { arg: &'static str },

    #[error("`{arg}`: the vocabulary is empty")]
    EmptyVocab { arg: &'static str },

    #[error("`{arg}`: sequence {seq} has an empty context")]
    EmptyContext { arg: &'static str, seq: usize },

    #[error("`{arg}`: sequence {seq} has {len} tokens, beyond max_model_len {max_model_len}")]
    ContextTooLong { arg: &'static str, seq: usize, len: usize, max_model_len: usize },

    #[error("`{arg}`: uniform {value} at {index:?} is outside [0, 1)")]
    UniformOutOfRange { arg: &'static str, index: Vec<usize>, value: f64 },

    #[error("`{arg}`: exponential noise {value:e} at {index:?} is outside [2^-126, 2^126], the binary32 normal range SAMPLE-2 admits (erratum E25)")]
    InvalidNoise { arg: &'static str, index: Vec<usize>, value: f64 },

    #[error("`{arg}`: score row {index:?} is entirely -inf")]
    AllMasked { arg: &'static str, index: Vec<usize> },

    #[error("parameter `{name}` = {value}: {reason}")]
    InvalidParameter { name: &'static str, value: String, reason: &'static str },

    #[error("sequence {seq}: cannot trim {trim} positions from a cache holding {len}")]
    TrimBeyondLength { seq: usize, len: usize, trim: i64 },

    #[error("sequence {seq}: appending {add} positions to {len} exceeds capacity {capacity}")]
    CapacityExceeded { seq: usize, len: usize, add: i64, capacity: usize },

    #[error("sequence {seq}: block table slot {slot} holds {block}, not a page in [0, {num_pages})")]
    InvalidBlock { seq: usize, slot: usize, block: i64, num_pages: usize },
}

/// Stable names of the error variants, as written in conformance case files.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum ErrorKind {
    ShapeMismatch,
    DataLength,
    NonFinite,
    NegativeProbability,
    NotNormalized,
    ZeroMass,
    TokenOutOfRange,
    PaddingMismatch,
    LengthOutOfRange,
    EmptyDraft,
    EmptyBatch,
    EmptyVocab,
    EmptyContext,
    ContextTooLong,
    UniformOutOfRange,
    InvalidNoise,
    AllMasked,
    InvalidParameter,
    TrimBeyondLength,
    CapacityExceeded,
    InvalidBlock,
}

impl SpecError {
    /// The stable kind of this error.
    pub fn kind(&self) -> ErrorKind {
        use SpecError as E;
        match self {
            E::ShapeMismatch { .. } => ErrorKind::ShapeMismatch,
            E::DataLength { .. } => ErrorKind::DataLength,
            E::NonFinite { .. } => ErrorKind::NonFinite,
            E::NegativeProbability { .. } => ErrorKind::NegativeProbability,
            E::NotNormalized { .. } => ErrorKind::NotNormalized,
            E::ZeroMass { .. } => ErrorKind::ZeroMass,
            E::TokenOutOfRange { .. } => ErrorKind::TokenOutOfRange,
            E::PaddingMismatch { .. } => ErrorKind::PaddingMismatch,
            E::LengthOutOfRange { .. } => ErrorKind::LengthOutOfRange,
            E::EmptyDraft { .. } => ErrorKind::EmptyDraft,
            E::EmptyBatch { .. } => ErrorKind::EmptyBatch,
            E::EmptyVocab { .. } => ErrorKind::EmptyVocab,
            E::EmptyContext { .. } => ErrorKind::EmptyContext,
            E::ContextTooLong { .. } => ErrorKind::ContextTooLong,
            E::UniformOutOfRange { .. } => ErrorKind::UniformOutOfRange,
            E::InvalidNoise { .. } => ErrorKind::InvalidNoise,
            E::AllMasked { .. } => ErrorKind::AllMasked,
            E::InvalidParameter { .. } => ErrorKind::InvalidParameter,
            E::TrimBeyondLength { .. } => ErrorKind::TrimBeyondLength,
            E::CapacityExceeded { .. } => ErrorKind::CapacityExceeded,
            E::InvalidBlock { .. } => ErrorKind::InvalidBlock,
        }
    }

    /// The argument the error is about, when it names one.
    pub fn arg(&self) -> Option<&'static str> {
        use SpecError as E;
        match self {
            E::ShapeMismatch { arg, .. }
            | E::DataLength { arg, .. }
            | E::NonFinite { arg, .. }
            | E::NegativeProbability { arg, .. }
            | E::NotNormalized { arg, .. }
            | E::ZeroMass { arg, .. }
            | E::TokenOutOfRange { arg, .. }
            | E::PaddingMismatch { arg, .. }
            | E::LengthOutOfRange { arg, .. }
            | E::EmptyDraft { arg }
            | E::EmptyBatch { arg }
            | E::EmptyVocab { arg }
            | E::EmptyContext { arg, .. }
            | E::ContextTooLong { arg, .. }
            | E::UniformOutOfRange { arg, .. }
            | E::InvalidNoise { arg, .. }
            | E::AllMasked { arg, .. } => Some(arg),
            E::InvalidParameter { name, .. } => Some(name),
            E::TrimBeyondLength { .. } | E::CapacityExceeded { .. } | E::InvalidBlock { .. } => None,
        }
    }

    pub(crate) fn param(name: &'static str, value: impl std::fmt::Display, reason: &'static str) -> Self {
        SpecError::InvalidParameter { name, value: value.to_string(), reason }
    }
}

impl ErrorKind {
    /// All kinds, in declaration order (used by coverage reports).
    pub const ALL: [ErrorKind; 21] = [
        ErrorKind::ShapeMismatch,
        ErrorKind::DataLength,
        ErrorKind::NonFinite,
        ErrorKind::NegativeProbability,
        ErrorKind::NotNormalized,
        ErrorKind::ZeroMass,
        ErrorKind::TokenOutOfRange,
        ErrorKind::PaddingMismatch,
        ErrorKind::LengthOutOfRange,
        ErrorKind::EmptyDraft,
        ErrorKind::EmptyBatch,
        ErrorKind::EmptyVocab,
        ErrorKind::EmptyContext,
        ErrorKind::ContextTooLong,
        ErrorKind::UniformOutOfRange,
        ErrorKind::InvalidNoise,
        ErrorKind::AllMasked,
        ErrorKind::InvalidParameter,
        ErrorKind::TrimBeyondLength,
        ErrorKind::CapacityExceeded,
        ErrorKind::InvalidBlock,
    ];
}
