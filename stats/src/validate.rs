//! Input validation shared by the public functions. Kept in one place so every
//! function reports the same error for the same defect.

use crate::StatsError;

/// Tolerance on `|sum(p) - 1|` for an exact expected distribution.
pub const PROBABILITY_SUM_TOLERANCE: f64 = 1e-9;

/// Checks that `p` is a non-empty probability vector; returns its sum.
pub(crate) fn probabilities(arg: &'static str, p: &[f64]) -> Result<f64, StatsError> {
    if p.is_empty() {
        return Err(StatsError::Empty { arg });
    }
    let mut sum = 0.0;
    for (i, &v) in p.iter().enumerate() {
        if !v.is_finite() {
            return Err(StatsError::NotFinite { arg, index: Some(i), value: v });
        }
        if v < 0.0 {
            return Err(StatsError::Negative { arg, index: Some(i), value: v });
        }
        sum += v;
    }
    if (sum - 1.0).abs() > PROBABILITY_SUM_TOLERANCE {
        return Err(StatsError::NotNormalized { arg, sum, tolerance: PROBABILITY_SUM_TOLERANCE });
    }
    Ok(sum)
}

/// Checks that `counts` is non-empty with a positive total that fits in `u64`.
pub(crate) fn counts(arg: &'static str, counts: &[u64]) -> Result<u64, StatsError> {
    if counts.is_empty() {
        return Err(StatsError::Empty { arg });
    }
    let total = counts.iter().try_fold(0u64, |acc, &c| acc.checked_add(c)).ok_or(StatsError::CountOverflow { arg })?;
    if total == 0 {
        return Err(StatsError::ZeroSamples { arg });
    }
    Ok(total)
}

pub(crate) fn same_len(left: &'static str, left_len: usize, right: &'static str, right_len: usize) -> Result<(), StatsError> {
    if left_len != right_len {
        return Err(StatsError::LengthMismatch { left, left_len, right, right_len });
    }
    Ok(())
}

/// Checks `value` is in the open interval (0, 1) (levels and effect sizes).
pub(crate) fn open_unit(arg: &'static str, value: f64) -> Result<(), StatsError> {
    if !value.is_finite() {
        return Err(StatsError::NotFinite { arg, index: None, value });
    }
    if !(value > 0.0 && value < 1.0) {
        return Err(StatsError::NotInOpenUnitInterval { arg, value });
    }
    Ok(())
}

/// Checks `value` is a probability in [0, 1].
pub(crate) fn closed_unit(arg: &'static str, index: Option<usize>, value: f64) -> Result<(), StatsError> {
    if !value.is_finite() {
        return Err(StatsError::NotFinite { arg, index, value });
    }
    if !(0.0..=1.0).contains(&value) {
        return Err(StatsError::NotInClosedUnitInterval { arg, index, value });
    }
    Ok(())
}

pub(crate) fn positive_n(arg: &'static str, n: u64) -> Result<(), StatsError> {
    if n == 0 {
        return Err(StatsError::ZeroSamples { arg });
    }
    Ok(())
}

/// Largest degrees of freedom accepted. `statrs`'s chi-squared tails lose accuracy as
/// df grows (measured against scipy at x = df: relative error ~3e-10 at 1e6, ~2e-6 at
/// 1e9, ~2e-5 at 1e11; wrong in the third digit at 1e13).
pub const MAX_DF: f64 = 1e9;

pub(crate) fn df(value: f64) -> Result<(), StatsError> {
    if !value.is_finite() {
        return Err(StatsError::NotFinite { arg: "df", index: None, value });
    }
    if value <= 0.0 {
        return Err(StatsError::TooSmall { arg: "df", value: 0, min: 1 });
    }
    if value > MAX_DF {
        return Err(StatsError::TooLarge { arg: "df", value, max: MAX_DF });
    }
    Ok(())
}

/// Number of cells `m` for a power calculation: at least 2 (df = m - 1 >= 1), at most
/// `MAX_DF + 1`.
pub(crate) fn cells(arg: &'static str, m: usize) -> Result<(), StatsError> {
    if m < 2 {
        return Err(StatsError::TooSmall { arg, value: m as u64, min: 2 });
    }
    if (m - 1) as f64 > MAX_DF {
        return Err(StatsError::TooLarge { arg, value: m as f64, max: MAX_DF + 1.0 });
    }
    Ok(())
}
