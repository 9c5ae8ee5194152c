//! The end-to-end section of the suite: the speculative decoder
//! (`specdec-decoder`) on a backend, every proposer, against plain decoding
//! on the same backend and against the exact law of the reference forward
//! (DECODE-2 .. DECODE-5).
//!
//! Models: the tiny model, the architectures' checkpoints (`hf-<arch>`,
//! n-gram and self-draft greedy and rollback) and SmolLM2.
//!
//! Proposers: n-gram, a seeded draft model, the target as its own draft
//! (every draft accepted: bonus and eos paths), early exit, seeded DFlash
//! drafters (parallel and iterative unmasking) on the tiny model, and the
//! shipped DFlash draft trained for SmolLM2 (`fixtures/dflash/`).
//!
//! Checks, `e2e/<model>/<proposer>/<check>`:
//! - `greedy`: speculative greedy output equals the same backend's plain
//!   greedy output (an independent loop, [`crate::model_section::greedy`]),
//!   token for token; a divergence is excused only at a step whose plain
//!   top-2 margin is below the backend's epsilon, and counted; on SmolLM2
//!   the runs of n-gram and the trained DFlash draft must also accept a
//!   whole block, the bonus row read (`full_blocks::SMOLLM2_FULL_BLOCKS`;
//!   the seeded draft and early exit have `full-blocks` instead);
//! - `full-blocks`: the same identity on 48 seeded prompts at k = 1 and
//!   k = 2, with at least 4 steps whose every draft was accepted, so the
//!   bonus row is read for every proposer of the tiny model; on SmolLM2, for
//!   the seeded draft and early exit, the same on the greedy prompts with a
//!   drafter of their kind that agrees with the target (`full_blocks.rs`);
//! - `rollback`: after that run the target cache equals a fresh prefill of
//!   the prompt and the emitted tokens but the last (within the backend's
//!   tolerance; exactly on the reference);
//! - `stop`: with stop strings (DECODE-7) cut from the plain output (a
//!   token's whole text, and the last character of one token with the first
//!   of the next), each request ends exactly at the token that completes its
//!   string, wherever that falls in an accepted run or across steps
//!   (`stop.rs`);
//! - `fidelity` (every proposer on the tiny model, n-gram on SmolLM2): the
//!   proposer does what it claims, which losslessness alone does not show:
//!   every n-gram draft is the reference rule's on the sequence's current
//!   context; a draft model's cache (seeded, self, early exit) equals a
//!   fresh prefill of what it kept after every step; a DFlash drafter's
//!   context equals a fresh one from the target's hidden rows of the
//!   positions in the target cache after every step; the target drafting
//!   for itself at temperature 0 has every draft accepted (`fidelity.rs`);
//! - `sampled` (tiny model only): the law of whole generated sequences
//!   (temperature 1, top-k 4, up to 3 tokens, an eos the law reaches, k = 2) from
//!   requests with their own seeds equals the exact law computed from the
//!   reference forward; chi-squared, the family judged with Holm at
//!   `FAMILY_ALPHA`, the sample size planned before sampling so each check
//!   detects a total variation of [`E2E_DELTA`] with miss probability
//!   [`E2E_BETA`]; never retried;
//! - `sampled-penalised` (tiny model): the same law check with every
//!   processor and a logit bias on ([`PENALISED`]), one Holm family with
//!   `sampled`;
//!
//! - `step-law` (tiny model, every proposer): the exact law of one sampled
//!   step given its drafts (k = 2 and 3, with and without every processor),
//!   integrated over the engine's explicit verify uniforms (DECODE-3),
//!   equals the law the rules give on the reference forward's rows
//!   (`step_law.rs`): a shared or misindexed uniform, or a bonus from the
//!   wrong row, fails deterministically.
//!
//! The negative controls (conformance/tests/e2e_section.rs) run these same
//! checks on decoders with one injected bug each and assert they fail; the
//! fault list (`fixtures/faults.json`, `fault_list.rs`) names, for each
//! listed fault and proposer, the check that catches it, or why it cannot
//! show.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use specdec_backend::SamplingParams;
use specdec_backend::model::{ForwardRequest, LlamaWeights, ModelBackend, RefModel};

use specdec_decoder::choice::DraftSource;
use specdec_decoder::{DecodeError, Engine, EngineConfig, NoSink, Proposer, ProposerChoice, Request};
use specdec_reference::{RowInputs, bias_row, penalty_counts, process_logits_with};
use specdec_stats::TestReport;

use crate::check::{CheckResult, Kind, SuiteConfig, catch, settle};
use crate::compare::{Verdict, row_scale, within};
use crate::model_section::{self, ARCHITECTURE_CASES, HF_PREFIX, ModelFiles, SMOLLM2, Subject, err, shipped_prompts};
use crate::stat;

