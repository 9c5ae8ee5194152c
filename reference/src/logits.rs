//! The sampling processors (LOGITS-1 .. LOGITS-13): logit bias, repetition,
//! presence and frequency penalties, temperature, top-k, top-p and min-p, in
//! the one order LOGITS-11 fixes.
//!
//! The output is the exact distribution a sampler draws from. Rejection
//! sampling is lossless only if its `p` and `q` are these distributions,
//! each computed with the parameters its own token was sampled with, and
//! with the penalty counts of its own row: the context plus the drafts
//! before it (LOGITS-13, [`window_counts`]).

use serde::{Deserialize, Serialize};

use crate::error::{Result, SpecError};
use crate::greedy::argmax;
use crate::tensor::Tensor;
use crate::validate;

/// Which tokens the penalties count (LOGITS-12).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PenaltyScope {
    /// The prompt and the generated tokens (HF, llama.cpp).
    #[default]
    Context,
    /// The generated tokens only (OpenAI and vLLM for presence and frequency).
    Generated,
}

impl PenaltyScope {
    pub fn name(self) -> &'static str {
        match self {
            PenaltyScope::Context => "context",
            PenaltyScope::Generated => "generated",
        }
    }

    pub fn from_name(name: &str) -> Option<Self> {
        [PenaltyScope::Context, PenaltyScope::Generated].into_iter().find(|s| s.name() == name)
    }

    /// The tokens this scope counts, of a sequence whose first `prompt_len`
    /// tokens are its prompt.
    pub fn counted(self, tokens: &[u32], prompt_len: usize) -> &[u32] {
        match self {
            PenaltyScope::Context => tokens,
            PenaltyScope::Generated => &tokens[prompt_len.min(tokens.len())..],
        }
    }
}

fn one() -> f64 {
    1.0
}

/// Sampling parameters of one row. The processors whose parameter is at its
/// neutral value (`min_p` 0, `repetition_penalty` 1, the other penalties 0)
/// are off; a row with all of them off is LOGITS-1 .. LOGITS-6 alone.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct SamplingParams {
    /// `0` means greedy (one-hot at the argmax); otherwise finite and `> 0`.
    pub temperature: f64,
    /// `0` disables top-k.
    pub top_k: usize,
    /// In `(0, 1]`; `1` disables top-p.
    pub top_p: f64,
    /// In `[0, 1]`; `0` disables min-p (LOGITS-10).
    #[serde(default)]
    pub min_p: f64,
    /// Finite and `> 0`; `1` disables (LOGITS-8).
    #[serde(default = "one")]
    pub repetition_penalty: f64,
    /// Finite; `0` disables (LOGITS-9).
    #[serde(default)]
    pub presence_penalty: f64,
    /// Finite; `0` disables (LOGITS-9).
    #[serde(default)]
    pub frequency_penalty: f64,
    /// Which tokens the penalties count (LOGITS-12).
    #[serde(default)]
    pub penalty_scope: PenaltyScope,
}

impl Default for SamplingParams {
    fn default() -> Self {
        SamplingParams::new(1.0, 0, 1.0)
    }
}

impl SamplingParams {
    /// Temperature, top-k and top-p; every other processor off.
    pub const fn new(temperature: f64, top_k: usize, top_p: f64) -> Self {
        SamplingParams { temperature, top_k, top_p, min_p: 0.0, repetition_penalty: 1.0, presence_penalty: 0.0, frequency_penalty: 0.0, penalty_scope: PenaltyScope::Context }
    }

    /// Greedy, every processor off.
    pub const fn greedy() -> Self {
        SamplingParams::new(0.0, 0, 1.0)
    }

    /// Whether any penalty is on (the row then needs its counts, LOGITS-12/13).
    pub fn penalised(&self) -> bool {
        self.repetition_penalty != 1.0 || self.presence_penalty != 0.0 || self.frequency_penalty != 0.0
    }

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
        if !(0.0..=1.0).contains(&self.min_p) {
            return Err(SpecError::param("min_p", self.min_p, "must be in [0, 1]"));
        }
        let r = self.repetition_penalty;
        if !(r.is_finite() && r > 0.0) {
            return Err(SpecError::param("repetition_penalty", r, "must be finite and > 0"));
        }
        for (name, x) in [("presence_penalty", self.presence_penalty), ("frequency_penalty", self.frequency_penalty)] {
            if !x.is_finite() {
                return Err(SpecError::param(name, x, "must be finite"));
            }
        }
        Ok(())
    }
}

