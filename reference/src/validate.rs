//! Input validation shared by every reference function (CONV-1 .. CONV-7).
//!
//! Validation always completes before any computation or mutation starts, so
//! an `Err` never leaves partial results behind.

use crate::PAD;
use crate::error::{Result, SpecError};
use crate::tensor::{Tensor, unravel};

/// Absolute tolerance on the sum of a probability row (CONV-2).
///
/// Loose enough for f32 softmax output over a 150k vocabulary, tight enough
/// to catch rows that were never normalised. Rows are used as given, never
/// renormalised: samplers divide by the actual row sum.
pub const SUM_TOLERANCE: f64 = 1e-4;

/// CONV-4: checks that `actual` equals `expected`; `names` spells the symbolic shape
/// (e.g. `"[B, k+1, V]"`) for the error message.
pub(crate) fn shape(arg: &'static str, actual: &[usize], expected: &[usize], names: &str) -> Result<()> {
    if actual == expected { Ok(()) } else { Err(SpecError::ShapeMismatch { arg, expected: format!("{names} = {expected:?}"), actual: actual.to_vec() }) }
}

/// Checks only the rank; returns the dims.
pub(crate) fn rank<'a>(arg: &'static str, actual: &'a [usize], rank: usize, names: &str) -> Result<&'a [usize]> {
    if actual.len() == rank { Ok(actual) } else { Err(SpecError::ShapeMismatch { arg, expected: format!("{names} (rank {rank})"), actual: actual.to_vec() }) }
}

/// Validates one probability row: finite, non-negative, sums to 1 (CONV-2).
pub(crate) fn prob_row(arg: &'static str, prefix: &[usize], row: &[f64]) -> Result<()> {
    let mut sum = 0.0;
    for (i, &x) in row.iter().enumerate() {
        if !x.is_finite() {
            return Err(SpecError::NonFinite { arg, index: with(prefix, i), value: x });
        }
        if x < 0.0 {
            return Err(SpecError::NegativeProbability { arg, index: with(prefix, i), value: x });
        }
        sum += x;
    }
    if (sum - 1.0).abs() > SUM_TOLERANCE {
        return Err(SpecError::NotNormalized { arg, row: prefix.to_vec(), sum, tolerance: SUM_TOLERANCE });
    }
    Ok(())
}

/// Validates a whole probability tensor, every last-axis lane being a row.
pub(crate) fn prob_rows(arg: &'static str, t: &Tensor<f64>) -> Result<()> {
    let Some((&v, lead)) = t.shape().split_last() else {
        return Err(SpecError::ShapeMismatch { arg, expected: "at least one axis".into(), actual: vec![] });
    };
    if v == 0 {
        return Err(SpecError::EmptyVocab { arg });
    }
    for (r, row) in t.data().chunks(v).enumerate() {
        prob_row(arg, &unravel(lead, r), row)?;
    }
    Ok(())
}

/// Validates a score (logit) row: no NaN, no +inf, not entirely -inf (CONV-8).
pub(crate) fn score_row(arg: &'static str, prefix: &[usize], row: &[f64]) -> Result<()> {
    let mut any_finite = false;
    for (i, &x) in row.iter().enumerate() {
        if x.is_nan() || x == f64::INFINITY {
            return Err(SpecError::NonFinite { arg, index: with(prefix, i), value: x });
        }
        any_finite |= x.is_finite();
    }
    if !any_finite {
        return Err(SpecError::AllMasked { arg, index: prefix.to_vec() });
    }
    Ok(())
}

/// Validates every value of a uniform-noise tensor: in [0, 1) (CONV-3).
pub(crate) fn uniforms(arg: &'static str, t: &Tensor<f64>) -> Result<()> {
    for (i, &u) in t.data().iter().enumerate() {
        uniform(arg, || unravel(t.shape(), i), u)?;
    }
    Ok(())
}

pub(crate) fn uniform(arg: &'static str, index: impl FnOnce() -> Vec<usize>, u: f64) -> Result<()> {
    // `!(0 <= u < 1)` also rejects NaN.
    if (0.0..1.0).contains(&u) { Ok(()) } else { Err(SpecError::UniformOutOfRange { arg, index: index(), value: u }) }
}

