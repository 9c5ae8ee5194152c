//! Exact binomial test and confidence intervals for a proportion.
//!
//! Tail sums come from `statrs`'s `Binomial::cdf`/`sf` (regularized incomplete beta,
//! continued fraction capped at 140 iterations) and its pmf from `ln n!` differences,
//! so accuracy falls with `n`. Measured against scipy's `binomtest` (p0 = 0.3,
//! |z| <= 10), the relative error of the p-value is ~1e-9 at n = 1e6, ~1e-7 at 1e8,
//! ~4e-6 at 1e9, ~4e-5 at 1e10 and ~3e-3 at 1e12; at 1e15 the answers are wrong.
//! Hence `n` is capped at [`MAX_BINOMIAL_N`].

use serde::Serialize;
use statrs::distribution::{Beta, Binomial, ContinuousCDF, Discrete, DiscreteCDF, Normal};

use crate::StatsError;
use crate::gof::TestKind;
use crate::tail::PValue;
use crate::validate;

/// Largest `n` accepted by [`binomial_test`] and [`clopper_pearson_interval`]
/// (p-value relative error ~4e-5 there; see the module docs).
pub const MAX_BINOMIAL_N: u64 = 10_000_000_000;

/// Relative tolerance when comparing outcome probabilities in the two-sided test
/// (scipy's `binomtest` uses the same `1 + 1e-7`), so outcomes as likely as the
/// observed one are not excluded by rounding.
pub const BINOMIAL_RELATIVE_TOLERANCE: f64 = 1e-7;

/// Alternative hypothesis of a binomial test.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Alternative {
    /// `p != p0`: sum of probabilities of outcomes no more likely than the observed one.
    TwoSided,
    /// `p < p0`: `P(X <= k)`.
    Less,
    /// `p > p0`: `P(X >= k)`.
    Greater,
}

/// Result of [`binomial_test`].
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct BinomialTestResult {
    pub k: u64,
    pub n: u64,
    pub p0: f64,
    pub alternative: Alternative,
    pub p_value: PValue,
    /// `k` has probability exactly 0 under the null (`p0` is 0 or 1): p-value 0.
    pub impossible_outcome: bool,
}

impl BinomialTestResult {
    pub fn kind(&self) -> TestKind {
        match self.alternative {
            Alternative::TwoSided => TestKind::BinomialTwoSided,
            Alternative::Less => TestKind::BinomialLess,
            Alternative::Greater => TestKind::BinomialGreater,
        }
    }
}

fn max_n(n: u64) -> Result<(), StatsError> {
    if n > MAX_BINOMIAL_N {
        return Err(StatsError::TooLarge { arg: "n", value: n as f64, max: MAX_BINOMIAL_N as f64 });
    }
    Ok(())
}

/// Exact binomial test of `k` successes in `n` trials against success probability `p0`.
///
/// Two-sided: `Σ P(X = i)` over `i` with `P(X = i) <= P(X = k) (1 + 1e-7)`,
/// evaluated as two `statrs` tail sums whose boundary is found by bisection
/// (the pmf is unimodal). `p0` may be 0 or 1; an outcome impossible under such a
/// null gets p-value 0 and `impossible_outcome = true`.
///
/// Errors: `n` = 0 or above [`MAX_BINOMIAL_N`]; `k > n`; `p0` NaN/infinite or outside `[0, 1]`.
pub fn binomial_test(k: u64, n: u64, p0: f64, alternative: Alternative) -> Result<BinomialTestResult, StatsError> {
    validate::positive_n("n", n)?;
    max_n(n)?;
    if k > n {
        return Err(StatsError::KExceedsN { k, n });
    }
    validate::closed_unit("p0", None, p0)?;
    let b = Binomial::new(p0, n).map_err(|_| StatsError::Numerical { context: "Binomial::new in binomial_test" })?;

    let impossible_outcome = b.pmf(k) == 0.0 && (p0 == 0.0 || p0 == 1.0);
    let p_value = if impossible_outcome {
        PValue::IMPOSSIBLE
    } else {
        match alternative {
            Alternative::Less => PValue::from_tail(b.cdf(k), || ln_tail(&b, k, Direction::Down)),
            Alternative::Greater => PValue::from_tail(upper_tail(&b, k), || ln_tail(&b, k, Direction::Up)),
            Alternative::TwoSided => two_sided(&b, k, n, p0),
        }
    };
    Ok(BinomialTestResult { k, n, p0, alternative, p_value, impossible_outcome })
}

