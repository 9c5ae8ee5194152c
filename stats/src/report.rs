//! A uniform, serialisable record of one test: what was tested, how strongly it could
//! detect a departure (stated from `n` alone), what it found and how it was judged.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::StatsError;
use crate::binomial::BinomialTestResult;
use crate::gof::{GofOutcome, GofResult, Pooling, TestKind, plan_pooling};
use crate::holm::holm;
use crate::power::detectable_delta;
use crate::validate;

/// The power statement attached to a test: at level `alpha`, every alternative at
/// TV distance `>= detectable_delta` is detected with probability `>= 1 - beta`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct PowerClaim {
    pub alpha: f64,
    pub beta: f64,
    pub detectable_delta: f64,
}

/// Verdict of a test.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Decision {
    /// Not yet compared with an alpha.
    Pending,
    /// Null rejected (including impossible outcomes).
    Reject,
    NotRejected,
    /// No test was possible (fewer than 2 cells after pooling); never counts as a pass.
    Degenerate,
}

/// One test's result, ready to serialise, read back (a sharded run's reports are
/// judged again at their merge) or print (`Display` gives one line).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TestReport {
    /// Caller-chosen name of the check.
    pub label: String,
    pub kind: TestKind,
    pub n: u64,
    /// Cells the test ran on, after pooling (2 for binomial tests).
    pub cells: usize,
    /// Original cells merged into the pool (0: no pooling).
    pub cells_pooled: usize,
    /// Pearson's X² or G; for binomial tests, the success count `k`.
    pub statistic: Option<f64>,
    pub df: Option<u64>,
    /// `None` only when degenerate; `0` only for an impossible outcome.
    pub p_value: Option<f64>,
    /// `None` when degenerate or impossible; an upper bound when `p_value_floored`.
    pub log10_p_value: Option<f64>,
    /// The true p-value underflowed `f64`; `p_value` is `f64::MIN_POSITIVE`, an upper bound.
    pub p_value_floored: bool,
    pub impossible_outcome: bool,
    /// The per-test alpha it was judged against (set by [`TestReport::judge`] or [`judge_holm`]).
    pub alpha: Option<f64>,
    /// Detectable TV distance at this `n` (set by [`TestReport::with_power`]).
    pub power: Option<PowerClaim>,
    pub decision: Decision,
}

impl GofResult {
    /// The report for this result, with decision [`Decision::Pending`] unless degenerate.
    pub fn to_report(&self, label: impl Into<String>) -> TestReport {
        let (statistic, df, p, impossible) = match &self.outcome {
            GofOutcome::Tested { statistic, df, p_value } => (Some(*statistic), Some(*df), Some(*p_value), false),
            GofOutcome::ImpossibleOutcome { .. } => (None, None, None, true),
            GofOutcome::Degenerate => (None, None, None, false),
        };
        let degenerate = matches!(self.outcome, GofOutcome::Degenerate);
        TestReport {
            label: label.into(),
            kind: self.kind,
            n: self.n,
            cells: self.pooling.cells_after_pooling,
            cells_pooled: self.pooling.pooled.len(),
            statistic,
            df,
            p_value: self.p_value(),
            log10_p_value: p.map(|p| p.log10),
            p_value_floored: p.is_some_and(|p| p.floored),
            impossible_outcome: impossible,
            alpha: None,
            power: None,
            decision: if degenerate { Decision::Degenerate } else { Decision::Pending },
        }
    }
}

impl BinomialTestResult {
    /// The report for this result, with decision [`Decision::Pending`].
    pub fn to_report(&self, label: impl Into<String>) -> TestReport {
        TestReport {
            label: label.into(),
            kind: self.kind(),
            n: self.n,
            cells: 2,
            cells_pooled: 0,
            statistic: Some(self.k as f64),
            df: None,
            p_value: Some(self.p_value.value),
            log10_p_value: (!self.impossible_outcome).then_some(self.p_value.log10),
            p_value_floored: self.p_value.floored,
            impossible_outcome: self.impossible_outcome,
            alpha: None,
            power: None,
            decision: Decision::Pending,
        }
    }
}

impl TestReport {
    /// Attaches the detectable TV distance for this report's `n` and cell count at
    /// level `alpha` and power `1 - beta` (left `None` when degenerate). Inside a Holm
    /// family of `m` tests pass `alpha = family_alpha / m`: Holm rejects whenever that
    /// Bonferroni level would, so the claim holds whatever the test's rank.
    ///
    /// Errors: `alpha`, `beta` not in (0, 1); `alpha + beta >= 1`.
    pub fn with_power(mut self, alpha: f64, beta: f64) -> Result<TestReport, StatsError> {
        self.power = power_claim(self.cells, self.n, alpha, beta)?;
        Ok(self)
    }

    /// [`TestReport::with_power`] for a test whose power is that of a
    /// goodness-of-fit test on `n_equivalent` draws over its cells (a
    /// two-sample test on `n` draws per sample has that of `n / 2`).
    pub fn with_power_at(mut self, n_equivalent: u64, alpha: f64, beta: f64) -> Result<TestReport, StatsError> {
        self.power = power_claim(self.cells, n_equivalent, alpha, beta)?;
        Ok(self)
    }