/// The smallest exponential race noise value SAMPLE-2 admits: 2^-126, the
/// smallest binary32 normal, so an f32 port never flushes a value to zero
/// (or to a subnormal with fewer bits) and turns a strict order into a tie.
pub const MIN_EXPONENTIAL: f64 = f32::MIN_POSITIVE as f64;
/// The largest: 2^126, so `1 / e` and `e` itself stay binary32 normals.
pub const MAX_EXPONENTIAL: f64 = 8.507059173023462e37;

/// Validates exponential race noise: within `[2^-126, 2^126]` (SAMPLE-2).
pub(crate) fn exponentials(arg: &'static str, t: &Tensor<f64>) -> Result<()> {
    for (i, &e) in t.data().iter().enumerate() {
        if !(MIN_EXPONENTIAL..=MAX_EXPONENTIAL).contains(&e) {
            return Err(SpecError::InvalidNoise { arg, index: unravel(t.shape(), i), value: e });
        }
    }
    Ok(())
}

/// Validates a token id against the vocabulary (CONV-1).
pub(crate) fn token(arg: &'static str, index: impl FnOnce() -> Vec<usize>, t: i64, vocab: usize) -> Result<usize> {
    if t >= 0 && (t as u64) < vocab as u64 { Ok(t as usize) } else { Err(SpecError::TokenOutOfRange { arg, index: index(), token: t, vocab }) }
}

/// The layout of a padded draft batch, validated (CONV-5).
pub(crate) struct DraftLayout {
    pub batch: usize,
    pub k: usize,
    pub lens: Vec<usize>,
}

/// CONV-5/CONV-6: validates `draft_tokens` `[B, k]` against `proposal_lens` `[B]`: `B >= 1`,
/// `k >= 1`, every length in `[0, k]`, ids valid below the length, PAD after.
pub(crate) fn draft_layout(draft: &Tensor<i64>, lens: &Tensor<i64>, vocab: usize) -> Result<DraftLayout> {
    let dims = rank("draft_tokens", draft.shape(), 2, "[B, k]")?;
    let (batch, k) = (dims[0], dims[1]);
    if batch == 0 {
        return Err(SpecError::EmptyBatch { arg: "draft_tokens" });
    }
    if k == 0 {
        return Err(SpecError::EmptyDraft { arg: "draft_tokens" });
    }
    shape("proposal_lens", lens.shape(), &[batch], "[B]")?;
    let mut out = Vec::with_capacity(batch);
    for (b, &len) in lens.data().iter().enumerate() {
        if len < 0 || len as u64 > k as u64 {
            return Err(SpecError::LengthOutOfRange { arg: "proposal_lens", seq: b, len, max: k });
        }
        let len = len as usize;
        let row = draft.lane_at(&[b]);
        for (j, &t) in row.iter().enumerate() {
            if j < len {
                token("draft_tokens", || vec![b, j], t, vocab)?;
            } else if t != PAD {
                return Err(SpecError::PaddingMismatch { arg: "draft_tokens", index: vec![b, j], token: t, expected: "PAD (-1) beyond the proposal length" });
            }
        }
        out.push(len);
    }
    Ok(DraftLayout { batch, k, lens: out })
}

/// A verify batch (CONV-4, CONV-5, CONV-7): `target` `[B, k+1, V]` against
/// the padded drafts, and every target row a sequence reads (rows
/// `0..=len_b`) checked with `row`. Returns the layout and `V`.
pub(crate) fn verify_batch(arg: &'static str, target: &Tensor<f64>, draft: &Tensor<i64>, lens: &Tensor<i64>, row: fn(&'static str, &[usize], &[f64]) -> Result<()>) -> Result<(DraftLayout, usize)> {
    let vocab = *rank(arg, target.shape(), 3, "[B, k+1, V]")?.last().unwrap_or(&0);
    if vocab == 0 {
        return Err(SpecError::EmptyVocab { arg });
    }
    let layout = draft_layout(draft, lens, vocab)?;
    shape(arg, target.shape(), &[layout.batch, layout.k + 1, vocab], "[B, k+1, V]")?;
    for (b, &len) in layout.lens.iter().enumerate() {
        for j in 0..=len {
            row(arg, &[b, j], target.lane_at(&[b, j]))?;
        }
    }
    Ok((layout, vocab))
}

fn with(prefix: &[usize], i: usize) -> Vec<usize> {
    let mut v = prefix.to_vec();
    v.push(i);
    v
}
