//! The proposer trait, and the proposers (DECODE-4): n-gram lookup, a draft
//! model (any Llama-family model sharing the vocabulary, or the target's
//! first layers: early exit), and DFlash block drafts.
//!
//! A proposer sees each active sequence's whole context (prompt and emitted
//! tokens) and a cap on its drafts, and returns drafts, plus their processed
//! distributions `q` when it sampled them (REJECT-1). It owns whatever state
//! it keeps per sequence (an n-gram index, a KV cache) and is told after
//! every step which tokens were kept, so it can roll that state back.

pub mod dflash;
pub mod draft;
pub mod ngram;

use rand_pcg::Pcg64;
use specdec_backend::SamplingParams;
use specdec_backend::model::{ForwardPlan, ModelBackend};
use specdec_constraint::State;

use crate::constrained::Constrained;
use crate::error::DecodeError;
use crate::fault::Fault;

pub use dflash::{DflashMode, DflashProposer, DrafterContext};
pub use draft::DraftModelProposer;
pub use ngram::NgramProposer;

/// One active sequence, as a proposer sees it.
#[derive(Debug, Clone, Copy)]
pub struct SeqView<'a> {
    /// The request's index in the batch.
    pub slot: usize,
    /// Prompt and emitted tokens; the last one is not in the target cache yet.
    pub context: &'a [u32],
    /// At most this many drafts (the step's `k`, less where the cache is nearly full).
    pub max_drafts: usize,
    pub sampling: SamplingParams,
    /// The first `prompt_len` tokens of `context` are the prompt (LOGITS-12).
    pub prompt_len: usize,
    /// The request's logit bias (LOGITS-7).
    pub logit_bias: &'a [(u32, f64)],
    /// The request's constraint and its state after `context` (CONSTRAIN-3).
    pub constraint: Option<(&'a Constrained, State)>,
    /// The request's eos ids (a constraint allows them where it accepts).
    pub eos: &'a [u32],
}

impl<'a> SeqView<'a> {
    /// The processor inputs of this sequence's row after `drafts`: a draft's
    /// `q` counts the context plus the drafts before it (LOGITS-13).
    pub(crate) fn row(&self, drafts: &'a [u32]) -> crate::device::Row<'a> {
        crate::device::Row::after(self.sampling, self.context, self.prompt_len, self.logit_bias, drafts)
    }

    /// The tokens the request's constraint allows after `context` and
    /// `drafts` (CONSTRAIN-3): `None` without a constraint, or past a draft
    /// it refuses, or where it allows nothing (a draft drawn there is
    /// unmasked, its `q` the law it was drawn from, and the target refuses
    /// it).
    pub fn allowed_after(&self, drafts: &[u32]) -> Option<Vec<bool>> {
        let (c, state) = self.constraint?;
        let state = drafts.iter().try_fold(state, |st, &t| c.advance(st, t, self.eos))?;
        Some(c.allowed(state, self.eos)).filter(|m| m.contains(&true))
    }
}

/// How the target checks a proposal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VerifyRule {
    /// `greedy_verify` at temperature 0, `rejection_verify` otherwise.
    Standard,
    /// DFlash blocks (DFLASH-1 .. DFLASH-3) at temperature 0 when every
    /// sequence has a full block (DFLASH-4: the same tokens as greedy),
    /// otherwise as `Standard`.
    DflashBlock,
}

/// A step's drafts.
#[derive(Debug, Clone)]
pub struct Proposal<T> {
    /// `drafts[i]` for the `i`-th active sequence, at most its `max_drafts`.
    pub drafts: Vec<Vec<u32>>,
    /// `[A, width, V]`: the distributions the drafts were drawn from,
    /// processed with the request's own sampling parameters (LOGITS-6), and
    /// `width`. `None` for drafts that are a function of the context
    /// (n-gram, greedy drafts): verified without `q` (RESID-2).
    pub draft_probs: Option<(T, usize)>,
    pub rule: VerifyRule,
}

