//! Upper-tail probabilities (p-values) that never silently become 0.
//!
//! `statrs`'s chi-squared survival function is `Gamma::sf`, i.e. the regularized
//! upper incomplete gamma `Q(df/2, x/2)` evaluated directly by a continued fraction
//! in the upper tail (it falls back to `1 - P` only where `Q` is not small), so small
//! p-values keep full relative precision. It returns 0 once the prefactor
//! `x^a e^-x / Γ(a)` drops below `e^-709.78`, i.e. when the true value is below what
//! an `f64` can hold (statistic 2000 on 5 df has `p ≈ 1.2e-430`). A p-value of 0
//! would claim the outcome is impossible, so [`PValue`] instead floors it to
//! `f64::MIN_POSITIVE` — an upper bound on the truth, hence conservative — and keeps
//! an analytic upper bound on its `log10`.

use serde::Serialize;
use statrs::distribution::{ChiSquared, ContinuousCDF};
use statrs::function::gamma::ln_gamma;

use crate::StatsError;
use crate::validate;

/// A p-value with its base-10 logarithm.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct PValue {
    /// The p-value in `[0, 1]`. Exactly 0 only for an outcome impossible under the null.
    pub value: f64,
    /// `log10` of the p-value; an upper bound when `floored`; `-inf` only when `value` is 0.
    pub log10: f64,
    /// The true p-value is below `f64::MIN_POSITIVE`; `value` is `f64::MIN_POSITIVE`,
    /// an upper bound, so judging on it can only under-reject.
    pub floored: bool,
}

impl PValue {
    pub(crate) const ONE: PValue = PValue { value: 1.0, log10: 0.0, floored: false };
    /// Used only for outcomes with probability exactly 0 under the null.
    pub(crate) const IMPOSSIBLE: PValue = PValue { value: 0.0, log10: f64::NEG_INFINITY, floored: false };

    /// Wraps a computed tail probability, flooring it when it underflowed. `ln_bound`
    /// is evaluated only then, and must return an upper bound on the natural log of
    /// the true tail probability.
    pub(crate) fn from_tail(p: f64, ln_bound: impl FnOnce() -> f64) -> PValue {
        if p >= f64::MIN_POSITIVE {
            let value = p.min(1.0);
            PValue { value, log10: value.log10(), floored: false }
        } else {
            // Both the bound and MIN_POSITIVE are upper bounds on the truth; keep the tighter.
            let log10 = (ln_bound() / std::f64::consts::LN_10).min(f64::MIN_POSITIVE.log10());
            PValue { value: f64::MIN_POSITIVE, log10, floored: true }
        }
    }
}

/// Upper-tail p-value `P(X >= statistic)` for `X ~ chi-squared(df)`, from `statrs`'s
/// survival function (never `1 - cdf`).
///
/// Errors: `statistic` NaN/infinite or negative; `df` = 0 or above [`crate::MAX_DF`].
pub fn chi_squared_p_value(statistic: f64, df: u64) -> Result<PValue, StatsError> {
    if !statistic.is_finite() {
        return Err(StatsError::NotFinite { arg: "statistic", index: None, value: statistic });
    }
    if statistic < 0.0 {
        return Err(StatsError::Negative { arg: "statistic", index: None, value: statistic });
    }
    validate::df(df as f64)?;
    if statistic == 0.0 {
        return Ok(PValue::ONE);
    }
    let dist = ChiSquared::new(df as f64).map_err(|_| StatsError::Numerical { context: "ChiSquared::new in chi_squared_p_value" })?;
    let sf = dist.sf(statistic);
    Ok(PValue::from_tail(sf, || ln_upper_gamma_bound(df as f64 / 2.0, statistic / 2.0)))
}

/// Upper bound on `ln Q(a, x)`, used only where `statrs` underflows (`x >> a`).
///
/// `Q(a,x) Γ(a) = ∫_x^∞ t^(a-1) e^-t dt`. For `a <= 1`, `t^(a-1) <= x^(a-1)` gives
/// `Q <= x^(a-1) e^-x / Γ(a)`. For `a > 1` and `x > a - 1`, `ln(t/x) <= t/x - 1` gives
/// `Q <= x^(a-1) e^-x / Γ(a) * x / (x - a + 1)`. Both are within a factor
/// `1 + O(a/x)` of the truth in the region where they are used.
fn ln_upper_gamma_bound(a: f64, x: f64) -> f64 {
    let base = (a - 1.0) * x.ln() - x - ln_gamma(a);
    if a <= 1.0 {
        base
    } else if x > a - 1.0 {
        base + (x / (x - a + 1.0)).ln()
    } else {
        // Unreachable in practice (Q is not small here); ln Q <= 0 always holds.
        0.0
    }
}
