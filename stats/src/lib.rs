//! Calibrated statistical tests behind specdec's "lossless" claims: goodness of fit
//! (Pearson chi-squared, G-test) against exact distributions, with small cells
//! pooled deterministically ([`plan_pooling`]), two-sample homogeneity where no
//! exact law exists, exact binomial tests and proportion intervals, Holm's
//! multiplicity correction, and power/sample-size calculations in terms of
//! total-variation distance; each test's result is a serialisable [`TestReport`]
//! (one line when printed), which a sharded run's merge judges again.
//!
//! Invariants: distributions come from `statrs`; p-values come from survival
//! functions, never `1 - cdf`, and are 0 only for outcomes impossible under the
//! null (underflow is floored to `f64::MIN_POSITIVE`, an upper bound, with its
//! log10 kept); impossible outcomes and untestable (degenerate) nulls are reported
//! as such, never pooled away or counted as passes; pooling depends on `n` and the
//! null only, so every test can state its power before it runs (the size and power
//! of the chi-squared test hold by simulation, `tests/simulation.rs`); nothing here
//! retries or resamples; every public function validates its input and returns
//! [`StatsError`] instead of panicking.

mod binomial;
mod distance;
mod error;
mod gof;
mod holm;
mod homogeneity;
mod power;
mod report;
mod tail;
mod validate;

pub use binomial::{Alternative, BINOMIAL_RELATIVE_TOLERANCE, BinomialTestResult, Interval, MAX_BINOMIAL_N, binomial_test, clopper_pearson_interval, wilson_interval};
pub use distance::total_variation;
pub use error::StatsError;
pub use gof::{GofOutcome, GofResult, MIN_EXPECTED_COUNT, Pooling, TestKind, chi_squared_gof, g_test_gof, plan_pooling};
pub use holm::{HolmDecision, holm};
pub use homogeneity::{MIN_COMBINED_COUNT, chi_squared_homogeneity};
pub use power::{MAX_NONCENTRALITY, NONCENTRAL_TRUNCATION, detectable_delta, gof_power, min_samples, noncentral_chi_squared_cdf, noncentral_chi_squared_sf, noncentrality_for_power};
pub use report::{Decision, GofPlan, PowerClaim, TestReport, judge_holm, plan_gof};
pub use tail::{PValue, chi_squared_p_value};
pub use validate::{MAX_DF, PROBABILITY_SUM_TOLERANCE};
