//! Total-variation distance between observed frequencies and an exact distribution.

use crate::StatsError;
use crate::validate;

/// `TV = ½ Σ |c_i / n - p_i|` with `n = Σ c_i`; in `[0, 1]`.
///
/// Errors: either slice empty; lengths differ; `expected` non-finite, negative, or
/// not summing to 1 within [`crate::PROBABILITY_SUM_TOLERANCE`]; counts sum to 0 or
/// overflow `u64`.
pub fn total_variation(observed: &[u64], expected: &[f64]) -> Result<f64, StatsError> {
    let n = validate::counts("observed", observed)?;
    validate::probabilities("expected", expected)?;
    validate::same_len("observed", observed.len(), "expected", expected.len())?;
    let n = n as f64;
    let l1: f64 = observed.iter().zip(expected).map(|(&c, &p)| (c as f64 / n - p).abs()).sum();
    Ok((0.5 * l1).min(1.0))
}
