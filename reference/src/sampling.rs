//! The two specified ways to draw a token from non-negative weights
//! (SAMPLE-1 .. SAMPLE-3). Randomness is always an explicit input (CONV-10).

use serde::{Deserialize, Serialize};

use crate::error::{Result, SpecError};
use crate::tensor::Tensor;
use crate::validate;

/// Which draw method consumes the draw noise.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum DrawMethod {
    /// SAMPLE-1: one uniform per draw, inverse CDF over index order.
    #[default]
    InverseCdf,
    /// SAMPLE-2: one Exp(1) value per vocabulary entry per draw; the
    /// exponential race (Gumbel-max) form of seed 001 P2.2 and vLLM.
    ExponentialRace,
}

/// A drawn token and the margin of the decision (SAMPLE-3).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Drawn {
    pub token: usize,
    /// Distance to the nearest boundary that would change the token, in
    /// units of the total weight; `f64::INFINITY` if no noise could change it.
    pub margin: f64,
}

/// Validates a weight row: non-empty, finite, non-negative, positive total.
pub(crate) fn weights(arg: &'static str, prefix: &[usize], w: &[f64]) -> Result<()> {
    if w.is_empty() {
        return Err(SpecError::EmptyVocab { arg });
    }
    let mut total = 0.0;
    for (i, &x) in w.iter().enumerate() {
        let index = || prefix.iter().copied().chain([i]).collect();
        if !x.is_finite() {
            return Err(SpecError::NonFinite { arg, index: index(), value: x });
        }
        if x < 0.0 {
            return Err(SpecError::NegativeProbability { arg, index: index(), value: x });
        }
        total += x;
    }
    if total.is_infinite() {
        // Finite weights whose total overflows: v * S would be NaN or inf.
        return Err(SpecError::NonFinite { arg, index: prefix.to_vec(), value: total });
    }
    if total > 0.0 { Ok(()) } else { Err(SpecError::ZeroMass { arg, row: prefix.to_vec() }) }
}

/// SAMPLE-1, validated: the smallest `i` with `v * S < C_i`, where `S` is the
/// f64 sum of `w` and `C_i` its running sum in index order.
pub fn sample_inverse_cdf(w: &[f64], v: f64) -> Result<Drawn> {
    weights("weights", &[], w)?;
    validate::uniform("v", Vec::new, v)?;
    Ok(inverse_cdf(w, v))
}

/// SAMPLE-2, validated: `argmax_{i : w_i > 0} w_i / e_i`, ties to the lowest id.
pub fn sample_exponential_race(w: &[f64], e: &[f64]) -> Result<Drawn> {
    weights("weights", &[], w)?;
    validate::shape("exponentials", &[e.len()], &[w.len()], "[V]")?;
    for (i, &x) in e.iter().enumerate() {
        if !(validate::MIN_EXPONENTIAL..=validate::MAX_EXPONENTIAL).contains(&x) {
            return Err(SpecError::InvalidNoise { arg: "exponentials", index: vec![i], value: x });
        }
    }
    Ok(exponential_race(w, e))
}

/// SAMPLE-1 on validated input (positive total weight, `v` in [0, 1)).
pub(crate) fn inverse_cdf(w: &[f64], v: f64) -> Drawn {
    let total: f64 = w.iter().sum();
    let target = v * total;
    let mut below = 0.0;
    for (i, &x) in w.iter().enumerate() {
        let above = below + x;
        if target < above {
            return Drawn { token: i, margin: (target - below).min(above - target) / total };
        }
        below = above;
    }
    // `v * S` rounded up to `S`: the last id with positive weight, margin 0.
    let last = w.iter().rposition(|&x| x > 0.0).expect("positive total weight");
    Drawn { token: last, margin: 0.0 }
}

