//! Two-sample chi-squared test of homogeneity: do two samples of counts
//! over the same cells come from one law? For laws that cannot be
//! enumerated (a real model's whole generations), where no exact expected
//! distribution exists to test against.
//!
//! # Pooling rule
//!
//! Expected counts under the null are `n_side × combined_i / n_total`. Cells
//! are sorted by their combined count ascending (ties by index) and moved
//! into one pool while the next cell's combined count is below
//! [`MIN_COMBINED_COUNT`] or the pool's is. The rule reads the combined
//! counts only, which under the null carry no information about which
//! sample a draw came from, so the test stays conditionally valid.
//!
//! # Power
//!
//! With `n` draws per sample, the noncentrality of the statistic against
//! two laws at total-variation distance `δ` is at least `2 n δ²` (half a
//! goodness-of-fit test's `4 n δ²` on `n` draws, by Cauchy–Schwarz on the
//! mixture), so the detectable distance is the goodness-of-fit one at `n / 2`
//! draws over the same cells ([`TestReport::with_power_at`]).

use crate::StatsError;
use crate::gof::TestKind;
use crate::report::{Decision, TestReport};
use crate::tail::chi_squared_p_value;
use crate::validate;

/// Cells whose combined count is below this are pooled (5 expected per sample of equal size).
pub const MIN_COMBINED_COUNT: u64 = 10;

/// Pearson's chi-squared test that `a` and `b` (counts over the same cells)
/// come from one law, as a report (decision pending; degenerate when fewer
/// than two cells remain after pooling).
///
/// Errors: either slice empty; lengths differ; either sample sums to 0 or overflows.
pub fn chi_squared_homogeneity(label: impl Into<String>, a: &[u64], b: &[u64]) -> Result<TestReport, StatsError> {
    let na = validate::counts("a", a)?;
    let nb = validate::counts("b", b)?;
    validate::same_len("a", a.len(), "b", b.len())?;
    let n = na.checked_add(nb).ok_or(StatsError::CountOverflow { arg: "a + b" })?;
    let combined: Vec<u64> = a.iter().zip(b).map(|(x, y)| x + y).collect();
    let mut order: Vec<usize> = (0..a.len()).filter(|&i| combined[i] > 0).collect();
    order.sort_by_key(|&i| (combined[i], i));
    // (a, b, combined) per tested cell: the pool, then the unpooled cells.
    let mut pool = (0u64, 0u64, 0u64);
    let mut pooled = 0;
    let mut cells = Vec::new();
    for &i in &order {
        if combined[i] < MIN_COMBINED_COUNT || (pooled > 0 && pool.2 < MIN_COMBINED_COUNT) {
            pool = (pool.0 + a[i], pool.1 + b[i], pool.2 + combined[i]);
            pooled += 1;
        } else {
            cells.push((a[i], b[i], combined[i]));
        }
    }
    if pooled > 0 {
        cells.push(pool);
    }
    let df = cells.len() as u64 - 1;
    let mut report = TestReport {
        label: label.into(),
        kind: TestKind::ChiSquaredHomogeneity,
        n,
        cells: cells.len(),
        cells_pooled: pooled,
        statistic: None,
        df: None,
        p_value: None,
        log10_p_value: None,
        p_value_floored: false,
        impossible_outcome: false,
        alpha: None,
        power: None,
        decision: Decision::Degenerate,
    };
    if cells.len() < 2 {
        return Ok(report);
    }
    let (fa, fb) = (na as f64 / n as f64, nb as f64 / n as f64);
    let statistic: f64 = cells
        .iter()
        .map(|&(x, y, c)| {
            let (ea, eb) = (c as f64 * fa, c as f64 * fb);
            (x as f64 - ea).powi(2) / ea + (y as f64 - eb).powi(2) / eb
        })
        .sum();
    let p = chi_squared_p_value(statistic, df)?;
    report.statistic = Some(statistic);
    report.df = Some(df);
    report.p_value = Some(p.value);
    report.log10_p_value = Some(p.log10);
    report.p_value_floored = p.floored;
    report.decision = Decision::Pending;
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn equal_samples_fit_and_different_ones_do_not() {
        let same = chi_squared_homogeneity("same", &[100, 200, 300], &[100, 200, 300]).unwrap();
        assert_eq!(same.statistic, Some(0.0));
        assert_eq!(same.df, Some(2));
        let apart = chi_squared_homogeneity("apart", &[300, 200, 100], &[100, 200, 300]).unwrap();
        // Worked by hand: each outer cell (300 vs 100, expected 200 each) gives 2 x 100^2/200 = 100.
        assert!((apart.statistic.unwrap() - 200.0).abs() < 1e-9);
        assert!(apart.p_value.unwrap() < 1e-40);
    }

    #[test]
    fn sparse_cells_pool_and_a_single_cell_is_degenerate() {
        let r = chi_squared_homogeneity("pooled", &[50, 2, 3, 1, 0], &[50, 3, 2, 2, 0]).unwrap();
        assert_eq!((r.cells, r.cells_pooled), (2, 3), "the three sparse cells form one pool");
        let d = chi_squared_homogeneity("one", &[7, 0], &[9, 0]).unwrap();
        assert_eq!(d.decision, Decision::Degenerate);
        assert!(chi_squared_homogeneity("bad", &[1], &[1, 2]).is_err());
        assert!(chi_squared_homogeneity("empty", &[0, 0], &[1, 2]).is_err());
    }
}