/// A row's penalty counts (LOGITS-12): `counts[i]` occurrences of `i` in `tokens`.
/// Ids must be in the vocabulary (the caller's tokens are).
pub fn penalty_counts(tokens: &[u32], vocab: usize) -> Vec<f64> {
    let mut counts = vec![0.0; vocab];
    for &t in tokens {
        counts[t as usize] += 1.0;
    }
    counts
}

/// The counts of the `drafts.len() + 1` rows of one verify window
/// (LOGITS-13): row `j` counts `base` plus `drafts[..j]`.
pub fn window_counts(base: &[f64], drafts: &[u32]) -> Vec<Vec<f64>> {
    let mut rows = Vec::with_capacity(drafts.len() + 1);
    let mut counts = base.to_vec();
    rows.push(counts.clone());
    for &d in drafts {
        counts[d as usize] += 1.0;
        rows.push(counts.clone());
    }
    rows
}

/// A dense bias row from a request's `(id, bias)` pairs (LOGITS-7): ids in
/// the vocabulary, none twice, biases finite.
pub fn bias_row(pairs: &[(u32, f64)], vocab: usize) -> Result<Vec<f64>> {
    let mut row = vec![0.0; vocab];
    let mut seen = vec![false; vocab];
    for (i, &(id, b)) in pairs.iter().enumerate() {
        let id = validate::token("logit_bias", || vec![i], i64::from(id), vocab)?;
        if seen[id] {
            return Err(SpecError::param("logit_bias", id, "names this id twice"));
        }
        if !b.is_finite() {
            return Err(SpecError::NonFinite { arg: "logit_bias", index: vec![i], value: b });
        }
        seen[id] = true;
        row[id] = b;
    }
    Ok(row)
}

/// A row's optional processor inputs (LOGITS-7 .. LOGITS-9): `None` is all zeros.
#[derive(Debug, Clone, Copy, Default)]
pub struct RowInputs<'a> {
    /// `[V]` penalty counts: finite non-negative integers.
    pub counts: Option<&'a [f64]>,
    /// `[V]` logit bias: finite.
    pub bias: Option<&'a [f64]>,
}

/// The batch form of [`RowInputs`]: `[R, V]` tensors.
#[derive(Debug, Clone, Copy, Default)]
pub struct BatchInputs<'a> {
    pub counts: Option<&'a Tensor<f64>>,
    pub bias: Option<&'a Tensor<f64>>,
}

/// Turns one row of logits into the distribution sampled from (LOGITS-2 .. LOGITS-6,
/// LOGITS-10), with no bias and zero penalty counts.
///
/// Logits may be `-inf` (masked) but not NaN or `+inf`, and not all `-inf`.
pub fn process_logits(logits: &[f64], params: SamplingParams) -> Result<Vec<f64>> {
    process_logits_with(logits, params, RowInputs::default())
}

/// [`process_logits`] with the row's bias and penalty counts (LOGITS-7 .. LOGITS-13).
pub fn process_logits_with(logits: &[f64], params: SamplingParams, inputs: RowInputs<'_>) -> Result<Vec<f64>> {
    params.validate()?;
    if logits.is_empty() {
        return Err(SpecError::EmptyVocab { arg: "logits" });
    }
    validate::score_row("logits", &[], logits)?;
    let vocab = logits.len();
    if let Some(c) = inputs.counts {
        validate::shape("penalty_counts", &[c.len()], &[vocab], "[V]")?;
        counts_row(&[], c)?;
    }
    if let Some(b) = inputs.bias {
        validate::shape("logit_bias", &[b.len()], &[vocab], "[V]")?;
        bias_values(&[], b)?;
    }
    let z = pre_process(logits, &params, inputs);
    validate::score_row("processed_logits", &[], &z)?;
    Ok(process_row(&z, params))
}

