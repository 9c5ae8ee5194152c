//! `engine/<label>/processors/<setting>/{greedy,on,off}` (ENGINE-8): min-p,
//! a logit bias that bans an id, one that boosts one, and each penalty,
//! carried through the engine contract. `greedy`: at temperature 0 with the
//! setting, speculation on and off equal the f64 reference's greedy output
//! under the same processors (exact, margins excused as ENGINE-3). `on` and
//! `off`: the law of the first tokens at temperature 1 with the setting
//! equals the exact law enumerated on the reference (statistical, in the
//! engine's family, as ENGINE-4). Min-p has no `greedy` check: it always
//! keeps the largest id, so it cannot move an argmax, and a check there
//! could not fail.
//!
//! The biased ids come from the reference, never from the engine: the ban
//! falls on the argmax of the first generated position of the check's
//! first prompt (the token the outputs would otherwise lead with), the
//! boost lifts that row's least likely id to 2 above its largest logit.

use specdec_backend::model::{ForwardRequest, LlamaWeights, RefModel};
use specdec_backend::{PenaltyScope, SamplingParams};
use specdec_decoder::LogprobMode;
use specdec_engines::{EngineInfo, Finish, GenerationEngine, GenerationRequest};
use specdec_reference::{RowInputs, bias_row, logprob_row};
use specdec_stats::TestReport;

use super::{Expect, GreedyRun, greedy_pick, judge_all, law_check};
use crate::compare::Verdict;
use crate::e2e_section::{Setting, TINY_TOKENS, exact_law_with, penalty_counts_of, sampled_setup, tiny_prompts};

/// A logit bias of a setting, resolved on the reference.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Bias {
    None,
    /// -100 on the argmax of the first generated position.
    Ban,
    /// The least likely id of that row lifted to 2 above its largest logit.
    Boost,
}

/// One setting of the check: its name, its parameters at temperature 1
/// (the `greedy` check sets temperature 0), its bias.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ProcessorSetting {
    pub name: &'static str,
    pub params: SamplingParams,
    pub bias: Bias,
}

const fn t1() -> SamplingParams {
    SamplingParams::new(1.0, 0, 1.0)
}

/// The settings. Each penalty counts the scope its peers count it over
/// (repetition the whole context as HF and llama.cpp; presence and
/// frequency the generated tokens as OpenAI and vLLM), or the other where
/// the engine states only that ([`ProcessorSetting::in_scope_of`]: llama.cpp
/// counts every penalty over the context), strong enough that a row that
/// misses it moves the law by far more than the check's delta.
pub const PROCESSOR_SETTINGS: [ProcessorSetting; 6] = [
    ProcessorSetting { name: "min-p", params: SamplingParams { min_p: 0.3, ..t1() }, bias: Bias::None },
    ProcessorSetting { name: "bias-ban", params: t1(), bias: Bias::Ban },
    ProcessorSetting { name: "bias-boost", params: t1(), bias: Bias::Boost },
    ProcessorSetting { name: "repetition", params: SamplingParams { repetition_penalty: 1.8, ..t1() }, bias: Bias::None },
    ProcessorSetting { name: "presence", params: SamplingParams { presence_penalty: 1.0, penalty_scope: PenaltyScope::Generated, ..t1() }, bias: Bias::None },
    ProcessorSetting { name: "frequency", params: SamplingParams { frequency_penalty: 0.8, penalty_scope: PenaltyScope::Generated, ..t1() }, bias: Bias::None },
];

impl ProcessorSetting {
    /// The setting in a scope the engine states: a penalty's own scope where
    /// it states that one or none, else the one it states (the reference
    /// counts either exactly, LOGITS-12).
    pub fn in_scope_of(&self, info: &EngineInfo) -> ProcessorSetting {
        let scope = self.params.penalty_scope;
        let penalised = self.params.penalised();
        match info.penalty_scopes.first() {
            Some(&stated) if penalised && !info.penalty_scopes.contains(&scope) => ProcessorSetting { params: SamplingParams { penalty_scope: stated, ..self.params }, ..*self },
            _ => *self,
        }
    }

    /// Whether it has a `greedy` check (min-p cannot move an argmax).
    pub fn has_greedy(&self) -> bool {
        self.params.min_p == 0.0
    }

    /// Its bias pairs after `prompt`, resolved on the reference forward.
    fn bias(&self, model: &RefModel, prompt: &[u32]) -> Result<Vec<(u32, f64)>, String> {
        if self.bias == Bias::None {
            return Ok(Vec::new());
        }
        let mut cache = model.new_cache(1, prompt.len()).map_err(|e| e.to_string())?;
        let out = model.forward(&mut cache, &ForwardRequest::last_logits(&[prompt.to_vec()])).map_err(|e| e.to_string())?;
        let row = &out.logits;
        let (top, max) = row.iter().enumerate().fold((0, f64::NEG_INFINITY), |(i, m), (j, &x)| if x > m { (j, x) } else { (i, m) });
        let (low, min) = row.iter().enumerate().fold((0, f64::INFINITY), |(i, m), (j, &x)| if x < m { (j, x) } else { (i, m) });
        Ok(match self.bias {
            Bias::Ban => vec![(top as u32, -100.0)],
            _ => vec![(low as u32, max - min + 2.0)],
        })
    }

