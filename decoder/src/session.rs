//! A session: the decode loop over a fixed set of request slots, which
//! requests join and leave between steps (continuous batching).
//!
//! [`Engine::run`](crate::Engine::run) is one session that admits its whole
//! batch and steps it to the end; `specdec serve` keeps one session for its
//! lifetime and admits each request into a free slot at the next step
//! boundary. Both run the same [`Session::step`], so what the end-to-end
//! checks prove of `run` holds for a server.
//!
//! Invariants: a slot's target cache is empty when a request is admitted
//! into it (the previous occupant's positions are trimmed away, and its
//! proposer state released); a request's noise comes from its own streams
//! and its rows from its own cache slot, so its output does not depend on
//! when it joined or who else ran (DECODE-3), nor on whether its prompt was
//! fed at once or in slices between steps (chunked prefill); a finished
//! request keeps its slot until its output is taken; a cancelled one frees
//! it at once.

use std::time::Instant;

use rand_pcg::Pcg64;
use specdec_backend::model::{ForwardRequest, LogitRows, ModelBackend};

use crate::commit::commit;
use crate::config::OnProposerError;
use crate::engine::Engine;
use crate::error::DecodeError;
use crate::ledger::{Ledger, Phase};
use crate::logprobs::step_logprobs;
use crate::proposer::{Observed, ObservedSeq, Proposal, Proposer, SeqView};
use crate::request::{Acceptance, FinishReason, Output, Request, RunOutput, Timings};
use crate::seq::Seq;
use crate::sink::Sink;
use crate::stop::Detokenize;
use crate::{masks, verify, window};
use specdec_reference::TokenLogprob;

/// What a slot holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Slot {
    /// Free: no request, nothing in its cache that matters.
    Free,
    /// A request admitted by [`Session::admit_unfed`] whose prompt is being
    /// fed in slices ([`Session::prefill_some`]); `fed` of its tokens are in
    /// its cache. It joins the steps once all but the last are. `since`
    /// orders the prefilling requests by admission.
    Prefilling { fed: usize, since: u64 },
    /// A request that is generating or whose output awaits [`Session::take`].
    Busy,
}

/// The decode loop over `slots` request slots (see the module doc).
pub struct Session<'s, B: ModelBackend> {
    engine: &'s Engine<'s, B>,
    proposer: &'s mut dyn Proposer<B>,
    cache: B::ModelCache,
    capacity: usize,
    seqs: Vec<Seq>,
    slots: Vec<Slot>,
    ledger: Ledger,
    /// Requests admitted unfed so far (their order, for [`Slot::Prefilling`]).
    unfed: u64,
}

impl<'a, B: ModelBackend> Engine<'a, B> {
    /// A session of `slots` request slots whose contexts fit `capacity`
    /// positions: requests join it ([`Session::admit`]) and leave it
    /// ([`Session::take`], [`Session::cancel`]) between steps, so a server
    /// batches continuously. [`Engine::run`] is one session.
    pub fn session<'s>(&'s self, slots: usize, capacity: usize, proposer: &'s mut dyn Proposer<B>) -> Result<Session<'s, B>, DecodeError> {
        Session::new(self, slots, capacity, proposer)
    }
}

impl<'s, B: ModelBackend> Session<'s, B> {
    fn new(engine: &'s Engine<'s, B>, slots: usize, capacity: usize, proposer: &'s mut dyn Proposer<B>) -> Result<Self, DecodeError> {
        if slots == 0 {
            return Err(DecodeError::Config("a session needs at least one slot".into()));
        }
        if capacity < 2 || capacity > engine.max_positions {
            return Err(DecodeError::Config(format!("a session's capacity of {capacity} positions must be in [2, {}] (the model's)", engine.max_positions)));
        }
        let b = engine.backend;
        let t = Instant::now();
        let cache = b.new_model_cache(engine.target, slots, capacity)?;
        if let Some(fault) = engine.config.faults().0 {
            proposer.inject(fault);
        }
        proposer.begin(b, slots, capacity, engine.config.max_k())?;
        let ledger = Ledger::new(&engine.config, Timings { prefill_s: t.elapsed().as_secs_f64(), ..Timings::default() })?;
        let seqs = (0..slots).map(|_| Seq::vacant()).collect();
        Ok(Session { engine, proposer, cache, capacity, seqs, slots: vec![Slot::Free; slots], ledger, unfed: 0 })
    }

