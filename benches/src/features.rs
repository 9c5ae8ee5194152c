//! What a request carries beside its prompt, and what it costs a decode
//! step (issue 48's logprobs, issue 43's constraints): on the tool-call mix
//! of `fixtures/prompts/tool_calls.json`, greedy, each prompt plain, plain
//! with logprobs (top 5, processed), plain under its JSON schema, and with
//! n-gram drafts without and with logprobs and the schema; and plain and with n-gram
//! drafts under a recursive grammar of any JSON object
//! (`fixtures/constraints/json-object.gbnf`, a context-free constraint: its
//! mask llguidance's, its parser moved along the output).
//! The ratios are of decode time per token in this one run: logprobs over
//! plain, each mask over plain, and speculation over plain with and without
//! a constraint (how much drafts buy when most of the output is forced). A configuration whose
//! tokens differ from the plain run it must equal fails the section.

use std::sync::Arc;

use serde::Serialize;
use specdec_backend::model::ModelBackend;
use specdec_decoder::{Constrained, ConstraintSpec, Engine, EngineConfig, LogprobMode, LogprobRequest, NoSink, ProposerChoice, Request, RunOutput, TokenTable};
use specdec_models::{LlamaWeights, Tokenizer};

/// Drafts per step of the speculative runs (a fixed k: the pay-off
/// controller would fold its own choices into the ratio).
pub const FEATURE_K: usize = 3;

/// One configuration's totals over the mix.
#[derive(Debug, Clone, Serialize)]
pub struct FeatureRow {
    pub config: &'static str,
    pub tokens: usize,
    pub decode_s: f64,
    /// Decode time per token over the plain run's.
    pub over_plain: f64,
}

/// The section's result on one backend.
#[derive(Debug, Clone, Serialize)]
pub struct Features {
    pub backend: String,
    pub prompts: usize,
    /// Tokens at most per answer.
    pub max_tokens: usize,
    pub rows: Vec<FeatureRow>,
    /// Each constrained answer, plain, named by its configuration (the texts the rows timed).
    pub answers: Vec<String>,
}

/// What a configuration constrains its answers to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Constrain {
    Nothing,
    /// The mix's tool-call schema (a regex, its DFA).
    Schema,
    /// Any JSON object, a recursive grammar (Earley).
    Grammar,
}

/// Any JSON object, as a recursive GBNF grammar.
const JSON_OBJECT_GRAMMAR: &str = include_str!("../../fixtures/constraints/json-object.gbnf");

/// The configurations: name, drafts, logprobs, constraint; and the one
/// whose tokens it must equal.
const CONFIGS: [(&str, bool, bool, Constrain, &str); 8] = [
    ("plain", false, false, Constrain::Nothing, "plain"),
    ("plain + logprobs", false, true, Constrain::Nothing, "plain"),
    ("n-gram", true, false, Constrain::Nothing, "plain"),
    ("n-gram + logprobs", true, true, Constrain::Nothing, "plain"),
    ("plain + schema", false, false, Constrain::Schema, "plain + schema"),
    ("n-gram + schema", true, false, Constrain::Schema, "plain + schema"),
    ("plain + grammar", false, false, Constrain::Grammar, "plain + grammar"),
    ("n-gram + grammar", true, false, Constrain::Grammar, "plain + grammar"),
];

