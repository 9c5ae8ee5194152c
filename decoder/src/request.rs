//! What a caller asks of the engine, and what it gets back (DECODE-1,
//! DECODE-6 .. DECODE-8).

use serde::Serialize;
use specdec_backend::SamplingParams;
use specdec_reference::controller::{SpecStats, StepCounts};
use specdec_reference::{LogprobRequest, MAX_TOP_LOGPROBS, TokenLogprob};

use crate::constrained::Constrained;
use crate::error::DecodeError;

/// One generation request: its own prompt, sampling, seed and stops.
#[derive(Debug, Clone, PartialEq)]
pub struct Request {
    /// Prompt token ids; at least one.
    pub prompt: Vec<u32>,
    /// Temperature 0 is greedy (ties to the lowest id, LOGITS-2); min-p and
    /// the penalties with their scope (LOGITS-8 .. LOGITS-12) are here too.
    pub sampling: SamplingParams,
    /// `(id, bias)` pairs added to the logits before everything (LOGITS-7):
    /// ids in the vocabulary, none twice, biases finite.
    pub logit_bias: Vec<(u32, f64)>,
    /// Seeds this request's own noise streams (DECODE-3): its output does
    /// not depend on the other requests of the batch.
    pub seed: u64,
    /// Generated tokens at most, the stop token included; at least one.
    pub max_tokens: usize,
    /// Tokens that end the generation; the stop token is emitted, nothing
    /// after it (DECODE-6).
    pub eos: Vec<u32>,
    /// Strings that end the generation when the decoded output contains
    /// them, even split across tokens (DECODE-7). Needs a detokenizer.
    pub stop_strings: Vec<String>,
    /// Verify uniforms given explicitly, read in DECODE-3's order (each
    /// step's `len_b` accept uniforms, then its draw uniform) instead of the
    /// seed's verify stream; a run that needs more is an error. With them a
    /// step is a function of its noise, which an exact check integrates.
    pub verify_uniforms: Option<Vec<f64>>,
    /// Whether this request's steps carry drafts; `false` decodes it
    /// plainly inside a speculating batch (each step one verify of no draft).
    pub speculate: bool,
    /// The logprobs to report with each generated token (LOGPROB-1 ..
    /// LOGPROB-4), or none.
    pub logprobs: Option<LogprobRequest>,
    /// The constraint the output text must match (CONSTRAIN-1 .. CONSTRAIN-4),
    /// or none; it needs an eos id to end a match.
    pub constraint: Option<Constrained>,
}

impl Request {
    /// A greedy request with no stop condition but `max_tokens`.
    pub fn greedy(prompt: Vec<u32>, max_tokens: usize) -> Self {
        Request {
            prompt,
            sampling: SamplingParams::greedy(),
            logit_bias: Vec::new(),
            seed: 0,
            max_tokens,
            eos: Vec::new(),
            stop_strings: Vec::new(),
            verify_uniforms: None,
            speculate: true,
            logprobs: None,
            constraint: None,
        }
    }

    /// Checks the request against the model's vocabulary (ERR-1: typed, named, no clamping).
    pub fn validate(&self, index: usize, vocab: usize) -> Result<(), DecodeError> {
        let bad = |reason: String| Err(DecodeError::Request { index, reason });
        if self.prompt.is_empty() {
            return bad("the prompt is empty".into());
        }
        if let Some((i, t)) = self.prompt.iter().enumerate().find(|(_, t)| **t as usize >= vocab) {
            return bad(format!("prompt token {i} is id {t}, outside the vocabulary of {vocab}"));
        }
        if let Some(t) = self.eos.iter().find(|t| **t as usize >= vocab) {
            return bad(format!("eos id {t} is outside the vocabulary of {vocab}"));
        }
        if self.max_tokens == 0 {
            return bad("max_tokens must be at least 1".into());
        }
        if self.stop_strings.iter().any(String::is_empty) {
            return bad("a stop string is empty".into());
        }
        if let Err(e) = self.sampling.validate() {
            return bad(e.to_string());
        }
        if let Err(e) = specdec_reference::bias_row(&self.logit_bias, vocab) {
            return bad(e.to_string());
        }
        if let Some(l) = self.logprobs
            && l.top > MAX_TOP_LOGPROBS
        {
            return bad(format!("top_logprobs = {} is more than {MAX_TOP_LOGPROBS}", l.top));
        }
        if let Some(c) = &self.constraint {
            let tokens = c.table().vocabulary().len();
            if tokens != vocab {
                return bad(format!("the constraint's token table has {tokens} tokens, the model {vocab}"));
            }
            if self.eos.is_empty() {
                return bad("a constrained request needs an eos id: its output ends with one at a match".into());
            }
            if !c.allowed(c.constraint().start(), &self.eos).contains(&true) {
                return bad(format!("the constraint `{}` allows no first token of this vocabulary", c.constraint().pattern()));
            }
        }
        if let Some((i, u)) = self.verify_uniforms.iter().flatten().enumerate().find(|(_, u)| !(0.0..1.0).contains(*u)) {
            return bad(format!("explicit verify uniform {i} is {u}, outside [0, 1)"));
        }
        Ok(())
    }
}

