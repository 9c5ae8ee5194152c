//! The engine section (spec section 21): black-box checks of a whole
//! inference engine through the generation-level contract
//! ([`specdec_engines::GenerationEngine`]), in process or in any language.
//! The engine runs the tiny model `tiny-v12-l2` (vocabulary 12, so the law
//! of whole generations is enumerable); the expectations come from the f64
//! reference forward on the same weights, never from the engine.
//!
//! Checks, `engine/<label>/<check>` (`<label>`: the proposer, or `exec`):
//! - `greedy-identity` (ENGINE-3): speculation on and off each equal the
//!   reference's greedy output (22 tokens, four prompts with repeats); a
//!   divergence is excused only at a step whose reference top-2 margin is
//!   below the engine's stated `greedy_epsilon` (at most
//!   [`MAX_GREEDY_EPSILON`]), counted; where the engine counts drafts,
//!   speculation must have drafted. Every output of every exact check also
//!   keeps the finish contract whatever its tokens (nothing after an eos,
//!   at most `max_new_tokens`, a finish its tokens bear out);
//! - `eos`, `length`, `stop` (ENGINE-5): an eos the greedy outputs first
//!   reach mid-output ends them exactly there; `max_new_tokens` of 5 to 9
//!   (runs of k + 1 cross them) is honoured; stop strings (a token's text,
//!   and the last character of one token with the first of the next) end the
//!   output at the token completing them, also when the length cap falls
//!   one token later (a cap checked before the stop leaks that token);
//!   the finish reason right in each;
//! - `batch` (ENGINE-6): a sampled request gives the same tokens alone, in a
//!   batch of four and again with the same seed (where the engine states
//!   batch invariance; otherwise only the same seed again);
//! - `sampled/<setting>/<on|off>` (ENGINE-4, statistical): the law of the
//!   first 3 generated tokens (an eos the law reaches) at temperature 1 with
//!   top-k 4 and at 0.7 with top-p 0.9 equals the exact law enumerated on
//!   the reference forward; chi-squared, Holm over the section's statistical
//!   family at 1e-4, each sample size planned before sampling to detect a
//!   total variation of 0.05 with miss probability 0.01, no retry;
//! - `sampled/<setting>/on-vs-off` (ENGINE-4 (b), statistical): speculation
//!   on against off of the same engine with no law at all: two samples of
//!   whole generations (their own seeds), hashed into [`TWO_SAMPLE_CELLS`]
//!   cells fixed before sampling, chi-squared homogeneity, planned to detect
//!   a total variation of [`TWO_SAMPLE_DELTA`] between the hashed laws
//!   (what a model whose law cannot be enumerated is checked with);
//! - `seed-pairs` (ENGINE-6, statistical): two requests of one batch with
//!   different seeds have independent first tokens: the law of the pair is
//!   the product of the exact first-token laws (an engine whose requests
//!   share one noise stream fails);
//! - `logprobs/<on|off>` (ENGINE-7, `logprobs.rs`): every reported logprob
//!   against the reference's at its position, entries ending with the output;
//! - `processors/<setting>/<greedy|on|off>` (ENGINE-8, `processors.rs`):
//!   min-p, a banning and a boosting bias and each penalty, greedy identity
//!   and the exact law with speculation on and off;
//! - `constrained/<setting>/<greedy|on|off>` (ENGINE-9, `constrained.rs`):
//!   a regex constraint, greedy identity against the reference's
//!   constrained greedy decoding and the exact constrained law with
//!   speculation on and off;
//! - `<model>/own/..` (ENGINE-10, `own_oracle.rs`): for any model a server
//!   runs, given its tokenizer only, the engine's own plain decoding is the
//!   oracle: greedy identity alone and under a concurrency sweep, eos, stop
//!   and length cuts of the plain output, seeded repeatability and the
//!   two-sample law.
//!
//! What an engine does not state it takes (a processor, a penalty scope, a
//! logprob mode) is never asked of it: the check is not supported, named.
//!
//! Layout: this file holds the items, the loop, the shared request
//! machinery and the original checks; the families added with logprobs and
//! every sampling parameter live beside it, one file each, as the section
//! grows.
//!
//! The negative controls (`tests/engine_section.rs`) run these checks on
//! engines with one bug each (eos leak, a length cap checked before the
//! stop strings, a draft `q` other than the law its drafts came from, noise
//! shared across requests, logprobs from the draft, of 0 or past a stop, a
//! bias on a window's first row only, min-p skipped on verified rows) and
//! assert each is rejected.

mod constrained;
mod logprobs;
mod own_oracle;
mod processors;

pub use constrained::{CONSTRAINED_EOS, CONSTRAINT_SETTINGS, ConstraintSetting};
pub use logprobs::{LOGPROB_TOP, MAX_LOGPROB_EPSILON, reference_logprobs};
pub use own_oracle::{OWN_TOKENS, OwnConstraint, OwnModel, SWEEP, own_items, run_own};
pub use processors::{Bias, PROCESSOR_SETTINGS, ProcessorSetting};

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

use specdec_backend::model::{LlamaWeights, ModelBackend, RefModel};
use specdec_backend::{ReferenceBackend, SamplingParams};
use specdec_decoder::EngineConfig;
use specdec_engines::{DecoderEngine, EngineError, EngineInfo, Finish, Generation, GenerationEngine, GenerationRequest, validate_outputs};
use specdec_models::tiny::TinySpec;
use specdec_stats::TestReport;

use crate::check::{CheckResult, Kind, SuiteConfig, catch, settle};
use crate::compare::Verdict;
use crate::e2e_section::{E2E_BETA, E2E_DELTA, K, Setting, TINY_TOKENS, build_proposer, cuts, engine_config, exact_law_with, sampled_setup, tiny_eos, tiny_prompts, tiny_text};
use crate::model_section::{self, Divergence, GreedyRun};
use crate::section::Section;
use crate::stat;