mod fidelity;
mod full_blocks;
pub use fidelity::{dflash_context_fidelity, draft_cache_fidelity, ngram_fidelity};
pub use stop::{cuts, tiny_text};
mod step_law;
mod stop;

/// The tiny model of the end-to-end section (vocabulary 12: its whole output law is enumerable).
pub const TINY: &str = "tiny-v12-l2";
/// Drafts per step in the section.
pub const K: usize = 3;
/// Generated tokens per SmolLM2 prompt.
pub const SMOLLM2_TOKENS: usize = 24;
/// Generated tokens per tiny prompt in the greedy check: not a multiple of
/// `K + 1`, so a fully accepted run crosses the length cap.
pub const TINY_TOKENS: usize = 22;
/// Tokens of a sampled tiny generation (the law's sequences are at most this long).
pub const SAMPLED_TOKENS: usize = 3;
/// Drafts per step in the sampled check: fewer than its tokens, so a fully
/// accepted first step emits a bonus token the law sees.
pub const SAMPLED_K: usize = 2;
/// The sampling parameters of the sampled check.
pub const SAMPLED_PARAMS: SamplingParams = SamplingParams::new(1.0, 4, 1.0);

/// What a request samples with: its parameters, its logit bias and its
/// constraint.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Setting<'a> {
    pub params: SamplingParams,
    pub bias: &'a [(u32, f64)],
    pub constraint: Option<RefConstraint<'a>>,
}

/// A constraint as the reference applies it: the plain mask of
/// `specdec_constraint` (CONSTRAIN-2) over the generated tokens' text, eos
/// allowed where the output matches.
#[derive(Debug, Clone, Copy)]
pub struct RefConstraint<'a> {
    pub constraint: &'a specdec_constraint::Constraint,
    pub vocab: &'a specdec_constraint::Vocabulary,
    pub eos: u32,
}

impl PartialEq for RefConstraint<'_> {
    fn eq(&self, other: &Self) -> bool {
        std::ptr::eq(self.constraint, other.constraint) && self.vocab == other.vocab && self.eos == other.eos
    }
}

impl RefConstraint<'_> {
    /// The allowed tokens after `generated` (CONSTRAIN-2); an error where
    /// one of them is not allowed.
    pub fn allowed(&self, generated: &[u32]) -> Result<Vec<bool>, String> {
        let eos = [self.eos];
        let state = specdec_constraint::state_after(self.constraint, generated, self.vocab, &eos).ok_or_else(|| format!("{generated:?} leaves the constraint"))?;
        Ok(specdec_constraint::allowed(self.constraint, state, self.vocab, &eos))
    }
}

impl Setting<'_> {
    pub const fn plain(params: SamplingParams) -> Self {
        Setting { params, bias: &[], constraint: None }
    }

    /// A request of this setting.
    pub fn request(&self, prompt: Vec<u32>, max_tokens: usize, seed: u64) -> Request {
        Request { sampling: self.params, logit_bias: self.bias.to_vec(), seed, ..Request::greedy(prompt, max_tokens) }
    }
}

/// The `sampled-penalised` check's setting: every processor on (LOGITS-7 ..
/// LOGITS-12), strong enough that a window row that forgets the drafts
/// before it, or a draft `q` without them, moves the law by far more than
/// the check's `E2E_DELTA`.
pub const PENALISED: Setting = Setting {
    params: SamplingParams {
        temperature: 1.0,
        top_k: 0,
        top_p: 1.0,
        min_p: 0.02,
        repetition_penalty: 1.8,
        presence_penalty: 0.5,
        frequency_penalty: 0.4,
        penalty_scope: specdec_backend::PenaltyScope::Context,
    },
    bias: &[(2, 0.8), (9, -1.5)],
    constraint: None,
};
/// The total variation each sampled check detects ...
pub const E2E_DELTA: f64 = 0.05;
/// ... with this miss probability (stated before sampling).
pub const E2E_BETA: f64 = 1e-2;
/// Requests per engine batch in the sampled check.
const SAMPLED_BATCH: usize = 512;

/// The proposers of the section, by model.
pub fn proposers(model: &str) -> Vec<&'static str> {
    if model.starts_with(HF_PREFIX) {
        // The architectures' checkpoints (MODEL-17): a copying drafter and the model as its own draft.
        return vec!["ngram", "draft:self"];
    }
    if model == SMOLLM2 { vec!["ngram", "early-exit:8", "draft:seeded", "dflash:trained"] } else { vec!["ngram", "draft:seeded", "draft:self", "early-exit:1", "dflash:seeded", "dflash-iter:seeded"] }
}

/// One end-to-end check.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct E2eItem {
    pub name: String,
    pub model: String,
    pub proposer: String,
    pub check: &'static str,
    pub rules: &'static [&'static str],
}

