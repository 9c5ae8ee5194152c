//! The decode loop (DECODE-1 .. DECODE-5), after llama.cpp's
//! `llama-speculative`. Each step reads in four parts:
//!
//! 1. propose: the proposer drafts for every active sequence (its own noise);
//! 2. window (`window.rs`): one target forward over each sequence's
//!    `[last token, drafts..]`, its logit rows laid out for the verify;
//! 3. verify (`verify.rs`): greedy, DFlash or rejection sampling on the
//!    device, downloading only the emitted tokens and accepted counts;
//! 4. commit (`commit.rs`): emit up to a stop, roll the cache back, count.
//!
//! Invariants: a sequence's last token is never in the target cache before
//! the step that feeds it, so after every step the cache holds exactly the
//! prompt and the emitted tokens but the last (DECODE-5; KV-6); each
//! request draws its noise from its own streams in an order that depends
//! only on its own tokens, so its output does not depend on the batch
//! (DECODE-3); stop conditions cut an accepted run at its first stopping
//! token (DECODE-6, DECODE-7); a step without drafts is a plain decode step
//! through the same verify op (GREEDY-4 with `len_b = 0`).

use std::time::Instant;

use rand_pcg::Pcg64;
use specdec_backend::model::{ForwardRequest, LogitRows, ModelBackend};
use specdec_reference::controller::DynamicController;

use crate::DecodeError;
use crate::commit::commit;
pub use crate::config::MAX_K;
use crate::config::{EngineConfig, OnProposerError};
use crate::proposer::{Observed, ObservedSeq, Proposal, Proposer, SeqView};
use crate::request::{Acceptance, FinishReason, Output, Request, RunOutput, Timings};
use crate::seq::Seq;
use crate::sink::Sink;
use crate::stop::Detokenize;
use crate::{verify, window};

/// The speculative decoder over one target model on one backend.
pub struct Engine<'a, B: ModelBackend> {
    backend: &'a B,
    target: &'a B::Model,
    vocab: usize,
    max_positions: usize,
    config: EngineConfig,
}

impl<'a, B: ModelBackend> Engine<'a, B> {
    pub fn new(backend: &'a B, target: &'a B::Model, target_config: &specdec_backend::model::LlamaConfig, config: EngineConfig) -> Result<Self, DecodeError> {
        if let Some(c) = &config.controller {
            c.validate().map_err(|e| DecodeError::Config(format!("controller: {e}")))?;
        }
        if config.max_k() > MAX_K {
            return Err(DecodeError::Config(format!("k = {} is above the engine's limit of {MAX_K}", config.max_k())));
        }
        Ok(Engine { backend, target, vocab: target_config.vocab_size, max_positions: target_config.max_position_embeddings, config })
    }

    pub fn config(&self) -> &EngineConfig {
        &self.config
    }

    /// Generates every request to completion as one batch. An empty batch
    /// is a no-op (seed 001, scenario 14).
    pub fn generate(&self, requests: &[Request], proposer: &mut dyn Proposer<B>, detok: Option<&dyn Detokenize>, sink: &mut dyn Sink) -> Result<RunOutput, DecodeError> {
        if requests.is_empty() {
            return Ok(RunOutput { outputs: Vec::new(), acceptance: Acceptance::default(), batch_steps: 0, proposer_errors: 0, timings: Timings::default() });
        }
        self.run(requests, proposer, detok, sink).map(|(out, _)| out)
    }