    /// Judges this test alone at level `alpha`.
    ///
    /// Errors: `alpha` not in (0, 1).
    pub fn judge(&mut self, alpha: f64) -> Result<(), StatsError> {
        validate::open_unit("alpha", alpha)?;
        self.alpha = Some(alpha);
        self.decision = match self.p_value {
            None => Decision::Degenerate,
            Some(p) if p <= alpha => Decision::Reject,
            Some(_) => Decision::NotRejected,
        };
        Ok(())
    }
}

fn power_claim(cells: usize, n: u64, alpha: f64, beta: f64) -> Result<Option<PowerClaim>, StatsError> {
    // Validate even when degenerate, so bad levels never pass silently.
    validate::open_unit("alpha", alpha)?;
    validate::open_unit("beta", beta)?;
    if cells < 2 {
        return Ok(None);
    }
    let detectable_delta = detectable_delta(cells, n, alpha, beta)?;
    Ok(Some(PowerClaim { alpha, beta, detectable_delta }))
}

/// Judges a family of reports with Holm's step-down procedure at family-wise level
/// `family_alpha`, filling each report's `alpha` (its Holm threshold) and `decision`.
/// Degenerate reports rank last, as p = 1 (they still count in the family size), and
/// stay [`Decision::Degenerate`].
///
/// Errors: `reports` empty; `family_alpha` not in (0, 1); a stored p-value outside [0, 1].
pub fn judge_holm(reports: &mut [TestReport], family_alpha: f64) -> Result<(), StatsError> {
    if reports.is_empty() {
        return Err(StatsError::Empty { arg: "reports" });
    }
    // Tested reports first, degenerate ones after: holm breaks ties by position, so a
    // degenerate report (ranked as p = 1) never takes a rank from a real p = 1.
    let mut order: Vec<usize> = (0..reports.len()).collect();
    order.sort_by_key(|&i| reports[i].p_value.is_none());
    let p: Vec<f64> = order.iter().map(|&i| reports[i].p_value.unwrap_or(1.0)).collect();
    let decisions = holm(&p, family_alpha)?;
    for (&i, d) in order.iter().zip(decisions) {
        let r = &mut reports[i];
        r.alpha = Some(d.alpha);
        r.decision = match (r.p_value, d.rejected) {
            (None, _) => Decision::Degenerate,
            (Some(_), true) => Decision::Reject,
            (Some(_), false) => Decision::NotRejected,
        };
    }
    Ok(())
}

/// What a goodness-of-fit test at `n` will be able to see, computed before sampling.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct GofPlan {
    pub n: u64,
    pub pooling: Pooling,
    /// `None` when the test would be degenerate at this `n`.
    pub power: Option<PowerClaim>,
}

/// Plans a GOF test of `n` draws against `expected`: the pooling it will use and the
/// TV distance it is guaranteed (approximately) to detect at `alpha` with power `1 - beta`.
///
/// Errors: as [`plan_pooling`] and [`TestReport::with_power`].
pub fn plan_gof(n: u64, expected: &[f64], alpha: f64, beta: f64) -> Result<GofPlan, StatsError> {
    let pooling = plan_pooling(n, expected)?;
    let power = power_claim(pooling.cells_after_pooling, n, alpha, beta)?;
    Ok(GofPlan { n, pooling, power })
}

impl fmt::Display for TestReport {
    /// One line, e.g.
    /// `good [chi2] n=100 cells=4 (2 pooled) stat=1.2000 df=3 p=7.530e-1 alpha=5.00e-2 TV>=0.1874@0.80 -> not rejected`
    /// (`TV>=d@0.80`: any departure of TV distance `d` is caught with probability 0.80).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} [{}] n={} cells={}", self.label, self.kind.short_name(), self.n, self.cells)?;
        if self.cells_pooled > 0 {
            write!(f, " ({} pooled)", self.cells_pooled)?;
        }
        match (self.statistic, self.df) {
            // Binomial tests: the statistic is the success count.
            (Some(k), None) => write!(f, " k={k}")?,
            (Some(s), _) => write!(f, " stat={s:.4}")?,
            (None, _) => {}
        }
        if let Some(df) = self.df {
            write!(f, " df={df}")?;
        }
        match (self.p_value, self.impossible_outcome) {
            (_, true) => write!(f, " p=0 (impossible outcome)")?,
            (None, _) => write!(f, " p=n/a")?,
            (Some(_), false) if self.p_value_floored => write!(f, " p<{:.1e} (log10 p<={:.1})", f64::MIN_POSITIVE, self.log10_p_value.unwrap_or(f64::NAN))?,
            (Some(p), false) => write!(f, " p={p:.3e}")?,
        }
        if let Some(a) = self.alpha {
            write!(f, " alpha={a:.2e}")?;
        }
        if let Some(pw) = self.power {
            write!(f, " TV>={:.4}@{:.2}", pw.detectable_delta, 1.0 - pw.beta)?;
        }
        let verdict = match self.decision {
            Decision::Pending => "pending",
            Decision::Reject => "REJECTED",
            Decision::NotRejected => "not rejected",
            Decision::Degenerate => "DEGENERATE (<2 cells after pooling; not tested)",
        };
        write!(f, " -> {verdict}")
    }
}