/// The model every engine of the section runs.
pub const ENGINE_MODEL: &str = crate::e2e_section::TINY;
/// Tokens of a sampled generation in the `sampled` checks.
pub const SAMPLED_TOKENS: usize = 3;
/// The settings of the `sampled` checks.
pub const SETTINGS: [(&str, SamplingParams); 2] = [("t1-topk4", SamplingParams::new(1.0, 4, 1.0)), ("t07-topp09", SamplingParams::new(0.7, 0, 0.9))];
/// Requests per `generate` call in the statistical checks (an engine's
/// per-step cost is mostly fixed on the tiny model: large batches amortise it).
const BATCH: usize = 1024;
/// The proposers of the section in every backend's suite: drafts without
/// `q` and a draft model with its own `q`. `cargo xtask engines` runs every
/// proposer of the tiny model (`specdec engine-check --engine decoder:..`).
pub const SUITE_PROPOSERS: [&str; 2] = ["ngram", "draft:seeded"];
/// `max_new_tokens` of the `length` check: runs of k + 1 cross them.
const LENGTHS: [usize; 4] = [5, 6, 7, 9];
/// Tokens of the plain outputs the `stop` strings are cut from.
const STOP_CUTS: [usize; 4] = [2, 5, 9, 14];

/// One check of the section.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EngineItem {
    pub name: String,
    pub check: &'static str,
    pub rules: &'static [&'static str],
    /// The `sampled` check's setting and speculation.
    pub sampled: Option<(usize, bool)>,
}

/// Every check of the section for the engine called `label`, before selection.
pub fn engine_items(label: &str) -> Vec<EngineItem> {
    let item = |check: &'static str, rules: &'static [&'static str]| EngineItem { name: format!("engine/{label}/{check}"), check, rules, sampled: None };
    let mut items = vec![
        item("greedy-identity", &["ENGINE-3", "DECODE-2"]),
        item("eos", &["ENGINE-5", "DECODE-6"]),
        item("length", &["ENGINE-5", "DECODE-6"]),
        item("stop", &["ENGINE-5", "DECODE-7"]),
        item("batch", &["ENGINE-6", "DECODE-3"]),
    ];
    for (s, (setting, _)) in SETTINGS.iter().enumerate() {
        for on in [true, false] {
            let name = format!("engine/{label}/sampled/{setting}/{}", if on { "on" } else { "off" });
            items.push(EngineItem { name, check: "sampled", rules: &["ENGINE-4", "REJECT-7", "STAT-3"], sampled: Some((s, on)) });
        }
        let name = format!("engine/{label}/sampled/{setting}/on-vs-off");
        items.push(EngineItem { name, check: "two-sample", rules: &["ENGINE-4", "STAT-3"], sampled: Some((s, true)) });
    }
    items.push(item("seed-pairs", &["ENGINE-6", "DECODE-3", "STAT-3"]));
    for on in [true, false] {
        let name = format!("engine/{label}/logprobs/{}", on_off(on));
        items.push(EngineItem { name, check: "logprobs", rules: &["ENGINE-7", "LOGPROB-1", "LOGPROB-2", "LOGPROB-3", "LOGPROB-4"], sampled: Some((0, on)) });
    }
    for (s, setting) in PROCESSOR_SETTINGS.iter().enumerate() {
        if setting.has_greedy() {
            let name = format!("engine/{label}/processors/{}/greedy", setting.name);
            items.push(EngineItem { name, check: "processors-greedy", rules: &["ENGINE-8", "LOGITS-2", "LOGITS-13"], sampled: Some((s, true)) });
        }
        for on in [true, false] {
            let name = format!("engine/{label}/processors/{}/{}", setting.name, on_off(on));
            items.push(EngineItem { name, check: "processors", rules: &["ENGINE-8", "LOGITS-11", "LOGITS-13", "REJECT-7", "STAT-3"], sampled: Some((s, on)) });
        }
    }
    for (s, setting) in CONSTRAINT_SETTINGS.iter().enumerate() {
        let name = format!("engine/{label}/constrained/{}/greedy", setting.name);
        items.push(EngineItem { name, check: "constrained-greedy", rules: &["ENGINE-9", "CONSTRAIN-2", "CONSTRAIN-3", "CONSTRAIN-4"], sampled: Some((s, true)) });
        for on in [true, false] {
            let name = format!("engine/{label}/constrained/{}/{}", setting.name, on_off(on));
            items.push(EngineItem { name, check: "constrained", rules: &["ENGINE-9", "CONSTRAIN-1", "CONSTRAIN-3", "REJECT-7", "STAT-3"], sampled: Some((s, on)) });
        }
    }
    items
}

fn on_off(on: bool) -> &'static str {
    if on { "on" } else { "off" }
}

fn is_statistical(check: &str) -> bool {
    matches!(check, "sampled" | "two-sample" | "seed-pairs" | "processors" | "constrained")
}

/// The statistical checks of one engine: the family Holm judges.
fn family_size() -> usize {
    engine_items("-").iter().filter(|i| is_statistical(i.check)).count()
}