    /// [`Engine::generate`], also returning the target cache (DECODE-5:
    /// it holds each prompt and its emitted tokens but the last).
    pub fn run(&self, requests: &[Request], proposer: &mut dyn Proposer<B>, detok: Option<&dyn Detokenize>, sink: &mut dyn Sink) -> Result<(RunOutput, B::ModelCache), DecodeError> {
        let b = self.backend;
        self.check_requests(requests, detok)?;
        let max_k = self.config.max_k();
        let wanted = requests.iter().map(|r| r.prompt.len() + r.max_tokens).max().unwrap_or(0) + max_k + 1;
        let capacity = wanted.min(self.max_positions);
        let mut cache = b.new_model_cache(self.target, requests.len(), capacity)?;
        let mut controller = self.config.controller.clone().map(DynamicController::new).transpose().map_err(|e| DecodeError::Config(e.to_string()))?;
        let mut timings = Timings::default();
        let faults = self.config.faults();
        let mut seqs: Vec<Seq<'_>> = requests.iter().enumerate().map(|(i, r)| Seq::new(r, faults.noise_seed(requests, i))).collect();

        let t = Instant::now();
        proposer.begin(b, requests.len(), capacity, max_k)?;
        self.prefill(&mut cache, &seqs, proposer)?;
        timings.prefill_s += t.elapsed().as_secs_f64();

        let (mut batch_steps, mut proposer_errors) = (0, 0);
        loop {
            let active: Vec<usize> = (0..seqs.len()).filter(|&i| seqs[i].finish.is_none()).collect();
            if active.is_empty() {
                break;
            }
            let lens = b.cache_lens(&cache);
            // A sequence whose next input no longer fits is out of positions.
            let full: Vec<usize> = active.iter().copied().filter(|&i| lens[i] + 1 > capacity).collect();
            if !full.is_empty() {
                full.into_iter().for_each(|i| seqs[i].finish = Some(FinishReason::Capacity));
                continue;
            }
            let k = controller.as_ref().map_or(self.config.k, |c| c.k(active.len()));

            // 1. Propose.
            let t = Instant::now();
            let proposal = match self.propose(proposer, &mut seqs, &active, k, capacity, &lens) {
                Ok(p) => p,
                Err(e) if self.config.on_proposer_error == OnProposerError::Fail => return Err(e),
                Err(_) => {
                    proposer_errors += 1;
                    Proposal::none(active.len())
                }
            };
            timings.propose_s += t.elapsed().as_secs_f64();

            // 2. The window forward, 3. its verify.
            let t = Instant::now();
            let win = window::forward(b, self.target, &mut cache, &seqs, &active, &proposal, proposer.hidden_layers(), self.config.faults())?;
            let verdict = verify::verify(b, self.vocab, &self.config, &win, &mut seqs, &active, &proposal)?;
            timings.verify_s += t.elapsed().as_secs_f64();
            batch_steps += 1;

            // 4. Commit, and the controller's update from the step's counts.
            let t = Instant::now();
            let proposed: Vec<usize> = proposal.drafts.iter().map(Vec::len).collect();
            let step = commit(b, &mut cache, &self.config, &mut seqs, &active, &proposed, &verdict, detok, sink)?;
            if let Some(c) = controller.as_mut() {
                if k == 0 {
                    c.record_fallback();
                } else {
                    c.update(step.counts.step_counts()).map_err(|e| DecodeError::Internal(e.to_string()))?;
                }
            }
            timings.rest_s += t.elapsed().as_secs_f64();

            let t = Instant::now();
            let observed: Vec<ObservedSeq<'_>> =
                active.iter().zip(&step.kept).map(|(&i, &kept)| ObservedSeq { slot: i, context: &seqs[i].context, kept, finished: seqs[i].finish.is_some() }).collect();
            proposer.observe(b, &Observed { seqs: &observed, plan: &win.plan, hidden: win.hidden.as_ref() })?;
            timings.propose_s += t.elapsed().as_secs_f64();
        }

        let mut acceptance = Acceptance::default();
        let outputs = seqs
            .into_iter()
            .map(|s| {
                acceptance.merge(&s.acceptance);
                Output { tokens: s.out, finish: s.finish.expect("the loop ends when every sequence has finished"), acceptance: s.acceptance }
            })
            .collect();
        Ok((RunOutput { outputs, acceptance, batch_steps, proposer_errors, timings }, cache))
    }

