//! What a session counts and times, and the controllers that choose each
//! step's `k` from it: the bookkeeping of [`Session::step`](crate::session::Session::step),
//! kept here so the step reads as propose, window, verify, commit.
//!
//! Invariants: a step's `k` comes from the pay-off controller when it is on
//! (CTRL-7 .. CTRL-10), else from seed 001's dynamic controller, else from
//! the engine's fixed `k`; both controllers learn only a completed step's
//! counts, and the pay-off controller its whole time, the proposer's work
//! included (what a draft costs here).

use std::time::Instant;

use specdec_reference::controller::DynamicController;
use specdec_reference::controller::StepCounts;

use crate::config::EngineConfig;
use crate::error::DecodeError;
use crate::payoff::Payoff;
use crate::request::Timings;

/// The part of a step a lap of time is charged to.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Phase {
    /// Drafting, and the proposer's bookkeeping after a step.
    Propose,
    /// The window forward and its verify.
    Verify,
    /// Emission, stop checks and rollback.
    Commit,
}

/// A session's counters, timings and controllers.
pub(crate) struct Ledger {
    controller: Option<DynamicController>,
    payoff: Option<Payoff>,
    /// Steps run with each `k` (index `k`).
    pub(crate) steps_by_k: Vec<u64>,
    pub(crate) timings: Timings,
    pub(crate) batch_steps: u64,
    pub(crate) proposer_errors: u64,
    step_started: Instant,
}

impl Ledger {
    pub(crate) fn new(config: &EngineConfig, timings: Timings) -> Result<Self, DecodeError> {
        let controller = config.controller.clone().map(DynamicController::new).transpose().map_err(|e| DecodeError::Config(e.to_string()))?;
        let payoff = config.payoff.then(|| Payoff::new(config.k));
        Ok(Ledger { controller, payoff, steps_by_k: vec![0; config.max_k() + 1], timings, batch_steps: 0, proposer_errors: 0, step_started: Instant::now() })
    }

    /// Starts a step of `active` sequences: its `k`, counted, and its clock.
    pub(crate) fn begin(&mut self, active: usize, fixed_k: usize) -> usize {
        let k = match (&self.payoff, &self.controller) {
            (Some(p), _) => p.k(),
            (None, Some(c)) => c.k(active),
            (None, None) => fixed_k,
        };
        if let Some(n) = self.steps_by_k.get_mut(k) {
            *n += 1;
        }
        self.step_started = Instant::now();
        k
    }

    /// Charges the time since `started` to `phase`.
    pub(crate) fn lap(&mut self, phase: Phase, started: Instant) {
        let s = started.elapsed().as_secs_f64();
        match phase {
            Phase::Propose => self.timings.propose_s += s,
            Phase::Verify => self.timings.verify_s += s,
            Phase::Commit => self.timings.rest_s += s,
        }
    }

    /// Ends a completed step run with `k`: the drafts `proposed` per
    /// sequence and the step's `counts` teach the controllers.
    pub(crate) fn end(&mut self, k: usize, proposed: &[usize], counts: StepCounts) -> Result<(), DecodeError> {
        self.batch_steps += 1;
        if let Some(c) = self.controller.as_mut() {
            if k == 0 {
                c.record_fallback();
            } else {
                c.update(counts).map_err(|e| DecodeError::Internal(e.to_string()))?;
            }
        }
        if let Some(p) = self.payoff.as_mut() {
            // Sequences with drafts that did not keep them all: a rejection ended them.
            let rejected = (proposed.iter().filter(|&&p| p > 0).count() as u64).saturating_sub(counts.bonus);
            p.record(k, proposed.iter().copied().max().unwrap_or(0), counts.accepted, rejected, self.step_started.elapsed().as_secs_f64());
        }
        Ok(())
    }
}