/// `P(X >= k)`.
fn upper_tail(b: &Binomial, k: u64) -> f64 {
    if k == 0 { 1.0 } else { b.sf(k - 1) }
}

fn two_sided(b: &Binomial, k: u64, n: u64, p0: f64) -> PValue {
    let mean = n as f64 * p0;
    if k as f64 == mean {
        return PValue::ONE;
    }
    // Compared in log space so an underflowed pmf(k) cannot make every far outcome
    // look "as unlikely" as k.
    let threshold = b.ln_pmf(k) + BINOMIAL_RELATIVE_TOLERANCE.ln_1p();
    if (k as f64) < mean {
        // Other side: [ceil(mean), n], where the pmf is non-increasing. Find the first
        // j there with pmf(j) <= threshold; the other tail is P(X >= j).
        let lo = mean.ceil() as u64;
        let j = first_index(lo, n + 1, |i| b.ln_pmf(i) <= threshold);
        let other = if j > n { 0.0 } else { upper_tail(b, j) };
        PValue::from_tail(b.cdf(k) + other, || {
            let own = ln_tail(b, k, Direction::Down);
            if j > n { own } else { ln_add(own, ln_tail(b, j, Direction::Up)) }
        })
    } else {
        // Other side: [0, floor(mean)], where the pmf is non-decreasing. Find the last
        // j there with pmf(j) <= threshold; the other tail is P(X <= j).
        let hi = mean.floor() as u64;
        // first index in [0, hi+1) whose pmf exceeds the threshold; j = that - 1.
        let first_above = first_index(0, hi + 1, |i| b.ln_pmf(i) > threshold);
        let other = first_above.checked_sub(1);
        let tail_other = other.map_or(0.0, |j| b.cdf(j));
        PValue::from_tail(upper_tail(b, k) + tail_other, || {
            let own = ln_tail(b, k, Direction::Up);
            other.map_or(own, |j| ln_add(own, ln_tail(b, j, Direction::Down)))
        })
    }
}

/// Smallest `i` in `[lo, hi)` with `pred(i)`, assuming `pred` is monotone
/// (false...true); `hi` if none.
fn first_index(mut lo: u64, mut hi: u64, pred: impl Fn(u64) -> bool) -> u64 {
    while lo < hi {
        let mid = lo + (hi - lo) / 2;
        if pred(mid) { hi = mid } else { lo = mid + 1 }
    }
    lo
}

#[derive(Clone, Copy)]
enum Direction {
    Down,
    Up,
}

/// `ln Σ pmf(i)` over the tail starting at `start` going in `dir`, summed in log space
/// from `statrs`'s `ln_pmf`. Only called when the linear-scale tail underflowed, i.e.
/// `start` is far out in a tail where terms shrink geometrically, so the loop ends
/// after few terms (stops once a term is below 1e-17 of the running sum).
fn ln_tail(b: &Binomial, start: u64, dir: Direction) -> f64 {
    let ln0 = b.ln_pmf(start);
    let mut sum = 1.0;
    let mut i = start;
    loop {
        let next = match dir {
            Direction::Down => i.checked_sub(1),
            Direction::Up => (i < b.n()).then_some(i + 1),
        };
        let Some(next) = next else { break };
        let term = (b.ln_pmf(next) - ln0).exp();
        sum += term;
        i = next;
        if term < 1e-17 * sum {
            break;
        }
    }
    ln0 + sum.ln()
}

fn ln_add(a: f64, b: f64) -> f64 {
    let (hi, lo) = if a >= b { (a, b) } else { (b, a) };
    if lo == f64::NEG_INFINITY { hi } else { hi + (lo - hi).exp().ln_1p() }
}

/// A two-sided confidence interval `[lower, upper]` for a proportion.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Interval {
    pub lower: f64,
    pub upper: f64,
}