/// Every end-to-end check, before selection.
pub fn e2e_items() -> Vec<E2eItem> {
    let mut items = Vec::new();
    let architectures: Vec<String> = ARCHITECTURE_CASES.iter().map(|c| format!("{HF_PREFIX}{c}")).collect();
    for model in [TINY].into_iter().chain(architectures.iter().map(String::as_str)).chain([SMOLLM2]) {
        for p in proposers(model) {
            if model.starts_with(HF_PREFIX) {
                for (check, rules) in [("greedy", &["DECODE-2", "GREEDY-5", "MODEL-17"][..]), ("rollback", &["DECODE-5", "KV-6"][..])] {
                    items.push(E2eItem { name: format!("e2e/{model}/{p}/{check}"), model: model.into(), proposer: p.into(), check, rules });
                }
                continue;
            }
            let mut checks: Vec<(&'static str, &'static [&'static str])> = vec![("greedy", &["DECODE-2", "GREEDY-5"]), ("rollback", &["DECODE-5", "KV-6"]), ("stop", &["DECODE-7", "DECODE-6"])];
            if fidelity::applies(p) && (model == TINY || p == "ngram") {
                checks.push(("fidelity", fidelity::rules(p)));
            }
            if model == SMOLLM2 && full_blocks::has_smollm2_stand_in(p) {
                checks.push(("full-blocks", full_blocks::RULES));
            }
            if model == TINY {
                checks.push(("full-blocks", full_blocks::RULES));
                checks.push(("sampled", &["DECODE-2", "DECODE-3", "REJECT-7", "STAT-3"]));
                checks.push(("sampled-penalised", &["LOGITS-7", "LOGITS-8", "LOGITS-9", "LOGITS-10", "LOGITS-12", "LOGITS-13", "REJECT-7", "STAT-3"]));
                if step_law::applies(p) {
                    checks.push(("step-law", step_law::rules(p)));
                }
            }
            for (check, rules) in checks {
                items.push(E2eItem { name: format!("e2e/{model}/{p}/{check}"), model: model.into(), proposer: p.into(), check, rules });
            }
        }
    }
    items
}

/// Builds a proposer of the section for `w` on `b`, by the decoder's one
/// parser and builder ([`ProposerChoice`]); the arguments of its names are
/// the section's own drafts ([`SectionDrafts`]).
pub fn build_proposer<B: ModelBackend>(b: &B, name: &str, w: &Arc<LlamaWeights>) -> Result<Box<dyn Proposer<B>>, String> {
    name.parse::<ProposerChoice>()?.build_from(b, w, K, &SectionDrafts).map_err(|e| e.to_string())
}

/// The section's drafts: `self` (the target), `seeded` (a seeded model of
/// the target's vocabulary) and `trained` (the shipped DFlash checkpoint).
pub struct SectionDrafts;

impl DraftSource for SectionDrafts {
    fn draft_model<'t>(&self, arg: &Path, target: &'t LlamaWeights) -> Result<Cow<'t, LlamaWeights>, DecodeError> {
        match arg.to_str() {
            Some("self") => Ok(Cow::Borrowed(target)),
            Some("seeded") => seeded_draft(target).map(Cow::Owned).map_err(DecodeError::Config),
            _ => Err(DecodeError::Config(format!("the section has no draft `{}`", arg.display()))),
        }
    }

    fn dflash_draft(&self, arg: &Path, target: &LlamaWeights) -> Result<specdec_models::DflashDraft, DecodeError> {
        match arg.to_str() {
            Some("seeded") => seeded_dflash(target).map_err(DecodeError::Config),
            // The shipped draft trained for SmolLM2 (its checkpoint is validated against `target` at load).
            Some("trained") => specdec_models::load_dflash(model_section::shipped_dflash_dir(), &target.config).map_err(|e| DecodeError::Config(format!("the shipped DFlash draft: {e}"))),
            _ => Err(DecodeError::Config(format!("the section has no DFlash draft `{}`", arg.display()))),
        }
    }
}

/// A small seeded draft on `w`'s vocabulary: a model of its own (one layer,
/// hidden 32), which shares nothing with the target but the vocabulary.
pub fn seeded_draft(w: &LlamaWeights) -> Result<LlamaWeights, String> {
    let mut cfg = w.config.clone();
    cfg.hidden_size = 32;
    cfg.intermediate_size = 64;
    cfg.num_hidden_layers = 1;
    cfg.num_attention_heads = 4;
    cfg.num_key_value_heads = 2;
    cfg.head_dim = None;
    specdec_models::tiny::seeded(cfg, 77).map_err(|e| e.to_string())
}

/// A seeded DFlash drafter for `w` (one layer, block 4, every target layer
/// as context features, the last id as the mask).
pub fn seeded_dflash(w: &LlamaWeights) -> Result<specdec_models::DflashDraft, String> {
    let c = &w.config;
    let spec = specdec_models::DflashSpec::one_layer(c, 4, (c.vocab_size - 1) as u32);
    specdec_models::seeded_dflash(c, spec, 91).map_err(|e| e.to_string())
}

