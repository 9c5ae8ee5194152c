//! The decode loop (DECODE-1 .. DECODE-5), after llama.cpp's
//! `llama-speculative`: propose, one target forward over each sequence's
//! `[last token, drafts..]` (ragged), verify on the device, download only
//! the emitted tokens and accepted counts, roll the caches back, emit.
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

use rand::RngExt;
use rand_pcg::Pcg64;
use specdec_backend::model::{ForwardRequest, LogitRows, ModelBackend};
use specdec_backend::{Comparator, DrawNoiseArg, PAD, RejectionArgs, RejectionNoise, Verified};
use specdec_reference::controller::{DynamicController, SpecConfig, StepCounts};

use crate::DecodeError;
use crate::device;
use crate::proposer::{Observed, ObservedSeq, Proposal, Proposer, SeqView, VerifyRule};
use crate::request::{Acceptance, FinishReason, Output, Request, RunOutput, Timings};
use crate::stop::{Appended, Detokenize, StopState};

/// How the caches are rolled back after a verify step (KV-6, KV-7).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Rollback {
    /// Each sequence keeps its own accepted drafts (KV-4, KV-6).
    #[default]
    PerSequence,
    /// Seed 001's min-accepted strategy (KV-7): every sequence emits the
    /// batch's smallest accepted count plus one token. Lossless (erratum
    /// E5), but sequences give up drafts their neighbours rejected.
    MinAccepted,
}

/// A decoder bug peers have shipped, injected so the end-to-end checks can
/// prove they reject it (negative controls only: the config field that
/// selects one exists with the `negative-controls` feature alone).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// Trims one position more than the rejected drafts (seed 001's
    /// Conflict-2 example, erratum E5).
    RollbackOffByOne,
    /// Takes the bonus distribution from the last draft's row, not row
    /// `len_b` (erratum E11).
    BonusFromWrongRow,
    /// Ignores eos inside an accepted run (emits the drafts after it).
    AcceptPastEos,
}

/// What a failing proposer does to a step (seed 001, scenario 13).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum OnProposerError {
    /// The run fails with the proposer's typed error.
    #[default]
    Fail,
    /// The step runs as a plain decode step and the failure is counted
    /// (`RunOutput::proposer_errors`); the proposer is asked again next step.
    PlainStep,
}

/// Engine settings.
#[derive(Debug, Clone)]
pub struct EngineConfig {
    /// Drafts per step at most (`k`); 0 decodes plainly.
    pub k: usize,
    pub rollback: Rollback,
    /// Seed 001's dynamic controller (CTRL-2 .. CTRL-4): when set, it picks
    /// each step's `k` (its `num_speculative_tokens` replaces `k`).
    pub controller: Option<SpecConfig>,
    /// Use the checked verify ops (a validity read-back per op) instead of
    /// the unchecked hot path (GLUE-6); the results are the same.
    pub checked: bool,
    pub on_proposer_error: OnProposerError,
    #[cfg(feature = "negative-controls")]
    pub fault: Option<Fault>,
}

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig {
            k: 4,
            rollback: Rollback::PerSequence,
            controller: None,
            checked: false,
            on_proposer_error: OnProposerError::Fail,
            #[cfg(feature = "negative-controls")]
            fault: None,
        }
    }
}

impl EngineConfig {
    fn has_fault(&self, f: Fault) -> bool {
        #[cfg(feature = "negative-controls")]
        return self.fault == Some(f);
        #[cfg(not(feature = "negative-controls"))]
        {
            let _ = f;
            false
        }
    }

    fn max_k(&self) -> usize {
        self.controller.as_ref().map_or(self.k, |c| c.num_speculative_tokens)
    }
}

/// Where a stream of emitted tokens goes, as they are decided.
pub trait Sink {
    /// `ids` are request `slot`'s next tokens, in order, each exactly once.
    fn emit(&mut self, slot: usize, ids: &[u32]);
}

