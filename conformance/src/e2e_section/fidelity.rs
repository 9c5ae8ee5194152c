//! The `fidelity` check: a proposer does what it claims. Losslessness alone
//! cannot show it (greedy verify repairs any draft), yet users read the
//! acceptance figures as facts about the proposer.
//!
//! - `ngram` (NGRAM-2, NGRAM-3): every step's drafts are the reference rule's
//!   (`specdec_reference::ngram::propose`) on the sequence's context at that
//!   step, cut to the step's room; a proposer drafting from a stale context
//!   fails (the negative control in `tests/e2e_section.rs`).
//! - the draft models, `draft:seeded` and `early-exit:L` (DECODE-4, KV-6):
//!   after every step the draft model's cache holds exactly what it kept (a
//!   fresh prefill of those tokens, within the backend's tolerance), so a
//!   rejection rolled it back; a draft that forgets rejected tokens without
//!   trimming its cache fails (`Fault::DraftCacheNotTrimmed`, the negative
//!   control). The prompts must make some draft be rejected.
//! - `draft:self` (GREEDY-2, DECODE-2, DECODE-4, KV-6): the target drafting
//!   for itself at temperature 0 has every draft accepted, a rejection
//!   excused (and counted) only where the request's plain output has a top-2
//!   margin below the backend's window epsilon; its cache is checked after
//!   every step as above (with nothing rejected, nothing is rolled back: a
//!   missing rollback cannot show here, and the fault list says so).
//! - the DFlash drafters, `dflash:*` and `dflash-iter:*` (DECODE-4, DRAFT-7):
//!   after every step each sequence's drafter context holds exactly the
//!   positions in the target cache (the prompt and the output but its last
//!   token), equal to a fresh context built from a fresh target forward's
//!   hidden rows of those tokens (within the backend's hidden-state
//!   tolerance), so the rows of rejected drafts never reached it.

use std::sync::Arc;

use rand_pcg::Pcg64;
use specdec_backend::NgramConfig;
use specdec_backend::model::{ForwardRequest, LlamaWeights, LogitRows, ModelBackend};
use specdec_decoder::choice::DraftSource;
use specdec_decoder::proposer::Observed;
use specdec_decoder::{DecodeError, DflashMode, DflashProposer, DraftModelProposer, EngineConfig, Fault, NoSink, Proposal, Proposer, ProposerChoice, RunOutput, SeqView};

use super::{GreedyPrompts, K, Plain, SectionDrafts, build_proposer, engine, err_of};
use crate::compare::{row_scale, within};
use crate::model_section::{Subject, err};

/// Whether a proposer has a fidelity statement: every proposer of the section.
pub(super) fn applies(proposer: &str) -> bool {
    proposer == "ngram" || ["draft:", "early-exit:", "dflash:", "dflash-iter:"].iter().any(|p| proposer.starts_with(p))
}

pub(super) fn rules(proposer: &str) -> &'static [&'static str] {
    match proposer {
        "ngram" => &["NGRAM-2", "NGRAM-3"],
        "draft:self" => &["GREEDY-2", "DECODE-2", "DECODE-4", "KV-6"],
        p if p.starts_with("dflash") => &["DECODE-4", "DRAFT-7"],
        _ => &["DECODE-4", "KV-6"],
    }
}

/// One proposal: the context it was drafted from, the room, the drafts.
struct Step {
    slot: usize,
    context: Vec<u32>,
    max_drafts: usize,
    drafts: Vec<u32>,
}

/// A proposer that records what the proposer it wraps drafted, from what.
pub(super) struct Recording<'p, B: ModelBackend> {
    inner: &'p mut dyn Proposer<B>,
    steps: Vec<Step>,
    /// The first proposal's `q` rows of its first sequence, where it had any.
    first_q: Option<Vec<Vec<f64>>>,
}