/// An engine's config for the section (checked ops: conformance runs the
/// validity checks; the results are the same as the unchecked hot path).
pub fn engine_config() -> EngineConfig {
    EngineConfig { k: K, checked: true, ..EngineConfig::default() }
}

/// Runs the selected end-to-end checks on `backend`.
pub fn run<B: ModelBackend>(backend: &B, cfg: &SuiteConfig, files: &ModelFiles, progress: &mut dyn FnMut(&CheckResult)) -> Vec<CheckResult> {
    run_with(backend, cfg, files, &engine_config(), progress)
}

/// [`run`] with a given engine config (the negative controls inject faults here).
pub fn run_with<B: ModelBackend>(backend: &B, cfg: &SuiteConfig, files: &ModelFiles, engine: &EngineConfig, progress: &mut dyn FnMut(&CheckResult)) -> Vec<CheckResult> {
    let mut results = Vec::new();
    let mut sampled = Vec::new();
    let mut current: model_section::CurrentModel<B::Model> = None;
    let mut last_cache: Option<(String, Result<GreedyRun<B>, String>)> = None;
    // Plain greedy runs once per model; every proposer is compared with it.
    let mut plain: Option<(String, Result<Plain, String>)> = None;
    for item in e2e_items() {
        let mut result = CheckResult::unselected(&item.name, Kind::EndToEnd, format!("e2e/{}", item.check), item.rules, &backend.name(), cfg.seed);
        if !cfg.wants(&item.name) {
            progress(&result);
            results.push(result);
            continue;
        }
        if item.model == SMOLLM2 && backend.name() == "reference" {
            // The f64 reference decodes SmolLM2 at ~10 tokens/s: it is the
            // model section's greedy oracle, and runs this section on the tiny model.
            settle(&mut result, Verdict::NotSupported("the reference runs the end-to-end section on the tiny model only".into()), &cfg.selection);
            progress(&result);
            results.push(result);
            continue;
        }
        let start = Instant::now();
        if current.as_ref().is_none_or(|(m, _)| *m != item.model) {
            current = Some((item.model.clone(), model_section::load_subject(backend, &item.model, files)));
        }
        let Some((_, loaded)) = &current else { unreachable!("set above") };
        let (subject, model) = match loaded {
            Ok(x) => x,
            Err(v) => {
                settle(&mut result, v.clone(), &cfg.selection);
                progress(&result);
                results.push(result);
                continue;
            }
        };
        let key = format!("{}/{}", item.model, item.proposer);
        let verdict = match item.check {
            "greedy" | "rollback" => {
                if plain.as_ref().is_none_or(|(m, _)| *m != item.model) {
                    plain = Some((item.model.clone(), catch(|| plain_run(backend, subject, model)).and_then(|r| r)));
                }
                if last_cache.as_ref().is_none_or(|(k, _)| *k != key) {
                    let run = match &plain {
                        Some((_, Ok(p))) => catch(|| greedy_run(backend, subject, model, p, &item.proposer, engine)).and_then(|r| r),
                        Some((_, Err(e))) => Err(e.clone()),
                        None => unreachable!("set above"),
                    };
                    last_cache = Some((key, run));
                }
                match &last_cache {
                    Some((_, Ok(run))) if item.check == "greedy" => run.verdict.clone(),
                    Some((_, Ok(run))) => catch(|| check_rollback(backend, subject, model, run)).unwrap_or_else(Verdict::Fail),
                    Some((_, Err(e))) => to_verdict(Err(e.clone())),
                    None => unreachable!("set above"),
                }
            }
            "stop" | "fidelity" | "full-blocks" if item.model == SMOLLM2 || item.check != "full-blocks" => {
                if plain.as_ref().is_none_or(|(m, _)| *m != item.model) {
                    plain = Some((item.model.clone(), catch(|| plain_run(backend, subject, model)).and_then(|r| r)));
                }
                let outcome = match &plain {
                    Some((_, Ok(p))) if item.check == "stop" => catch(|| stop::check(backend, subject, model, p, &item.proposer, engine)).and_then(|r| r),
                    Some((_, Ok(p))) if item.check == "full-blocks" => catch(|| full_blocks::check_smollm2(backend, subject, model, p, &item.proposer, engine)).and_then(|r| r),
                    Some((_, Ok(p))) => catch(|| fidelity::check(backend, subject, model, p, &item.proposer, engine)).and_then(|r| r),
                    Some((_, Err(e))) => Err(e.clone()),
                    None => unreachable!("set above"),
                };
                to_verdict(outcome)
            }
            "step-law" => catch(|| step_law::check(backend, subject, model, &item.proposer, engine, cfg.seed)).unwrap_or_else(Verdict::Fail),
            "full-blocks" => to_verdict(catch(|| full_blocks::check(backend, subject, model, &item.proposer, engine)).and_then(|r| r)),
            "sampled" | "sampled-penalised" => {
                // Judged with the family below (Holm, STAT-2).
                let setting = if item.check == "sampled" { Setting::plain(SAMPLED_PARAMS) } else { PENALISED };
                let outcome = catch(|| sampled_counts(backend, subject, model, &item.proposer, engine, cfg.seed, &setting)).unwrap_or_else(|m| Err(Verdict::Fail(m)));
                result.millis = start.elapsed().as_secs_f64() * 1e3;
                sampled.push((results.len(), outcome));
                results.push(result);
                continue;
            }
            other => Verdict::Fail(format!("unknown check `{other}`")),
        };
        result.millis = start.elapsed().as_secs_f64() * 1e3;
        settle(&mut result, verdict, &cfg.selection);
        progress(&result);
        results.push(result);
    }
    stat::settle_family(&mut results, sampled, "e2e", &cfg.selection, progress);
    results
}

