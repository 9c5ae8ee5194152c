//! The `fidelity` check: a proposer does what it claims. Losslessness alone
//! cannot show it (greedy verify repairs any draft), yet users read the
//! acceptance figures as facts about the proposer.
//!
//! - `ngram` (NGRAM-2, NGRAM-3): every step's drafts are the reference rule's
//!   (`specdec_reference::ngram::propose`) on the sequence's context at that
//!   step, cut to the step's room; a proposer drafting from a stale context
//!   fails (the negative control in `tests/e2e_section.rs`).
//! - `draft:seeded` (DECODE-4, KV-6): after every step the draft model's
//!   cache holds exactly what it kept (a fresh prefill of those tokens, within
//!   the backend's tolerance), so a rejection rolled it back; a draft that
//!   forgets rejected tokens without trimming its cache fails (the negative
//!   control).
//! - `draft:self` (GREEDY-2, DECODE-2): the target drafting for itself at
//!   temperature 0 has every draft accepted; a rejection is excused (and
//!   counted) only where the request's plain output has a top-2 margin below
//!   the backend's window epsilon.

use rand_pcg::Pcg64;
use specdec_backend::NgramConfig;
use specdec_backend::model::{ForwardRequest, LogitRows};
use specdec_backend::model::{LlamaWeights, ModelBackend};
use specdec_decoder::proposer::Observed;
use specdec_decoder::{DecodeError, DraftModelProposer, EngineConfig, NoSink, Proposal, Proposer, SeqView};

use super::{GreedyPrompts, K, Plain, build_proposer, engine, err_of, seeded_draft};
use crate::compare::{row_scale, within};
use crate::model_section::{Subject, err};

/// Whether a proposer has a fidelity statement.
pub(super) fn applies(proposer: &str) -> bool {
    matches!(proposer, "ngram" | "draft:self" | "draft:seeded")
}

pub(super) fn rules(proposer: &str) -> &'static [&'static str] {
    match proposer {
        "ngram" => &["NGRAM-2", "NGRAM-3"],
        "draft:seeded" => &["DECODE-4", "KV-6"],
        _ => &["GREEDY-2", "DECODE-2"],
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
}

impl<'p, B: ModelBackend> Recording<'p, B> {
    pub(super) fn new(inner: &'p mut dyn Proposer<B>) -> Self {
        Recording { inner, steps: Vec::new() }
    }

    /// The drafts of the first proposal, if there was one.
    pub(super) fn first_drafts(&self) -> Option<Vec<u32>> {
        self.steps.first().map(|s| s.drafts.clone())
    }
}

impl<B: ModelBackend> Proposer<B> for Recording<'_, B> {
    fn name(&self) -> String {
        self.inner.name()
    }

    fn hidden_layers(&self) -> &[usize] {
        self.inner.hidden_layers()
    }

    fn begin(&mut self, b: &B, batch: usize, capacity: usize, max_k: usize) -> Result<(), DecodeError> {
        self.inner.begin(b, batch, capacity, max_k)
    }

    fn propose(&mut self, b: &B, seqs: &[SeqView<'_>], rngs: &mut [Pcg64]) -> Result<Proposal<B::Tensor>, DecodeError> {
        let p = self.inner.propose(b, seqs, rngs)?;
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

/// A draft model whose cache is compared with a fresh prefill after every step.
struct CheckedDraft<'p, B: ModelBackend> {
    inner: &'p mut DraftModelProposer<B>,
    layers: usize,
    tolerance: f64,
    steps: usize,
    failure: Option<String>,
}

impl<B: ModelBackend> Proposer<B> for CheckedDraft<'_, B> {
    fn name(&self) -> String {
        self.inner.name()
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
            && let Err(e) = draft_cache_matches(b, self.inner, self.layers, self.tolerance)
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
    let tolerance = b.model_precision().logit_rel_tolerance;
    let mut checked = CheckedDraft { inner: draft, layers: draft_layers, tolerance, steps: 0, failure: None };
    let out = engine(b, target, m, config)?.generate(&set.requests(), &mut checked, None, &mut NoSink);
    // A stale cache may go on to break the run (it outgrows its capacity):
    // the first mismatch is the finding.
    if let Some(f) = checked.failure {
        return Err(f);
    }
    let out = out.map_err(|e| err_of(&e))?;
    if out.acceptance.accepted == out.acceptance.proposed {
        return Err("no draft was rejected: the prompts do not exercise the draft's rollback".into());
    }
    Ok(0)
}

/// Runs the check for `proposer` on the section's greedy prompts.
pub(super) fn check<B: ModelBackend>(b: &B, s: &Subject, m: &B::Model, plain: &Plain, proposer: &str, config: &EngineConfig) -> Result<usize, String> {
    if proposer == "draft:seeded" {
        let draft = seeded_draft(&s.weights)?;
        let mut p = DraftModelProposer::new(b, proposer, &draft, s.weights.config.vocab_size).map_err(|e| e.to_string())?;
        return draft_cache_fidelity(b, &s.weights, m, &plain.set, &mut p, draft.config.num_hidden_layers, config);
    }
    let mut p = build_proposer(b, proposer, &s.weights)?;
    if proposer == "ngram" {
        return ngram_fidelity(b, &s.weights, m, &plain.set, p.as_mut(), config);
    }
    let out = engine(b, &s.weights, m, config)?.generate(&plain.set.requests(), p.as_mut(), None, &mut NoSink).map_err(|e| err_of(&e))?;
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
