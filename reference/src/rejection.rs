//! Rejection sampling verification (Leviathan et al.), RESID-1 .. RESID-3
//! and REJECT-1 .. REJECT-5.

use crate::accept::{Comparator, accept_test};
use crate::error::{Result, SpecError};
use crate::greedy::VerifyOutput;
use crate::sampling::{DrawNoise, Drawn};
use crate::tensor::Tensor;
use crate::validate;

/// Everything one rejection-sampling verification reads (REJECT-1).
#[derive(Debug, Clone, Copy)]
pub struct RejectionInputs<'a> {
    /// `[B, k+1, V]`: target distributions; row `j` is the law of the token
    /// after the first `j` drafts. Rows beyond `proposal_lens[b]` are padding.
    pub target_probs: &'a Tensor<f64>,
    /// `[B, k, V]`: the distributions the drafts were sampled from, or `None`
    /// for drafts without probabilities (n-gram, greedy drafter): then `q` is
    /// one-hot at the drafted token (RESID-2).
    pub draft_probs: Option<&'a Tensor<f64>>,
    /// `[B, k]`, PAD beyond each proposal length.
    pub draft_tokens: &'a Tensor<i64>,
    /// `[B]`, each in `[0, k]`.
    pub proposal_lens: &'a Tensor<i64>,
    /// `[B, k]`: the accept uniforms, in [0, 1).
    pub accept_uniforms: &'a Tensor<f64>,
    /// Noise for the correction or bonus draw.
    pub draw: &'a DrawNoise,
}

/// A residual row ready for drawing (RESID-1 .. RESID-3).
#[derive(Debug, Clone, PartialEq)]
pub struct Residual {
    /// Unnormalised weights `max(0, p - q)`, or `p` itself when they are all 0.
    pub weights: Vec<f64>,
    /// The residual mass `R = sum max(0, p - q)` before any fallback.
    pub mass: f64,
}

impl Residual {
    /// RESID-1/2/3 for one position. `q = None` means one-hot at `drafted`.
    pub(crate) fn new(p: &[f64], q: Option<&[f64]>, drafted: usize) -> Residual {
        let weights: Vec<f64> = match q {
            Some(q) => p.iter().zip(q).map(|(&p, &q)| (p - q).max(0.0)).collect(),
            None => p.iter().enumerate().map(|(i, &p)| if i == drafted { 0.0 } else { p }).collect(),
        };
        let mass: f64 = weights.iter().sum();
        if mass > 0.0 {
            Residual { weights, mass }
        } else {
            // RESID-3: a rejection with zero residual mass has probability 0 in
            // exact arithmetic; drawing from p keeps the output a valid token.
            Residual { weights: p.to_vec(), mass }
        }
    }
}

/// The residual as a normalised distribution, row by row (the backend `residual` op).
///
/// * `target_probs`, `draft_probs`: `[R, V]`; with `draft_probs = None`,
///   `drafted` `[R]` gives the one-hot draft of each row (RESID-2).
pub fn residual_distribution(target_probs: &Tensor<f64>, draft_probs: Option<&Tensor<f64>>, drafted: &Tensor<i64>) -> Result<Tensor<f64>> {
    let dims = validate::rank("target_probs", target_probs.shape(), 2, "[R, V]")?;
    let (rows, vocab) = (dims[0], dims[1]);
    if rows == 0 {
        return Err(SpecError::EmptyBatch { arg: "target_probs" });
    }
    if vocab == 0 {
        return Err(SpecError::EmptyVocab { arg: "target_probs" });
    }
    if let Some(q) = draft_probs {
        validate::shape("draft_probs", q.shape(), &[rows, vocab], "[R, V]")?;
    }
    validate::shape("drafted", drafted.shape(), &[rows], "[R]")?;
    for (r, &t) in drafted.data().iter().enumerate() {
        validate::token("drafted", || vec![r], t, vocab)?;
    }
    validate::prob_rows("target_probs", target_probs)?;
    if let Some(q) = draft_probs {
        validate::prob_rows("draft_probs", q)?;
    }
    let mut data = Vec::with_capacity(rows * vocab);
    for r in 0..rows {
        let q = draft_probs.map(|q| q.lane_at(&[r]));
        let res = Residual::new(target_probs.lane_at(&[r]), q, *drafted.at(&[r]) as usize);
        let total: f64 = res.weights.iter().sum();
        data.extend(res.weights.iter().map(|w| w / total));
    }
    Tensor::new(vec![rows, vocab], data)
}

/// Batched rejection-sampling verification (REJECT-1 .. REJECT-5).
///
/// REJECT-6 follows from the rules: with a one-hot `p` row, `u q(x) < p(x)`
/// holds exactly for the argmax, and the residual of any other draft is
/// one-hot at the argmax, so the output is GREEDY's for any noise.
pub fn rejection_verify(inputs: &RejectionInputs<'_>, comparator: Comparator) -> Result<VerifyOutput> {
    let RejectionInputs { target_probs, draft_probs, draft_tokens, proposal_lens, accept_uniforms, draw } = *inputs;
    let (layout, vocab) = validate::verify_batch("target_probs", target_probs, draft_tokens, proposal_lens, validate::prob_row)?;
    let (batch, k) = (layout.batch, layout.k);
    if let Some(q) = draft_probs {
        validate::shape("draft_probs", q.shape(), &[batch, k, vocab], "[B, k, V]")?;
    }
    validate::shape("accept_uniforms", accept_uniforms.shape(), &[batch, k], "[B, k]")?;
    draw.validate(batch, k, vocab)?;
    validate::uniforms("accept_uniforms", accept_uniforms)?;
    // CONV-7: only the draft rows a sequence reads are validated.
    if let Some(q) = draft_probs {
        for (b, &len) in layout.lens.iter().enumerate() {
            for j in 0..len {
                validate::prob_row("draft_probs", &[b, j], q.lane_at(&[b, j]))?;
            }
        }
    }

    let mut out = VerifyOutput::new(batch, k);
    for (b, &len) in layout.lens.iter().enumerate() {
        let drafts = draft_tokens.lane_at(&[b]);
        let mut margin = f64::INFINITY;
        let mut n = 0;
        let next = loop {
            let p = target_probs.lane_at(&[b, n]);
            if n == len {
                // REJECT-4: every draft accepted; the bonus comes from row len.
                let drawn = draw.draw(p, b, n);
                break Drawn { margin: margin.min(drawn.margin), ..drawn };
            }
            let x = drafts[n] as usize;
            let q = draft_probs.map(|q| q.lane_at(&[b, n]));
            let q_x = q.map_or(1.0, |q| q[x]);
            // REJECT-2 with ACCEPT-1 (or the named variant).
            let (accepted, m) = accept_test(comparator, *accept_uniforms.at(&[b, n]), p[x], q_x);
            margin = margin.min(m);
            if accepted {
                n += 1;
                continue;
            }
            // REJECT-3: the correction comes from the residual of the same row.
            let residual = Residual::new(p, q, x);
            let drawn = draw.draw(&residual.weights, b, n);
            break Drawn { margin: margin.min(drawn.margin), ..drawn };
        };
        out.set(b, &drafts[..n], next.token as i64, next.margin);
    }
    Ok(out)
}