/// SAMPLE-2 on validated input (positive total weight, `e` within `[2^-126, 2^126]`).
pub(crate) fn exponential_race(w: &[f64], e: &[f64]) -> Drawn {
    // w / e overflows for tiny e or huge w; ln w - ln e orders the same
    // ratios and cannot overflow, so it is used when any ratio would.
    let overflow = w.iter().zip(e).any(|(&x, &ei)| x > 0.0 && (x / ei).is_infinite());
    let score = |x: f64, ei: f64| if overflow { x.ln() - ei.ln() } else { x / ei };
    let mut best: Option<(usize, f64)> = None;
    let mut second = f64::NEG_INFINITY;
    for (i, (&x, &ei)) in w.iter().zip(e).enumerate() {
        if x <= 0.0 {
            continue; // zero-weight ids never win, whatever their noise
        }
        let score = score(x, ei);
        match best {
            Some((_, b)) if score <= b => second = second.max(score),
            _ => {
                if let Some((_, b)) = best {
                    second = second.max(b);
                }
                best = Some((i, score));
            }
        }
    }
    let (token, top) = best.expect("positive total weight");
    // The relative gap of the two best ratios, (top - second) / top, in either form.
    let margin = match (second == f64::NEG_INFINITY, overflow) {
        (true, _) => f64::INFINITY,
        (false, false) => (top - second) / top,
        (false, true) => -(second - top).exp_m1(),
    };
    Drawn { token, margin }
}

/// The draw noise of a batch: one draw per verify position (REJECT-3/4).
#[derive(Debug, Clone, PartialEq)]
pub enum DrawNoise {
    /// `[B, k+1]` uniforms in [0, 1) for [`DrawMethod::InverseCdf`].
    InverseCdf(Tensor<f64>),
    /// `[B, k+1, V]` Exp(1) values for [`DrawMethod::ExponentialRace`].
    ExponentialRace(Tensor<f64>),
}

impl DrawNoise {
    pub fn method(&self) -> DrawMethod {
        match self {
            DrawNoise::InverseCdf(_) => DrawMethod::InverseCdf,
            DrawNoise::ExponentialRace(_) => DrawMethod::ExponentialRace,
        }
    }

    pub(crate) fn validate(&self, batch: usize, k: usize, vocab: usize) -> Result<()> {
        match self {
            DrawNoise::InverseCdf(u) => {
                validate::shape("draw_uniforms", u.shape(), &[batch, k + 1], "[B, k+1]")?;
                validate::uniforms("draw_uniforms", u)
            }
            DrawNoise::ExponentialRace(e) => {
                validate::shape("draw_exponentials", e.shape(), &[batch, k + 1, vocab], "[B, k+1, V]")?;
                validate::exponentials("draw_exponentials", e)
            }
        }
    }

    pub(crate) fn draw(&self, w: &[f64], b: usize, row: usize) -> Drawn {
        match self {
            DrawNoise::InverseCdf(u) => inverse_cdf(w, *u.at(&[b, row])),
            DrawNoise::ExponentialRace(e) => exponential_race(w, e.lane_at(&[b, row])),
        }
    }
}

/// SAMPLE-1/2 row by row (the backend `draw` operation): `weights` `[R, V]`
/// with `[R]` uniforms or `[R, V]` exponentials.
pub fn draw_rows(weights: &Tensor<f64>, noise: &DrawNoise) -> Result<Vec<Drawn>> {
    let dims = validate::rank("weights", weights.shape(), 2, "[R, V]")?;
    let (rows, vocab) = (dims[0], dims[1]);
    if rows == 0 {
        return Err(SpecError::EmptyBatch { arg: "weights" });
    }
    if vocab == 0 {
        return Err(SpecError::EmptyVocab { arg: "weights" });
    }
    match noise {
        DrawNoise::InverseCdf(u) => {
            validate::shape("draw_uniforms", u.shape(), &[rows], "[R]")?;
            validate::uniforms("draw_uniforms", u)?;
        }
        DrawNoise::ExponentialRace(e) => {
            validate::shape("draw_exponentials", e.shape(), &[rows, vocab], "[R, V]")?;
            validate::exponentials("draw_exponentials", e)?;
        }
    }
    for r in 0..rows {
        self::weights("weights", &[r], weights.lane_at(&[r]))?;
    }
    Ok((0..rows)
        .map(|r| {
            let w = weights.lane_at(&[r]);
            match noise {
                DrawNoise::InverseCdf(u) => inverse_cdf(w, u.data()[r]),
                DrawNoise::ExponentialRace(e) => exponential_race(w, e.lane_at(&[r])),
            }
        })
        .collect())
}
