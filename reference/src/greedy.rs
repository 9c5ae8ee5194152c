//! Greedy verification (GREEDY-1 .. GREEDY-5) and the DFlash accept rule
//! (DFLASH-1 .. DFLASH-4).

use crate::PAD;
use crate::error::{Result, SpecError};
use crate::tensor::Tensor;
use crate::validate;

/// The result of verifying a padded batch of drafts.
#[derive(Debug, Clone, PartialEq)]
pub struct VerifyOutput {
    /// `[B, k+1]`: the accepted drafts, then the correction or bonus token,
    /// then PAD (GREEDY-4, REJECT-5).
    pub tokens: Tensor<i64>,
    /// `[B]`: accepted drafts per sequence; the sequence emits this plus one.
    pub num_accepted: Vec<usize>,
    /// `[B]`: the smallest decision margin of the sequence (SAMPLE-3); a
    /// backend whose answer differs from the reference may be excused only
    /// when this is below its stated epsilon. `f64::INFINITY` if no decision
    /// could flip.
    pub margins: Vec<f64>,
}

impl VerifyOutput {
    /// The tokens sequence `b` emits (accepted drafts then one more), if `b < B`.
    pub fn emitted(&self, b: usize) -> Option<&[i64]> {
        Some(&self.tokens.lane(&[b])?[..=*self.num_accepted.get(b)?])
    }

    /// The correction, bonus or plain decode token of sequence `b`, if `b < B`.
    pub fn next_token(&self, b: usize) -> Option<i64> {
        self.emitted(b)?.last().copied()
    }

    pub(crate) fn new(batch: usize, k: usize) -> Self {
        VerifyOutput { tokens: Tensor::full(vec![batch, k + 1], PAD), num_accepted: vec![0; batch], margins: vec![f64::INFINITY; batch] }
    }

    /// Writes one sequence's result: `accepted` drafts then `next`.
    pub(crate) fn set(&mut self, b: usize, accepted: &[i64], next: i64, margin: f64) {
        let k1 = self.tokens.shape()[1];
        let row = &mut self.tokens.data_mut()[b * k1..(b + 1) * k1];
        row[..accepted.len()].copy_from_slice(accepted);
        row[accepted.len()] = next;
        self.num_accepted[b] = accepted.len();
        self.margins[b] = margin;
    }
}

/// The lowest id among a row's equal maxima (CONV-8), for any ordered
/// value; 0 for an empty row. The one argmax of the host code (the f64 and
/// f32 DFlash drafters use it too).
pub fn lowest_argmax<T: PartialOrd>(row: &[T]) -> usize {
    let mut best = 0;
    for (i, v) in row.iter().enumerate() {
        if *v > row[best] {
            best = i;
        }
    }
    best
}

/// Argmax of a validated, non-empty score row: the lowest id among equal
/// maxima (CONV-8), with the relative gap to the best other value as margin.
pub(crate) fn argmax(row: &[f64]) -> (usize, f64) {
    let best = lowest_argmax(row);
    let runner_up = row.iter().enumerate().filter(|&(i, _)| i != best).map(|(_, &x)| x).fold(f64::NEG_INFINITY, f64::max);
    let scale = row[best].abs().max(1.0);
    (best, (row[best] - runner_up) / scale)
}

/// Batched greedy verification (GREEDY-1 .. GREEDY-4).
///
/// * `target_scores` `[B, k+1, V]`: logits or probabilities of the target at
///   each verify position; only rows `0..=proposal_lens[b]` are read (CONV-7).
/// * `draft_tokens` `[B, k]`: PAD beyond each proposal length (CONV-5).
/// * `proposal_lens` `[B]`: in `[0, k]`; 0 means a plain decode step.
pub fn greedy_verify(target_scores: &Tensor<f64>, draft_tokens: &Tensor<i64>, proposal_lens: &Tensor<i64>) -> Result<VerifyOutput> {
    let (layout, _) = validate::verify_batch("target_scores", target_scores, draft_tokens, proposal_lens, validate::score_row)?;
    let (batch, k) = (layout.batch, layout.k);

    let mut out = VerifyOutput::new(batch, k);
    for (b, &len) in layout.lens.iter().enumerate() {
        let drafts = draft_tokens.lane_at(&[b]);
        let mut margin = f64::INFINITY;
        let mut n = 0;
        // GREEDY-3: accept while the draft equals the target argmax.
        let next = loop {
            let (best, gap) = argmax(target_scores.lane_at(&[b, n]));
            margin = margin.min(gap);
            if n < len && drafts[n] == best as i64 {
                n += 1;
            } else {
                // GREEDY-4: correction (n < len), bonus (n == len) or plain decode (len == 0).
                break best as i64;
            }
        };
        out.set(b, &drafts[..n], next, margin);
    }
    Ok(out)
}

/// Output of the DFlash accept rule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DflashOutput {
    /// `[bs]`: accepted draft tokens, excluding the current token (DFLASH-2).
    pub accept_len: Vec<usize>,
    /// `[bs]`: `target_predict[b, accept_len[b]]`, always appended (DFLASH-3).
    pub bonus: Vec<i64>,
}

/// The DFlash accept rule of seed 000 (DFLASH-1 .. DFLASH-3).
///
/// * `candidates` `[bs, Bk]`: column 0 is the current verified token, columns
///   `1..Bk` the drafted block; `Bk >= 2`.
/// * `target_predict` `[bs, Bk]`: the target's greedy token at each position.
/// * `vocab`: the vocabulary size, used to validate ids.
pub fn dflash_accept(candidates: &Tensor<i64>, target_predict: &Tensor<i64>, vocab: usize) -> Result<DflashOutput> {
    let dims = validate::rank("candidates", candidates.shape(), 2, "[bs, Bk]")?;
    let (bs, block) = (dims[0], dims[1]);
    if bs == 0 {
        return Err(SpecError::EmptyBatch { arg: "candidates" });
    }
    if block < 2 {
        // A block of 1 holds only the current token: k = 0 drafts.
        return Err(SpecError::EmptyDraft { arg: "candidates" });
    }
    if vocab == 0 {
        return Err(SpecError::EmptyVocab { arg: "vocab" });
    }
    validate::shape("target_predict", target_predict.shape(), &[bs, block], "[bs, Bk]")?;
    for (arg, t) in [("candidates", candidates), ("target_predict", target_predict)] {
        for (i, &tok) in t.data().iter().enumerate() {
            validate::token(arg, || vec![i / block, i % block], tok, vocab)?;
        }
    }

    let mut accept_len = Vec::with_capacity(bs);
    let mut bonus = Vec::with_capacity(bs);
    for b in 0..bs {
        let cand = candidates.lane_at(&[b]);
        let pred = target_predict.lane_at(&[b]);
        // DFLASH-2: cumprod(candidates[1:] == target_predict[:-1]).sum()
        let len = cand[1..].iter().zip(&pred[..block - 1]).take_while(|(c, p)| c == p).count();
        accept_len.push(len);
        bonus.push(pred[len]);
    }
    Ok(DflashOutput { accept_len, bonus })
}
