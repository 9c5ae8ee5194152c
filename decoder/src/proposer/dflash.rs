//! DFlash block drafts (DRAFT-1 .. DRAFT-9, DECODE-4): the drafter reads the
//! target's hidden states at `target_layer_ids` (the engine asks the target
//! forward for them), projects each verified position once into its
//! context (incremental), and drafts a block `[last token, mask..]` in one
//! non-causal pass, with the target's lm_head.
//!
//! Verification: at temperature 0 the drafts are the block's argmaxes and the
//! engine applies the DFlash accept rule (DFLASH-1 .. DFLASH-3, equal to
//! greedy by DFLASH-4). At temperature > 0 the single-pass drafter samples
//! every position from its own processed row, independently given the
//! context, so those rows are the drafts' law given the accepted prefix
//! (DRAFT-5) and are passed as `q`. The iterative-unmasking variant's drafts
//! are a deterministic function of the context: verified without `q`
//! (RESID-2, erratum E12), never with its per-step softmax.
//!
//! The drafter runs on the host on every backend: the target's hidden rows
//! of the kept tokens are downloaded after each step. Parallel drafting uses
//! the f32 forward (`specdec_models::dflash_f32`, sgemm on every core) and
//! reads its block out through a Q8_0 copy of the target's head, so a
//! block costs a fraction of a target step; the iterative variant runs the
//! f64 reference forward. Either way verification decides what is emitted,
//! so the forward's precision changes only how much is accepted. A device
//! port of the drafter is future work.

use std::sync::Arc;

use rand::RngExt;
use rand_pcg::Pcg64;
use specdec_backend::model::{LlamaWeights, ModelBackend};
use specdec_models::dflash::{DflashContext, DflashDraft, Schedule};
use specdec_models::dflash_f32::{ContextF32, DflashF32};
use specdec_reference::sampling::sample_inverse_cdf;
use specdec_reference::{RowInputs, bias_row, penalty_counts, process_logits_with};

use super::{Observed, Proposal, Proposer, SeqView, VerifyRule};
use crate::device;
use crate::error::DecodeError;
use crate::fault::Fault;

/// How the block is drafted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DflashMode {
    /// One pass (seed 000, SGLang DFlash v1).
    Parallel,
    /// Seed 002's iterative confidence unmasking in `steps` passes.
    Iterative { steps: usize, schedule: Schedule },
}

/// The DFlash proposer.
pub struct DflashProposer {
    name: String,
    target: Arc<LlamaWeights>,
    mode: DflashMode,
    /// The f32 forward; it also holds the validated checkpoint.
    fast: DflashF32,
    contexts: Contexts,
    /// Injected defect for negative controls ([`Fault::DraftCacheNotTrimmed`]):
    /// the context takes every fed row, the rejected drafts' too.
    keeps_rejected: bool,
}

/// Per-sequence drafter contexts: the f32 forward's (parallel drafting) or
/// the f64 reference's (iterative unmasking).
enum Contexts {
    F32(Vec<ContextF32>),
    F64(Vec<DflashContext>),
}

impl Contexts {
    fn new(fast: &DflashF32, mode: DflashMode, batch: usize) -> Self {
        match mode {
            DflashMode::Parallel => Contexts::F32((0..batch).map(|_| fast.new_context()).collect()),
            DflashMode::Iterative { .. } => Contexts::F64((0..batch).map(|_| fast.draft().new_context()).collect()),
        }
    }

    fn is_empty(&self, slot: usize) -> bool {
        match self {
            Contexts::F32(c) => c[slot].is_empty(),
            Contexts::F64(c) => c[slot].is_empty(),
        }
    }

    fn reset(&mut self, fast: &DflashF32, slot: usize) {
        match self {
            Contexts::F32(c) => c[slot] = fast.new_context(),
            Contexts::F64(c) => c[slot] = fast.draft().new_context(),
        }
    }

    /// Sequence `slot`'s context, widened to f64.
    fn view(&self, slot: usize, layers: usize) -> Option<DrafterContext> {
        Some(match self {
            Contexts::F32(c) => {
                let c = c.get(slot)?;
                let widen = |x: &[f32]| x.iter().map(|&v| f64::from(v)).collect();
                DrafterContext { len: c.len(), layers: (0..layers).map(|l| (widen(c.keys(l)), widen(c.values(l)))).collect() }
            }
            Contexts::F64(c) => {
                let c = c.get(slot)?;
                DrafterContext { len: c.len(), layers: (0..layers).map(|l| (c.keys(l).to_vec(), c.values(l).to_vec())).collect() }
            }
        })
    }

