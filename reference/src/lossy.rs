//! LOSSY verifiers (LOSSY-1, LOSSY-2). They change what the model says and
//! exist only so that their loss can be measured and so that the statistical
//! suite can prove it detects them. Never use them where lossless is claimed.

use crate::error::{Result, SpecError};
use crate::greedy::{VerifyOutput, argmax};
use crate::sampling;
use crate::tensor::Tensor;
use crate::validate;

/// Shared shape and value validation; returns the proposal lengths.
fn validate_common(target_probs: &Tensor<f64>, draft_tokens: &Tensor<i64>, proposal_lens: &Tensor<i64>) -> Result<Vec<usize>> {
    Ok(validate::verify_batch("target_probs", target_probs, draft_tokens, proposal_lens, validate::prob_row)?.0.lens)
}

/// Runs the accept-prefix loop shared by both lossy rules.
fn verify_prefix(target_probs: &Tensor<f64>, draft_tokens: &Tensor<i64>, lens: &[usize], accept: impl Fn(&[f64], usize) -> bool, next: impl Fn(&[f64], usize, usize) -> usize) -> VerifyOutput {
    let k = draft_tokens.shape()[1];
    let mut out = VerifyOutput::new(lens.len(), k);
    for (b, &len) in lens.iter().enumerate() {
        let drafts = draft_tokens.lane_at(&[b]);
        let n = (0..len).take_while(|&j| accept(target_probs.lane_at(&[b, j]), drafts[j] as usize)).count();
        let token = next(target_probs.lane_at(&[b, n]), b, n);
        // Lossy rules make no claim a margin could protect.
        out.set(b, &drafts[..n], token as i64, f64::INFINITY);
    }
    out
}

/// LOSSY-1, seed 001's threshold mode: accept a draft iff the target gives
/// it probability `>= threshold`; the next token is the argmax of the target
/// row at the stop position.
pub fn lossy_threshold_verify(target_probs: &Tensor<f64>, draft_tokens: &Tensor<i64>, proposal_lens: &Tensor<i64>, threshold: f64) -> Result<VerifyOutput> {
    if !(0.0..=1.0).contains(&threshold) {
        return Err(SpecError::param("threshold", threshold, "must be in [0, 1]"));
    }
    let lens = validate_common(target_probs, draft_tokens, proposal_lens)?;
    Ok(verify_prefix(target_probs, draft_tokens, &lens, |p, x| p[x] >= threshold, |p, _, _| argmax(p).0))
}

/// LOSSY-2, Medusa's typical acceptance: accept iff
/// `p(x) > min(epsilon, delta * exp(-H(p)))` with `H` the natural-log entropy
/// (`0 ln 0 = 0`); the next token is drawn from the target row by inverse CDF
/// with `draw_uniforms` `[B, k+1]`.
pub fn lossy_typical_verify(target_probs: &Tensor<f64>, draft_tokens: &Tensor<i64>, proposal_lens: &Tensor<i64>, epsilon: f64, delta: f64, draw_uniforms: &Tensor<f64>) -> Result<VerifyOutput> {
    if !(epsilon.is_finite() && epsilon > 0.0) {
        return Err(SpecError::param("epsilon", epsilon, "must be finite and > 0"));
    }
    if !(delta.is_finite() && delta > 0.0) {
        return Err(SpecError::param("delta", delta, "must be finite and > 0"));
    }
    let lens = validate_common(target_probs, draft_tokens, proposal_lens)?;
    let k = draft_tokens.shape()[1];
    validate::shape("draw_uniforms", draw_uniforms.shape(), &[lens.len(), k + 1], "[B, k+1]")?;
    validate::uniforms("draw_uniforms", draw_uniforms)?;
    let accept = |p: &[f64], x: usize| {
        let entropy: f64 = p.iter().filter(|&&v| v > 0.0).map(|&v| -v * v.ln()).sum();
        p[x] > epsilon.min(delta * (-entropy).exp())
    };
    let next = |p: &[f64], b: usize, n: usize| sampling::inverse_cdf(p, *draw_uniforms.at(&[b, n])).token;
    Ok(verify_prefix(target_probs, draft_tokens, &lens, accept, next))
}