impl<T> Proposal<T> {
    /// No drafts for `n` sequences: each step is a plain decode step.
    pub fn none(n: usize) -> Self {
        Proposal { drafts: vec![Vec::new(); n], draft_probs: None, rule: VerifyRule::Standard }
    }
}

/// One active sequence after a step (or after the prefill).
#[derive(Debug, Clone, Copy)]
pub struct ObservedSeq<'a> {
    pub slot: usize,
    /// Prompt and emitted tokens now.
    pub context: &'a [u32],
    /// How many of the tokens this sequence fed to the target forward stay
    /// in its cache (the last token and the accepted drafts; all of a prefill).
    pub kept: usize,
    /// The request has finished; the proposer may drop its state.
    pub finished: bool,
}

/// What a proposer learns after each target forward.
#[derive(Debug)]
pub struct Observed<'a, T> {
    pub seqs: &'a [ObservedSeq<'a>],
    /// The target forward's row layout.
    pub plan: &'a ForwardPlan,
    /// `[plan.total_tokens, K·hidden]` when [`Proposer::hidden_layers`] is not empty.
    pub hidden: Option<&'a T>,
}

/// A source of drafts (DECODE-4).
pub trait Proposer<B: ModelBackend> {
    /// A short name for reports, e.g. `"ngram"`, `"draft:tiny"`, `"early-exit:2"`.
    fn name(&self) -> String;

    /// Target layers whose hidden states this proposer consumes (DFlash's
    /// `target_layer_ids`); the engine asks the target forward for them.
    fn hidden_layers(&self) -> &[usize] {
        &[]
    }

    /// Starts a generation of `batch` sequences whose verified contexts fit
    /// `capacity` positions, with at most `max_k` drafts per step.
    fn begin(&mut self, backend: &B, batch: usize, capacity: usize, max_k: usize) -> Result<(), DecodeError>;

    /// Drafts for each active sequence, noise from each sequence's own draft
    /// stream (`rngs[i]` for `seqs[i]`).
    fn propose(&mut self, backend: &B, seqs: &[SeqView<'_>], rngs: &mut [Pcg64]) -> Result<Proposal<B::Tensor>, DecodeError>;

    /// After each target forward: what was kept, so the proposer rolls back.
    fn observe(&mut self, backend: &B, observed: &Observed<'_, B::Tensor>) -> Result<(), DecodeError>;

    /// Forgets sequence `slot`: its request finished or was cancelled, and
    /// the slot may take a new request, whose prefill is observed next.
    fn release(&mut self, backend: &B, slot: usize) -> Result<(), DecodeError>;

    /// NEGATIVE CONTROL: the session's injected fault, told before `begin`
    /// (the engine injects one only with the `negative-controls` feature). A proposer the
    /// fault is about takes it; the others ignore it; one that wraps another
    /// passes it on.
    fn inject(&mut self, fault: Fault) {
        let _ = fault;
    }
}

/// Plain decoding: never proposes.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoProposer;

impl<B: ModelBackend> Proposer<B> for NoProposer {
    fn name(&self) -> String {
        "none".into()
    }

    fn begin(&mut self, _: &B, _: usize, _: usize, _: usize) -> Result<(), DecodeError> {
        Ok(())
    }

    fn propose(&mut self, _: &B, seqs: &[SeqView<'_>], _: &mut [Pcg64]) -> Result<Proposal<B::Tensor>, DecodeError> {
        Ok(Proposal::none(seqs.len()))
    }

    fn observe(&mut self, _: &B, _: &Observed<'_, B::Tensor>) -> Result<(), DecodeError> {
        Ok(())
    }

    fn release(&mut self, _: &B, _: usize) -> Result<(), DecodeError> {
        Ok(())
    }
}

/// The number of leading tokens `a` and `b` share.
pub(crate) fn common_prefix(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}