    fn extend(&mut self, fast: &DflashF32, slot: usize, rows: &[f64]) -> specdec_models::Result<()> {
        match self {
            Contexts::F32(c) => fast.extend(&mut c[slot], rows),
            Contexts::F64(c) => fast.draft().extend(&mut c[slot], rows),
        }
    }
}

impl DflashProposer {
    pub fn new(name: impl Into<String>, draft: DflashDraft, target: Arc<LlamaWeights>, mode: DflashMode) -> Result<Self, DecodeError> {
        let name = name.into();
        // The checkpoint was validated against a target config at load; check it is this one.
        draft.config().validate(&target.config, &name).map_err(|e| DecodeError::Config(e.to_string()))?;
        if let DflashMode::Iterative { steps, .. } = mode
            && !(1..draft.config().block_size).contains(&steps)
        {
            return Err(DecodeError::Config(format!("{name}: {steps} unmasking steps for a block of {}", draft.config().block_size)));
        }
        // The iterative variant runs the f64 forward and never reads this head.
        let fast = if mode == DflashMode::Parallel { DflashF32::with_q8_0_head(draft, &target) } else { DflashF32::new(draft) };
        let contexts = Contexts::new(&fast, mode, 0);
        Ok(DflashProposer { name, fast, target, mode, contexts, keeps_rejected: false })
    }

    fn err(&self, e: impl std::fmt::Display) -> DecodeError {
        DecodeError::proposer(&self.name, e)
    }

    /// The width of one context row (`K · hidden`: the target's hidden
    /// rows at every layer the drafter reads).
    pub fn feature_width(&self) -> usize {
        self.fast.draft().config().feature_width()
    }

    /// Sequence `slot`'s drafter context as it stands (after `begin`): the
    /// state a fidelity check compares with [`fresh_context`](Self::fresh_context).
    pub fn context(&self, slot: usize) -> Option<DrafterContext> {
        self.contexts.view(slot, self.fast.draft().config().layers.num_hidden_layers)
    }

    /// The context a fresh drafter builds from `rows` (the target's hidden
    /// rows at `target_layer_ids`, `[n, feature_width]`), in this drafter's
    /// precision.
    pub fn fresh_context(&self, rows: &[f64]) -> Result<DrafterContext, DecodeError> {
        let mut fresh = Contexts::new(&self.fast, self.mode, 1);
        fresh.extend(&self.fast, 0, rows).map_err(|e| self.err(e))?;
        fresh.view(0, self.fast.draft().config().layers.num_hidden_layers).ok_or_else(|| DecodeError::Internal("a fresh context has no slot 0".into()))
    }
}

/// A drafter's per-sequence context: its positions, and each draft layer's
/// keys and values (widened to f64).
#[derive(Debug, Clone, PartialEq)]
pub struct DrafterContext {
    pub len: usize,
    pub layers: Vec<(Vec<f64>, Vec<f64>)>,
}

impl<B: ModelBackend> Proposer<B> for DflashProposer {
    fn name(&self) -> String {
        self.name.clone()
    }

    fn hidden_layers(&self) -> &[usize] {
        &self.fast.draft().config().target_layer_ids
    }

    fn begin(&mut self, _: &B, batch: usize, _: usize, _: usize) -> Result<(), DecodeError> {
        self.contexts = Contexts::new(&self.fast, self.mode, batch);
        Ok(())
    }

    fn inject(&mut self, fault: Fault) {
        self.keeps_rejected |= fault == Fault::DraftCacheNotTrimmed;
    }