/// Why a generation ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum FinishReason {
    /// An eos token was emitted (it is the last token).
    Eos,
    /// A stop string appeared in the output.
    Stop,
    /// `max_tokens` were emitted.
    Length,
    /// The cache or the model's positions are full.
    Capacity,
    /// The request failed alone ([`Output::error`] says why: a constraint
    /// the vocabulary cannot continue, CONSTRAIN-2); the others of its batch
    /// go on. Its tokens are those emitted before the failure.
    Error,
}

impl FinishReason {
    pub fn name(self) -> &'static str {
        match self {
            FinishReason::Eos => "eos",
            FinishReason::Stop => "stop",
            FinishReason::Length => "length",
            FinishReason::Capacity => "capacity",
            FinishReason::Error => "error",
        }
    }
}

/// Draft counts of one request or one run (CTRL-5, DECODE-8).
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Acceptance {
    /// Verify steps (each emits the accepted drafts plus one token).
    pub steps: u64,
    /// Steps that had no draft to verify (plain decode steps, CTRL-6).
    pub plain_steps: u64,
    pub proposed: u64,
    pub accepted: u64,
    /// Steps whose every draft (at least one) was accepted: the emitted
    /// token after them was a bonus.
    pub bonus: u64,
    /// `proposed_at[j]`: steps that proposed a draft at position `j`.
    pub proposed_at: Vec<u64>,
    /// `accepted_at[j]`: steps whose draft at position `j` was accepted.
    pub accepted_at: Vec<u64>,
}

impl Acceptance {
    /// Records one step's proposal length and accepted count.
    pub fn record(&mut self, proposed: usize, accepted: usize) {
        self.steps += 1;
        self.plain_steps += u64::from(proposed == 0);
        self.proposed += proposed as u64;
        self.accepted += accepted as u64;
        self.bonus += u64::from(proposed > 0 && accepted == proposed);
        if self.proposed_at.len() < proposed {
            self.proposed_at.resize(proposed, 0);
            self.accepted_at.resize(proposed, 0);
        }
        for j in 0..proposed {
            self.proposed_at[j] += 1;
            self.accepted_at[j] += u64::from(j < accepted);
        }
    }

    pub fn merge(&mut self, other: &Acceptance) {
        self.steps += other.steps;
        self.plain_steps += other.plain_steps;
        self.proposed += other.proposed;
        self.accepted += other.accepted;
        self.bonus += other.bonus;
        let n = self.proposed_at.len().max(other.proposed_at.len());
        self.proposed_at.resize(n, 0);
        self.accepted_at.resize(n, 0);
        for j in 0..other.proposed_at.len() {
            self.proposed_at[j] += other.proposed_at[j];
            self.accepted_at[j] += other.accepted_at[j];
        }
    }

    /// The counts in the controller's terms (CTRL-5, CTRL-6): a request's
    /// steps are its sequence steps. One definition of the metrics serves the
    /// decoder and the controller ([`SpecStats`]).
    pub fn stats(&self) -> SpecStats {
        SpecStats { steps: self.steps, sequence_steps: self.steps, proposed: self.proposed, accepted: self.accepted, bonus_tokens: self.bonus, fallback_steps: self.plain_steps }
    }

