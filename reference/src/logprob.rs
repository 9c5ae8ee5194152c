//! Reported logprobs (spec section 22, LOGPROB-1 .. LOGPROB-3): the plain
//! definition every engine's reported logprobs are judged against.
//!
//! A row's logprobs are either `raw` (the log-softmax of the model's own
//! logits) or `processed` (the log of the distribution the token was drawn
//! from, LOGITS-6; at temperature 0, the log-softmax of the logits after bias
//! and penalties, since LOGITS-2's one-hot is no law worth reporting). An
//! entry is the chosen id's logprob and the top-n ids by logprob descending,
//! then id ascending; ids at `-inf` are never listed.

use serde::{Deserialize, Serialize};

use crate::error::Result;
use crate::logits::{RowInputs, SamplingParams, pre_process, process_logits_with};
use crate::validate;

/// Top logprobs a request may ask for at most (OpenAI's limit).
pub const MAX_TOP_LOGPROBS: usize = 20;

/// How a `-inf` logprob of a chosen token is written (vLLM's convention):
/// JSON has no `-inf`.
pub const LOGPROB_FLOOR: f64 = -9999.0;

/// Which distribution a reported logprob is of (LOGPROB-1, LOGPROB-2).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LogprobMode {
    /// The model's own distribution: the softmax of its logits.
    Raw,
    /// The distribution sampled from, after every processor.
    Processed,
}

impl LogprobMode {
    pub const ALL: [LogprobMode; 2] = [LogprobMode::Raw, LogprobMode::Processed];

    pub fn name(self) -> &'static str {
        match self {
            LogprobMode::Raw => "raw",
            LogprobMode::Processed => "processed",
        }
    }

    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|m| m.name() == name)
    }
}

/// What a request asks to have reported with each generated token.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LogprobRequest {
    /// Alternatives per token, `0 ..= MAX_TOP_LOGPROBS`.
    pub top: usize,
    pub mode: LogprobMode,
}

/// One generated token's entry (LOGPROB-3).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TokenLogprob {
    /// The generated id.
    pub id: u32,
    /// Its logprob (`LOGPROB_FLOOR` for `-inf`).
    pub logprob: f64,
    /// `(id, logprob)` of the largest logprobs, descending, ties by id ascending.
    pub top: Vec<(u32, f64)>,
}

/// Every id's logprob of one row (LOGPROB-1, LOGPROB-2), in f64: `logits`
/// are the model's, `params` and `inputs` the row's processors (ignored for
/// `Raw`).
pub fn logprob_row(logits: &[f64], mode: LogprobMode, params: SamplingParams, inputs: RowInputs<'_>) -> Result<Vec<f64>> {
    validate::score_row("logits", &[], logits)?;
    match mode {
        LogprobMode::Raw => Ok(log_softmax(logits, |_| true)),
        LogprobMode::Processed => {
            // Validates the parameters and inputs, and gives the kept set.
            let kept = process_logits_with(logits, params, inputs)?;
            let z = pre_process(logits, &params, inputs);
            if params.temperature == 0.0 {
                return Ok(log_softmax(&z, |_| true));
            }
            let z: Vec<f64> = z.iter().map(|l| l / params.temperature).collect();
            Ok(log_softmax(&z, |i| kept[i] > 0.0))
        }
    }
}

/// `z_i - logsumexp(z over kept)` for kept ids, `-inf` for the others.
fn log_softmax(z: &[f64], kept: impl Fn(usize) -> bool) -> Vec<f64> {
    let max = (0..z.len()).filter(|&i| kept(i)).map(|i| z[i]).fold(f64::NEG_INFINITY, f64::max);
    let sum: f64 = (0..z.len()).filter(|&i| kept(i)).map(|i| (z[i] - max).exp()).sum();
    let lse = max + sum.ln();
    (0..z.len()).map(|i| if kept(i) && z[i] > f64::NEG_INFINITY { z[i] - lse } else { f64::NEG_INFINITY }).collect()
}

/// The entry of `id` in a row of logprobs `lp`, with its `top` largest.
pub fn entry(lp: &[f64], id: u32, top: usize) -> TokenLogprob {
    let mut ids: Vec<u32> = (0..lp.len() as u32).filter(|&i| lp[i as usize].is_finite()).collect();
    // LOGPROB-3's order is total (logprob descending, then id), so the `top`
    // first of a partition are the `top` first of a full sort: select, then
    // sort those few (a vocabulary-wide sort per token would dominate).
    let order = |a: &u32, b: &u32| lp[*b as usize].total_cmp(&lp[*a as usize]).then(a.cmp(b));
    if top < ids.len() {
        ids.select_nth_unstable_by(top, order);
        ids.truncate(top);
    }
    ids.sort_by(order);
    let chosen = lp.get(id as usize).copied().unwrap_or(f64::NEG_INFINITY);
    TokenLogprob { id, logprob: floored(chosen), top: ids.into_iter().take(top).map(|i| (i, lp[i as usize])).collect() }
}

