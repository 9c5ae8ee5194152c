//! Decoder bugs peers have shipped, injected so the end-to-end checks can
//! prove they reject them (negative controls). The decode step asks
//! [`Faults`] at the places a fault would bend it, each a no-op
//! unless the `negative-controls` feature set one.

/// A decoder bug peers have shipped (the config field that selects one
/// exists with the `negative-controls` feature alone).
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
    /// Ignores `max_tokens` inside an accepted run (emits the drafts after the cap).
    AcceptPastLength,
    /// Looks for stop strings only at the last token of an emitted run, so a
    /// string completed inside the run cuts it at its end, not where it completes.
    StopAtRunEndOnly,
    /// Draws one accept uniform per step and tests every draft with it
    /// (the acceptances of a step become dependent).
    SharedAcceptUniform,
    /// Draws the correction at a rejected row with that row's accept uniform
    /// (the noise rows misindexed: the draw then depends on the rejection).
    DrawReadsAcceptRow,
    /// Checks the length cap before the stop strings: a run that reaches
    /// the cap is cut there without looking for stop strings in it, so the
    /// tokens between a stop and the cap leak (SGLang #31599).
    LengthBeforeStop,
    /// Every request of a batch draws its noise from the first request's
    /// seed (one noise stream shared across requests, TensorRT-LLM #19487).
    SharedNoiseAcrossRequests,
    /// A slot a request left is handed to the next one without clearing
    /// its target cache: the new prompt lands after the old positions.
    SlotNotCleared,
    /// The penalties of every verify row count the context alone, not the
    /// drafts before the row (breaks LOGITS-13: a drafted token that repeats
    /// an earlier draft of the same window goes unpenalised).
    PenaltyIgnoresDrafts,
    /// A request that a stop string ended is reported as finished by its
    /// length (`length` for `stop`: the client thinks the output was cut).
    StopReportedAsLength,
    /// The drafter forgets the tokens a step rejected without rolling its
    /// cache back (a draft model's KV cache, a DFlash drafter's context keeps
    /// the rejected positions), so it drafts from stale positions: lossless
    /// all the same, since the target verifies. Injected into the proposer.
    DraftCacheNotTrimmed,
    /// The n-gram proposer appends the emitted tokens to its index after
    /// drafting, so it drafts from the context before the last token.
    /// Injected into the proposer.
    NgramIndexedAfterProposing,
    /// Chunked prefill feeds each slice after the first from one token
    /// early, so the token at every slice boundary is cached twice (an
    /// off-by-one in the slice's start).
    PrefillSliceRefed,
    /// Reports the logprob of a drafted position from the draft's `q`, not
    /// the target's row (vLLM #34497's class: logprobs broken under speculation).
    LogprobsFromDraft,
    /// Reports every logprob of a step that verified drafts as 0
    /// (llama.cpp #27972: logprob 0.0 for every token with speculation on).
    LogprobsZeroWhenSpeculating,
    /// Reports the logprobs of a whole accepted run though a stop cut it
    /// (vLLM #47616: entries past a stop string matched inside the run).
    LogprobsPastStop,
    /// Applies the logit bias to row 0 of a verify window only (SGLang
    /// #10617: a token biased by -100 still appears under speculation).
    BiasOnFirstRowOnly,
    /// Drops min-p on every row of a window that verifies drafts (SGLang
    /// #10617: min-p not applied under speculative verification).
    MinPSkippedOnVerify,
    /// Feeds a step's drafts to the constraint's state and never rolls it
    /// back after a rejection (the grammar state of vLLM #56077's class).
    ConstraintNotRolledBack,
    /// Masks row 0 of a verify window with the constraint only.
    MaskFirstRowOnly,
    /// Masks every row of a verify window with the committed state, not the
    /// state after the drafts before the row.
    MaskFromCommittedState,
    /// A draft model draws under the constraint's mask but reports `q`
    /// without it. Injected into the proposer.
    DraftQWithoutMask,
    /// Allows eos in a state that does not accept.
    EosOutsideAccept,
}

impl Fault {
    /// Every fault, for lists of negative controls.
    pub const ALL: [Fault; 25] = [
        Fault::RollbackOffByOne,
        Fault::BonusFromWrongRow,
        Fault::AcceptPastEos,
        Fault::AcceptPastLength,
        Fault::StopAtRunEndOnly,
        Fault::SharedAcceptUniform,
        Fault::DrawReadsAcceptRow,
        Fault::LengthBeforeStop,
        Fault::SharedNoiseAcrossRequests,
        Fault::SlotNotCleared,
        Fault::PenaltyIgnoresDrafts,
        Fault::StopReportedAsLength,
        Fault::DraftCacheNotTrimmed,
        Fault::NgramIndexedAfterProposing,
        Fault::PrefillSliceRefed,
        Fault::LogprobsFromDraft,
        Fault::LogprobsZeroWhenSpeculating,
        Fault::LogprobsPastStop,
        Fault::BiasOnFirstRowOnly,
        Fault::MinPSkippedOnVerify,
        Fault::ConstraintNotRolledBack,
        Fault::MaskFirstRowOnly,
        Fault::MaskFromCommittedState,
        Fault::DraftQWithoutMask,
        Fault::EosOutsideAccept,
    ];
}

