//! The crate's single error type. Every variant names the offending argument so a
//! caller can surface the message unchanged.

use thiserror::Error;

/// Invalid input to a public function of this crate (or, for [`StatsError::Numerical`],
/// a failure inside `statrs` that validation should have ruled out).
#[derive(Debug, Clone, PartialEq, Error)]
#[non_exhaustive]
pub enum StatsError {
    /// A slice argument has no elements.
    #[error("`{arg}` is empty")]
    Empty { arg: &'static str },

    /// Two slices that must be parallel have different lengths.
    #[error("length mismatch: `{left}` has {left_len} entries but `{right}` has {right_len}")]
    LengthMismatch { left: &'static str, left_len: usize, right: &'static str, right_len: usize },

    /// A float argument (or element) is NaN or infinite.
    #[error("`{arg}{}` is {value}, which is not finite", index_suffix(.index))]
    NotFinite { arg: &'static str, index: Option<usize>, value: f64 },

    /// A probability, count-like float or parameter is negative.
    #[error("`{arg}{}` is {value}, which is negative", index_suffix(.index))]
    Negative { arg: &'static str, index: Option<usize>, value: f64 },

    /// Probabilities do not sum to 1 within `tolerance`.
    #[error("`{arg}` sums to {sum}, which differs from 1 by more than the tolerance {tolerance:e}")]
    NotNormalized { arg: &'static str, sum: f64, tolerance: f64 },

    /// A level or effect size (alpha, beta, delta) is outside the open interval (0, 1).
    #[error("`{arg}` is {value}, which is outside the open interval (0, 1)")]
    NotInOpenUnitInterval { arg: &'static str, value: f64 },

    /// A probability (p-value, null proportion) is outside the closed interval [0, 1].
    #[error("`{arg}{}` is {value}, which is outside the closed interval [0, 1]", index_suffix(.index))]
    NotInClosedUnitInterval { arg: &'static str, index: Option<usize>, value: f64 },

    /// A sample size (`n`, or the total of the observed counts) is zero.
    #[error("`{arg}` is 0; at least one observation is required")]
    ZeroSamples { arg: &'static str },

    /// A success count exceeds the number of trials.
    #[error("`k` = {k} exceeds `n` = {n}")]
    KExceedsN { k: u64, n: u64 },

    /// An integer parameter is below its minimum (e.g. fewer than 2 cells).
    #[error("`{arg}` is {value}, which is below the minimum {min}")]
    TooSmall { arg: &'static str, value: u64, min: u64 },

    /// A parameter exceeds the range where this crate's numerics are validated.
    #[error("`{arg}` is {value:e}, above the supported maximum {max:e}")]
    TooLarge { arg: &'static str, value: f64, max: f64 },

    /// Summing the counts in `arg` overflows `u64`.
    #[error("the counts in `{arg}` sum past u64::MAX")]
    CountOverflow { arg: &'static str },

    /// Power 1 - beta at or below the size alpha is what a coin flip achieves.
    #[error("`alpha` + `beta` is {sum}, which is not below 1: power 1 - beta would not exceed the size alpha")]
    PowerNotAboveSize { sum: f64 },

    /// The required sample size does not fit in the exactly representable integers.
    #[error("the required sample size ({required:e}) exceeds 2^53; `delta` = {delta} is too small")]
    SampleSizeTooLarge { delta: f64, required: f64 },

    /// `statrs` rejected parameters that validation accepted (a bug here, not in the input).
    #[error("internal numerical failure in {context}")]
    Numerical { context: &'static str },
}

fn index_suffix(index: &Option<usize>) -> String {
    match index {
        Some(i) => format!("[{i}]"),
        None => String::new(),
    }
}