    /// A request of this setting (its parameters with `temperature`).
    fn request(&self, prompt: Vec<u32>, temperature: f64, bias: &[(u32, f64)], seed: u64, max_new_tokens: usize, on: bool) -> GenerationRequest {
        let params = SamplingParams { temperature, ..self.params };
        GenerationRequest { logit_bias: bias.to_vec(), ..GenerationRequest::sampled(prompt, params, seed, max_new_tokens, on) }
    }
}

/// `greedy`: the section's prompts at temperature 0 under the setting,
/// speculation on and off, against the reference's greedy outputs under it.
pub(super) fn greedy(engine: &mut dyn GenerationEngine, w: &LlamaWeights, s: &ProcessorSetting) -> Result<Verdict, Verdict> {
    let fail = Verdict::Fail;
    let s = &s.in_scope_of(engine.info());
    let model = RefModel::new(w.clone());
    let prompts = tiny_prompts();
    let bias = s.bias(&model, &prompts[0]).map_err(fail)?;
    let mut cases = Vec::new();
    for on in [true, false] {
        for p in &prompts {
            let req = s.request(p.clone(), 0.0, &bias, 0, TINY_TOKENS, on);
            let run = reference_greedy(&model, &req).map_err(fail)?;
            cases.push(Expect::new(req, &run, TINY_TOKENS, Finish::Length));
        }
    }
    judge_all(engine, &cases, "greedy-identity")
}

/// The reference's greedy output of `r` (no eos): each token the argmax of
/// its row after bias and penalties (LOGITS-2), ties to the lowest id, with
/// its top-2 margin.
fn reference_greedy(model: &RefModel, r: &GenerationRequest) -> Result<GreedyRun, String> {
    let vocab = model.config().vocab_size;
    let params = r.params();
    let bias = if r.logit_bias.is_empty() { None } else { Some(bias_row(&r.logit_bias, vocab).map_err(|e| e.to_string())?) };
    let mut context = r.prompt.clone();
    let mut run = GreedyRun { tokens: Vec::new(), margins: Vec::new() };
    for _ in 0..r.max_new_tokens {
        let mut cache = model.new_cache(1, context.len()).map_err(|e| e.to_string())?;
        let out = model.forward(&mut cache, &ForwardRequest::last_logits(std::slice::from_ref(&context))).map_err(|e| e.to_string())?;
        let counts = penalty_counts_of(&params, &context, r.prompt.len(), vocab);
        let lp = logprob_row(&out.logits, LogprobMode::Processed, params, RowInputs { counts: counts.as_deref(), bias: bias.as_deref() }).map_err(|e| e.to_string())?;
        let (id, margin) = greedy_pick(&lp)?;
        run.tokens.push(id);
        run.margins.push(margin);
        context.push(id);
    }
    Ok(run)
}

/// Tokens of the `on` / `off` law: the second is decided by a window row
/// after a draft (where a processor forgotten on verified rows, or counts
/// that miss the draft, LOGITS-13, show), and the law stays small enough
/// for a planned sample that costs seconds.
pub const PROCESSOR_TOKENS: usize = 2;

/// `on` / `off`: the law of the first [`PROCESSOR_TOKENS`] tokens of the
/// sampled prompt at temperature 1 with the setting, counted against the
/// exact law (one extra cell, expected 0, for anything outside its support).
pub(super) fn law(engine: &mut dyn GenerationEngine, w: &LlamaWeights, s: &ProcessorSetting, on: bool, name: &str, base: u64, family: usize) -> Result<TestReport, Verdict> {
    let fail = Verdict::Fail;
    let s = &s.in_scope_of(engine.info());
    let model = RefModel::new(w.clone());
    let (prompt, eos) = sampled_setup(w).map_err(fail)?;
    let bias = s.bias(&model, &prompt).map_err(fail)?;
    let law = exact_law_with(w, &prompt, eos, &Setting { params: s.params, bias: &bias, constraint: None }, PROCESSOR_TOKENS).map_err(fail)?;
    let request = |i: usize| GenerationRequest { eos: vec![eos], ..s.request(prompt.clone(), s.params.temperature, &bias, base.wrapping_add(i as u64), PROCESSOR_TOKENS, on) };
    law_check(engine, &law, &request, name, family)
}
