//! Prompt lookup (NGRAM-1 .. NGRAM-6) behind the [`Proposer`] trait: one
//! incremental index per sequence, fed only the tokens it has not seen, so
//! a step costs `O(ngram_max^2)` whatever the context length (NGRAM-6).
//! Its drafts are a function of the context: verified without `q` (RESID-2).

use rand_pcg::Pcg64;
use specdec_backend::NgramConfig;
use specdec_backend::model::ModelBackend;
use specdec_reference::ngram::NgramIndex;

use super::{Observed, Proposal, Proposer, SeqView, VerifyRule};
use crate::error::DecodeError;
use crate::fault::Fault;

/// The n-gram proposer.
#[derive(Debug, Clone)]
pub struct NgramProposer {
    cfg: NgramConfig,
    vocab: usize,
    indexes: Vec<Option<NgramIndex>>,
    /// A negative control ([`Fault::NgramIndexedAfterProposing`]): drafts
    /// from the context before the last token.
    stale: bool,
}

impl NgramProposer {
    /// `cfg.k` is the most drafts per step; a step's `max_drafts` may lower it.
    pub fn new(cfg: NgramConfig, vocab: usize) -> Result<Self, DecodeError> {
        NgramIndex::new(cfg, vocab).map_err(|e| DecodeError::Config(format!("n-gram proposer: {e}")))?;
        Ok(NgramProposer { cfg, vocab, indexes: Vec::new(), stale: false })
    }

    /// How much of a context to index: all of it, or (a negative control) all but the last token.
    fn indexed(&self, context: &[u32]) -> usize {
        if self.stale { (context.len() - 1).max(1) } else { context.len() }
    }
}

impl<B: ModelBackend> Proposer<B> for NgramProposer {
    fn name(&self) -> String {
        "ngram".into()
    }

    fn begin(&mut self, _: &B, batch: usize, _: usize, _: usize) -> Result<(), DecodeError> {
        self.indexes = vec![None; batch];
        Ok(())
    }

    /// [`Fault::NgramIndexedAfterProposing`]: the proposer drafts from a stale
    /// context (without its last token, as when the emitted tokens are
    /// appended after drafting); lossless all the same, its drafts are not
    /// the n-gram rule's.
    fn inject(&mut self, fault: Fault) {
        self.stale |= fault == Fault::NgramIndexedAfterProposing;
    }

    fn propose(&mut self, _: &B, seqs: &[SeqView<'_>], _: &mut [Pcg64]) -> Result<Proposal<B::Tensor>, DecodeError> {
        let mut drafts = Vec::with_capacity(seqs.len());
        for s in seqs {
            let upto = self.indexed(s.context);
            let slot = self.indexes.get_mut(s.slot).ok_or_else(|| DecodeError::proposer("ngram", format!("slot {} beyond the batch", s.slot)))?;
            let index = match slot {
                Some(i) => i,
                None => slot.insert(NgramIndex::new(self.cfg, self.vocab).map_err(|e| DecodeError::proposer("ngram", e))?),
            };
            // Contexts only grow: index the new tail.
            let seen = index.context().len();
            let tail: Vec<i64> = s.context[seen.min(upto)..upto].iter().map(|&t| i64::from(t)).collect();
            index.extend(&tail).map_err(|e| DecodeError::proposer("ngram", e))?;
            let mut p = index.propose().map_err(|e| DecodeError::proposer("ngram", e))?;
            p.truncate(s.max_drafts);
            drafts.push(p.into_iter().map(|t| t as u32).collect());
        }
        Ok(Proposal { drafts, draft_probs: None, rule: VerifyRule::Standard })
    }

    fn observe(&mut self, _: &B, observed: &Observed<'_, B::Tensor>) -> Result<(), DecodeError> {
        for s in observed.seqs.iter().filter(|s| s.finished) {
            if let Some(slot) = self.indexes.get_mut(s.slot) {
                *slot = None;
            }
        }
        Ok(())
    }

    fn release(&mut self, _: &B, slot: usize) -> Result<(), DecodeError> {
        if let Some(index) = self.indexes.get_mut(slot) {
            *index = None;
        }
        Ok(())
    }
}