/// Runs the selected checks on `engine` (named `label` in the check names),
/// whose model is `weights`.
pub fn run(engine: &mut dyn GenerationEngine, label: &str, weights: &LlamaWeights, cfg: &SuiteConfig, progress: &mut dyn FnMut(&CheckResult)) -> Vec<CheckResult> {
    let refused = refuse_statement(engine.info(), weights, ENGINE_MODEL);
    let mut plain: Option<Result<Vec<GreedyRun>, String>> = None;
    run_checks(engine, engine_items(label), refused, cfg, progress, &mut |engine, item| {
        if is_statistical(item.check) {
            return Ran::Statistical(catch(|| statistical_check(engine, weights, item, cfg.seed)).unwrap_or_else(|m| Err(Verdict::Fail(m))));
        }
        let plain = plain.get_or_insert_with(|| reference_greedy(weights, &tiny_prompts(), &[]));
        Ran::Exact(match plain {
            Ok(plain) => catch(|| exact_item(engine, weights, plain, item, cfg.seed)).unwrap_or_else(|m| Err(Verdict::Fail(m))).unwrap_or_else(|v| v),
            Err(e) => Verdict::Fail(e.clone()),
        })
    })
}

/// What one check gave: a verdict, or a statistical outcome the family judges.
enum Ran {
    Exact(Verdict),
    Statistical(stat::Outcome),
}

/// The loop every engine run shares: unselected checks reported as such,
/// every check failed when the engine's statement is refused, each check
/// timed, and the statistical ones judged together with Holm at the end.
fn run_checks(
    engine: &mut dyn GenerationEngine,
    items: Vec<EngineItem>,
    refused: Option<String>,
    cfg: &SuiteConfig,
    progress: &mut dyn FnMut(&CheckResult),
    check: &mut dyn FnMut(&mut dyn GenerationEngine, &EngineItem) -> Ran,
) -> Vec<CheckResult> {
    let name = engine.info().name.clone();
    // One family per engine label (`engine/<label>`), as the check names begin.
    let family = items.first().map(|i| i.name.splitn(3, '/').take(2).collect::<Vec<_>>().join("/")).unwrap_or_else(|| "engine".into());
    let mut results = Vec::new();
    let mut statistical = Vec::new();
    for item in items {
        let mut result = CheckResult::unselected(&item.name, Kind::Engine, format!("engine/{}", item.check), item.rules, &name, cfg.seed);
        if !cfg.wants(&item.name) {
            progress(&result);
            results.push(result);
            continue;
        }
        let start = Instant::now();
        let ran = match &refused {
            Some(why) => Ran::Exact(Verdict::Fail(why.clone())),
            None => check(engine, &item),
        };
        result.millis = start.elapsed().as_secs_f64() * 1e3;
        match ran {
            Ran::Statistical(outcome) => statistical.push((results.len(), outcome)),
            Ran::Exact(verdict) => {
                settle(&mut result, verdict, &cfg.selection);
                progress(&result);
            }
        }
        results.push(result);
    }
    stat::settle_family(&mut results, statistical, &family, &cfg.selection, progress);
    results
}

/// The reference forward's greedy outputs (with their top-2 margins).
fn reference_greedy(w: &LlamaWeights, prompts: &[Vec<u32>], eos: &[u32]) -> Result<Vec<GreedyRun>, String> {
    model_section::greedy(&ReferenceBackend, &RefModel::new(w.clone()), prompts, TINY_TOKENS, eos, w.config.vocab_size)
}

/// The largest `greedy_epsilon` an engine may state: a margin above it is no
/// rounding difference, and excusing it would excuse a wrong engine.
pub const MAX_GREEDY_EPSILON: f64 = 1e-2;

/// Why what an engine states of itself rules the section out (ENGINE-1): another
/// vocabulary than the model's, or an epsilon that would excuse anything.
fn refuse_statement(info: &EngineInfo, w: &LlamaWeights, model: &str) -> Option<String> {
    if info.vocab != w.config.vocab_size {
        return Some(format!("the engine states a vocabulary of {}, the section's model {model} has {}", info.vocab, w.config.vocab_size));
    }
    if !(0.0..=MAX_GREEDY_EPSILON).contains(&info.greedy_epsilon) {
        return Some(format!("the engine states a greedy epsilon of {:e}, outside [0, {MAX_GREEDY_EPSILON:e}]", info.greedy_epsilon));
    }
    None
}

/// The engine's outputs for `requests`, validated (ENGINE-1) before any check reads
/// them; a refused request makes the check not supported.
fn generate(engine: &mut dyn GenerationEngine, requests: &[GenerationRequest]) -> Result<Vec<Generation>, Verdict> {
    // What the engine does not state it takes is not asked of it (ENGINE-1).
    if let Some((i, why)) = requests.iter().enumerate().find_map(|(i, r)| engine.info().refuses(r).map(|why| (i, why))) {
        return Err(Verdict::NotSupported(format!("request {i}: {why}")));
    }
    let outputs = engine.generate(requests).map_err(|e| match e {
        EngineError::Request { index, reason } => Verdict::NotSupported(format!("the engine refused request {index}: {reason}")),
        EngineError::NotSupported(why) => Verdict::NotSupported(why),
        other => Verdict::Fail(other.to_string()),
    })?;
    validate_outputs(engine.info(), requests, &outputs).map_err(|e| Verdict::Fail(e.to_string()))?;
    Ok(outputs)
}

/// The greedy choice of a row of logprobs (ties to the lowest id,
/// LOGPROB-3's order) and its top-2 margin (infinite with one finite id).
fn greedy_pick(lp: &[f64]) -> Result<(u32, f64), String> {
    match specdec_reference::logprob::entry(lp, 0, 2).top[..] {
        [(a, x), (_, y), ..] => Ok((a, x - y)),
        [(a, _)] => Ok((a, f64::INFINITY)),
        [] => Err("a row with no finite logprob".into()),
    }
}