/// Row-wise [`process_logits`] over `logits` `[R, V]` with one parameter set per row.
pub fn process_logits_batch(logits: &Tensor<f64>, params: &[SamplingParams]) -> Result<Tensor<f64>> {
    process_logits_batch_with(logits, params, BatchInputs::default())
}

/// Row-wise [`process_logits_with`]: `counts` and `bias` are `[R, V]`.
pub fn process_logits_batch_with(logits: &Tensor<f64>, params: &[SamplingParams], inputs: BatchInputs<'_>) -> Result<Tensor<f64>> {
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
    if let Some(c) = inputs.counts {
        validate::shape("penalty_counts", c.shape(), &[rows, vocab], "[R, V]")?;
        for r in 0..rows {
            counts_row(&[r], c.lane_at(&[r]))?;
        }
    }
    if let Some(b) = inputs.bias {
        validate::shape("logit_bias", b.shape(), &[rows, vocab], "[R, V]")?;
        for r in 0..rows {
            bias_values(&[r], b.lane_at(&[r]))?;
        }
    }
    let mut processed = Vec::with_capacity(rows);
    for (r, p) in params.iter().enumerate() {
        let row = RowInputs { counts: inputs.counts.map(|c| c.lane_at(&[r])), bias: inputs.bias.map(|b| b.lane_at(&[r])) };
        let z = pre_process(logits.lane_at(&[r]), p, row);
        validate::score_row("processed_logits", &[r], &z)?;
        processed.push(z);
    }
    let mut data = Vec::with_capacity(rows * vocab);
    for (z, p) in processed.iter().zip(params) {
        data.extend(process_row(z, *p));
    }
    Tensor::new(vec![rows, vocab], data)
}

fn counts_row(prefix: &[usize], c: &[f64]) -> Result<()> {
    for (i, &x) in c.iter().enumerate() {
        if !(x.is_finite() && x >= 0.0 && x.fract() == 0.0) {
            let index: Vec<usize> = prefix.iter().copied().chain([i]).collect();
            return Err(SpecError::param("penalty_counts", format!("{x} at {index:?}"), "must be finite non-negative integers"));
        }
    }
    Ok(())
}

fn bias_values(prefix: &[usize], b: &[f64]) -> Result<()> {
    match b.iter().position(|x| !x.is_finite()) {
        Some(i) => Err(SpecError::NonFinite { arg: "logit_bias", index: prefix.iter().copied().chain([i]).collect(), value: b[i] }),
        None => Ok(()),
    }
}

/// LOGITS-7 .. LOGITS-9 in LOGITS-11's order: bias, repetition, presence and
/// frequency. The result is what temperature, top-k, top-p and min-p (or the
/// greedy argmax) see; inputs are validated by the caller.
pub fn pre_process(logits: &[f64], params: &SamplingParams, inputs: RowInputs<'_>) -> Vec<f64> {
    let mut z = logits.to_vec();
    if let Some(b) = inputs.bias {
        for (l, &b) in z.iter_mut().zip(b) {
            *l += b; // -inf + finite stays -inf
        }
    }
    if let Some(c) = inputs.counts {
        let rho = params.repetition_penalty;
        for (l, &c) in z.iter_mut().zip(c) {
            if c > 0.0 {
                if rho != 1.0 {
                    *l = if *l > 0.0 { *l / rho } else { *l * rho };
                }
                *l -= c * params.frequency_penalty + params.presence_penalty;
            }
        }
    }
    z
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
    }
    let probs = if params.top_p < 1.0 { weights(&keep) } else { probs };

    // LOGITS-10: min-p after top-p, relative to the largest probability
    // (the argmax survives every cut, so it is the same largest).
    if params.min_p > 0.0 {
        let largest = probs[top];
        for (kept, &p) in keep.iter_mut().zip(&probs) {
            *kept = *kept && p >= params.min_p * largest;
        }
        return weights(&keep);
    }
    probs
}