/// A fault by its name (`RollbackOffByOne`, ...), as lists of negative controls spell it.
impl std::str::FromStr for Fault {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        Fault::ALL.into_iter().find(|f| format!("{f:?}") == s).ok_or_else(|| format!("unknown fault `{s}`"))
    }
}

/// The fault of a run, if any.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Faults(pub(crate) Option<Fault>);

impl Faults {
    /// The logit row read for window position `j` of a sequence with `len` drafts.
    pub(crate) fn window_row(self, j: usize, len: usize) -> usize {
        if j == len && len > 0 && self.0 == Some(Fault::BonusFromWrongRow) { j - 1 } else { j }
    }

    /// How many of the drafts before verify row `j` its penalties count.
    pub(crate) fn penalty_window(self, j: usize) -> usize {
        if self.0 == Some(Fault::PenaltyIgnoresDrafts) { 0 } else { j }
    }

    /// The processor inputs of verify row `j` of a window of `len` drafts,
    /// where the correct ones are `row` (LOGITS-13).
    pub(crate) fn window_processors<'a>(self, mut row: crate::device::Row<'a>, j: usize, len: usize) -> crate::device::Row<'a> {
        match self.0 {
            Some(Fault::BiasOnFirstRowOnly) if j > 0 => row.bias = &[],
            Some(Fault::MinPSkippedOnVerify) if len > 0 => row.params.min_p = 0.0,
            _ => {}
        }
        row
    }

    /// Whether verify row `j` carries its constraint mask.
    pub(crate) fn masks_window_row(self, j: usize) -> bool {
        j == 0 || self.0 != Some(Fault::MaskFirstRowOnly)
    }

    /// Whether every row is masked with the committed state.
    pub(crate) fn masks_from_committed_state(self) -> bool {
        self.0 == Some(Fault::MaskFromCommittedState)
    }

    /// Whether eos is allowed where the constraint does not accept.
    pub(crate) fn eos_outside_accept(self) -> bool {
        self.0 == Some(Fault::EosOutsideAccept)
    }

    /// Whether the constraint's state keeps a step's rejected drafts.
    pub(crate) fn constraint_not_rolled_back(self) -> bool {
        self.0 == Some(Fault::ConstraintNotRolledBack)
    }

    /// Whether a step's logprobs of drafted positions come from the draft's `q`.
    pub(crate) fn logprobs_from_draft(self) -> bool {
        self.0 == Some(Fault::LogprobsFromDraft)
    }

    /// Whether a step that verified drafts reports every logprob as 0.
    pub(crate) fn zero_logprobs(self, drafted: bool) -> bool {
        drafted && self.0 == Some(Fault::LogprobsZeroWhenSpeculating)
    }

    /// Whether a run's logprobs are kept past a stop that cut it.
    pub(crate) fn logprobs_past_stop(self) -> bool {
        self.0 == Some(Fault::LogprobsPastStop)
    }

    /// Where a prefill slice that continues at `fed` starts feeding.
    pub(crate) fn slice_start(self, fed: usize) -> usize {
        if self.0 == Some(Fault::PrefillSliceRefed) { fed.saturating_sub(1) } else { fed }
    }

    /// Positions trimmed beyond the rejected drafts.
    pub(crate) fn extra_trim(self) -> usize {
        usize::from(self.0 == Some(Fault::RollbackOffByOne))
    }

    /// Whether an eos inside an accepted run is ignored.
    pub(crate) fn emits_past_eos(self) -> bool {
        self.0 == Some(Fault::AcceptPastEos)
    }

    /// Whether the length cap inside an accepted run is ignored.
    pub(crate) fn emits_past_length(self) -> bool {
        self.0 == Some(Fault::AcceptPastLength)
    }

    /// Whether stop strings are looked for only at a run's last token.
    pub(crate) fn stop_at_run_end_only(self) -> bool {
        self.0 == Some(Fault::StopAtRunEndOnly)
    }

    /// Whether one accept uniform serves every draft of a step.
    pub(crate) fn shared_accept_uniform(self) -> bool {
        self.0 == Some(Fault::SharedAcceptUniform)
    }

    /// The uniform of draw noise row `j` of a step whose accept uniforms are
    /// `accept` and whose draw uniform is `draw`.
    pub(crate) fn draw_noise(self, j: usize, accept: &[f64], draw: f64) -> f64 {
        if self.0 == Some(Fault::DrawReadsAcceptRow) && j < accept.len() { accept[j] } else { draw }
    }

    /// Whether a run that reaches the length cap skips the stop strings.
    pub(crate) fn length_before_stop(self) -> bool {
        self.0 == Some(Fault::LengthBeforeStop)
    }

    /// The finish reason reported for `reason`.
    pub(crate) fn reported(self, reason: crate::request::FinishReason) -> crate::request::FinishReason {
        use crate::request::FinishReason;
        if reason == FinishReason::Stop && self.0 == Some(Fault::StopReportedAsLength) { FinishReason::Length } else { reason }
    }

    /// Whether a slot's old cache positions are cleared before it is reused.
    pub(crate) fn clears_slots(self) -> bool {
        self.0 != Some(Fault::SlotNotCleared)
    }

    /// The seed request `i`'s noise is drawn from.
    pub(crate) fn noise_seed(self, requests: &[crate::request::Request], i: usize) -> u64 {
        if self.0 == Some(Fault::SharedNoiseAcrossRequests) { requests[0].seed } else { requests[i].seed }
    }
}