/// A sampled law against the exact one (ENGINE-4's machinery, for the
/// processors' and the constraints' laws): `n` requests made by
/// `request(i)`, `n` planned before sampling for the family, each output
/// counted in its cell of `law` or in one extra cell, expected 0, for
/// anything outside its support.
fn law_check(engine: &mut dyn GenerationEngine, law: &BTreeMap<Vec<u32>, f64>, request: &dyn Fn(usize) -> GenerationRequest, name: &str, family: usize) -> Result<TestReport, Verdict> {
    let fail = Verdict::Fail;
    let cells: BTreeMap<&Vec<u32>, usize> = law.keys().enumerate().map(|(i, k)| (k, i)).collect();
    let mut expected: Vec<f64> = law.values().copied().collect();
    expected.push(0.0);
    let n = stat::planned_n_for(&expected, family, E2E_DELTA, E2E_BETA).map_err(fail)? as usize;
    let mut counts = vec![0u64; expected.len()];
    for g in generate_n(engine, n, request)? {
        counts[cells.get(&g.tokens).copied().unwrap_or(expected.len() - 1)] += 1;
    }
    stat::test_counts(&format!("{name} (n = {n})"), &counts, &expected, family).map_err(fail)
}

/// [`generate`] for `n` requests made by `request(i)`, in batches of [`BATCH`].
fn generate_n(engine: &mut dyn GenerationEngine, n: usize, request: &dyn Fn(usize) -> GenerationRequest) -> Result<Vec<Generation>, Verdict> {
    let mut out = Vec::with_capacity(n);
    for start in (0..n).step_by(BATCH) {
        let requests: Vec<GenerationRequest> = (start..n.min(start + BATCH)).map(request).collect();
        out.extend(generate(engine, &requests)?);
    }
    Ok(out)
}

/// What any output must be, whatever its tokens (ENGINE-5): within
/// `max_new_tokens`, an eos only as the last token and then with finish `eos`,
/// and a finish that its length and last token bear out.
fn finish_contract(req: &GenerationRequest, got: &Generation) -> Result<(), String> {
    let n = got.tokens.len();
    if n > req.max_new_tokens {
        return Err(format!("{n} tokens, more than max_new_tokens {}", req.max_new_tokens));
    }
    if let Some(i) = got.tokens.iter().position(|t| req.eos.contains(t)) {
        if i + 1 < n {
            return Err(format!("eos {} at token {i}, then {} more", got.tokens[i], n - i - 1));
        }
        if got.finish != Finish::Eos {
            return Err(format!("ends with eos {} but finishes {:?}", got.tokens[i], got.finish));
        }
    }
    match got.finish {
        Finish::Eos if !got.tokens.last().is_some_and(|t| req.eos.contains(t)) => Err("finishes eos without an eos token last".into()),
        Finish::Length if n != req.max_new_tokens => Err(format!("finishes length after {n} of {} tokens", req.max_new_tokens)),
        Finish::Stop if req.stop.is_empty() => Err("finishes stop without a stop string".into()),
        _ => Ok(()),
    }
}

/// One request of an exact check and what the reference expects of it: the
/// first `keep` tokens of `run`, then `finish`.
struct Expect {
    req: GenerationRequest,
    run: GreedyRun,
    keep: usize,
    finish: Finish,
    /// What every output must also be, whatever its tokens (a constraint kept).
    holds: Option<OutputRule>,
}

/// A property of an output beyond the finish contract, with why it fails.
type OutputRule = Arc<dyn Fn(&Generation) -> Result<(), String>>;

impl Expect {
    fn new(req: GenerationRequest, run: &GreedyRun, keep: usize, finish: Finish) -> Self {
        Expect { req, run: run.clone(), keep, finish, holds: None }
    }

    /// This expectation, with `rule` checked on the output even where a divergence is excused.
    fn holding(self, rule: OutputRule) -> Self {
        Expect { holds: Some(rule), ..self }
    }

    /// Judges `got`: `Ok(true)` when it leaves the reference at a step the
    /// engine's epsilon excuses (its finish contract still holds).
    fn judge(&self, label: &str, got: &Generation, eps: f64) -> Result<bool, String> {
        finish_contract(&self.req, got).map_err(|e| format!("{label}: {e} (tokens {:?})", got.tokens))?;
        if let Some(rule) = &self.holds {
            rule(got).map_err(|e| format!("{label}: {e} (tokens {:?})", got.tokens))?;
        }
        let want = &self.run.tokens[..self.keep];
        match self.run.divergence(&got.tokens[..got.tokens.len().min(self.keep)], eps) {
            Divergence::Excused(_) => Ok(true),
            Divergence::Unexcused(step) => Err(format!(
                "{label}: token {step} is {}, the reference gives {} (reference top-2 margin {:.3e} >= the engine's epsilon {eps:e}); generated {:?}",
                got.tokens[step], want[step], self.run.margins[step], got.tokens
            )),
            Divergence::None if got.tokens.len() != self.keep || got.finish != self.finish => {
                Err(format!("{label}: {} tokens {:?} finishing {:?}, the reference ends after {} with {:?}", got.tokens.len(), got.tokens, got.finish, self.keep, self.finish))
            }
            Divergence::None => Ok(false),
        }
    }
}

/// An exact check of the section.
fn exact_item(engine: &mut dyn GenerationEngine, w: &LlamaWeights, plain: &[GreedyRun], item: &EngineItem, seed: u64) -> Result<Verdict, Verdict> {
    match (item.check, item.sampled) {
        ("logprobs", Some((_, on))) => logprobs::check(engine, w, plain, on, stat::stream_seed(seed, &item.name)),
        ("processors-greedy", Some((s, _))) => processors::greedy(engine, w, &PROCESSOR_SETTINGS[s]),
        ("constrained-greedy", Some((s, _))) => constrained::greedy(engine, w, &CONSTRAINT_SETTINGS[s]),
        (check, _) => exact_check(engine, w, plain, check),
    }
}