fn check_proportion(k: u64, n: u64, alpha: f64) -> Result<(), StatsError> {
    validate::positive_n("n", n)?;
    if k > n {
        return Err(StatsError::KExceedsN { k, n });
    }
    validate::open_unit("alpha", alpha)
}

/// Wilson score interval (no continuity correction) with confidence `1 - alpha`.
///
/// Errors: `n` = 0; `k > n`; `alpha` not in (0, 1).
pub fn wilson_interval(k: u64, n: u64, alpha: f64) -> Result<Interval, StatsError> {
    check_proportion(k, n, alpha)?;
    // From the lower tail: `inverse_cdf(1 - alpha/2)` would lose alpha below ~1e-16.
    let z = -Normal::standard().inverse_cdf(alpha / 2.0);
    let (k, n) = (k as f64, n as f64);
    let z2 = z * z;
    let center = (k + z2 / 2.0) / (n + z2);
    let half = z / (n + z2) * (k * (n - k) / n + z2 / 4.0).sqrt();
    Ok(Interval { lower: (center - half).max(0.0), upper: (center + half).min(1.0) })
}

/// Clopper–Pearson exact interval with confidence `1 - alpha`:
/// `lower = Beta(k, n-k+1).q(alpha/2)` (0 when `k = 0`) and
/// `upper = Beta(k+1, n-k).q(1-alpha/2) = 1 - Beta(n-k, k+1).q(alpha/2)` (1 when `k = n`);
/// the second form keeps the digits of a tiny `alpha`. Quantiles come from `statrs`'s
/// `Beta::inverse_cdf` for `alpha/2 >= 1e-15` and from bisection on its `Beta::cdf` below
/// (where its inverse is inaccurate, panics or does not return).
///
/// Errors: `n` = 0 or above [`MAX_BINOMIAL_N`]; `k > n`; `alpha` not in (0, 1).
pub fn clopper_pearson_interval(k: u64, n: u64, alpha: f64) -> Result<Interval, StatsError> {
    check_proportion(k, n, alpha)?;
    max_n(n)?;
    let (kf, nf) = (k as f64, n as f64);
    let q = alpha / 2.0;
    let lower = if k == 0 { 0.0 } else { beta_lower_quantile(kf, nf - kf + 1.0, q)? };
    let upper = if k == n { 1.0 } else { 1.0 - beta_lower_quantile(nf - kf, kf + 1.0, q)? };
    Ok(Interval { lower, upper })
}

/// Below this lower-tail probability `statrs`'s `Beta::inverse_cdf` (AS 64/AS 109) is not
/// trusted: measured, it is accurate to ~6e-15 relative down to 5e-16 for shapes up to
/// 1e6, off by 2e-10 at 5e-21, wrong by orders of magnitude at 5e-31, panics below ~1e-154
/// (`x * x` underflows to 0, giving NaN) and never returns for `Beta(1000, 1)` at 5e-141.
const STATRS_BETA_QUANTILE_MIN: f64 = 1e-15;

/// `x` with `Beta(a, b).cdf(x) = q`, for `0 < q < 1/2`: `statrs`'s `inverse_cdf` where
/// it is reliable, otherwise bisection on `ln x` against `statrs`'s `Beta::cdf` to
/// 1e-15 relative, returning the end with `cdf < q` (the interval is widened, never
/// narrowed).
fn beta_lower_quantile(a: f64, b: f64, q: f64) -> Result<f64, StatsError> {
    let d = Beta::new(a, b).map_err(|_| StatsError::Numerical { context: "Beta::new in clopper_pearson_interval" })?;
    if q >= STATRS_BETA_QUANTILE_MIN {
        return Ok(d.inverse_cdf(q));
    }
    // Down to the smallest subnormal: a quantile below that is reported as 5e-324.
    let (mut lo, mut hi) = ((f64::MIN_POSITIVE * f64::EPSILON).ln(), 0.0f64);
    while hi - lo > 1e-15 {
        let mid = 0.5 * (lo + hi);
        if mid <= lo || mid >= hi {
            break;
        }
        if d.cdf(mid.exp()) < q { lo = mid } else { hi = mid }
    }
    Ok(lo.exp())
}