impl<'p, B: ModelBackend> Recording<'p, B> {
    pub(super) fn new(inner: &'p mut dyn Proposer<B>) -> Self {
        Recording { inner, steps: Vec::new(), first_q: None }
    }

    /// The drafts of the first proposal, if there was one.
    pub(super) fn first_drafts(&self) -> Option<Vec<u32>> {
        self.steps.first().map(|s| s.drafts.clone())
    }

    /// The `q` rows the first proposal reported for its first sequence's drafts.
    pub(super) fn first_q(&self) -> Option<&[Vec<f64>]> {
        self.first_q.as_deref()
    }
}

impl<B: ModelBackend> Proposer<B> for Recording<'_, B> {
    fn name(&self) -> String {
        self.inner.name()
    }

    fn inject(&mut self, fault: Fault) {
        self.inner.inject(fault);
    }

    fn hidden_layers(&self) -> &[usize] {
        self.inner.hidden_layers()
    }

    fn begin(&mut self, b: &B, batch: usize, capacity: usize, max_k: usize) -> Result<(), DecodeError> {
        self.inner.begin(b, batch, capacity, max_k)
    }

    fn propose(&mut self, b: &B, seqs: &[SeqView<'_>], rngs: &mut [Pcg64]) -> Result<Proposal<B::Tensor>, DecodeError> {
        let p = self.inner.propose(b, seqs, rngs)?;
        if self.steps.is_empty()
            && let (Some((q, width)), Some(d)) = (&p.draft_probs, p.drafts.first())
        {
            let q = b.download_f64(q)?;
            let vocab = q.data().len() / (seqs.len() * width).max(1);
            self.first_q = Some((0..d.len()).map(|j| q.data()[j * vocab..(j + 1) * vocab].to_vec()).collect());
        }
        for (v, d) in seqs.iter().zip(&p.drafts) {
            self.steps.push(Step { slot: v.slot, context: v.context.to_vec(), max_drafts: v.max_drafts, drafts: d.clone() });
        }
        Ok(p)
    }

    fn observe(&mut self, b: &B, observed: &Observed<'_, B::Tensor>) -> Result<(), DecodeError> {
        self.inner.observe(b, observed)
    }

    fn release(&mut self, b: &B, slot: usize) -> Result<(), DecodeError> {
        self.inner.release(b, slot)
    }
}

/// The n-gram statement for any proposer claiming the rule (the section's
/// own, or a negative control's): runs the plain prompts greedily and
/// compares every step's drafts with the reference's.
pub fn ngram_fidelity<B: ModelBackend>(b: &B, weights: &LlamaWeights, m: &B::Model, set: &GreedyPrompts, proposer: &mut dyn Proposer<B>, config: &EngineConfig) -> Result<usize, String> {
    let mut rec = Recording::new(proposer);
    engine(b, weights, m, config)?.generate(&set.requests(), &mut rec, None, &mut NoSink).map_err(|e| err_of(&e))?;
    let cfg = NgramConfig { k: K, ..NgramConfig::default() };
    let mut drafted = 0;
    for (n, st) in rec.steps.iter().enumerate() {
        let context: Vec<i64> = st.context.iter().map(|&t| i64::from(t)).collect();
        let mut want = specdec_reference::ngram::propose(&context, weights.config.vocab_size, &cfg).map_err(|e| e.to_string())?;
        want.truncate(st.max_drafts);
        let got: Vec<i64> = st.drafts.iter().map(|&t| i64::from(t)).collect();
        if got != want {
            return Err(format!("proposal {n} (sequence {}, context of {} tokens): drafts {got:?}, the n-gram rule gives {want:?}", st.slot, st.context.len()));
        }
        drafted += usize::from(!want.is_empty());
    }
    if drafted == 0 {
        return Err("no step drafted anything: the prompts do not exercise the n-gram rule".into());
    }
    Ok(0)
}