/// The exact checks: greedy identity, eos, length, stop and batch.
fn exact_check(engine: &mut dyn GenerationEngine, w: &LlamaWeights, plain: &[GreedyRun], check: &str) -> Result<Verdict, Verdict> {
    if check == "batch" {
        return batch_check(engine);
    }
    let info = engine.info().clone();
    let mut cases = match exact_cases(check, &info, w, plain)? {
        Ok(cases) => cases,
        Err(why) => return Ok(Verdict::NotSupported(why)),
    };
    let off: Vec<Expect> =
        cases.iter().map(|c| Expect { req: GenerationRequest { speculation: false, ..c.req.clone() }, run: c.run.clone(), keep: c.keep, finish: c.finish, holds: c.holds.clone() }).collect();
    cases.extend(off);
    judge_all(engine, &cases, check)
}

/// The requests of an exact check (speculation on) and what the reference
/// expects of each; `Ok(Err(why))` where the engine's statement rules the
/// check out.
fn exact_cases(check: &str, info: &EngineInfo, w: &LlamaWeights, plain: &[GreedyRun]) -> Result<Result<Vec<Expect>, String>, Verdict> {
    let fail = Verdict::Fail;
    let prompts = tiny_prompts();
    let mut cases: Vec<Expect> = Vec::new();
    match check {
        "greedy-identity" => {
            for (p, run) in prompts.iter().zip(plain) {
                cases.push(Expect::new(GenerationRequest::greedy(p.clone(), TINY_TOKENS, true), run, TINY_TOKENS, Finish::Length));
            }
        }
        "eos" => {
            if !info.eos_ids {
                return Ok(Err("the engine takes no eos ids per request (its transport cuts its output after an eos, which this check would judge instead)".into()));
            }
            let eos = tiny_eos(w, &prompts).map_err(fail)?;
            for (p, run) in prompts.iter().zip(plain) {
                let (keep, finish) = match run.tokens.iter().position(|&t| t == eos) {
                    Some(i) => (i + 1, Finish::Eos),
                    None => (TINY_TOKENS, Finish::Length),
                };
                cases.push(Expect::new(GenerationRequest { eos: vec![eos], ..GenerationRequest::greedy(p.clone(), TINY_TOKENS, true) }, run, keep, finish));
            }
            // A copying drafter (n-gram, prompt lookup) drafts only ids its context
            // holds: prompts that hold a copy of their own continuation make it
            // draft an eos inside a run, with the tokens after it.
            let mut copied = 0;
            for (p, run) in prompts.iter().zip(plain) {
                let copy: Vec<u32> = p.iter().chain(&run.tokens[..COPIED]).chain(p).copied().collect();
                let g = reference_greedy(w, std::slice::from_ref(&copy), &[]).map_err(fail)?.remove(0);
                if let Some((e, j)) = copied_eos(&copy, &g.tokens) {
                    cases.push(Expect::new(GenerationRequest { eos: vec![e], ..GenerationRequest::greedy(copy, TINY_TOKENS, true) }, &g, j + 1, Finish::Eos));
                    copied += 1;
                }
            }
            if copied == 0 {
                return Err(fail("no copy prompt has an eos a copying drafter would draft mid-run: the check would not reach that path".into()));
            }
        }
        "length" => {
            for (p, run) in prompts.iter().zip(plain) {
                for n in LENGTHS {
                    cases.push(Expect::new(GenerationRequest::greedy(p.clone(), n, true), run, n, Finish::Length));
                }
            }
        }
        "stop" => {
            if !info.stop_strings {
                return Ok(Err("the engine does not take stop strings".into()));
            }
            for (p, run) in prompts.iter().zip(plain) {
                for (s, keep) in cuts(&run.tokens, &STOP_CUTS, &tiny_text) {
                    let base = GenerationRequest { stop: vec![s], ..GenerationRequest::greedy(p.clone(), TINY_TOKENS, true) };
                    // The length cap one token after the stop: the stop still ends it.
                    let capped = GenerationRequest { max_new_tokens: keep + 1, ..base.clone() };
                    cases.push(Expect::new(base, run, keep, Finish::Stop));
                    cases.push(Expect::new(capped, run, keep, Finish::Stop));
                }
            }
        }
        other => return Err(fail(format!("unknown check `{other}`"))),
    }
    Ok(Ok(cases))
}

/// Runs `cases` (speculation on, then the same requests off) as one batch
/// and judges each against the reference; greedy identity also wants the
/// engine, where it counts drafts, to have drafted.
fn judge_all(engine: &mut dyn GenerationEngine, cases: &[Expect], check: &str) -> Result<Verdict, Verdict> {
    let fail = Verdict::Fail;
    let eps = engine.info().greedy_epsilon;
    let requests: Vec<GenerationRequest> = cases.iter().map(|c| c.req.clone()).collect();
    let outputs = generate(engine, &requests)?;
    // Whether speculation on and off agree token for token, said with any failure: an
    // engine that leaves the reference the same way both ways has a forward that
    // differs from the reference's, not a verify that differs from its own plain decoding.
    let half = cases.len() / 2;
    let differ: Vec<usize> = (0..half).filter(|&i| outputs[i].tokens != outputs[i + half].tokens).collect();
    let agreement =
        if differ.is_empty() { format!("speculation on and off agree token for token on all {half} requests") } else { format!("speculation on and off differ on requests {differ:?} of {half}") };
    let mut excused = 0;
    for (i, (case, got)) in cases.iter().zip(&outputs).enumerate() {
        let r = &case.req;
        let label = format!("request {i} (prompt {:?}, speculation {}, max {}, eos {:?}, stop {:?})", r.prompt, if r.speculation { "on" } else { "off" }, r.max_new_tokens, r.eos, r.stop);
        excused += usize::from(case.judge(&label, got, eps).map_err(|e| fail(format!("{e}; {agreement}")))?);
    }
    // Speculation must have run: an engine that counts drafts drafted something.
    let on = &outputs[..cases.len() / 2];
    if check == "greedy-identity" && on.iter().map(|g| g.drafts.map(|d| d.proposed)).sum::<Option<u64>>() == Some(0) {
        return Err(fail("speculation on drafted nothing: the check would not exercise the engine's verify".into()));
    }
    Ok(Verdict::Pass { excused, max_abs_err: 0.0 })
}

