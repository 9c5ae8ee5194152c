//! Goodness of fit of observed counts to an exact expected distribution:
//! Pearson's chi-squared and the G-test (likelihood ratio), with deterministic pooling.
//!
//! # Pooling rule
//!
//! The chi-squared approximation to both statistics needs expected counts of at
//! least [`MIN_EXPECTED_COUNT`] (5). Given `n` and the null `p`:
//!
//! 1. Cells with `p_i = 0` are removed from the test. If any of them was observed,
//!    the result is [`GofOutcome::ImpossibleOutcome`] (p-value 0) — never pooled away.
//!    Unobserved ones are "structural zeros" and contribute no degree of freedom.
//! 2. The remaining cells are sorted by expected count `n p_i` ascending, ties by
//!    index ascending (so the rule is deterministic).
//! 3. Cells are moved, in that order, into a single pool while the next cell has
//!    expected count < 5 or the pool (if started) has expected count < 5. Hence every
//!    unpooled cell has expected count >= 5, and the pool, unless it swallowed every
//!    cell, holds at least 2 cells and has expected count >= 5.
//! 4. The test runs on the unpooled cells plus the pool; `df = cells - 1`. If fewer
//!    than 2 cells remain, the result is [`GofOutcome::Degenerate`]: at this `n` the
//!    null cannot be tested.
//!
//! Pooling depends only on `n` and `p`, never on the observed counts, so
//! [`plan_pooling`] can be called — and the power stated — before data are drawn.
//! Differences between cells inside the pool are invisible to the test.

use serde::{Deserialize, Serialize};

use crate::StatsError;
use crate::tail::{PValue, chi_squared_p_value};
use crate::validate;

/// Cells with a smaller expected count are pooled (see the module docs).
pub const MIN_EXPECTED_COUNT: f64 = 5.0;

/// Which test produced a result.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TestKind {
    /// Pearson's chi-squared goodness of fit.
    PearsonChiSquared,
    /// G-test (log-likelihood ratio) goodness of fit.
    GTest,
    /// Pearson's chi-squared test of homogeneity of two samples.
    ChiSquaredHomogeneity,
    /// Exact binomial test, two-sided (minimum-likelihood method).
    BinomialTwoSided,
    /// Exact binomial test, alternative `p < p0`.
    BinomialLess,
    /// Exact binomial test, alternative `p > p0`.
    BinomialGreater,
}

impl TestKind {
    /// Short name for one-line reports.
    pub fn short_name(self) -> &'static str {
        match self {
            TestKind::PearsonChiSquared => "chi2",
            TestKind::GTest => "G",
            TestKind::ChiSquaredHomogeneity => "chi2-2s",
            TestKind::BinomialTwoSided => "binom2",
            TestKind::BinomialLess => "binom<",
            TestKind::BinomialGreater => "binom>",
        }
    }
}

/// How the cells were combined for a given `n` and null distribution.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Pooling {
    /// Cells passed in.
    pub cells: usize,
    /// Indices of cells with null probability 0 (dropped; observed there = impossible).
    pub structural_zeros: Vec<usize>,
    /// Indices merged into the single pool, in merge order (empty: no pool).
    pub pooled: Vec<usize>,
    /// Cells the statistic sums over (the pool counts as one).
    pub cells_after_pooling: usize,
}

impl Pooling {
    /// Degrees of freedom of the test, `None` when degenerate (< 2 cells).
    pub fn df(&self) -> Option<u64> {
        (self.cells_after_pooling >= 2).then(|| self.cells_after_pooling as u64 - 1)
    }
}

/// What a goodness-of-fit test concluded.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "outcome", rename_all = "snake_case")]
pub enum GofOutcome {
    /// The statistic was computed and referred to chi-squared(df).
    Tested { statistic: f64, df: u64, p_value: PValue },
    /// Counts fell in cells whose null probability is 0: p-value exactly 0.
    ImpossibleOutcome { cells: Vec<usize> },
    /// Fewer than 2 cells after pooling: no test is possible at this `n`.
    Degenerate,
}

/// Result of [`chi_squared_gof`] or [`g_test_gof`].
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct GofResult {
    pub kind: TestKind,
    /// Total observed count.
    pub n: u64,
    pub pooling: Pooling,
    pub outcome: GofOutcome,
}

impl GofResult {
    /// The p-value: `Some(0.0)` for an impossible outcome, `None` when degenerate.
    pub fn p_value(&self) -> Option<f64> {
        match &self.outcome {
            GofOutcome::Tested { p_value, .. } => Some(p_value.value),
            GofOutcome::ImpossibleOutcome { .. } => Some(0.0),
            GofOutcome::Degenerate => None,
        }
    }
}

