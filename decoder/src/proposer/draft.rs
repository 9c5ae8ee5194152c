//! A draft model (DECODE-4): any Llama-family model sharing the target's
//! vocabulary, run autoregressively on the same backend, with its own KV
//! cache per sequence. Early exit is the same proposer on the target's
//! first `L` layers plus its final norm and lm_head (MODEL-7), so
//! speculation works with one model file.
//!
//! Each draft is drawn from the draft's processed distribution with the
//! request's own sampling parameters and draft noise stream; those rows are
//! `q` (REJECT-1, LOGITS-6). The draft cache holds exactly the tokens fed to
//! it; after a step it keeps the longest prefix that agrees with the new
//! context and trims the rest, so a rejection trims the rejected drafts and
//! a fully accepted step feeds `[last draft, bonus]` next time (the last
//! draft was drawn, never fed).

use rand_pcg::Pcg64;
use specdec_backend::SamplingParams;
use specdec_backend::model::{ForwardRequest, LlamaWeights, LogitRows, ModelBackend};

use super::{Observed, Proposal, Proposer, SeqView, VerifyRule, common_prefix};
use crate::device::{self, Row};
use crate::error::DecodeError;
use crate::fault::Fault;

/// A draft model (or the target's first layers) on the device.
pub struct DraftModelProposer<B: ModelBackend> {
    name: String,
    model: B::Model,
    vocab: usize,
    max_positions: usize,
    cache: Option<B::ModelCache>,
    /// `fed[slot]`: the tokens in the draft cache of that sequence.
    fed: Vec<Vec<u32>>,
    /// Injected defect for negative controls: `q` is not the law drafts are drawn from.
    q_fault: Option<QFault>,
    /// Injected defect for negative controls ([`Fault::DraftCacheNotTrimmed`]):
    /// the cache is not trimmed after a step.
    keeps_rejected: bool,
}

/// A draft `q` that is not the law the drafts came from (negative controls).
#[derive(Debug, Clone, Copy)]
#[cfg_attr(not(feature = "negative-controls"), allow(dead_code))]
enum QFault {
    /// Drafts drawn at the request's temperature times this.
    Temperature(f64),
    /// `q` reported without top-k and top-p.
    Unprocessed,
    /// `q` reported without the penalties and the bias the drafts were drawn with.
    WithoutPenalties,
    /// `q` reported without the constraint's mask the drafts were drawn under.
    WithoutMask,
}

