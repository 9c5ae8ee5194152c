//! Holm's step-down correction for a family of tests (controls the family-wise
//! error rate at `alpha` under arbitrary dependence).

use serde::Serialize;

use crate::StatsError;
use crate::validate;

/// Holm's verdict on one test of the family.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct HolmDecision {
    /// The test's p-value, as given.
    pub p_value: f64,
    /// Position among the p-values sorted ascending (0-based; ties by input index).
    pub rank: usize,
    /// The per-test alpha it was compared with: `alpha / (m - rank)`.
    pub alpha: f64,
    pub rejected: bool,
}

/// Holm step-down over `p_values` at family-wise level `alpha`; returns one decision
/// per input, in input order. Sorted ascending, the `i`-th p-value (0-based) is
/// compared with `alpha / (m - i)`; at the first that exceeds its threshold, it and
/// every later one are not rejected.
///
/// Errors: `p_values` empty, NaN/infinite or outside `[0, 1]`; `alpha` not in (0, 1).
pub fn holm(p_values: &[f64], alpha: f64) -> Result<Vec<HolmDecision>, StatsError> {
    if p_values.is_empty() {
        return Err(StatsError::Empty { arg: "p_values" });
    }
    for (i, &p) in p_values.iter().enumerate() {
        validate::closed_unit("p_values", Some(i), p)?;
    }
    validate::open_unit("alpha", alpha)?;

    let m = p_values.len();
    let mut order: Vec<usize> = (0..m).collect();
    order.sort_by(|&a, &b| p_values[a].total_cmp(&p_values[b]).then(a.cmp(&b)));

    let mut out = vec![HolmDecision { p_value: 0.0, rank: 0, alpha: 0.0, rejected: false }; m];
    let mut still_rejecting = true;
    for (rank, &i) in order.iter().enumerate() {
        let per_test = alpha / (m - rank) as f64;
        still_rejecting = still_rejecting && p_values[i] <= per_test;
        out[i] = HolmDecision { p_value: p_values[i], rank, alpha: per_test, rejected: still_rejecting };
    }
    Ok(out)
}