/// A proposer that runs the one it wraps and, after every step, asks
/// `check` of its state; the first failure is kept (a stale state may go on
/// to break the run, and the mismatch is the finding).
struct CheckedEachStep<'p, P, F> {
    inner: &'p mut P,
    check: F,
    steps: usize,
    failure: Option<String>,
}

impl<'p, P, F> CheckedEachStep<'p, P, F> {
    fn new(inner: &'p mut P, check: F) -> Self {
        CheckedEachStep { inner, check, steps: 0, failure: None }
    }
}

impl<B: ModelBackend, P: Proposer<B>, F: FnMut(&B, &P, &Observed<'_, B::Tensor>) -> Result<(), String>> Proposer<B> for CheckedEachStep<'_, P, F> {
    fn name(&self) -> String {
        self.inner.name()
    }

    fn hidden_layers(&self) -> &[usize] {
        self.inner.hidden_layers()
    }

    fn inject(&mut self, fault: Fault) {
        self.inner.inject(fault);
    }

    fn begin(&mut self, b: &B, batch: usize, capacity: usize, max_k: usize) -> Result<(), DecodeError> {
        self.inner.begin(b, batch, capacity, max_k)
    }

    fn propose(&mut self, b: &B, seqs: &[SeqView<'_>], rngs: &mut [Pcg64]) -> Result<Proposal<B::Tensor>, DecodeError> {
        self.inner.propose(b, seqs, rngs)
    }

    fn observe(&mut self, b: &B, observed: &Observed<'_, B::Tensor>) -> Result<(), DecodeError> {
        self.inner.observe(b, observed)?;
        self.steps += 1;
        if self.failure.is_none()
            && let Err(e) = (self.check)(b, self.inner, observed)
        {
            self.failure = Some(format!("after step {}: {e}", self.steps));
        }
        Ok(())
    }

    fn release(&mut self, b: &B, slot: usize) -> Result<(), DecodeError> {
        self.inner.release(b, slot)
    }
}

/// Every sequence's draft cache against a fresh prefill of what it should hold.
fn draft_cache_matches<B: ModelBackend>(b: &B, d: &DraftModelProposer<B>, layers: usize, tol: f64) -> Result<(), String> {
    let (cache, fed) = d.cache_and_fed().ok_or("no draft cache")?;
    let lens = b.cache_lens(cache);
    for (slot, kept) in fed.iter().enumerate() {
        if lens[slot] != kept.len() {
            return Err(format!("sequence {slot}: the draft cache holds {} positions, it kept {} tokens", lens[slot], kept.len()));
        }
        if kept.is_empty() {
            continue;
        }
        let mut fresh = b.new_model_cache(d.model(), 1, kept.len()).map_err(err)?;
        b.forward(d.model(), &mut fresh, &ForwardRequest { tokens: std::slice::from_ref(kept), logits: LogitRows::None, hidden_layers: &[] }).map_err(err)?;
        for layer in 0..layers {
            let (k1, v1) = b.cache_contents(cache, layer, slot).map_err(err)?;
            let (k2, v2) = b.cache_contents(&fresh, layer, 0).map_err(err)?;
            for (what, x, y) in [("keys", &k1, &k2), ("values", &v1, &v2)] {
                let scale = row_scale(y);
                if let Some((j, (a, e))) = x.iter().zip(y).enumerate().find(|(_, (a, e))| !within((*a - *e).abs(), tol * scale)) {
                    return Err(format!("sequence {slot} layer {layer} {what}[{j}]: {a} vs a fresh prefill's {e}"));
                }
            }
        }
    }
    Ok(())
}

/// The draft-model statement for a draft proposer (the section's seeded
/// draft, or a negative control's): greedy runs of the prompts, the draft's
/// cache checked after every step.
pub fn draft_cache_fidelity<B: ModelBackend>(
    b: &B,
    target: &LlamaWeights,
    m: &B::Model,
    set: &GreedyPrompts,
    draft: &mut DraftModelProposer<B>,
    draft_layers: usize,
    config: &EngineConfig,
) -> Result<usize, String> {
    let out = checked_draft_run(b, target, m, set, draft, draft_layers, config)?;
    some_rejection(&out, "the draft's rollback")
}

/// A greedy run of the prompts with the draft's cache checked after every step.
fn checked_draft_run<B: ModelBackend>(
    b: &B,
    target: &LlamaWeights,
    m: &B::Model,
    set: &GreedyPrompts,
    draft: &mut DraftModelProposer<B>,
    draft_layers: usize,
    config: &EngineConfig,
) -> Result<RunOutput, String> {
    let tolerance = b.model_precision().logit_rel_tolerance;
    let mut checked = CheckedEachStep::new(draft, |b: &B, d: &DraftModelProposer<B>, _: &Observed<'_, B::Tensor>| draft_cache_matches(b, d, draft_layers, tolerance));
    let out = engine(b, target, m, config)?.generate(&set.requests(), &mut checked, None, &mut NoSink);
    // A stale cache may go on to break the run (it outgrows its capacity):
    // the first mismatch is the finding.
    if let Some(f) = checked.failure {
        return Err(f);
    }
    out.map_err(|e| err_of(&e))
}

/// `Err` where no draft was rejected: the run never exercised `what`.
fn some_rejection(out: &RunOutput, what: &str) -> Result<usize, String> {
    if out.acceptance.accepted == out.acceptance.proposed {
        return Err(format!("no draft was rejected: the prompts do not exercise {what}"));
    }
    Ok(0)
}

/// How far an f32 drafter context may sit from a fresh one, relative to the row scale.
const F32_CONTEXT_TOLERANCE: f64 = 1e-5;

/// Sequence `slot`'s drafter context against a fresh one from the target's
/// hidden rows of `tokens` (the positions in the target cache).
fn dflash_context_matches<B: ModelBackend>(b: &B, d: &DflashProposer, target: &B::Model, slot: usize, tokens: &[u32], tol: f64) -> Result<(), String> {
    let held = d.context(slot).ok_or("no drafter context")?;
    if held.len != tokens.len() {
        return Err(format!("sequence {slot}: the drafter context holds {} positions, the target cache {}", held.len, tokens.len()));
    }
    let layers = Proposer::<B>::hidden_layers(d).to_vec();
    let mut cache = b.new_model_cache(target, 1, tokens.len()).map_err(err)?;
    let out = b.forward(target, &mut cache, &ForwardRequest { tokens: &[tokens.to_vec()], logits: LogitRows::None, hidden_layers: &layers }).map_err(err)?;
    let hidden = b.download_f64(out.hidden.as_ref().ok_or("the target forward returned no hidden states")?).map_err(err)?;
    let fresh = d.fresh_context(hidden.data()).map_err(|e| e.to_string())?;
    for (layer, ((k1, v1), (k2, v2))) in held.layers.iter().zip(&fresh.layers).enumerate() {
        for (what, x, y) in [("keys", k1, k2), ("values", v1, v2)] {
            let scale = row_scale(y);
            if x.len() != y.len() {
                return Err(format!("sequence {slot} layer {layer} {what}: {} values, a fresh context's {}", x.len(), y.len()));
            }
            if let Some((j, (a, e))) = x.iter().zip(y).enumerate().find(|(_, (a, e))| !within((*a - *e).abs(), tol * scale)) {
                return Err(format!("sequence {slot} layer {layer} {what}[{j}]: {a} vs a fresh context's {e}"));
            }
        }
    }
    Ok(())
}

/// The DFlash statement for a DFlash drafter (the section's, or a negative
/// control's): greedy runs of the prompts, every context checked after every step.
pub fn dflash_context_fidelity<B: ModelBackend>(b: &B, target: &LlamaWeights, m: &B::Model, set: &GreedyPrompts, drafter: &mut DflashProposer, config: &EngineConfig) -> Result<usize, String> {
    // The parallel drafter's f32 context is projected by sgemm, whose sums
    // round differently for a step's few rows than for a prefill's many
    // (2.3e-7 of the row scale seen on the tiny model): its own bound.
    let tolerance = b.model_precision().hidden_rel_tolerance.max(F32_CONTEXT_TOLERANCE);
    let check = |b: &B, d: &DflashProposer, o: &Observed<'_, B::Tensor>| {
        o.seqs.iter().filter(|s| !s.finished).try_for_each(|s| dflash_context_matches(b, d, m, s.slot, &s.context[..s.context.len() - 1], tolerance))
    };
    let mut checked = CheckedEachStep::new(drafter, check);
    let out = engine(b, target, m, config)?.generate(&set.requests(), &mut checked, None, &mut NoSink);
    if let Some(f) = checked.failure {
        return Err(f);
    }
    some_rejection(&out.map_err(|e| err_of(&e))?, "the drafter's context")
}

/// Runs the check for `proposer` on the section's greedy prompts.
pub(super) fn check<B: ModelBackend>(b: &B, s: &Subject, m: &B::Model, plain: &Plain, proposer: &str, config: &EngineConfig) -> Result<usize, String> {
    let w = &s.weights;
    let vocab = w.config.vocab_size;
    let e = |e: DecodeError| e.to_string();
    match proposer.parse::<ProposerChoice>()? {
        ProposerChoice::Ngram => {
            let mut p = build_proposer(b, proposer, w)?;
            ngram_fidelity(b, w, m, &plain.set, p.as_mut(), config)
        }
        ProposerChoice::Draft(arg) if arg.to_str() == Some("self") => {
            let mut p = DraftModelProposer::new(b, proposer, w, vocab).map_err(e)?;
            let out = checked_draft_run(b, w, m, &plain.set, &mut p, w.config.num_hidden_layers, config)?;
            every_draft_accepted(b, &out, plain)
        }
        ProposerChoice::Draft(arg) => {
            let draft = SectionDrafts.draft_model(&arg, w).map_err(e)?;
            let mut p = DraftModelProposer::new(b, proposer, &draft, vocab).map_err(e)?;
            draft_cache_fidelity(b, w, m, &plain.set, &mut p, draft.config.num_hidden_layers, config)
        }
        ProposerChoice::EarlyExit(l) => {
            let mut p = DraftModelProposer::early_exit(b, w, l).map_err(e)?;
            draft_cache_fidelity(b, w, m, &plain.set, &mut p, l, config)
        }
        ProposerChoice::Dflash(arg) | ProposerChoice::DflashIter(arg) => {
            let mode = if proposer.starts_with("dflash-iter:") { specdec_decoder::choice::ITERATIVE } else { DflashMode::Parallel };
            let mut p = DflashProposer::new(proposer, SectionDrafts.dflash_draft(&arg, w).map_err(e)?, Arc::clone(w), mode).map_err(e)?;
            dflash_context_fidelity(b, w, m, &plain.set, &mut p, config)
        }
        ProposerChoice::None => Err("plain decoding has no proposer to check".into()),
    }
}

/// The target drafting for itself at temperature 0: every draft accepted,
/// a rejection excused (and counted) only below the window epsilon.
fn every_draft_accepted<B: ModelBackend>(b: &B, out: &RunOutput, plain: &Plain) -> Result<usize, String> {
    let eps = b.model_precision().window_margin_epsilon;
    let mut excused = 0;
    for (i, (o, run)) in out.outputs.iter().zip(&plain.runs).enumerate() {
        let a = &o.acceptance;
        if a.accepted == a.proposed {
            continue;
        }
        if run.margins.iter().any(|&m| m < eps) {
            excused += 1;
            continue;
        }
        return Err(format!("request {i}: the target drafting for itself had {} of {} drafts accepted", a.accepted, a.proposed));
    }
    if out.acceptance.proposed == 0 {
        return Err("no draft was proposed".into());
    }
    Ok(excused)
}
