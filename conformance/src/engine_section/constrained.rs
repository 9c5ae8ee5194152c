//! `engine/<label>/constrained/<setting>/{greedy,on,off}` (ENGINE-9): a
//! regex constraint, or a recursive grammar, carried through the engine contract, lossless under
//! speculation (CONSTRAIN-1 .. CONSTRAIN-4). `greedy`: at temperature 0,
//! speculation on and off equal the reference's constrained greedy output
//! (each row masked by the plain definition, CONSTRAIN-2, margins excused as
//! ENGINE-3), which ends at eos where the pattern lets it; so every output
//! keeps the constraint and finishes right. `on` and `off`: the law of the
//! first two tokens at temperature 1 under the constraint equals the exact
//! law enumerated on the reference (statistical, in the engine's family):
//! the second token is decided by a window row after a draft, where a mask
//! from the committed state, a mask on the first row only, or a draft `q`
//! without the mask shows.
//!
//! The patterns are over the tiny models' text (`Aa`, `Bb`, ..): tokens
//! straddle their elements, and they refuse what a repeating prompt's
//! n-gram drafts propose; the grammar counts (n openers, `Ff`, n closers),
//! which no regex can, so its state is a chart the engine must keep with
//! its KV cache. The eos is `Ll` (id 11), which no pattern uses, so it is
//! allowed only where the output matches.

use specdec_backend::SamplingParams;
use specdec_backend::model::{ForwardRequest, LlamaWeights, RefModel};
use specdec_constraint::{Constraint, Vocabulary};
use specdec_decoder::{ConstraintSpec, LogprobMode, TokenTable};
use specdec_engines::{Finish, GenerationEngine, GenerationRequest};
use specdec_reference::{RowInputs, logprob_row};
use specdec_stats::TestReport;

use super::{Expect, GreedyRun, greedy_pick, judge_all, law_check};
use crate::compare::Verdict;
use crate::e2e_section::{RefConstraint, Setting, TINY_TOKENS, exact_law_with, sampled_setup, tiny_prompts};

/// One setting of the check: its name and its regex, or GBNF grammar, over tiny text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConstraintSetting {
    pub name: &'static str,
    pub pattern: &'static str,
    /// `pattern` is a GBNF grammar (CONSTRAIN-5), not a regex.
    pub grammar: bool,
}