fn to_verdict(outcome: Result<usize, String>) -> Verdict {
    match outcome {
        Ok(excused) => Verdict::Pass { excused, max_abs_err: 0.0 },
        Err(msg) if msg.starts_with(model_section::NOT_SUPPORTED) => Verdict::NotSupported(msg[model_section::NOT_SUPPORTED.len()..].to_string()),
        Err(msg) => Verdict::Fail(msg),
    }
}

/// A greedy speculative run, its verdict, and its cache for the rollback check.
struct GreedyRun<B: ModelBackend> {
    verdict: Verdict,
    prompts: Vec<Vec<u32>>,
    tokens: Vec<Vec<u32>>,
    cache: B::ModelCache,
}

/// What a model's greedy checks decode: prompts, tokens per prompt, eos ids.
#[derive(Debug, Clone)]
pub struct GreedyPrompts {
    pub prompts: Vec<Vec<u32>>,
    pub max_tokens: usize,
    pub eos: Vec<u32>,
}

impl GreedyPrompts {
    /// One greedy request per prompt.
    pub fn requests(&self) -> Vec<Request> {
        self.prompts.iter().map(|p| Request { eos: self.eos.clone(), ..Request::greedy(p.clone(), self.max_tokens) }).collect()
    }
}

/// A fresh engine for `weights` with `config`.
fn engine<'a, B: ModelBackend>(b: &'a B, weights: &LlamaWeights, m: &'a B::Model, config: &EngineConfig) -> Result<Engine<'a, B>, String> {
    Engine::new(b, m, &weights.config, config.clone()).map_err(|e| e.to_string())
}

/// Greedy prompts: SmolLM2's shipped prompts, or seeded ids with repeats for the tiny model.
fn greedy_prompts(s: &Subject) -> Result<GreedyPrompts, String> {
    if let Some(loaded) = &s.loaded {
        let tok = loaded.tokenizer.as_ref().ok_or("SmolLM2 has no tokenizer")?;
        let prompts = shipped_prompts().iter().map(|p| tok.prompt_ids(&p.text, p.chat).map_err(|e| e.to_string())).collect::<Result<_, _>>()?;
        return Ok(GreedyPrompts { prompts, max_tokens: SMOLLM2_TOKENS, eos: s.weights.config.eos_ids() });
    }
    let prompts = tiny_prompts();
    if s.hf.is_some() {
        // An architecture's checkpoint has no end token of its own: the length ends its outputs.
        return Ok(GreedyPrompts { prompts, max_tokens: TINY_TOKENS, eos: Vec::new() });
    }
    let eos = tiny_eos(&s.weights, &prompts)?;
    Ok(GreedyPrompts { prompts, max_tokens: TINY_TOKENS, eos: vec![eos] })
}

/// The tiny model's greedy prompts: seeded ids with repeats (n-gram drafts).
pub fn tiny_prompts() -> Vec<Vec<u32>> {
    vec![vec![1, 2, 3, 1, 2, 3, 1], vec![5], vec![7, 7, 7, 7], vec![0, 4, 9, 2, 4, 9, 2, 4, 11, 10]]
}

/// The tiny greedy check's eos: an id the plain greedy outputs (of the
/// reference, without eos) first reach mid-generation in some prompts,
/// never in the first few tokens of any, and never at all in another, so
/// accepted runs hold it (DECODE-6) and a run also crosses the length cap.
/// The smallest such id.
pub fn tiny_eos(w: &LlamaWeights, prompts: &[Vec<u32>]) -> Result<u32, String> {
    let reference = RefModel::new(w.clone());
    let runs = model_section::greedy(&specdec_backend::ReferenceBackend, &reference, prompts, TINY_TOKENS, &[], w.config.vocab_size)?;
    let first = |v: u32| runs.iter().map(|r| r.tokens.iter().position(|&t| t == v)).collect::<Vec<_>>();
    (0..w.config.vocab_size as u32)
        .find(|&v| {
            let f = first(v);
            f.iter().flatten().all(|&p| p >= 4) && f.iter().flatten().any(|&p| p >= TINY_TOKENS / 3) && f.iter().any(Option::is_none)
        })
        .ok_or_else(|| "no id of the tiny model's vocabulary ends some greedy outputs mid-generation and no other".to_string())
}