/// Runs every configuration on `b`, `max_tokens` per answer.
pub fn measure<B: ModelBackend>(name: &str, b: &B, w: &Arc<LlamaWeights>, tok: &Tokenizer, max_tokens: usize) -> Result<Features, String> {
    let mix = specdec_models::prompts::tool_call_mix(tok).map_err(|e| e.to_string())?;
    let (schema, prompts): (_, Vec<Vec<u32>>) = (mix.schema, mix.prompts.into_iter().map(|(_, ids)| ids).collect());
    let table = TokenTable::of_tokenizer(tok, w.config.vocab_size)?;
    let schema = Constrained::new(ConstraintSpec::JsonSchema(schema), Arc::clone(&table)).map_err(|e| e.to_string())?;
    let grammar = ConstraintSpec::grammar(JSON_OBJECT_GRAMMAR).map_err(|e| e.to_string())?;
    let model = b.load_model(w).map_err(|e| e.to_string())?;
    let run = |drafts: bool, logprobs: bool, constrain: Constrain, prompt: &[u32]| -> Result<RunOutput, String> {
        let proposer = if drafts { "ngram".parse::<ProposerChoice>()? } else { ProposerChoice::None };
        let mut p = proposer.build(b, w, FEATURE_K).map_err(|e| e.to_string())?;
        let config = EngineConfig { k: if drafts { FEATURE_K } else { 0 }, ..EngineConfig::default() };
        let engine = Engine::new(b, &model, &w.config, config).map_err(|e| e.to_string())?;
        let request = Request {
            eos: w.config.eos_ids(),
            logprobs: logprobs.then_some(LogprobRequest { top: 5, mode: LogprobMode::Processed }),
            constraint: match constrain {
                Constrain::Nothing => None,
                Constrain::Schema => Some(schema.clone()),
                // Compiled per request, as a server does (its charts are per output).
                Constrain::Grammar => Some(Constrained::new(grammar.clone(), Arc::clone(&table)).map_err(|e| e.to_string())?),
            },
            ..Request::greedy(prompt.to_vec(), max_tokens)
        };
        engine.generate(&[request], p.as_mut(), None, &mut NoSink).map_err(|e| e.to_string())
    };
    let mut totals = vec![(0usize, 0.0f64); CONFIGS.len()];
    let mut answers = Vec::new();
    for (i, prompt) in prompts.iter().enumerate() {
        let mut tokens: Vec<Vec<u32>> = Vec::new();
        for (c, &(config, drafts, logprobs, constrain, equal_to)) in CONFIGS.iter().enumerate() {
            let r = run(drafts, logprobs, constrain, prompt)?;
            let out = r.outputs[0].tokens.clone();
            let base = CONFIGS.iter().position(|x| x.0 == equal_to).expect("a named configuration");
            if base < c && out != tokens[base] {
                return Err(format!("{name}, prompt {i}: `{config}` gives other tokens than `{equal_to}`"));
            }
            if config == "plain + schema" || config == "plain + grammar" {
                answers.push(format!("{config}: {}", tok.decode(&out, true).map_err(|e| e.to_string())?));
            }
            totals[c].0 += out.len();
            totals[c].1 += r.timings.total_s() - r.timings.prefill_s;
            tokens.push(out);
        }
    }
    let per_token = |(n, s): (usize, f64)| s / n.max(1) as f64;
    let plain = per_token(totals[0]);
    let rows = CONFIGS.iter().zip(&totals).map(|(c, &t)| FeatureRow { config: c.0, tokens: t.0, decode_s: t.1, over_plain: per_token(t) / plain }).collect();
    Ok(Features { backend: name.into(), prompts: prompts.len(), max_tokens, rows, answers })
}

/// The section in Markdown.
pub fn markdown(f: &Result<Features, String>) -> String {
    let mut md = String::from("## What a request carries: logprobs and a JSON schema\n\n");
    match f {
        Err(why) => md.push_str(&format!("Not run: {why}\n\n")),
        Ok(f) => {
            md.push_str(&format!(
                "SmolLM2-135M on {}, greedy, the {} chat prompts of `fixtures/prompts/tool_calls.json` (at most {} tokens each, a constrained answer ending at eos), n-gram drafts at a fixed k = {FEATURE_K}. Decode time per token over plain decoding's, this run; a configuration whose tokens differ from the run it must equal fails the section.\n\n| configuration | tokens | decode s | time per token over plain |\n|---|---|---|---|\n",
                f.backend, f.prompts, f.max_tokens
            ));
            for r in &f.rows {
                md.push_str(&format!("| {} | {} | {:.3} | {:.3} |\n", r.config, r.tokens, r.decode_s, r.over_plain));
            }
            md.push_str("\nThe constrained answers:\n\n");
            for a in &f.answers {
                md.push_str(&format!("- `{a}`\n"));
            }
            md.push('\n');
        }
    }
    md
}