    /// Positions a slot's context may fill (prompt, output and one step's drafts).
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Slots that hold no request.
    pub fn free_slots(&self) -> usize {
        self.slots.iter().filter(|s| **s == Slot::Free).count()
    }

    /// Requests still generating.
    pub fn active(&self) -> usize {
        self.active_slots().len()
    }

    fn active_slots(&self) -> Vec<usize> {
        (0..self.seqs.len()).filter(|&i| self.slots[i] == Slot::Busy && self.seqs[i].finish.is_none()).collect()
    }

    /// Whether `slot` holds a request whose prompt is still being fed.
    pub fn is_prefilling(&self, slot: usize) -> bool {
        matches!(self.slots.get(slot), Some(Slot::Prefilling { .. }))
    }

    /// Requests admitted whose prompts are still being fed.
    pub fn prefilling(&self) -> usize {
        self.slots.iter().filter(|s| matches!(s, Slot::Prefilling { .. })).count()
    }

    /// Admits `requests` into free slots (lowest first) and feeds their
    /// prompts but the last token, in one forward; returns their slots. All
    /// are checked before any is admitted (ERR-1); too few free slots is an
    /// error, never a wait.
    pub fn admit(&mut self, requests: Vec<Request>, detok: Option<&dyn Detokenize>) -> Result<Vec<usize>, DecodeError> {
        let t = Instant::now();
        let slots = self.reserve(requests, detok)?;
        let spans: Vec<(usize, std::ops::Range<usize>)> = slots.iter().map(|&i| (i, 0..self.seqs[i].context.len() - 1)).collect();
        let prefilled = self.feed(&spans);
        self.ledger.timings.prefill_s += t.elapsed().as_secs_f64();
        if let Err(e) = prefilled {
            for &slot in &slots {
                self.slots[slot] = Slot::Free;
            }
            return Err(e);
        }
        Ok(slots)
    }

    /// Admits `requests` as [`Session::admit`] does but feeds nothing yet:
    /// [`Session::prefill_some`] feeds their prompts in slices between
    /// steps (chunked prefill), so a long prompt does not hold up the
    /// requests already generating. Each joins the steps once its prompt
    /// but the last token is in its cache; what it generates is what
    /// [`Session::admit`] would give (the same rows, fed in more forwards).
    pub fn admit_unfed(&mut self, requests: Vec<Request>, detok: Option<&dyn Detokenize>) -> Result<Vec<usize>, DecodeError> {
        let slots = self.reserve(requests, detok)?;
        for &i in &slots {
            if self.seqs[i].context.len() > 1 {
                self.slots[i] = Slot::Prefilling { fed: 0, since: self.unfed };
                self.unfed += 1;
            }
        }
        Ok(slots)
    }

    /// Feeds at most `budget` prompt tokens of the requests admitted by
    /// [`Session::admit_unfed`], in one forward: the longest-waiting prompt
    /// first gets half the budget (so none waits forever), then the prompts
    /// with the fewest tokens left get the rest (ties to the lowest slot),
    /// so a short prompt that arrives beside a long one starts generating
    /// at the next step. Returns the slots whose prompts are now fed (they
    /// join the next step). On an error the slots stay as they were;
    /// [`Session::cancel`] frees them.
    pub fn prefill_some(&mut self, budget: usize) -> Result<Vec<usize>, DecodeError> {
        if budget == 0 {
            return Err(DecodeError::Config("a prefill budget of 0 tokens feeds nothing".into()));
        }
        let t = Instant::now();
        // (tokens left, slot, fed, admission order) of every prompt being fed.
        let waiting: Vec<(usize, usize, usize, u64)> = (0..self.slots.len())
            .filter_map(|i| match self.slots[i] {
                Slot::Prefilling { fed, since } => Some((self.seqs[i].context.len() - 1 - fed, i, fed, since)),
                _ => None,
            })
            .collect();
        let mut amount = vec![0usize; self.slots.len()];
        let mut left = budget;
        if let Some(&(remaining, i, _, _)) = waiting.iter().min_by_key(|w| w.3) {
            amount[i] = remaining.min((budget / 2).max(1));
            left -= amount[i];
        }
        let mut by_need: Vec<(usize, usize)> = waiting.iter().map(|&(remaining, i, _, _)| (remaining - amount[i], i)).collect();
        by_need.sort_unstable();
        for (need, i) in by_need {
            let more = need.min(left);
            amount[i] += more;
            left -= more;
        }
        let spans: Vec<(usize, std::ops::Range<usize>)> =
            waiting.iter().filter(|&&(_, i, _, _)| amount[i] > 0).map(|&(_, i, fed, _)| (i, self.engine.config.faults().slice_start(fed)..fed + amount[i])).collect();
        self.feed(&spans)?;
        self.ledger.timings.prefill_s += t.elapsed().as_secs_f64();
        let mut ready = Vec::new();
        for (i, span) in spans {
            self.slots[i] = match self.slots[i] {
                _ if span.end == self.seqs[i].context.len() - 1 => {
                    ready.push(i);
                    Slot::Busy
                }
                Slot::Prefilling { since, .. } => Slot::Prefilling { fed: span.end, since },
                other => other,
            };
        }
        Ok(ready)
    }