/// Plain-output tokens copied into a copy prompt (`prompt ++ output[..COPIED] ++ prompt`,
/// which with 22 generated tokens fits the tiny model's 64 positions).
const COPIED: usize = 12;

/// In the greedy output `out` after `context`, the first token `e` at some `j >= 2` that
/// `out` has not held before and that follows the same two tokens earlier in the
/// context (so a drafter copying the continuation of the last bigram drafts it
/// there): `(e, j)`.
fn copied_eos(context: &[u32], out: &[u32]) -> Option<(u32, usize)> {
    (2..out.len().saturating_sub(1)).find_map(|j| {
        let (a, b, e) = (out[j - 2], out[j - 1], out[j]);
        let seen: Vec<u32> = context.iter().chain(&out[..j - 1]).copied().collect();
        let copied = seen.windows(3).any(|t| t == [a, b, e]);
        (!out[..j].contains(&e) && copied).then_some((e, j))
    })
}

/// ENGINE-6, exact: the same sampled request alone, in a batch, and again.
fn batch_check(engine: &mut dyn GenerationEngine) -> Result<Verdict, Verdict> {
    let invariant = engine.info().batch_invariant;
    let params = SamplingParams::new(0.9, 0, 0.95);
    let sampled = |prompt: Vec<u32>, seed: u64, on: bool| GenerationRequest::sampled(prompt, params, seed, 12, on);
    for on in [true, false] {
        let me = sampled(vec![1, 2, 3, 1, 2, 3], 42, on);
        let alone = generate(engine, std::slice::from_ref(&me))?;
        let again = generate(engine, std::slice::from_ref(&me))?;
        if alone[0].tokens != again[0].tokens {
            return Err(Verdict::Fail(format!("speculation {on}: the same request and seed gave {:?}, then {:?}", alone[0].tokens, again[0].tokens)));
        }
        if invariant {
            let batch = [sampled(vec![4], 1, on), me.clone(), sampled(vec![5, 5, 5, 5, 5], 2, on), sampled(vec![7, 8], 6, on)];
            let together = generate(engine, &batch)?;
            if together[1].tokens != alone[0].tokens {
                return Err(Verdict::Fail(format!("speculation {on}: alone {:?}, in a batch of four {:?} (the engine states batch invariance)", alone[0].tokens, together[1].tokens)));
            }
        }
    }
    Ok(Verdict::Pass { excused: 0, max_abs_err: 0.0 })
}

/// Cells of the two-sample check: a generation's tokens hashed into this
/// many, fixed before sampling and for any model (no law is enumerated).
pub const TWO_SAMPLE_CELLS: usize = 16;
/// The total variation between the hashed laws of speculation on and off
/// that the two-sample check is planned to detect (miss probability
/// [`E2E_BETA`]); the checks against the exact law hold 0.05 on the whole
/// sequences, this one is for models whose law cannot be enumerated.
pub const TWO_SAMPLE_DELTA: f64 = 0.05;

/// A generation's two-sample cell: FNV-1a of its tokens, modulo the cells.
pub fn two_sample_cell(tokens: &[u32]) -> usize {
    let h = tokens.iter().flat_map(|t| t.to_le_bytes()).fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3));
    (h % TWO_SAMPLE_CELLS as u64) as usize
}

/// Draws per side of a two-sample check planned for `delta` inside a
/// family of `family`: twice the goodness-of-fit size over the same cells
/// (its power at `n` per side is that of goodness of fit at `n / 2`).
pub fn two_sample_n(family: usize, delta: f64) -> Result<u64, String> {
    let alpha = stat::FAMILY_ALPHA / family as f64;
    Ok(2 * specdec_stats::min_samples(TWO_SAMPLE_CELLS, delta, alpha, E2E_BETA).map_err(|e| e.to_string())?)
}

/// ENGINE-4 (b): speculation on against off of the same engine, two
/// samples of `n` generations each (their own seeds), hashed into
/// [`TWO_SAMPLE_CELLS`] cells: chi-squared homogeneity, power stated.
pub fn two_sample(engine: &mut dyn GenerationEngine, label: &str, request: &dyn Fn(usize, bool) -> GenerationRequest, family: usize, delta: f64) -> Result<TestReport, Verdict> {
    let n = two_sample_n(family, delta).map_err(Verdict::Fail)? as usize;
    let mut counts = [vec![0u64; TWO_SAMPLE_CELLS], vec![0u64; TWO_SAMPLE_CELLS]];
    for (side, on) in [true, false].into_iter().enumerate() {
        for g in generate_n(engine, n, &|i| request(i, on))? {
            counts[side][two_sample_cell(&g.tokens)] += 1;
        }
    }
    let alpha = stat::FAMILY_ALPHA / family as f64;
    specdec_stats::chi_squared_homogeneity(format!("{label} (n = {n} per side, {TWO_SAMPLE_CELLS} hashed cells)"), &counts[0], &counts[1])
        .and_then(|r| r.with_power_at(n as u64 / 2, alpha, E2E_BETA))
        .map_err(|e| Verdict::Fail(e.to_string()))
}