/// The settings: tokens that straddle the pattern's elements and may not
/// repeat; a forced stretch with a bounded tail; a recursive grammar.
pub const CONSTRAINT_SETTINGS: [ConstraintSetting; 3] = [
    ConstraintSetting { name: "alternation", pattern: "A(a[BC]|b[AC]|c[AB])*[abc]", grammar: false },
    ConstraintSetting { name: "bounded", pattern: "(AaBb|CcDd|Ee)*Ff(Gg|Hh){2,4}", grammar: false },
    ConstraintSetting { name: "nested", pattern: r#"root ::= ("Aa" | "Bb" | "Cc") root ("Dd" | "Ee") | "Ff""#, grammar: true },
];

/// The eos of every constrained request (`Ll`).
pub const CONSTRAINED_EOS: u32 = 11;

/// Tokens of the `on` / `off` law (the second decided by a window row after a draft).
pub const CONSTRAINED_TOKENS: usize = 2;

impl ConstraintSetting {
    pub fn spec(&self) -> ConstraintSpec {
        if self.grammar { ConstraintSpec::Grammar(self.pattern.into()) } else { ConstraintSpec::Regex(self.pattern.into()) }
    }

    fn request(&self, prompt: Vec<u32>, params: SamplingParams, seed: u64, max_new_tokens: usize, on: bool) -> GenerationRequest {
        GenerationRequest { eos: vec![CONSTRAINED_EOS], constraint: Some(self.spec()), ..GenerationRequest::sampled(prompt, params, seed, max_new_tokens, on) }
    }

    /// The constraint and the tiny vocabulary of `w`, as the reference applies them.
    fn compiled(&self, w: &LlamaWeights) -> Result<(Constraint, Vocabulary), String> {
        let c = Constraint::new(&self.spec()).map_err(|e| e.to_string())?;
        Ok((c, TokenTable::tiny(w.config.vocab_size).vocabulary().clone()))
    }
}

/// `greedy`: the section's prompts at temperature 0 under the constraint,
/// speculation on and off, against the reference's constrained greedy outputs.
pub(super) fn greedy(engine: &mut dyn GenerationEngine, w: &LlamaWeights, s: &ConstraintSetting) -> Result<Verdict, Verdict> {
    let fail = Verdict::Fail;
    let model = RefModel::new(w.clone());
    let (c, vocab) = s.compiled(w).map_err(fail)?;
    let rc = RefConstraint { constraint: &c, vocab: &vocab, eos: CONSTRAINED_EOS };
    // Every token allowed in its turn, and a match where eos ends it (CONSTRAIN-4).
    let (kc, kv) = (c.clone(), vocab.clone());
    let keeps: super::OutputRule = std::sync::Arc::new(move |g: &specdec_engines::Generation| {
        let eos = [CONSTRAINED_EOS];
        match specdec_constraint::state_after(&kc, &g.tokens, &kv, &eos) {
            None => Err("a token the constraint refuses".into()),
            Some(s) if g.finish == Finish::Eos && !kc.accepts(s) => Err("eos where the output does not match".into()),
            Some(_) => Ok(()),
        }
    });
    let mut cases = Vec::new();
    for on in [true, false] {
        for p in tiny_prompts() {
            let req = s.request(p, SamplingParams::greedy(), 0, TINY_TOKENS, on);
            let run = reference_greedy(&model, &req, &rc).map_err(fail)?;
            let finish = if run.tokens.last() == Some(&CONSTRAINED_EOS) { Finish::Eos } else { Finish::Length };
            cases.push(Expect::new(req, &run, run.tokens.len(), finish).holding(keeps.clone()));
        }
    }
    if !cases.iter().any(|e| e.finish == Finish::Eos) {
        return Err(fail(format!("{}: no reference output ends at eos, so the check would not see eos allowed early", s.name)));
    }
    judge_all(engine, &cases, "greedy-identity")
}

/// The reference's constrained greedy output of `r`: each row masked with
/// the plain definition, the argmax with ties to the lowest id, its top-2
/// margin among the allowed ids; it ends at eos or the length cap.
fn reference_greedy(model: &RefModel, r: &GenerationRequest, c: &RefConstraint) -> Result<GreedyRun, String> {
    let mut context = r.prompt.clone();
    let mut run = GreedyRun { tokens: Vec::new(), margins: Vec::new() };
    while run.tokens.len() < r.max_new_tokens && run.tokens.last() != Some(&CONSTRAINED_EOS) {
        let mut cache = model.new_cache(1, context.len()).map_err(|e| e.to_string())?;
        let out = model.forward(&mut cache, &ForwardRequest::last_logits(std::slice::from_ref(&context))).map_err(|e| e.to_string())?;
        let masked = specdec_constraint::mask_scores(&out.logits, &c.allowed(&run.tokens)?);
        let lp = logprob_row(&masked, LogprobMode::Processed, r.params(), RowInputs::default()).map_err(|e| e.to_string())?;
        let (id, margin) = greedy_pick(&lp)?;
        run.tokens.push(id);
        run.margins.push(margin);
        context.push(id);
    }
    Ok(run)
}

/// `on` / `off`: the law of the first [`CONSTRAINED_TOKENS`] tokens of the
/// sampled prompt at temperature 1 under the constraint, counted against
/// the exact law (one extra cell, expected 0, for anything outside it: a
/// token the constraint refuses lands there).
pub(super) fn law(engine: &mut dyn GenerationEngine, w: &LlamaWeights, s: &ConstraintSetting, on: bool, name: &str, base: u64, family: usize) -> Result<TestReport, Verdict> {
    let fail = Verdict::Fail;
    let (prompt, _) = sampled_setup(w).map_err(fail)?;
    let (c, vocab) = s.compiled(w).map_err(fail)?;
    let params = SamplingParams::new(1.0, 0, 1.0);
    let setting = Setting { params, bias: &[], constraint: Some(RefConstraint { constraint: &c, vocab: &vocab, eos: CONSTRAINED_EOS }) };
    let law = exact_law_with(w, &prompt, CONSTRAINED_EOS, &setting, CONSTRAINED_TOKENS).map_err(fail)?;
    let request = |i: usize| s.request(prompt.clone(), params, base.wrapping_add(i as u64), CONSTRAINED_TOKENS, on);
    law_check(engine, &law, &request, name, family)
}