    /// Checks `requests` and gives each a free slot (lowest first), its
    /// earlier occupant's state gone; nothing is fed.
    fn reserve(&mut self, requests: Vec<Request>, detok: Option<&dyn Detokenize>) -> Result<Vec<usize>, DecodeError> {
        for (i, r) in requests.iter().enumerate() {
            self.engine.check_request(i, r, self.capacity, detok)?;
        }
        let free: Vec<usize> = (0..self.slots.len()).filter(|&i| self.slots[i] == Slot::Free).take(requests.len()).collect();
        if free.len() < requests.len() {
            return Err(DecodeError::Config(format!("{} requests for {} free slots", requests.len(), free.len())));
        }
        // An earlier occupant's cache positions and proposer state go first.
        let lens = self.engine.backend.cache_lens(&self.cache);
        let mut trim = vec![0; self.slots.len()];
        let clears = self.engine.config.faults().clears_slots();
        for &slot in &free {
            trim[slot] = if clears { lens[slot] } else { 0 };
            self.proposer.release(self.engine.backend, slot)?;
        }
        if trim.iter().any(|&n| n > 0) {
            self.engine.backend.cache_trim(&mut self.cache, &trim)?;
        }
        let faults = self.engine.config.faults();
        let seeds: Vec<u64> = (0..requests.len()).map(|i| faults.noise_seed(&requests, i)).collect();
        for ((&slot, r), seed) in free.iter().zip(requests).zip(seeds) {
            self.seqs[slot] = Seq::new(r, seed);
            self.slots[slot] = Slot::Busy;
        }
        Ok(free)
    }

    /// Feeds each slot's span of its prompt (never its last token, which the
    /// first step feeds) in one forward, and tells the proposer.
    fn feed(&mut self, spans: &[(usize, std::ops::Range<usize>)]) -> Result<(), DecodeError> {
        let b = self.engine.backend;
        let mut tokens: Vec<Vec<u32>> = vec![Vec::new(); self.seqs.len()];
        for (i, span) in spans {
            tokens[*i] = self.seqs[*i].context[span.clone()].to_vec();
        }
        if tokens.iter().all(Vec::is_empty) {
            return Ok(());
        }
        let hidden_layers = self.proposer.hidden_layers().to_vec();
        let out = b.forward(self.engine.target, &mut self.cache, &ForwardRequest { tokens: &tokens, logits: LogitRows::None, hidden_layers: &hidden_layers })?;
        let observed: Vec<ObservedSeq<'_>> =
            spans.iter().filter(|(i, _)| !tokens[*i].is_empty()).map(|(i, _)| ObservedSeq { slot: *i, context: &self.seqs[*i].context, kept: tokens[*i].len(), finished: false }).collect();
        self.proposer.observe(b, &Observed { seqs: &observed, plan: &out.plan, hidden: out.hidden.as_ref() })
    }