    fn propose(&mut self, backend: &B, seqs: &[SeqView<'_>], rngs: &mut [Pcg64]) -> Result<Proposal<B::Tensor>, DecodeError> {
        let vocab = self.target.config.vocab_size;
        let block = self.fast.draft().config().block_size;
        let sampled = self.mode == DflashMode::Parallel && seqs.iter().any(|s| s.sampling.temperature > 0.0);
        let mut drafts = Vec::with_capacity(seqs.len());
        let mut q = Vec::new();
        for (s, rng) in seqs.iter().zip(rngs.iter_mut()) {
            let verified = *s.context.last().expect("contexts are never empty");
            // No target hidden state yet (a one-token prompt): a plain step.
            if self.contexts.is_empty(s.slot) || s.max_drafts == 0 {
                drafts.push(Vec::new());
                q.extend(std::iter::repeat_n(0.0, (block - 1) * vocab));
                continue;
            }
            let mut d = match &self.contexts {
                Contexts::F32(c) if sampled => {
                    let ctx = &c[s.slot];
                    let tokens = self.fast.draft().block_input(verified).map_err(|e| self.err(e))?;
                    let logits = self.fast.block_logits(&self.target, ctx, &tokens).map_err(|e| self.err(e))?;
                    let mut d = Vec::with_capacity(block - 1);
                    // Draft j's q counts the context plus the drafts before it (LOGITS-13).
                    let penalised = s.sampling.penalised();
                    let mut counts = if penalised { penalty_counts(s.sampling.penalty_scope.counted(s.context, s.prompt_len), vocab) } else { Vec::new() };
                    let bias = if s.logit_bias.is_empty() { None } else { Some(bias_row(s.logit_bias, vocab).map_err(|e| self.err(e))?) };
                    for row in logits.chunks(vocab).skip(1) {
                        // Widening is exact: q is the law of exactly these logits.
                        let row: Vec<f64> = row.iter().map(|&v| f64::from(v)).collect();
                        let inputs = RowInputs { counts: penalised.then_some(&counts[..]), bias: bias.as_deref() };
                        let p = process_logits_with(&row, s.sampling, inputs).map_err(|e| self.err(e))?;
                        let drawn = sample_inverse_cdf(&p, rng.random::<f64>()).map_err(|e| self.err(e))?;
                        d.push(drawn.token as u32);
                        if penalised {
                            counts[drawn.token] += 1.0;
                        }
                        q.extend(p);
                    }
                    d
                }
                Contexts::F32(c) => self.fast.draft_parallel(&self.target, &c[s.slot], verified, s.max_drafts.min(block - 1)).map_err(|e| self.err(e))?,
                Contexts::F64(c) => {
                    let DflashMode::Iterative { steps, schedule } = self.mode else { return Err(DecodeError::Internal("f64 contexts outside iterative mode".into())) };
                    self.fast.draft().draft_iterative(&self.target, &c[s.slot], verified, steps, schedule).map_err(|e| self.err(e))?.tokens
                }
            };
            d.truncate(s.max_drafts);
            drafts.push(d);
        }
        let (draft_probs, rule) = if sampled {
            (Some((device::upload_f64(backend, vec![seqs.len(), block - 1, vocab], q)?, block - 1)), VerifyRule::Standard)
        } else {
            (None, if self.mode == DflashMode::Parallel { VerifyRule::DflashBlock } else { VerifyRule::Standard })
        };
        Ok(Proposal { drafts, draft_probs, rule })
    }

    fn observe(&mut self, backend: &B, observed: &Observed<'_, B::Tensor>) -> Result<(), DecodeError> {
        let hidden = observed.hidden.ok_or_else(|| self.err("the target forward returned no hidden states"))?;
        let hidden = backend.download_f64(hidden)?;
        let width = self.fast.draft().config().feature_width();
        for s in observed.seqs {
            if s.finished {
                self.contexts.reset(&self.fast, s.slot);
                continue;
            }
            let rows = observed.plan.rows.iter().find(|r| r.seq == s.slot).ok_or_else(|| self.err(format!("no hidden rows for sequence {}", s.slot)))?;
            let rows_kept = if self.keeps_rejected { rows.count } else { s.kept };
            let kept = &hidden.data()[rows.token_row * width..(rows.token_row + rows_kept) * width];
            self.contexts.extend(&self.fast, s.slot, kept).map_err(|e| DecodeError::proposer(&self.name, e))?;
        }
        Ok(())
    }

    fn release(&mut self, _: &B, slot: usize) -> Result<(), DecodeError> {
        self.contexts.reset(&self.fast, slot);
        Ok(())
    }
}