/// Applies the pooling rule (module docs) for `n` draws from the null `expected`,
/// without looking at any data.
///
/// Errors: `n` = 0; `expected` empty, non-finite, negative, or not summing to 1
/// within [`crate::PROBABILITY_SUM_TOLERANCE`].
pub fn plan_pooling(n: u64, expected: &[f64]) -> Result<Pooling, StatsError> {
    validate::positive_n("n", n)?;
    let sum = validate::probabilities("expected", expected)?;
    Ok(plan(n, expected, sum).0)
}

/// Pooling plus the expected counts it was computed from (renormalised so they sum to `n`).
fn plan(n: u64, expected: &[f64], sum: f64) -> (Pooling, Vec<f64>) {
    let e: Vec<f64> = expected.iter().map(|&p| n as f64 * p / sum).collect();
    let structural_zeros: Vec<usize> = (0..e.len()).filter(|&i| expected[i] == 0.0).collect();
    let mut order: Vec<usize> = (0..e.len()).filter(|&i| expected[i] > 0.0).collect();
    order.sort_by(|&a, &b| e[a].total_cmp(&e[b]).then(a.cmp(&b)));

    let mut pooled = Vec::new();
    let mut pool_e = 0.0;
    for &i in &order {
        let pool_short = !pooled.is_empty() && pool_e < MIN_EXPECTED_COUNT;
        if e[i] < MIN_EXPECTED_COUNT || pool_short {
            pooled.push(i);
            pool_e += e[i];
        } else {
            break;
        }
    }
    let cells_after_pooling = order.len() - pooled.len() + usize::from(!pooled.is_empty());
    let pooling = Pooling { cells: expected.len(), structural_zeros, pooled, cells_after_pooling };
    (pooling, e)
}

/// Pearson's chi-squared goodness-of-fit test of `observed` counts against the exact
/// null probabilities `expected`, with the pooling rule of the module docs.
///
/// Errors: either slice empty; lengths differ; `expected` non-finite, negative, or
/// not summing to 1 within [`crate::PROBABILITY_SUM_TOLERANCE`]; counts sum to 0 or
/// overflow `u64`; more than [`crate::MAX_DF`]` + 1` cells after pooling.
pub fn chi_squared_gof(observed: &[u64], expected: &[f64]) -> Result<GofResult, StatsError> {
    gof(TestKind::PearsonChiSquared, observed, expected)
}

/// G-test (likelihood ratio, `G = 2 Σ o ln(o/e)`) goodness of fit; same inputs,
/// pooling and errors as [`chi_squared_gof`].
pub fn g_test_gof(observed: &[u64], expected: &[f64]) -> Result<GofResult, StatsError> {
    gof(TestKind::GTest, observed, expected)
}

fn gof(kind: TestKind, observed: &[u64], expected: &[f64]) -> Result<GofResult, StatsError> {
    let n = validate::counts("observed", observed)?;
    let sum = validate::probabilities("expected", expected)?;
    validate::same_len("observed", observed.len(), "expected", expected.len())?;

    let (pooling, e) = plan(n, expected, sum);
    let impossible: Vec<usize> = pooling.structural_zeros.iter().copied().filter(|&i| observed[i] > 0).collect();
    let outcome = if !impossible.is_empty() {
        GofOutcome::ImpossibleOutcome { cells: impossible }
    } else if let Some(df) = pooling.df() {
        // (observed, expected) per tested cell: the pool first, then unpooled cells.
        let mut in_pool = vec![false; expected.len()];
        pooling.pooled.iter().for_each(|&i| in_pool[i] = true);
        let pool = pooling.pooled.iter().fold((0.0, 0.0), |(o, x), &i| (o + observed[i] as f64, x + e[i]));
        let cells = (!pooling.pooled.is_empty()).then_some(pool).into_iter().chain((0..expected.len()).filter(|&i| expected[i] > 0.0 && !in_pool[i]).map(|i| (observed[i] as f64, e[i])));
        let statistic = match kind {
            TestKind::GTest => {
                let g: f64 = cells.filter(|&(o, _)| o > 0.0).map(|(o, x)| o * (o / x).ln()).sum();
                // Rounding can make a perfect fit slightly negative.
                (2.0 * g).max(0.0)
            }
            _ => cells.map(|(o, x)| (o - x) * (o - x) / x).sum(),
        };
        let p_value = chi_squared_p_value(statistic, df)?;
        GofOutcome::Tested { statistic, df, p_value }
    } else {
        GofOutcome::Degenerate
    };
    Ok(GofResult { kind, n, pooling, outcome })
}