    /// One step of every active request: propose, the window forward, its
    /// verify, commit (DECODE-1 .. DECODE-5). Returns the slots that
    /// finished in it (their outputs wait for [`Session::take`]).
    pub fn step(&mut self, detok: Option<&dyn Detokenize>, sink: &mut dyn Sink) -> Result<Vec<usize>, DecodeError> {
        let b = self.engine.backend;
        let config = &self.engine.config;
        let lens = b.cache_lens(&self.cache);
        let mut finished = self.finish_out_of_room(&lens);
        let active = self.active_slots();
        if active.is_empty() {
            return Ok(finished);
        }
        let k = self.ledger.begin(active.len(), config.k);

        // 1. Propose.
        let t = Instant::now();
        let proposal = match self.propose(&active, k, &lens) {
            Ok(p) => p,
            Err(e) if config.on_proposer_error == OnProposerError::Fail => return Err(e),
            Err(_) => {
                self.ledger.proposer_errors += 1;
                Proposal::none(active.len())
            }
        };
        self.ledger.lap(Phase::Propose, t);

        // 2. The window forward, 3. its verify.
        let t = Instant::now();
        let win = window::forward(b, self.engine.target, &mut self.cache, &self.seqs, &active, &proposal, self.proposer.hidden_layers(), config.faults())?;
        let masks = masks::window_masks(&self.seqs, &active, &proposal.drafts, win.width, config.faults());
        let verdict = verify::verify(b, self.engine.vocab, config, &win, &mut self.seqs, &active, &proposal, &masks)?;
        let logprobs = step_logprobs(b, self.engine.vocab, &win, &self.seqs, &active, &proposal, &verdict, &masks, config.faults())?;
        self.ledger.lap(Phase::Verify, t);

        // 4. Commit: emission up to a stop, and the rollback.
        let t = Instant::now();
        let proposed: Vec<usize> = proposal.drafts.iter().map(Vec::len).collect();
        let step = commit(b, &mut self.cache, config, &mut self.seqs, &active, &proposed, &verdict, &masks, logprobs, detok, sink)?;
        for ((&i, &kept), drafts) in active.iter().zip(&step.kept).zip(&proposal.drafts) {
            masks::commit_state(&mut self.seqs[i], kept, drafts, config.faults());
        }
        self.ledger.lap(Phase::Commit, t);

        // The proposer rolls its state back to what was kept; the controllers learn the step.
        let t = Instant::now();
        let seqs = &self.seqs;
        let observed: Vec<ObservedSeq<'_>> = active.iter().zip(&step.kept).map(|(&i, &kept)| ObservedSeq { slot: i, context: &seqs[i].context, kept, finished: seqs[i].finish.is_some() }).collect();
        self.proposer.observe(b, &Observed { seqs: &observed, plan: &win.plan, hidden: win.hidden.as_ref() })?;
        self.ledger.lap(Phase::Propose, t);
        self.ledger.end(k, &proposed, step.counts.step_counts())?;
        finished.extend(active.into_iter().filter(|&i| self.seqs[i].finish.is_some()));
        Ok(finished)
    }

    /// Finishes each active request whose next input no longer fits its slot.
    fn finish_out_of_room(&mut self, lens: &[usize]) -> Vec<usize> {
        let out: Vec<usize> = self.active_slots().into_iter().filter(|&i| lens[i] + 1 > self.capacity).collect();
        for &i in &out {
            self.seqs[i].finish = Some(FinishReason::Capacity);
        }
        out
    }

    /// The output of the finished request in `slot`, which frees the slot;
    /// `None` when the slot is free or its request is still generating.
    pub fn take(&mut self, slot: usize) -> Option<Output> {
        if self.slots.get(slot) != Some(&Slot::Busy) {
            return None;
        }
        let s = &mut self.seqs[slot];
        let finish = s.finish?;
        self.slots[slot] = Slot::Free;
        let logprobs = s.req.logprobs.is_some().then(|| std::mem::take(&mut s.logprobs));
        Some(Output { tokens: std::mem::take(&mut s.out), finish, acceptance: std::mem::take(&mut s.acceptance), logprobs, error: s.error.take() })
    }

    /// The logprob entries of the request in `slot` so far, one per token it
    /// emitted (empty where it asked for none): a server streams them.
    pub fn logprobs(&self, slot: usize) -> &[TokenLogprob] {
        self.seqs.get(slot).map_or(&[], |s| &s.logprobs)
    }