/// A logprob as written: `-inf` as [`LOGPROB_FLOOR`].
pub fn floored(lp: f64) -> f64 {
    if lp.is_finite() { lp } else { LOGPROB_FLOOR }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LN2: f64 = std::f64::consts::LN_2;

    /// LOGPROB-3: the top list equals the first `top` of a full sort by
    /// logprob descending then id, ties and `-inf` included, at every `top`.
    #[test]
    fn the_top_list_is_the_head_of_the_full_order() {
        let ninf = f64::NEG_INFINITY;
        for lp in [vec![-1.0, -0.5, -1.0, ninf, -0.5, -3.0, -0.5], vec![ninf, ninf], vec![-0.1], (0..40).map(|i| -f64::from((i * 7) % 5)).collect()] {
            let mut full: Vec<u32> = (0..lp.len() as u32).filter(|&i| lp[i as usize].is_finite()).collect();
            full.sort_by(|&a, &b| lp[b as usize].total_cmp(&lp[a as usize]).then(a.cmp(&b)));
            for top in 0..=lp.len() + 1 {
                let want: Vec<(u32, f64)> = full.iter().take(top).map(|&i| (i, lp[i as usize])).collect();
                assert_eq!(entry(&lp, 0, top).top, want, "LOGPROB-3: top {top} of {lp:?}");
            }
        }
    }

    /// LOGPROB-1 by hand: logits (0, ln 3) are probabilities (1/4, 3/4).
    #[test]
    fn raw_is_the_log_softmax_of_the_logits() {
        let lp = logprob_row(&[0.0, 3f64.ln()], LogprobMode::Raw, SamplingParams::new(0.7, 1, 0.5), RowInputs::default()).unwrap();
        assert!((lp[0] - (-2.0 * LN2)).abs() < 1e-15 && (lp[1] - (0.75f64).ln()).abs() < 1e-15, "{lp:?}");
    }

    /// LOGPROB-2 by hand: top-k 2 of (ln 1, ln 2, ln 5) at T 1 keeps (2/7, 5/7); the dropped id is -inf.
    #[test]
    fn processed_is_the_law_sampled_from() {
        let logits = [0.0, LN2, 5f64.ln()];
        let lp = logprob_row(&logits, LogprobMode::Processed, SamplingParams::new(1.0, 2, 1.0), RowInputs::default()).unwrap();
        assert_eq!(lp[0], f64::NEG_INFINITY);
        assert!((lp[1] - (2.0f64 / 7.0).ln()).abs() < 1e-15 && (lp[2] - (5.0f64 / 7.0).ln()).abs() < 1e-15, "{lp:?}");
        // T 0.5 squares the odds: (4, 25) / 29 over the kept ids.
        let lp = logprob_row(&logits, LogprobMode::Processed, SamplingParams::new(0.5, 2, 1.0), RowInputs::default()).unwrap();
        assert!((lp[1] - (4.0f64 / 29.0).ln()).abs() < 1e-14 && (lp[2] - (25.0f64 / 29.0).ln()).abs() < 1e-14, "{lp:?}");
    }

    /// LOGPROB-2 at T 0: bias and penalties apply, truncation does not. A
    /// bias of ln 3 on id 0 of (0, 0) gives (3/4, 1/4), top-k 1 ignored.
    #[test]
    fn processed_at_temperature_zero_is_after_bias_and_penalties_only() {
        let bias = [3f64.ln(), 0.0];
        let lp = logprob_row(&[0.0, 0.0], LogprobMode::Processed, SamplingParams::new(0.0, 1, 1.0), RowInputs { counts: None, bias: Some(&bias) }).unwrap();
        assert!((lp[0] - 0.75f64.ln()).abs() < 1e-15 && (lp[1] - 0.25f64.ln()).abs() < 1e-15, "{lp:?}");
        let raw = logprob_row(&[0.0, 0.0], LogprobMode::Raw, SamplingParams::new(0.0, 1, 1.0), RowInputs { counts: None, bias: Some(&bias) }).unwrap();
        assert_eq!(raw, vec![-LN2, -LN2], "raw ignores the processors");
    }

    /// LOGPROB-3: top entries by logprob descending, ties by id ascending,
    /// `-inf` never listed, the chosen `-inf` floored.
    #[test]
    fn entries_order_ties_by_id_and_skip_minus_infinity() {
        let lp = [-1.0, -0.5, f64::NEG_INFINITY, -0.5, -3.0];
        let e = entry(&lp, 2, 4);
        assert_eq!(e, TokenLogprob { id: 2, logprob: LOGPROB_FLOOR, top: vec![(1, -0.5), (3, -0.5), (0, -1.0), (4, -3.0)] });
        assert_eq!(entry(&lp, 1, 10).top.len(), 4, "only finite ids are listed");
        assert!(entry(&lp, 0, 0).top.is_empty());
    }

    #[test]
    fn bad_rows_are_typed_errors() {
        assert!(logprob_row(&[f64::NAN, 0.0], LogprobMode::Raw, SamplingParams::greedy(), RowInputs::default()).is_err());
        assert!(logprob_row(&[], LogprobMode::Raw, SamplingParams::greedy(), RowInputs::default()).is_err());
        assert!(logprob_row(&[0.0], LogprobMode::Processed, SamplingParams::new(-1.0, 0, 1.0), RowInputs::default()).is_err());
    }
}