/// A model's greedy prompts and their plain greedy decoding on the backend.
pub(crate) struct Plain {
    set: GreedyPrompts,
    runs: Vec<model_section::GreedyRun>,
}

fn plain_run<B: ModelBackend>(b: &B, s: &Subject, m: &B::Model) -> Result<Plain, String> {
    let set = greedy_prompts(s)?;
    let runs = model_section::greedy(b, m, &set.prompts, set.max_tokens, &set.eos, s.weights.config.vocab_size)?;
    Ok(Plain { set, runs })
}

fn greedy_run<B: ModelBackend>(b: &B, s: &Subject, m: &B::Model, plain: &Plain, proposer: &str, config: &EngineConfig) -> Result<GreedyRun<B>, String> {
    let Plain { set, runs: plain } = plain;
    let mut p = build_proposer(b, proposer, &s.weights)?;
    let (out, cache) = engine(b, &s.weights, m, config)?.run(&set.requests(), p.as_mut(), None, &mut NoSink).map_err(|e| err_of(&e))?;
    // DECODE-2 within the backend: its windows against its own decodes.
    let eps = b.model_precision().window_margin_epsilon;
    let mut excused = 0;
    let mut failure = None;
    for (i, (o, e)) in out.outputs.iter().zip(plain.iter()).enumerate() {
        match e.divergence(&o.tokens, eps) {
            model_section::Divergence::Excused(_) => {
                excused += 1;
                continue;
            }
            model_section::Divergence::Unexcused(step) => {
                failure = Some(format!("prompt {i}: token {step} is {}, plain greedy gives {} (plain top-2 margin {:.3e} >= epsilon {eps:e})", o.tokens[step], e.tokens[step], e.margins[step]));
                break;
            }
            model_section::Divergence::None => {}
        }
        if o.tokens.len() != e.tokens.len() {
            failure = Some(format!("prompt {i}: {} tokens, plain greedy generated {}", o.tokens.len(), e.tokens.len()));
            break;
        }
    }
    let a = &out.acceptance;
    // On SmolLM2 the greedy run must also read the bonus row (`full_blocks.rs`).
    let bonus = if s.loaded.is_some() && full_blocks::SMOLLM2_FULL_BLOCKS.contains(&proposer) { full_blocks::enough_bonus(a, 1).err() } else { None };
    let verdict = match failure.or(bonus) {
        Some(f) => Verdict::Fail(format!("{f} [{} proposed, {} accepted, {} steps with every draft accepted]", a.proposed, a.accepted, a.bonus)),
        None => to_verdict(Ok(excused)),
    };
    Ok(GreedyRun { verdict, prompts: set.prompts.clone(), tokens: out.outputs.into_iter().map(|o| o.tokens).collect(), cache })
}

fn err_of(e: &specdec_decoder::DecodeError) -> String {
    match e {
        specdec_decoder::DecodeError::Backend(b) => err(b.clone()),
        other => other.to_string(),
    }
}

/// DECODE-5: the speculative run's cache against a fresh prefill of what it emitted.
fn check_rollback<B: ModelBackend>(b: &B, s: &Subject, m: &B::Model, run: &GreedyRun<B>) -> Verdict {
    let outcome = (|| -> Result<(usize, f64), String> {
        let tol = b.model_precision().logit_rel_tolerance;
        let mut worst = 0.0f64;
        for (i, (p, t)) in run.prompts.iter().zip(&run.tokens).enumerate() {
            let kept: Vec<u32> = p.iter().chain(&t[..t.len() - 1]).copied().collect();
            let lens = b.cache_lens(&run.cache);
            if lens[i] != kept.len() {
                return Err(format!("request {i}: the cache holds {} positions, the prompt and emitted tokens but the last are {}", lens[i], kept.len()));
            }
            let mut fresh = b.new_model_cache(m, 1, kept.len()).map_err(err)?;
            b.forward(m, &mut fresh, &ForwardRequest { tokens: &[kept], logits: specdec_backend::model::LogitRows::None, hidden_layers: &[] }).map_err(err)?;
            for layer in 0..s.weights.config.num_hidden_layers {
                let (k1, v1) = b.cache_contents(&run.cache, layer, i).map_err(err)?;
                let (k2, v2) = b.cache_contents(&fresh, layer, 0).map_err(err)?;
                for (what, x, y) in [("keys", &k1, &k2), ("values", &v1, &v2)] {
                    let scale = row_scale(y);
                    for (j, (a, e)) in x.iter().zip(y).enumerate() {
                        let d = (a - e).abs();
                        worst = worst.max(d);
                        if !within(d, tol * scale) {
                            return Err(format!("request {i} layer {layer} {what}[{j}]: {a} vs a fresh prefill's {e} (|diff| {d:.3e} > {tol:e} x {scale:.3e})"));
                        }
                    }
                }
            }
        }
        Ok((0, worst))
    })();
    match outcome {
        Ok((excused, max_abs_err)) => Verdict::Pass { excused, max_abs_err },
        Err(e) => to_verdict(Err(e)),
    }
}

