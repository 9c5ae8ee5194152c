//! DFlash block drafting pieces (DRAFT-1 .. DRAFT-5): the block input, the
//! mask-ratio schedules, the unmask order, and confidence-based selection.

use serde::{Deserialize, Serialize};

use crate::error::{Result, SpecError};
use crate::tensor::Tensor;
use crate::validate;

/// DRAFT-1: one row per sequence: the verified token, then `block - 1` mask ids.
///
/// `mask_id` may lie outside the target vocabulary (seed 002 maps its mask to
/// the extra embedding row `vocab`), so it is checked against `embed_rows`.
pub fn block_input(verified: &[i64], block: usize, mask_id: i64, vocab: usize, embed_rows: usize) -> Result<Tensor<i64>> {
    if verified.is_empty() {
        return Err(SpecError::EmptyBatch { arg: "verified" });
    }
    if block < 2 {
        return Err(SpecError::param("block", block, "must be >= 2 (the verified token and at least one draft)"));
    }
    if embed_rows < vocab {
        return Err(SpecError::param("embed_rows", embed_rows, "must be >= vocab"));
    }
    for (b, &t) in verified.iter().enumerate() {
        validate::token("verified", || vec![b], t, vocab)?;
    }
    validate::token("mask_id", Vec::new, mask_id, embed_rows)?;
    let mut data = Vec::with_capacity(verified.len() * block);
    for &t in verified {
        data.push(t);
        data.extend(std::iter::repeat_n(mask_id, block - 1));
    }
    Tensor::new(vec![verified.len(), block], data)
}

/// DRAFT-2: the fraction of positions still masked at time `t` in [0, 1].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Schedule {
    /// `cos(pi t / 2)`: concave, unmasks few positions first (MaskGIT).
    Cosine,
    /// `1 - t`.
    Linear,
    /// `1 - sqrt(t)`: convex, unmasks many positions first (MaskGIT).
    Sqrt,
}

impl Schedule {
    /// The mask ratio at `t` in [0, 1]; exactly 1 at `t = 0` and 0 at `t = 1`.
    pub fn mask_ratio(self, t: f64) -> Result<f64> {
        if !(0.0..=1.0).contains(&t) {
            return Err(SpecError::param("t", t, "must be in [0, 1]"));
        }
        Ok(self.ratio(t))
    }

    fn ratio(self, t: f64) -> f64 {
        match self {
            Schedule::Cosine if t == 1.0 => 0.0, // cos(pi/2) is 6e-17 in f64
            Schedule::Cosine => (std::f64::consts::FRAC_PI_2 * t).cos(),
            Schedule::Linear => 1.0 - t,
            Schedule::Sqrt => 1.0 - t.sqrt(),
        }
    }
}

/// DRAFT-3: how many positions to unmask at each of `steps` steps, summing
/// to `positions`: `m_s = round_half_even(positions * ratio(s / steps))`
/// masked after step `s`, and step `s` unmasks `m_{s-1} - m_s`.
pub fn unmask_order(positions: usize, steps: usize, schedule: Schedule) -> Result<Vec<usize>> {
    if positions == 0 {
        return Err(SpecError::param("positions", positions, "must be >= 1"));
    }
    if steps == 0 {
        return Err(SpecError::param("steps", steps, "must be >= 1"));
    }
    let masked: Vec<usize> = (0..=steps)
        .map(|s| {
            let ratio = schedule.ratio(s as f64 / steps as f64);
            (positions as f64 * ratio).round_ties_even() as usize
        })
        .collect();
    // The schedules are non-increasing, so each difference is >= 0, and the
    // sum telescopes to m_0 - m_T = positions - 0.
    Ok(masked.windows(2).map(|w| w[0] - w[1]).collect())
}

/// DRAFT-4: the `count` still-masked positions with the highest confidence,
/// ties to the lower position, in selection order.
pub fn select_unmask(confidence: &[f64], masked: &[bool], count: usize) -> Result<Vec<usize>> {
    validate::shape("masked", &[masked.len()], &[confidence.len()], "[N]")?;
    for (i, &c) in confidence.iter().enumerate() {
        if c.is_nan() || c == f64::INFINITY {
            return Err(SpecError::NonFinite { arg: "confidence", index: vec![i], value: c });
        }
    }
    let available = masked.iter().filter(|&&m| m).count();
    if count > available {
        return Err(SpecError::param("count", count, "exceeds the number of masked positions"));
    }
    let mut order: Vec<usize> = (0..confidence.len()).filter(|&i| masked[i]).collect();
    order.sort_by(|&a, &b| confidence[b].total_cmp(&confidence[a]).then(a.cmp(&b)));
    order.truncate(count);
    Ok(order)
}