/// A statistical check's counts, judged by the caller with the family.
fn statistical_check(engine: &mut dyn GenerationEngine, w: &LlamaWeights, item: &EngineItem, seed: u64) -> Result<TestReport, Verdict> {
    let fail = Verdict::Fail;
    let (prompt, eos) = sampled_setup(w).map_err(fail)?;
    let base = stat::stream_seed(seed, &item.name);
    let family = family_size();
    if let (Some((setting, _)), "two-sample") = (item.sampled, item.check) {
        let params = SETTINGS[setting].1;
        // The off side's seeds start far from the on side's: independent samples.
        let request = |i: usize, on: bool| GenerationRequest {
            eos: vec![eos],
            ..GenerationRequest::sampled(prompt.clone(), params, base.wrapping_add(i as u64).wrapping_add(if on { 0 } else { 1 << 40 }), SAMPLED_TOKENS, on)
        };
        return two_sample(engine, &item.name, &request, family, TWO_SAMPLE_DELTA);
    }
    if let (Some((setting, on)), "processors") = (item.sampled, item.check) {
        return processors::law(engine, w, &PROCESSOR_SETTINGS[setting], on, &item.name, base, family);
    }
    if let (Some((setting, on)), "constrained") = (item.sampled, item.check) {
        return constrained::law(engine, w, &CONSTRAINT_SETTINGS[setting], on, &item.name, base, family);
    }
    if let Some((setting, on)) = item.sampled {
        let (label, params) = SETTINGS[setting];
        let law = exact_law_with(w, &prompt, eos, &Setting::plain(params), SAMPLED_TOKENS).map_err(fail)?;
        let cells: BTreeMap<&Vec<u32>, usize> = law.keys().enumerate().map(|(i, k)| (k, i)).collect();
        let mut expected: Vec<f64> = law.values().copied().collect();
        expected.push(0.0); // any sequence outside the law's support
        let n = stat::planned_n_for(&expected, family, E2E_DELTA, E2E_BETA).map_err(fail)? as usize;
        let mut counts = vec![0u64; expected.len()];
        let request = |i: usize| GenerationRequest { eos: vec![eos], ..GenerationRequest::sampled(prompt.clone(), params, base.wrapping_add(i as u64), SAMPLED_TOKENS, on) };
        for g in generate_n(engine, n, &request)? {
            counts[cells.get(&g.tokens).copied().unwrap_or(expected.len() - 1)] += 1;
        }
        return stat::test_counts(&format!("{} ({label}, n = {n})", item.name), &counts, &expected, family).map_err(fail);
    }
    // seed-pairs: first tokens of two requests of one batch, seeds apart.
    let (params, first) = (SETTINGS[0].1, exact_law_with(w, &prompt, eos, &Setting::plain(SETTINGS[0].1), 1).map_err(fail)?);
    let vocab = w.config.vocab_size;
    let mut marginal = vec![0.0; vocab];
    for (seq, p) in &first {
        marginal[seq[0] as usize] += p;
    }
    let expected: Vec<f64> = (0..vocab * vocab).map(|c| marginal[c / vocab] * marginal[c % vocab]).collect();
    let n = stat::planned_n_for(&expected, family, E2E_DELTA, E2E_BETA).map_err(fail)? as usize;
    let mut counts = vec![0u64; vocab * vocab];
    // Pairs never straddle two calls: BATCH is even.
    let request = |i: usize| GenerationRequest::sampled(prompt.clone(), params, base.wrapping_add(i as u64), 1, true);
    for pair in generate_n(engine, 2 * n, &request)?.chunks(2) {
        match (pair[0].tokens.first(), pair[1].tokens.first()) {
            // Validated: every id is below the stated vocabulary, which is the model's.
            (Some(&a), Some(&b)) => counts[a as usize * vocab + b as usize] += 1,
            _ => return Err(fail(format!("a one-token request generated nothing ({:?}, {:?})", pair[0].finish, pair[1].finish))),
        }
    }
    stat::test_counts(&format!("{} (n = {n} pairs)", item.name), &counts, &expected, family).map_err(fail)
}

/// A model whose law the section cannot enumerate (SmolLM2), for the model
/// checks: its weights, the prompts of the greedy check (token ids), and the
/// prompt of the two-sample check.
pub struct LargeModel {
    pub name: String,
    pub weights: Arc<LlamaWeights>,
    pub greedy_prompts: Vec<Vec<u32>>,
    pub sampled_prompt: Vec<u32>,
}

/// Generated tokens of the model checks' greedy requests.
pub const LARGE_GREEDY_TOKENS: usize = 24;
/// The two-sample check on a large model: its setting, and the total
/// variation between the hashed laws it is planned to detect (a large
/// model's generations cost what the tiny model's do not: 0.1, not 0.05).
pub const LARGE_SETTING: (&str, SamplingParams) = ("t1-topk4", SamplingParams::new(1.0, 4, 1.0));
pub const LARGE_TWO_SAMPLE_DELTA: f64 = 0.1;

/// The model checks' items, `engine/<label>/<model>/<check>`.
pub fn large_items(label: &str, model: &str) -> Vec<EngineItem> {
    vec![
        EngineItem { name: format!("engine/{label}/{model}/greedy-identity"), check: "greedy-identity", rules: &["ENGINE-3", "DECODE-2"], sampled: None },
        EngineItem { name: format!("engine/{label}/{model}/sampled/{}/on-vs-off", LARGE_SETTING.0), check: "two-sample", rules: &["ENGINE-4", "STAT-3"], sampled: Some((0, true)) },
    ]
}