impl<F: FnMut(usize, &[u32])> Sink for F {
    fn emit(&mut self, slot: usize, ids: &[u32]) {
        self(slot, ids)
    }
}

/// Discards the stream.
pub struct NoSink;

impl Sink for NoSink {
    fn emit(&mut self, _: usize, _: &[u32]) {}
}

/// The speculative decoder over one target model on one backend.
pub struct Engine<'a, B: ModelBackend> {
    backend: &'a B,
    target: &'a B::Model,
    vocab: usize,
    max_positions: usize,
    config: EngineConfig,
}

/// One request's state during a run.
struct Seq<'r> {
    req: &'r Request,
    /// Prompt and emitted tokens; the last is the next input.
    context: Vec<u32>,
    out: Vec<u32>,
    finish: Option<FinishReason>,
    verify_rng: Pcg64,
    draft_rng: Pcg64,
    acceptance: Acceptance,
    stop: StopState<'r>,
}

/// The noise streams of a request: verify and draft, independent (DECODE-3).
pub fn noise_streams(seed: u64) -> (Pcg64, Pcg64) {
    // Distinct PCG streams of one seed (odd increments), not seed arithmetic.
    (Pcg64::new(u128::from(seed), 0x5851_f42d_4c95_7f2d_1405_7b7e_f767_814f), Pcg64::new(u128::from(seed), 0xda3e_39cb_94b9_5bdb_0a8f_2f6d_3b4b_8a71))
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
        let max_k = self.config.max_k();
        let wanted = requests.iter().map(|r| r.prompt.len() + r.max_tokens).max().unwrap_or(0) + max_k + 1;
        let capacity = wanted.min(self.max_positions);
        let mut cache = b.new_model_cache(self.target, requests.len(), capacity)?;
        let mut controller = self.config.controller.clone().map(DynamicController::new).transpose().map_err(|e| DecodeError::Config(e.to_string()))?;
        let mut timings = Timings::default();
        let mut seqs: Vec<Seq<'_>> = requests
            .iter()
            .map(|r| {
                let (verify_rng, draft_rng) = noise_streams(r.seed);
                Seq { req: r, context: r.prompt.clone(), out: Vec::new(), finish: None, verify_rng, draft_rng, acceptance: Acceptance::default(), stop: StopState::new(r) }
            })
            .collect();

        let t = Instant::now();
        proposer.begin(b, requests.len(), capacity, max_k)?;
        self.prefill(&mut cache, &seqs, proposer)?;
        timings.prefill_s += t.elapsed().as_secs_f64();

        let (mut batch_steps, mut proposer_errors) = (0, 0);
        let proposer_name = proposer.name();
        loop {
            let active: Vec<usize> = (0..seqs.len()).filter(|&i| seqs[i].finish.is_none()).collect();
            if active.is_empty() {
                break;
            }
            let lens = b.cache_lens(&cache);
            // A sequence whose next input no longer fits is out of positions.
            let mut any_full = false;
            for &i in &active {
                if lens[i] + 1 > capacity {
                    seqs[i].finish = Some(FinishReason::Capacity);
                    any_full = true;
                }
            }
            if any_full {
                continue;
            }
            let k = match controller.as_ref() {
                Some(c) => c.k(active.len()),
                None => self.config.k,
            };
            let t = Instant::now();
            let views: Vec<SeqView<'_>> = active.iter().map(|&i| SeqView { slot: i, context: &seqs[i].context, max_drafts: k.min(capacity - lens[i] - 1), sampling: seqs[i].req.sampling }).collect();
            let mut rngs: Vec<Pcg64> = active.iter().map(|&i| seqs[i].draft_rng.clone()).collect();
            let proposed = if k == 0 { Ok(Proposal::none(active.len())) } else { proposer.propose(b, &views, &mut rngs).and_then(|p| self.check_proposal(&p, &views, &proposer_name).map(|()| p)) };
            let proposal = match (proposed, self.config.on_proposer_error) {
                (Ok(p), _) => p,
                (Err(e), OnProposerError::Fail) => return Err(e),
                (Err(_), OnProposerError::PlainStep) => {
                    proposer_errors += 1;
                    Proposal::none(active.len())
                }
            };
            for (&i, r) in active.iter().zip(rngs) {
                seqs[i].draft_rng = r;
            }
            timings.propose_s += t.elapsed().as_secs_f64();

            let t = Instant::now();
            let step = self.verify(&mut cache, &mut seqs, &active, &proposal, proposer.hidden_layers())?;
            timings.verify_s += t.elapsed().as_secs_f64();
            batch_steps += 1;

            let t = Instant::now();
            let mut amounts = vec![0usize; seqs.len()];
            let mut counts = StepCounts { sequences: active.len() as u64, ..StepCounts::default() };
            let shared = match self.config.rollback {
                Rollback::PerSequence => None,
                Rollback::MinAccepted => step.num_accepted.iter().min().copied(),
            };
            let mut kept = Vec::with_capacity(active.len());
            for (pos, &i) in active.iter().enumerate() {
                let proposed = proposal.drafts[pos].len();
                let n = shared.unwrap_or(step.num_accepted[pos]);
                counts.proposed += proposed as u64;
                counts.accepted += n as u64;
                counts.bonus += u64::from(proposed > 0 && n == proposed);
                seqs[i].acceptance.record(proposed, n);
                // The forward appended the last token and the drafts; keep
                // the last token and the emitted ones but the new last (KV-6),
                // fewer when a stop cut the run (DECODE-5).
                let emitted = self.emit(&mut seqs[i], i, &step.tokens[pos][..=n], detok, sink);
                let mut trim = 1 + proposed - emitted;
                if self.config.has_fault(Fault::RollbackOffByOne) {
                    trim += 1;
                }
                amounts[i] = trim;
                kept.push(emitted);
            }
            b.cache_trim(&mut cache, &amounts)?;
            if let Some(c) = controller.as_mut() {
                if k == 0 {
                    c.record_fallback();
                } else {
                    c.update(counts).map_err(|e| DecodeError::Internal(e.to_string()))?;
                }
            }
            timings.rest_s += t.elapsed().as_secs_f64();

            let t = Instant::now();
            let observed: Vec<ObservedSeq<'_>> = active.iter().zip(&kept).map(|(&i, &kept)| ObservedSeq { slot: i, context: &seqs[i].context, kept, finished: seqs[i].finish.is_some() }).collect();
            proposer.observe(b, &Observed { seqs: &observed, plan: &step.plan, hidden: step.hidden.as_ref() })?;
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

    /// One target forward and one verify op for the active sequences.
    fn verify(&self, cache: &mut B::ModelCache, seqs: &mut [Seq<'_>], active: &[usize], p: &Proposal<B::Tensor>, hidden_layers: &[usize]) -> Result<StepResult<B::Tensor>, DecodeError> {
        let b = self.backend;
        let a = active.len();
        let mut tokens = vec![Vec::new(); seqs.len()];
        for (pos, &i) in active.iter().enumerate() {
            let last = *seqs[i].context.last().expect("contexts are never empty");
            tokens[i] = std::iter::once(last).chain(p.drafts[pos].iter().copied()).collect();
        }
        let q_width = p.draft_probs.as_ref().map_or(0, |(_, w)| *w);
        let width = p.drafts.iter().map(Vec::len).max().unwrap_or(0).max(q_width).max(1);
        let out = b.forward(self.target, cache, &ForwardRequest { tokens: &tokens, logits: LogitRows::All, hidden_layers })?;
        let logits = out.logits.as_ref().ok_or_else(|| DecodeError::Internal("the verify forward returned no logits".into()))?;

        // Lay the ragged rows out as [A, width + 1, V]; PAD rows are padding (CONV-7).
        let mut index = Vec::with_capacity(a * (width + 1));
        // Every active sequence fed at least its last token, so the plan's
        // rows are the active sequences, in batch order (MODEL-8).
        if out.plan.rows.len() != a || out.plan.rows.iter().zip(active).any(|(r, &i)| r.seq != i) {
            return Err(DecodeError::Internal("the verify forward's rows are not the active sequences in order".into()));
        }
        for (pos, rows) in out.plan.rows.iter().enumerate() {
            let len = p.drafts[pos].len();
            for j in 0..=width {
                let row = if j == len && len > 0 && self.config.has_fault(Fault::BonusFromWrongRow) { j - 1 } else { j };
                index.push(if j <= len { (rows.logit_row + row) as i64 } else { PAD });
            }
        }
        let index = device::upload_i64(b, vec![index.len()], index)?;
        let rows = b.gather_rows(logits, &index)?;
        let mut draft_ids = Vec::with_capacity(a * width);
        for d in &p.drafts {
            draft_ids.extend(d.iter().map(|&t| i64::from(t)));
            draft_ids.extend(std::iter::repeat_n(PAD, width - d.len()));
        }
        let drafts = device::upload_i64(b, vec![a, width], draft_ids)?;
        let lens = device::upload_i64(b, vec![a], p.drafts.iter().map(|d| d.len() as i64).collect())?;
        let greedy = active.iter().all(|&i| seqs[i].req.sampling.temperature == 0.0);

        let verified = if greedy && p.rule == VerifyRule::DflashBlock && p.drafts.iter().all(|d| d.len() == width) {
            self.dflash_verify(&rows, seqs, active, p, width)?
        } else if greedy {
            let scores = b.reshape(&rows, &[a, width + 1, self.vocab])?;
            let v = if self.config.checked { b.greedy_verify(&scores, &drafts, &lens)? } else { b.greedy_verify_unchecked(&scores, &drafts, &lens)? };
            self.download(&v, a, width)?
        } else {
            let params: Vec<_> = active.iter().flat_map(|&i| std::iter::repeat_n(seqs[i].req.sampling, width + 1)).collect();
            let probs = device::process(b, &rows, &params)?;
            let probs = b.reshape(&probs, &[a, width + 1, self.vocab])?;
            let q = match &p.draft_probs {
                Some((q, w)) if *w == width => Some(q.clone()),
                Some((q, w)) => {
                    // Widen q to the verify width with padding rows (never read: CONV-7).
                    let mut idx = Vec::with_capacity(a * width);
                    for pos in 0..a {
                        idx.extend((0..width).map(|j| if j < *w { (pos * w + j) as i64 } else { PAD }));
                    }
                    let flat = b.reshape(q, &[a * w, self.vocab])?;
                    let idx = device::upload_i64(b, vec![idx.len()], idx)?;
                    Some(b.reshape(&b.gather_rows(&flat, &idx)?, &[a, width, self.vocab])?)
                }
                None => None,
            };
            // Each request draws its own uniforms: one per draft, one for the drawn token.
            let (mut u, mut v) = (Vec::with_capacity(a * width), Vec::with_capacity(a * (width + 1)));
            for (pos, &i) in active.iter().enumerate() {
                let rng = &mut seqs[i].verify_rng;
                let len = p.drafts[pos].len();
                u.extend((0..width).map(|j| if j < len { rng.random::<f64>() } else { 0.5 }));
                // Exactly one draw row is read (row n_b); one uniform serves it.
                let draw = rng.random::<f64>();
                v.extend(std::iter::repeat_n(draw, width + 1));
            }
            let u = device::upload_f64(b, vec![a, width], u)?;
            let v = device::upload_f64(b, vec![a, width + 1], v)?;
            let args = RejectionArgs { target_probs: &probs, draft_probs: q.as_ref(), draft_tokens: &drafts, proposal_lens: &lens };
            let noise = RejectionNoise { accept_uniforms: &u, draw: DrawNoiseArg::InverseCdf(&v) };
            let out = if self.config.checked { b.rejection_verify(args, noise, Comparator::Strict)? } else { b.rejection_verify_unchecked(args, noise, Comparator::Strict)? };
            self.download(&out, a, width)?
        };
        Ok(StepResult { tokens: verified.0, num_accepted: verified.1, plan: out.plan, hidden: out.hidden })
    }

    /// DFLASH-1 .. DFLASH-3 on full blocks `[last, drafts..]` at temperature 0.
    fn dflash_verify(&self, rows: &B::Tensor, seqs: &[Seq<'_>], active: &[usize], p: &Proposal<B::Tensor>, width: usize) -> Result<(Vec<Vec<u32>>, Vec<usize>), DecodeError> {
        let b = self.backend;
        let a = active.len();
        let greedy = vec![seqs[active[0]].req.sampling; a * (width + 1)];
        let one_hot = device::process(b, rows, &greedy)?;
        let half = device::upload_f64(b, vec![a * (width + 1)], vec![0.5; a * (width + 1)])?;
        let predict = b.draw(&one_hot, DrawNoiseArg::InverseCdf(&half))?;
        let predict = b.reshape(&predict, &[a, width + 1])?;
        let mut cand = Vec::with_capacity(a * (width + 1));
        for (pos, &i) in active.iter().enumerate() {
            cand.push(i64::from(*seqs[i].context.last().expect("contexts are never empty")));
            cand.extend(p.drafts[pos].iter().map(|&t| i64::from(t)));
        }
        let cand = device::upload_i64(b, vec![a, width + 1], cand)?;
        let out = b.dflash_accept(&cand, &predict, self.vocab)?;
        let n = device::download_ids(b, &out.accept_len)?;
        let bonus = device::download_ids(b, &out.bonus)?;
        let tokens = (0..a).map(|pos| p.drafts[pos][..n[pos] as usize].iter().copied().chain([bonus[pos]]).collect()).collect();
        Ok((tokens, n.into_iter().map(|x| x as usize).collect()))
    }

    /// Downloads a verify's emitted tokens (`[A, width + 1]`, PAD after) and counts.
    fn download(&self, v: &Verified<B::Tensor>, a: usize, width: usize) -> Result<(Vec<Vec<u32>>, Vec<usize>), DecodeError> {
        let n = device::download_ids(self.backend, &v.num_accepted)?;
        let all = self.backend.download_i64(&v.tokens)?;
        let mut tokens = Vec::with_capacity(a);
        for (pos, &n) in n.iter().enumerate() {
            let row = &all.data()[pos * (width + 1)..][..=n as usize];
            tokens.push(row.iter().map(|&t| u32::try_from(t).map_err(|_| DecodeError::Internal(format!("the verify emitted id {t}")))).collect::<Result<Vec<_>, _>>()?);
        }
        Ok((tokens, n.into_iter().map(|x| x as usize).collect()))
    }

    /// Appends a step's tokens to a sequence until a stop condition holds;
    /// returns how many were emitted.
    fn emit(&self, s: &mut Seq<'_>, slot: usize, tokens: &[u32], detok: Option<&dyn Detokenize>, sink: &mut dyn Sink) -> usize {
        let start = s.out.len();
        let past_eos = self.config.has_fault(Fault::AcceptPastEos);
        for (j, &t) in tokens.iter().enumerate() {
            s.out.push(t);
            s.context.push(t);
            match s.stop.check(&s.out, detok) {
                Appended::Finished(FinishReason::Eos) if past_eos && j + 1 < tokens.len() => {}
                Appended::Finished(reason) => {
                    s.finish = Some(reason);
                    break;
                }
                Appended::Continue => {}
            }
        }
        sink.emit(slot, &s.out[start..]);
        s.out.len() - start
    }
}

/// The largest `k` the engine accepts.
pub const MAX_K: usize = 64;

struct StepResult<T> {
    tokens: Vec<Vec<u32>>,
    num_accepted: Vec<usize>,
    plan: specdec_backend::model::ForwardPlan,
    hidden: Option<T>,
}