    /// One batch step's counts (each recorded sequence once), for the controller.
    pub fn step_counts(&self) -> StepCounts {
        StepCounts { sequences: self.steps, proposed: self.proposed, accepted: self.accepted, bonus: self.bonus }
    }

    /// Accepted over proposed drafts; 0 before any proposal (CTRL-5).
    pub fn acceptance_rate(&self) -> f64 {
        self.stats().acceptance_rate()
    }

    /// The acceptance rate of each draft position: `accepted_at[j] / proposed_at[j]`.
    pub fn rate_per_position(&self) -> Vec<f64> {
        self.proposed_at.iter().zip(&self.accepted_at).map(|(&p, &a)| if p == 0 { 0.0 } else { a as f64 / p as f64 }).collect()
    }

    /// Mean accepted drafts per step.
    pub fn mean_accepted(&self) -> f64 {
        if self.steps == 0 { 0.0 } else { self.accepted as f64 / self.steps as f64 }
    }

    /// CTRL-5 (erratum E6): tokens a verify step emits per sequence,
    /// `(accepted + steps) / steps`; a fully accepted step of `k` counts `k + 1`,
    /// and a run without steps counts 1 (what plain decoding emits), as the
    /// controller's statistics do.
    pub fn tokens_per_step(&self) -> f64 {
        self.stats().tokens_per_sequence_step()
    }
}

/// Where a run's time went, in seconds (DECODE-8).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct Timings {
    /// Prompt prefill of the target and the proposer.
    pub prefill_s: f64,
    /// The proposer: drafting and its bookkeeping after a step.
    pub propose_s: f64,
    /// The target's verify forward, the verify op and the downloads.
    pub verify_s: f64,
    /// Everything else: emission, stop checks, rollback.
    pub rest_s: f64,
}

impl Timings {
    pub fn total_s(&self) -> f64 {
        self.prefill_s + self.propose_s + self.verify_s + self.rest_s
    }
}

/// One request's result.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Output {
    /// Generated ids, the stop token included when there is one.
    pub tokens: Vec<u32>,
    pub finish: FinishReason,
    pub acceptance: Acceptance,
    /// One entry per token of `tokens` where the request asked for them.
    pub logprobs: Option<Vec<TokenLogprob>>,
    /// Why the request failed, where it finished with [`FinishReason::Error`].
    pub error: Option<String>,
}

/// A whole `generate` call's results and metrics.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RunOutput {
    pub outputs: Vec<Output>,
    /// Every request's counts summed.
    pub acceptance: Acceptance,
    /// Batched verify steps (one target forward each).
    pub batch_steps: u64,
    /// Steps a failing proposer turned into plain decode steps.
    pub proposer_errors: u64,
    /// Batched steps run with each `k` (index `k`): what a controller chose.
    pub steps_by_k: Vec<u64>,
    pub timings: Timings,
}

impl RunOutput {
    /// Generated tokens over the decode time (prefill excluded).
    pub fn decode_tokens_per_s(&self) -> f64 {
        let tokens: usize = self.outputs.iter().map(|o| o.tokens.len()).sum();
        let t = self.timings.total_s() - self.timings.prefill_s;
        if t > 0.0 { tokens as f64 / t } else { 0.0 }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One counter, one set of formulas: a request's acceptance and the
    /// controller's statistics of the same steps agree, the empty run included.
    #[test]
    fn acceptance_and_the_controllers_statistics_agree() {
        assert_eq!(Acceptance::default().tokens_per_step(), SpecStats::default().tokens_per_sequence_step());
        assert_eq!(Acceptance::default().tokens_per_step(), 1.0, "a run without steps emits one token a step, as plain decoding does");
        let mut a = Acceptance::default();
        for (proposed, accepted) in [(4, 4), (4, 1), (0, 0), (2, 0)] {
            a.record(proposed, accepted);
        }
        let s = a.stats();
        assert_eq!((s.proposed, s.accepted, s.bonus_tokens, s.fallback_steps, s.sequence_steps), (10, 5, 1, 1, 4));
        assert_eq!(a.tokens_per_step(), 9.0 / 4.0);
        assert_eq!(a.acceptance_rate(), 0.5);
        let c = a.step_counts();
        assert_eq!((c.sequences, c.proposed, c.accepted, c.bonus), (4, 10, 5, 1));
    }
}
