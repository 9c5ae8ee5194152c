//! How an engine runs: `k`, the rollback policy, the dynamic controller,
//! checked or unchecked verify ops, what a failing proposer does, and (for
//! the negative controls only) an injected fault.

use specdec_reference::controller::SpecConfig;

use crate::fault::Faults;

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
    /// The pay-off controller (CTRL-7 .. CTRL-10, `payoff.rs`): each step's
    /// `k` in `0 ..= k`, where expected tokens per second are highest by what
    /// this run has measured. Exclusive with `controller`.
    pub payoff: bool,
    /// Use the checked verify ops (a validity read-back per op) instead of
    /// the unchecked hot path (GLUE-6); the results are the same.
    pub checked: bool,
    pub on_proposer_error: OnProposerError,
    #[cfg(feature = "negative-controls")]
    pub fault: Option<crate::fault::Fault>,
}

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig {
            k: 4,
            rollback: Rollback::PerSequence,
            controller: None,
            payoff: false,
            checked: false,
            on_proposer_error: OnProposerError::Fail,
            #[cfg(feature = "negative-controls")]
            fault: None,
        }
    }
}

impl EngineConfig {
    /// The injected fault, if any (always none without `negative-controls`).
    pub(crate) fn faults(&self) -> Faults {
        #[cfg(feature = "negative-controls")]
        return Faults(self.fault);
        #[cfg(not(feature = "negative-controls"))]
        Faults(None)
    }

    pub(crate) fn max_k(&self) -> usize {
        self.controller.as_ref().map_or(self.k, |c| c.num_speculative_tokens)
    }
}

/// The largest `k` the engine accepts.
pub const MAX_K: usize = 64;