/// The sampled check's prompt and eos: a repetitive prompt (n-gram drafts),
/// and the eos the law reaches: the second most likely first token.
pub fn sampled_setup(w: &LlamaWeights) -> Result<(Vec<u32>, u32), String> {
    let prompt = vec![3, 1, 4, 1, 5, 3, 1, 4];
    let p = next_law(w, &prompt, prompt.len(), &Setting::plain(SAMPLED_PARAMS))?;
    let mut order: Vec<usize> = (0..p.len()).collect();
    order.sort_by(|&a, &b| p[b].total_cmp(&p[a]).then(a.cmp(&b)));
    Ok((prompt, order[1] as u32))
}

/// The processed law of the token after `context` (whose first `prompt_len`
/// tokens are the prompt) by the reference forward.
fn next_law(w: &LlamaWeights, context: &[u32], prompt_len: usize, setting: &Setting) -> Result<Vec<f64>, String> {
    let (mut rows, _) = processed_rows(&RefModel::new(w.clone()), &[context.to_vec()], prompt_len, setting)?;
    Ok(rows.remove(0))
}

/// The penalty counts of a row whose context is `tokens` (the first
/// `prompt_len` the prompt) under `params`' scope, or none when no penalty
/// is on (LOGITS-12).
pub fn penalty_counts_of(params: &SamplingParams, tokens: &[u32], prompt_len: usize, vocab: usize) -> Option<Vec<f64>> {
    params.penalised().then(|| penalty_counts(params.penalty_scope.counted(tokens, prompt_len), vocab))
}

/// The processed law of the token after each context, by the reference
/// forward, and the largest `|logit|` seen. Each context's first
/// `prompt_len` tokens are the prompt; the penalties count its scope of the
/// whole context (LOGITS-12), drafts included (LOGITS-13).
fn processed_rows(model: &RefModel, contexts: &[Vec<u32>], prompt_len: usize, setting: &Setting) -> Result<(Vec<Vec<f64>>, f64), String> {
    processed_rows_counting(model, contexts, contexts, prompt_len, setting)
}

/// [`processed_rows`] whose penalties count `counted[i]` for row `i` (a
/// window row that forgets the drafts before it counts its prompt alone).
fn processed_rows_counting(model: &RefModel, contexts: &[Vec<u32>], counted: &[Vec<u32>], prompt_len: usize, setting: &Setting) -> Result<(Vec<Vec<f64>>, f64), String> {
    let mut rows = Vec::with_capacity(contexts.len());
    let mut scale = 0.0f64;
    for (context, counted) in contexts.iter().zip(counted) {
        let mut cache = model.new_cache(1, context.len()).map_err(|e| e.to_string())?;
        let out = model.forward(&mut cache, &ForwardRequest::last_logits(std::slice::from_ref(context))).map_err(|e| e.to_string())?;
        scale = out.logits.iter().fold(scale, |m, x| m.max(x.abs()));
        let vocab = out.logits.len();
        let counts = penalty_counts_of(&setting.params, counted, prompt_len, vocab);
        let bias = if setting.bias.is_empty() { None } else { Some(bias_row(setting.bias, vocab).map_err(|e| e.to_string())?) };
        let inputs = RowInputs { counts: counts.as_deref(), bias: bias.as_deref() };
        let logits = match &setting.constraint {
            Some(c) => specdec_constraint::mask_scores(&out.logits, &c.allowed(&context[prompt_len..])?),
            None => out.logits,
        };
        rows.push(process_logits_with(&logits, setting.params, inputs).map_err(|e| e.to_string())?);
    }
    Ok((rows, scale))
}

/// The exact law of a sampled generation: sequences that end at eos or at
/// [`SAMPLED_TOKENS`] tokens, by enumeration over the reference forward.
pub fn exact_law(w: &LlamaWeights, prompt: &[u32], eos: u32, setting: &Setting) -> Result<BTreeMap<Vec<u32>, f64>, String> {
    exact_law_with(w, prompt, eos, setting, SAMPLED_TOKENS)
}