impl QFault {
    /// The row `q` is reported with: the drawn row but in a negative control.
    fn reported(fault: Option<QFault>, row: Row<'_>) -> Row<'_> {
        match fault {
            Some(QFault::Unprocessed) => Row { params: SamplingParams { top_k: 0, top_p: 1.0, ..row.params }, ..row },
            Some(QFault::WithoutPenalties) => Row { allowed: row.allowed, ..Row::plain(SamplingParams { repetition_penalty: 1.0, presence_penalty: 0.0, frequency_penalty: 0.0, ..row.params }) },
            Some(QFault::WithoutMask) => Row { allowed: None, ..row },
            _ => row,
        }
    }

    /// The row drafts are drawn with: the request's but in a negative control.
    fn drawn(fault: Option<QFault>, row: Row<'_>) -> Row<'_> {
        match fault {
            Some(QFault::Temperature(scale)) => Row { params: SamplingParams { temperature: row.params.temperature * scale, ..row.params }, ..row },
            _ => row,
        }
    }
}

impl<B: ModelBackend> DraftModelProposer<B> {
    /// Loads `weights` on `backend`; their vocabulary must be the target's.
    pub fn new(backend: &B, name: impl Into<String>, weights: &LlamaWeights, target_vocab: usize) -> Result<Self, DecodeError> {
        let name = name.into();
        if weights.config.vocab_size != target_vocab {
            return Err(DecodeError::Config(format!("draft `{name}` has a vocabulary of {}, the target {target_vocab}", weights.config.vocab_size)));
        }
        let model = backend.load_model(weights)?;
        Ok(DraftModelProposer { name, model, vocab: target_vocab, max_positions: weights.config.max_position_embeddings, cache: None, fed: Vec::new(), q_fault: None, keeps_rejected: false })
    }

    /// The early-exit self-draft: the target's first `layers` layers (MODEL-7).
    pub fn early_exit(backend: &B, target: &LlamaWeights, layers: usize) -> Result<Self, DecodeError> {
        if layers >= target.config.num_hidden_layers {
            return Err(DecodeError::Config(format!("early-exit:{layers} needs fewer layers than the target's {}", target.config.num_hidden_layers)));
        }
        let truncated = target.truncated(layers).map_err(|e| DecodeError::Config(format!("early-exit:{layers}: {e}")))?;
        Self::new(backend, format!("early-exit:{layers}"), &truncated, target.config.vocab_size)
    }

    /// NEGATIVE CONTROL: draws drafts at the request's temperature times
    /// `scale` but reports `q` at the request's temperature (a drafter whose
    /// `q` is not the law its drafts came from; LOGITS-6 violated).
    #[cfg(feature = "negative-controls")]
    pub fn with_wrong_q_temperature(mut self, scale: f64) -> Self {
        self.q_fault = Some(QFault::Temperature(scale));
        self
    }

    /// NEGATIVE CONTROL: draws drafts from the processed law (top-k, top-p)
    /// but reports `q` from the logits at the temperature alone, unprocessed
    /// (HF transformers #47932).
    #[cfg(feature = "negative-controls")]
    pub fn with_unprocessed_q(mut self) -> Self {
        self.q_fault = Some(QFault::Unprocessed);
        self
    }

    /// NEGATIVE CONTROL: draws drafts with the request's penalties and bias
    /// (LOGITS-7 .. LOGITS-9) but reports `q` without them (breaks LOGITS-13).
    #[cfg(feature = "negative-controls")]
    pub fn with_unpenalised_q(mut self) -> Self {
        self.q_fault = Some(QFault::WithoutPenalties);
        self
    }

    /// The draft model on the device.
    pub fn model(&self) -> &B::Model {
        &self.model
    }

    /// The draft cache (after `begin`) and, per sequence, the tokens it is
    /// meant to hold: the state a fidelity check compares with a fresh prefill.
    pub fn cache_and_fed(&self) -> Option<(&B::ModelCache, &[Vec<u32>])> {
        self.cache.as_ref().map(|c| (c, self.fed.as_slice()))
    }
}

impl<B: ModelBackend> Proposer<B> for DraftModelProposer<B> {
    fn name(&self) -> String {
        self.name.clone()
    }

    fn begin(&mut self, backend: &B, batch: usize, capacity: usize, max_k: usize) -> Result<(), DecodeError> {
        // Drafting feeds up to k - 1 tokens past the verified context.
        let capacity = (capacity + max_k).min(self.max_positions);
        self.cache = Some(backend.new_model_cache(&self.model, batch, capacity)?);
        self.fed = vec![Vec::new(); batch];
        Ok(())
    }

    fn inject(&mut self, fault: Fault) {
        self.keeps_rejected |= fault == Fault::DraftCacheNotTrimmed;
        if fault == Fault::DraftQWithoutMask {
            self.q_fault = Some(QFault::WithoutMask);
        }
    }

    fn propose(&mut self, backend: &B, seqs: &[SeqView<'_>], rngs: &mut [Pcg64]) -> Result<Proposal<B::Tensor>, DecodeError> {
        let cache = self.cache.as_mut().ok_or_else(|| DecodeError::proposer(&self.name, "propose before begin"))?;
        let batch = self.fed.len();
        let steps = seqs.iter().map(|s| s.max_drafts).max().unwrap_or(0);
        let mut drafts: Vec<Vec<u32>> = vec![Vec::new(); seqs.len()];
        if steps == 0 {
            return Ok(Proposal::none(seqs.len()));
        }
        // The tokens each sequence's cache lacks: the context's unfed tail.
        let mut feed: Vec<Vec<u32>> = vec![Vec::new(); batch];
        for s in seqs {
            let fed = &self.fed[s.slot];
            if fed.len() >= s.context.len() || fed[..] != s.context[..fed.len()] {
                return Err(DecodeError::proposer(&self.name, format!("sequence {}: the draft cache is not a prefix of the context", s.slot)));
            }
            feed[s.slot] = s.context[fed.len()..].to_vec();
        }
        // What drafts are drawn with, and what `q` is reported with: the same
        // but in a negative control. Draft `j` counts the drafts before it (LOGITS-13).
        let mut q_rows = Vec::with_capacity(steps);
        for step in 0..steps {
            let out = backend.forward(&self.model, cache, &ForwardRequest { tokens: &feed, logits: LogitRows::Last, hidden_layers: &[] })?;
            let logits = out.logits.ok_or_else(|| DecodeError::Internal("a draft forward returned no logits".into()))?;
            // Rows come in batch order of the sequences fed: `seqs` order;
            // each masked with its constraint's state after its drafts so far.
            let masks: Vec<Option<Vec<bool>>> = seqs.iter().zip(&drafts).map(|(s, before)| s.allowed_after(before)).collect();
            let rows = |bend: fn(Option<QFault>, Row<'_>) -> Row<'_>| -> Vec<Row<'_>> {
                seqs.iter().zip(&drafts).zip(&masks).map(|((s, before), mask)| bend(self.q_fault, Row { allowed: mask.as_deref(), ..s.row(before) })).collect()
            };
            let q = device::process(backend, &logits, &rows(QFault::reported), self.vocab)?;
            let ids = if self.q_fault.is_some() {
                let drawn = device::process(backend, &logits, &rows(QFault::drawn), self.vocab)?;
                device::draw(backend, &drawn, rngs)?
            } else {
                device::draw(backend, &q, rngs)?
            };
            for (i, s) in seqs.iter().enumerate() {
                self.fed[s.slot].extend_from_slice(&feed[s.slot]);
                drafts[i].push(ids[i]);
            }
            q_rows.push(q);
            if step + 1 < steps {
                for (i, s) in seqs.iter().enumerate() {
                    feed[s.slot] = vec![ids[i]];
                }
            }
        }
        for (d, s) in drafts.iter_mut().zip(seqs) {
            d.truncate(s.max_drafts);
        }
        // q: rows of step j for sequence i sit at j * A + i; lay them out as [A, steps, V].
        let a = seqs.len();
        let stacked = backend.concat_rows(&q_rows.iter().collect::<Vec<_>>())?;
        let order: Vec<i64> = (0..a).flat_map(|i| (0..steps).map(move |j| (j * a + i) as i64)).collect();
        let order = device::upload_i64(backend, vec![a * steps], order)?;
        let q = backend.gather_rows(&stacked, &order)?;
        let q = backend.reshape(&q, &[a, steps, self.vocab])?;
        Ok(Proposal { drafts, draft_probs: Some((q, steps)), rule: VerifyRule::Standard })
    }

    fn observe(&mut self, backend: &B, observed: &Observed<'_, B::Tensor>) -> Result<(), DecodeError> {
        let Some(cache) = self.cache.as_mut() else { return Ok(()) };
        let mut amounts = vec![0; self.fed.len()];
        for s in observed.seqs {
            let fed = &mut self.fed[s.slot];
            // Keep what agrees with the new context, short of its last token
            // (the next input, never cached before it is fed).
            let keep = common_prefix(fed, &s.context[..s.context.len() - 1]);
            amounts[s.slot] = fed.len() - keep;
            fed.truncate(keep);
        }
        if amounts.iter().any(|&a| a > 0) && !self.keeps_rejected {
            backend.cache_trim(cache, &amounts)?;
        }
        Ok(())
    }

    fn release(&mut self, backend: &B, slot: usize) -> Result<(), DecodeError> {
        let batch = self.fed.len();
        let (Some(cache), Some(fed)) = (self.cache.as_mut(), self.fed.get_mut(slot)) else { return Ok(()) };
        let mut amounts = vec![0; batch];
        amounts[slot] = std::mem::take(fed).len();
        if amounts[slot] > 0 {
            backend.cache_trim(cache, &amounts)?;
        }
        Ok(())
    }
}