    /// Drops the request in `slot` (finished or not) and frees the slot at
    /// once; its cache and proposer state are released then, not at the
    /// next admission. Returns whether the slot held a request.
    pub fn cancel(&mut self, slot: usize) -> Result<bool, DecodeError> {
        if matches!(self.slots.get(slot), None | Some(Slot::Free)) {
            return Ok(false);
        }
        self.slots[slot] = Slot::Free;
        self.seqs[slot] = Seq::vacant();
        let b = self.engine.backend;
        let mut trim = vec![0; self.slots.len()];
        if self.engine.config.faults().clears_slots() {
            trim[slot] = b.cache_lens(&self.cache)[slot];
        }
        b.cache_trim(&mut self.cache, &trim)?;
        self.proposer.release(b, slot)?;
        Ok(true)
    }

    /// The run's totals with `outputs` (taken in request order), and the target cache.
    pub(crate) fn finish(self, outputs: Vec<Output>) -> (RunOutput, B::ModelCache) {
        let mut acceptance = Acceptance::default();
        for o in &outputs {
            acceptance.merge(&o.acceptance);
        }
        let l = self.ledger;
        (RunOutput { outputs, acceptance, batch_steps: l.batch_steps, proposer_errors: l.proposer_errors, steps_by_k: l.steps_by_k, timings: l.timings }, self.cache)
    }

    /// Asks the proposer for at most `k` drafts per active sequence (each
    /// within its cache room; none for a request that does not speculate),
    /// with each sequence's own draft stream, and checks its contract. The
    /// streams keep what the proposer drew, even when it failed (a plain
    /// step then follows, OnProposerError::PlainStep).
    fn propose(&mut self, active: &[usize], k: usize, lens: &[usize]) -> Result<Proposal<B::Tensor>, DecodeError> {
        if k == 0 || active.iter().all(|&i| !self.seqs[i].req.speculate) {
            return Ok(Proposal::none(active.len()));
        }
        let seqs = &self.seqs;
        let views: Vec<SeqView<'_>> = active
            .iter()
            .map(|&i| {
                let req = &seqs[i].req;
                let max_drafts = if req.speculate { k.min(self.capacity - lens[i] - 1) } else { 0 };
                let constraint = req.constraint.as_ref().zip(seqs[i].constraint);
                SeqView { slot: i, context: &seqs[i].context, max_drafts, sampling: req.sampling, prompt_len: req.prompt.len(), logit_bias: &req.logit_bias, constraint, eos: &req.eos }
            })
            .collect();
        let mut rngs: Vec<Pcg64> = active.iter().map(|&i| seqs[i].draft_rng.clone()).collect();
        let name = self.proposer.name();
        let proposal = self.proposer.propose(self.engine.backend, &views, &mut rngs).and_then(|p| check_proposal(&p, &views, &name, self.engine.vocab).map(|()| p));
        for (&i, r) in active.iter().zip(rngs) {
            self.seqs[i].draft_rng = r;
        }
        proposal
    }
}

/// Rejects a proposal that breaks its contract before it reaches the device.
fn check_proposal<T>(p: &Proposal<T>, views: &[SeqView<'_>], name: &str, vocab: usize) -> Result<(), DecodeError> {
    if p.drafts.len() != views.len() {
        return Err(DecodeError::proposer(name, format!("{} draft lists for {} sequences", p.drafts.len(), views.len())));
    }
    for (d, v) in p.drafts.iter().zip(views) {
        if d.len() > v.max_drafts {
            return Err(DecodeError::proposer(name, format!("sequence {}: {} drafts, at most {} allowed", v.slot, d.len(), v.max_drafts)));
        }
        if let Some(t) = d.iter().find(|&&t| t as usize >= vocab) {
            return Err(DecodeError::proposer(name, format!("sequence {}: draft id {t} is outside the vocabulary of {vocab}", v.slot)));
        }
    }
    if let Some((_, width)) = &p.draft_probs
        && let Some(d) = p.drafts.iter().find(|d| d.len() > *width)
    {
        return Err(DecodeError::proposer(name, format!("{} drafts but draft probabilities of width {width}", d.len())));
    }
    Ok(())
}