    /// Every request against the model, before anything is allocated (ERR-1).
    fn check_requests(&self, requests: &[Request], detok: Option<&dyn Detokenize>) -> Result<(), DecodeError> {
        if requests.is_empty() {
            return Err(DecodeError::Request { index: 0, reason: "no requests".into() });
        }
        for (i, r) in requests.iter().enumerate() {
            r.validate(i, self.vocab)?;
            if !r.stop_strings.is_empty() && detok.is_none() {
                return Err(DecodeError::Request { index: i, reason: "stop strings need a detokenizer".into() });
            }
            if r.prompt.len() >= self.max_positions {
                return Err(DecodeError::Request { index: i, reason: format!("{} prompt tokens leave no room in the model's {} positions", r.prompt.len(), self.max_positions) });
            }
        }
        Ok(())
    }

    /// Feeds every prompt but its last token (which the first step feeds).
    fn prefill(&self, cache: &mut B::ModelCache, seqs: &[Seq<'_>], proposer: &mut dyn Proposer<B>) -> Result<(), DecodeError> {
        let tokens: Vec<Vec<u32>> = seqs.iter().map(|s| s.context[..s.context.len() - 1].to_vec()).collect();
        if tokens.iter().all(Vec::is_empty) {
            return Ok(());
        }
        let hidden_layers = proposer.hidden_layers().to_vec();
        let out = self.backend.forward(self.target, cache, &ForwardRequest { tokens: &tokens, logits: LogitRows::None, hidden_layers: &hidden_layers })?;
        let observed: Vec<ObservedSeq<'_>> =
            seqs.iter().enumerate().filter(|(i, _)| !tokens[*i].is_empty()).map(|(i, s)| ObservedSeq { slot: i, context: &s.context, kept: tokens[i].len(), finished: false }).collect();
        proposer.observe(self.backend, &Observed { seqs: &observed, plan: &out.plan, hidden: out.hidden.as_ref() })
    }

    /// Asks the proposer for at most `k` drafts per active sequence (each
    /// within its cache room), with each sequence's own draft stream, and
    /// checks its contract. The streams keep what the proposer drew, even
    /// when it failed (a plain step then follows, OnProposerError::PlainStep).
    fn propose(&self, proposer: &mut dyn Proposer<B>, seqs: &mut [Seq<'_>], active: &[usize], k: usize, capacity: usize, lens: &[usize]) -> Result<Proposal<B::Tensor>, DecodeError> {
        if k == 0 {
            return Ok(Proposal::none(active.len()));
        }
        let views: Vec<SeqView<'_>> = active.iter().map(|&i| SeqView { slot: i, context: &seqs[i].context, max_drafts: k.min(capacity - lens[i] - 1), sampling: seqs[i].req.sampling }).collect();
        let mut rngs: Vec<Pcg64> = active.iter().map(|&i| seqs[i].draft_rng.clone()).collect();
        let proposal = proposer.propose(self.backend, &views, &mut rngs).and_then(|p| self.check_proposal(&p, &views, &proposer.name()).map(|()| p));
        for (&i, r) in active.iter().zip(rngs) {
            seqs[i].draft_rng = r;
        }
        proposal
    }

    /// Rejects a proposal that breaks its contract before it reaches the device.
    fn check_proposal(&self, p: &Proposal<B::Tensor>, views: &[SeqView<'_>], name: &str) -> Result<(), DecodeError> {
        if p.drafts.len() != views.len() {
            return Err(DecodeError::proposer(name, format!("{} draft lists for {} sequences", p.drafts.len(), views.len())));
        }
        for (d, v) in p.drafts.iter().zip(views) {
            if d.len() > v.max_drafts {
                return Err(DecodeError::proposer(name, format!("sequence {}: {} drafts, at most {} allowed", v.slot, d.len(), v.max_drafts)));
            }
            if let Some(t) = d.iter().find(|&&t| t as usize >= self.vocab) {
                return Err(DecodeError::proposer(name, format!("sequence {}: draft id {t} is outside the vocabulary of {}", v.slot, self.vocab)));
            }
        }
        if let Some((_, width)) = &p.draft_probs
            && let Some(d) = p.drafts.iter().find(|d| d.len() > *width)
        {
            return Err(DecodeError::proposer(name, format!("{} drafts but draft probabilities of width {width}", d.len())));
        }
        Ok(())
    }
}