/// [`exact_law`] with a given setting and at most `m` tokens.
pub fn exact_law_with(w: &LlamaWeights, prompt: &[u32], eos: u32, setting: &Setting, m: usize) -> Result<BTreeMap<Vec<u32>, f64>, String> {
    let mut law = BTreeMap::new();
    let mut open = vec![(Vec::new(), 1.0)];
    while let Some((seq, prob)) = open.pop() {
        let context: Vec<u32> = prompt.iter().chain(&seq).copied().collect();
        for (x, &px) in next_law(w, &context, prompt.len(), setting)?.iter().enumerate() {
            if px == 0.0 {
                continue;
            }
            let mut next: Vec<u32> = seq.clone();
            next.push(x as u32);
            if x as u32 == eos || next.len() == m {
                *law.entry(next).or_insert(0.0) += prob * px;
            } else {
                open.push((next, prob * px));
            }
        }
    }
    Ok(law)
}

fn sampled_counts<B: ModelBackend>(b: &B, s: &Subject, m: &B::Model, proposer: &str, config: &EngineConfig, seed: u64, setting: &Setting) -> Result<TestReport, Verdict> {
    let mut p = build_proposer(b, proposer, &s.weights).map_err(Verdict::Fail)?;
    sampled_law_check(b, &s.weights, m, p.as_mut(), config, seed, setting)
}

/// The `sampled` (or `sampled-penalised`) check with a given proposer and
/// setting: samples whole generations on `b` and counts them per cell of
/// the exact law (one extra cell, expected 0, for any sequence outside the
/// law's support); the report is judged by the caller (Holm over the family
/// of both checks).
pub fn sampled_law_check<B: ModelBackend>(b: &B, weights: &LlamaWeights, m: &B::Model, p: &mut dyn Proposer<B>, config: &EngineConfig, seed: u64, setting: &Setting) -> Result<TestReport, Verdict> {
    let fail = Verdict::Fail;
    let proposer = p.name();
    let (prompt, eos) = sampled_setup(weights).map_err(fail)?;
    let law = exact_law(weights, &prompt, eos, setting).map_err(fail)?;
    let mut expected: Vec<f64> = law.values().copied().collect();
    expected.push(0.0);
    let family = e2e_items().iter().filter(|i| is_sampled(i.check)).count();
    let check = if setting.params.penalised() { "sampled-penalised" } else { "sampled" };
    let n = stat::planned_n_for(&expected, family, E2E_DELTA, E2E_BETA).map_err(fail)? as usize;
    let cells: BTreeMap<&Vec<u32>, usize> = law.keys().enumerate().map(|(i, k)| (k, i)).collect();
    let mut counts = vec![0u64; expected.len()];
    let config = EngineConfig { k: SAMPLED_K, ..config.clone() };
    let engine = Engine::new(b, m, &weights.config, config).map_err(|e| fail(e.to_string()))?;
    let base = stat::stream_seed(seed, &if check == "sampled" { format!("e2e/{proposer}") } else { format!("e2e/{proposer}/{check}") });
    let mut done = 0;
    while done < n {
        let batch = SAMPLED_BATCH.min(n - done);
        let reqs: Vec<Request> = (0..batch).map(|i| Request { eos: vec![eos], ..setting.request(prompt.clone(), SAMPLED_TOKENS, base.wrapping_add((done + i) as u64)) }).collect();
        let out = engine.generate(&reqs, p, None, &mut NoSink).map_err(|e| match to_verdict(Err(err_of(&e))) {
            Verdict::Pass { .. } => fail(e.to_string()),
            v => v,
        })?;
        for o in &out.outputs {
            counts[cells.get(&o.tokens).copied().unwrap_or(expected.len() - 1)] += 1;
        }
        done += batch;
    }
    stat::test_counts(&format!("e2e/{proposer}/{check} (n = {n})"), &counts, &expected, family).map_err(fail)
}

/// The statistical checks of the section: one Holm family (STAT-2).
fn is_sampled(check: &str) -> bool {
    check == "sampled" || check == "sampled-penalised"
}

/// The end-to-end section as a section of the runner, with its engine
/// configuration (the negative controls run it with an injected fault).
pub struct EndToEndSection {
    pub files: ModelFiles,
    pub engine: EngineConfig,
}

impl EndToEndSection {
    pub fn new(files: ModelFiles) -> Self {
        EndToEndSection { files, engine: engine_config() }
    }
}

impl<B: ModelBackend> crate::section::Section<B> for EndToEndSection {
    fn names(&self) -> Vec<String> {
        e2e_items().into_iter().map(|i| i.name).collect()
    }

    fn run(&self, backend: &B, cfg: &SuiteConfig, progress: &mut dyn FnMut(&CheckResult)) -> Vec<CheckResult> {
        run_with(backend, cfg, &self.files, &self.engine, progress)
    }
}
