//! Temperature, top-k and top-p (LOGITS-1 .. LOGITS-6).
//!
//! The output is the exact distribution a sampler draws from. Rejection
//! sampling is lossless only if its `p` and `q` are these distributions,
//! each computed with the parameters its own token was sampled with.

use serde::{Deserialize, Serialize};

use crate::error::{Result, SpecError};
use crate::greedy::argmax;
use crate::tensor::Tensor;
use crate::validate;

/// Sampling parameters of one row.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct SamplingParams {
    /// `0` means greedy (one-hot at the argmax); otherwise finite and `> 0`.
    pub temperature: f64,
    /// `0` disables top-k.
    pub top_k: usize,
    /// In `(0, 1]`; `1` disables top-p.
    pub top_p: f64,
}

impl Default for SamplingParams {
    fn default() -> Self {
        SamplingParams { temperature: 1.0, top_k: 0, top_p: 1.0 }
    }
}

impl SamplingParams {
    /// LOGITS-1: parameter ranges.
    pub fn validate(&self) -> Result<()> {
        let t = self.temperature;
        if !(t.is_finite() && t >= 0.0) {
            return Err(SpecError::param("temperature", t, "must be finite and >= 0"));
        }
        let p = self.top_p;
        if !(p > 0.0 && p <= 1.0) {
            return Err(SpecError::param("top_p", p, "must be in (0, 1]"));
        }
        Ok(())
    }
}

/// Turns one row of logits into the distribution sampled from (LOGITS-2 .. LOGITS-6).
///
/// Logits may be `-inf` (masked) but not NaN or `+inf`, and not all `-inf`.
pub fn process_logits(logits: &[f64], params: SamplingParams) -> Result<Vec<f64>> {
    params.validate()?;
    if logits.is_empty() {
        return Err(SpecError::EmptyVocab { arg: "logits" });
    }
    validate::score_row("logits", &[], logits)?;
    Ok(process_row(logits, params))
}

/// Row-wise [`process_logits`] over `logits` `[R, V]` with one parameter set per row.
pub fn process_logits_batch(logits: &Tensor<f64>, params: &[SamplingParams]) -> Result<Tensor<f64>> {
    let dims = validate::rank("logits", logits.shape(), 2, "[R, V]")?;
    let (rows, vocab) = (dims[0], dims[1]);
    if rows == 0 {
        return Err(SpecError::EmptyBatch { arg: "logits" });
    }
    if vocab == 0 {
        return Err(SpecError::EmptyVocab { arg: "logits" });
    }
    validate::shape("params", &[params.len()], &[rows], "[R]")?;
    for p in params {
        p.validate()?;
    }
    for r in 0..rows {
        validate::score_row("logits", &[r], logits.lane_at(&[r]))?;
    }
    let mut data = Vec::with_capacity(rows * vocab);
    for (r, p) in params.iter().enumerate() {
        data.extend(process_row(logits.lane_at(&[r]), *p));
    }
    Tensor::new(vec![rows, vocab], data)
}

fn process_row(logits: &[f64], params: SamplingParams) -> Vec<f64> {
    let vocab = logits.len();
    let (top, _) = argmax(logits);
    // LOGITS-2: temperature 0 is greedy.
    if params.temperature == 0.0 {
        let mut out = vec![0.0; vocab];
        out[top] = 1.0;
        return out;
    }
    let max = logits[top];

    // LOGITS-4: top-k keeps every id whose logit reaches the k-th largest
    // (ties at the boundary survive). Temperature > 0 preserves the order,
    // so ranking the raw logits is the same as ranking logits / T.
    let mut keep = vec![true; vocab];
    if params.top_k > 0 && params.top_k < vocab {
        let mut sorted = logits.to_vec();
        sorted.sort_by(|a, b| b.total_cmp(a));
        let kth = sorted[params.top_k - 1];
        for (kept, &x) in keep.iter_mut().zip(logits) {
            *kept = x >= kth;
        }
    }

    // LOGITS-3/6: softmax of logits / T over the kept set, max-subtracted so
    // that a tiny T cannot overflow: exp((l - max) / T) lies in [0, 1].
    let weights = |keep: &[bool]| -> Vec<f64> {
        let w: Vec<f64> = logits.iter().zip(keep).map(|(&l, &k)| if k { ((l - max) / params.temperature).exp() } else { 0.0 }).collect();
        let total: f64 = w.iter().sum();
        w.into_iter().map(|x| x / total).collect()
    };
    let probs = weights(&keep);

    // LOGITS-5: top-p keeps a token iff the mass strictly before it, in
    // descending probability order (ties: lower id first), is below top_p.
    if params.top_p < 1.0 {
        let mut order: Vec<usize> = (0..vocab).filter(|&i| keep[i]).collect();
        order.sort_by(|&a, &b| probs[b].total_cmp(&probs[a]).then(a.cmp(&b)));
        let mut before = 0.0;
        for &i in &order {
            keep[i] = before < params.top_p;
            before += probs[i];
        }
        return weights(&keep);
    }
    probs
}