/// The engine checks on a large model (spec section 21): greedy identity,
/// on and off each against the f64 reference's greedy output with margins
/// in hand, and speculation on against off (ENGINE-4 (b)), the one
/// statistical check, alone in its family.
pub fn run_large(engine: &mut dyn GenerationEngine, label: &str, model: &LargeModel, cfg: &SuiteConfig, progress: &mut dyn FnMut(&CheckResult)) -> Vec<CheckResult> {
    let w = &model.weights;
    let refused = refuse_statement(engine.info(), w, &model.name);
    run_checks(engine, large_items(label, &model.name), refused, cfg, progress, &mut |engine, item| {
        if item.check != "two-sample" {
            return Ran::Exact(catch(|| large_greedy(engine, model)).unwrap_or_else(|m| Err(Verdict::Fail(m))).unwrap_or_else(|v| v));
        }
        let base = stat::stream_seed(cfg.seed, &item.name);
        let request = |i: usize, on: bool| GenerationRequest {
            eos: w.config.eos_ids(),
            ..GenerationRequest::sampled(model.sampled_prompt.clone(), LARGE_SETTING.1, base.wrapping_add(i as u64).wrapping_add(if on { 0 } else { 1 << 40 }), SAMPLED_TOKENS, on)
        };
        Ran::Statistical(catch(|| two_sample(engine, &item.name, &request, 1, LARGE_TWO_SAMPLE_DELTA)).unwrap_or_else(|m| Err(Verdict::Fail(m))))
    })
}

/// ENGINE-3 on a large model: every greedy prompt, speculation on and off,
/// against the reference's greedy output (the model's eos ends it).
fn large_greedy(engine: &mut dyn GenerationEngine, model: &LargeModel) -> Result<Verdict, Verdict> {
    let w = &model.weights;
    let eos = w.config.eos_ids();
    let plain = model_section::greedy(&ReferenceBackend, &RefModel::new((**w).clone()), &model.greedy_prompts, LARGE_GREEDY_TOKENS, &eos, w.config.vocab_size).map_err(Verdict::Fail)?;
    let mut cases = Vec::new();
    for on in [true, false] {
        for (p, run) in model.greedy_prompts.iter().zip(&plain) {
            let finish = if run.tokens.last().is_some_and(|t| eos.contains(t)) { Finish::Eos } else { Finish::Length };
            cases.push(Expect::new(GenerationRequest { eos: eos.clone(), ..GenerationRequest::greedy(p.clone(), LARGE_GREEDY_TOKENS, on) }, run, run.tokens.len(), finish));
        }
    }
    judge_all(engine, &cases, "greedy-identity")
}

/// The section in the suite of every backend: specdec's own decoder on the
/// backend with [`SUITE_PROPOSERS`] (k = 3), as an engine under test,
/// `engine/<proposer>/<check>`.
pub struct DecoderEngineSection;

impl<B: ModelBackend> Section<B> for DecoderEngineSection {
    fn names(&self) -> Vec<String> {
        SUITE_PROPOSERS.into_iter().flat_map(engine_items).map(|i| i.name).collect()
    }

    fn run(&self, backend: &B, cfg: &SuiteConfig, progress: &mut dyn FnMut(&CheckResult)) -> Vec<CheckResult> {
        let mut results = Vec::new();
        let weights = TinySpec::preset(ENGINE_MODEL).ok_or_else(|| format!("no tiny preset `{ENGINE_MODEL}`")).and_then(|s| s.weights().map(Arc::new).map_err(|e| e.to_string()));
        for proposer in SUITE_PROPOSERS {
            let items = engine_items(proposer);
            let engine = weights.clone().map_err(Verdict::Fail).and_then(|w| {
                if !items.iter().any(|i| cfg.wants(&i.name)) {
                    return Ok(None);
                }
                // A backend without models (an exec adapter of kernels) is not supported
                // here, as in the model and end-to-end sections; asked before a draft
                // model is loaded on it.
                backend.load_model(&w).map_err(|e| model_section::backend_verdict(&e))?;
                // The section judges against the f64 reference's greedy output, excusing at
                // most MAX_GREEDY_EPSILON; a backend whose forward states more (a quantized
                // format) is not an engine it can judge. Its losslessness against its own
                // plain decoding is the end-to-end section's.
                let eps = backend.model_precision().argmax_margin_epsilon;
                if eps > MAX_GREEDY_EPSILON {
                    return Err(Verdict::NotSupported(format!(
                        "the backend states an argmax epsilon of {eps:e} against the reference, beyond the {MAX_GREEDY_EPSILON:e} this section excuses; its decoder's losslessness is checked by the end-to-end section"
                    )));
                }
                let p = build_proposer(backend, proposer, &w).map_err(Verdict::Fail)?;
                let config = EngineConfig { k: K, ..engine_config() };
                DecoderEngine::new(backend, Arc::clone(&w), p, config, Some(Box::new(tiny_text))).map(|e| e.with_constraints(specdec_decoder::TokenTable::tiny(w.config.vocab_size))).map(|e| Some((e, w))).map_err(|e| match e {
                    EngineError::NotSupported(why) => Verdict::NotSupported(why),
                    other => Verdict::Fail(other.to_string()),
                })
            });
            match engine {
                Ok(Some((mut engine, w))) => results.extend(run(&mut engine, proposer, &w, cfg, progress)),
                Ok(None) => results.extend(run_none(&items, &backend.name(), cfg, progress, None)),
                Err(v) => results.extend(run_none(&items, &backend.name(), cfg, progress, Some(v))),
            }
        }
        results
    }
}

/// Results for `items` when no engine runs: unselected, or settled with `why`
/// (not supported, or failed).
fn run_none(items: &[EngineItem], backend: &str, cfg: &SuiteConfig, progress: &mut dyn FnMut(&CheckResult), why: Option<Verdict>) -> Vec<CheckResult> {
    items
        .iter()
        .map(|item| {
            let mut result = CheckResult::unselected(&item.name, Kind::Engine, format!("engine/{}", item.check), item.rules, backend, cfg.seed);
            if let (Some(why), true) = (&why, cfg.wants(&item.name)) {
                settle(&mut result, why.clone(), &cfg.selection);
            }
            progress(&result);
            result
        })
        .collect()
}
