//! The engine as its own oracle (ENGINE-10): checks for any model a server
//! runs, given only its tokenizer and prompts. Nothing here needs the f64
//! reference: every expectation is derived from the engine's own plain
//! decoding (speculation off, one request in flight, greedy), which is what
//! a vendor serving a model the reference cannot run still has.
//!
//! Checks, `engine/<label>/<model>/own/<check>`:
//! - `greedy`: speculation on, one request in flight, equals plain token for
//!   token, logprobs within the stated epsilon where reported; a divergence
//!   is reported with its prompt, position, both continuations as text and
//!   plain's top-2 margin, and excused only below `greedy_epsilon` (never
//!   for an engine stating batch invariance);
//! - `concurrency/<n>` for n in [`SWEEP`]: the same with n requests in
//!   flight at once (the prompts in turn), each against its plain output
//!   alone; a failure says whether plain decoding diverges at that load too;
//! - `eos`, `stop`, `length`: cuts of the plain output (an id it first emits
//!   mid-way given as eos, a stop string from its text, a cap inside it),
//!   speculation on and off;
//! - `seeded`: a sampled request again with its seed gives the same tokens;
//! - `sampled/t1-topk4/on-vs-off`: ENGINE-4 (b)'s two-sample law, alone in
//!   its Holm family;
//! - `constrained`: a constrained mix (the tool-call prompts under their
//!   JSON schema on a served model; the tiny model's prompts under a regex),
//!   speculation on equal to the engine's own constrained plain decoding,
//!   every output ending at eos a match of the constraint (a JSON output
//!   judged without its insignificant whitespace, which an engine's own
//!   schema grammar may allow).

use std::sync::Arc;

use specdec_constraint::{Constraint, ConstraintSpec};
use specdec_engines::{EngineInfo, Finish, Generation, GenerationEngine, GenerationRequest};
use specdec_reference::logprob::{LogprobMode, LogprobRequest};

use super::{EngineItem, LARGE_SETTING, LARGE_TWO_SAMPLE_DELTA, MAX_GREEDY_EPSILON, MAX_LOGPROB_EPSILON, Ran, SAMPLED_TOKENS, generate, run_checks, two_sample};
use crate::check::{CheckResult, SuiteConfig, catch};
use crate::compare::Verdict;
use crate::e2e_section::{cuts, tiny_prompts, tiny_text};
use crate::stat;

/// Generated tokens of the plain oracle's greedy requests.
pub const OWN_TOKENS: usize = 32;
/// Requests in flight at once in the concurrency sweep.
pub const SWEEP: [usize; 4] = [1, 4, 16, 64];
/// Positions of the plain output where the `length` check caps it and the
/// `stop` check takes its strings (those inside the output).
const CUTS: [usize; 4] = [3, 7, 12, 20];
/// Seeds of the `seeded` check, per prompt.
const SEEDS: [u64; 2] = [7, 1 << 33];
/// Tokens of a continuation quoted in a divergence report.
const QUOTED: usize = 8;

/// The text of a token sequence (a tokenizer's decode, specials kept).
pub type TokenText = Arc<dyn Fn(&[u32]) -> String + Send + Sync>;

/// A model the checks know through its tokenizer alone.
#[derive(Clone)]
pub struct OwnModel {
    /// Its name in check names (lowercase, no `/`).
    pub name: String,
    /// `(id, token ids)` of each prompt; at least one.
    pub prompts: Vec<(String, Vec<u32>)>,
    /// The model's end-of-generation ids, every request's eos.
    pub eos: Vec<u32>,
    /// The text of a token sequence.
    pub text: TokenText,
    /// The `constrained` check's mix, or why there is none (the check is then not supported).
    pub constrained: Result<OwnConstraint, String>,
}

/// The `constrained` check's mix: prompts whose answer the constraint
/// forces, each request's eos, and a cap the constrained answers end within.
#[derive(Clone)]
pub struct OwnConstraint {
    pub spec: ConstraintSpec,
    /// `(id, token ids)` of each prompt; at least one.
    pub prompts: Vec<(String, Vec<u32>)>,
    /// Where a constrained output ends (at least one id, CONSTRAIN-2).
    pub eos: Vec<u32>,
    pub max_new_tokens: usize,
}

/// Tokens of the tiny model's constrained requests (its regex's greedy
/// answers end within them).
const TINY_CONSTRAINED_TOKENS: usize = 24;

impl OwnModel {
    /// The engine section's tiny model as the checks see a served model:
    /// the section's prompts, no eos, its text (`tiny:` in `--tokenizer`).
    pub fn tiny() -> OwnModel {
        let prompts: Vec<(String, Vec<u32>)> = tiny_prompts().into_iter().enumerate().map(|(i, p)| (format!("tiny-{i}"), p)).collect();
        let setting = super::constrained::CONSTRAINT_SETTINGS[0];
        let constrained = OwnConstraint { spec: setting.spec(), prompts: Vec::clone(&prompts), eos: vec![super::constrained::CONSTRAINED_EOS], max_new_tokens: TINY_CONSTRAINED_TOKENS };
        OwnModel { name: super::ENGINE_MODEL.into(), prompts, eos: Vec::new(), text: Arc::new(tiny_text), constrained: Ok(constrained) }
    }
}

/// The checks' items, `engine/<label>/<model>/own/<check>`.
pub fn own_items(label: &str, model: &str) -> Vec<EngineItem> {
    let item = |check: &'static str, name: String, rules: &'static [&'static str], sampled| EngineItem { name: format!("engine/{label}/{model}/own/{name}"), check, rules, sampled };
    let mut items = vec![item("own-greedy", "greedy".into(), &["ENGINE-10", "ENGINE-3", "DECODE-2"], None)];
    for (i, n) in SWEEP.iter().enumerate() {
        items.push(item("own-concurrency", format!("concurrency/{n}"), &["ENGINE-10", "ENGINE-6", "DECODE-3"], Some((i, true))));
    }
    items.push(item("own-eos", "eos".into(), &["ENGINE-10", "ENGINE-5", "DECODE-6"], None));
    items.push(item("own-stop", "stop".into(), &["ENGINE-10", "ENGINE-5", "DECODE-7"], None));
    items.push(item("own-length", "length".into(), &["ENGINE-10", "ENGINE-5", "DECODE-6"], None));
    items.push(item("own-seeded", "seeded".into(), &["ENGINE-10", "ENGINE-6"], None));
    items.push(item("two-sample", format!("sampled/{}/on-vs-off", LARGE_SETTING.0), &["ENGINE-10", "ENGINE-4", "STAT-3"], Some((0, true))));
    items.push(item("own-constrained", "constrained".into(), &["ENGINE-10", "ENGINE-9", "CONSTRAIN-3", "CONSTRAIN-4"], None));
    items
}

/// Runs the selected checks on `engine` (named `label`) serving `model`.
pub fn run_own(engine: &mut dyn GenerationEngine, label: &str, model: &OwnModel, cfg: &SuiteConfig, progress: &mut dyn FnMut(&CheckResult)) -> Vec<CheckResult> {
    let refused = refuse(engine, model);
    let mut plain: Option<Result<Vec<Generation>, Verdict>> = None;
    let mut notes: Vec<(String, String)> = Vec::new();
    let mut results = run_checks(engine, own_items(label, &model.name), refused, cfg, progress, &mut |engine, item| {
        if item.check == "two-sample" {
            let base = stat::stream_seed(cfg.seed, &item.name);
            let prompt = model.prompts[0].1.clone();
            let request = |i: usize, on: bool| GenerationRequest {
                eos: model.eos.clone(),
                ..GenerationRequest::sampled(prompt.clone(), LARGE_SETTING.1, base.wrapping_add(i as u64).wrapping_add(if on { 0 } else { 1 << 40 }), SAMPLED_TOKENS, on)
            };
            return Ran::Statistical(catch(|| two_sample(engine, &item.name, &request, 1, LARGE_TWO_SAMPLE_DELTA)).unwrap_or_else(|m| Err(Verdict::Fail(m))));
        }
        let verdict = if item.check == "own-constrained" {
            catch(|| constrained(engine, model)).unwrap_or_else(|m| Err(Verdict::Fail(m)))
        } else {
            match plain.get_or_insert_with(|| plain_outputs(engine, model)) {
                Ok(plain) => catch(|| own_check(engine, model, plain, item)).unwrap_or_else(|m| Err(Verdict::Fail(m))),
                Err(v) => Err(v.clone()),
            }
        };
        Ran::Exact(match verdict {
            Ok((v, note)) => {
                notes.push((item.name.clone(), note));
                v
            }
            Err(v) => v,
        })
    });
    // The acceptance counts beside the verdict, in every report format.
    for r in &mut results {
        if let Some((_, note)) = notes.iter().find(|(n, _)| *n == r.name).filter(|(_, note)| !note.is_empty()) {
            r.message = if r.message.is_empty() { note.clone() } else { format!("{}; {note}", r.message) };
        }
    }
    results
}

/// The checks' epsilons against plain decoding, (greedy margin, logprob):
/// none for an engine stating batch invariance (its windows and batches equal
/// its decodes bit for bit, so its epsilons against the f64 reference, which a
/// quantized port's may make large, do not enter), else the stated ones.
fn own_epsilons(info: &specdec_engines::EngineInfo) -> (f64, f64) {
    if info.batch_invariant { (0.0, 0.0) } else { (info.greedy_epsilon, info.logprobs.as_ref().map_or(0.0, |l| l.epsilon)) }
}

/// What the engine states that rules the checks out: an epsilon that
/// would excuse anything.
fn refuse(engine: &dyn GenerationEngine, model: &OwnModel) -> Option<String> {
    let (greedy, logprob) = own_epsilons(engine.info());
    if !(0.0..=MAX_GREEDY_EPSILON).contains(&greedy) {
        return Some(format!("the engine states a greedy epsilon of {greedy:e}, outside [0, {MAX_GREEDY_EPSILON:e}]"));
    }
    if !(0.0..=MAX_LOGPROB_EPSILON).contains(&logprob) {
        return Some(format!("the engine states a logprob epsilon above {MAX_LOGPROB_EPSILON:e}"));
    }
    if model.prompts.is_empty() {
        return Some("no prompts".into());
    }
    None
}

/// A greedy request of the checks: the model's eos, the top-2 raw logprobs
/// (processed where the engine reports only those) where it reports any.
fn greedy(info: &EngineInfo, model: &OwnModel, prompt: &[u32], on: bool) -> GenerationRequest {
    let logprobs =
        info.logprobs.as_ref().filter(|s| s.max_top >= 2).map(|s| LogprobRequest { top: 2, mode: if s.modes.contains(&LogprobMode::Raw) { LogprobMode::Raw } else { LogprobMode::Processed } });
    GenerationRequest { eos: model.eos.clone(), logprobs, ..GenerationRequest::greedy(prompt.to_vec(), OWN_TOKENS, on) }
}

/// The oracle: each prompt's plain greedy output, alone.
fn plain_outputs(engine: &mut dyn GenerationEngine, model: &OwnModel) -> Result<Vec<Generation>, Verdict> {
    let info = engine.info().clone();
    plain_of(engine, model, &|prompt| greedy(&info, model, prompt, false))
}

/// Each prompt of `model` alone as `request` makes it (speculation off),
/// its finish checked against the request.
fn plain_of(engine: &mut dyn GenerationEngine, model: &OwnModel, request: &dyn Fn(&[u32]) -> GenerationRequest) -> Result<Vec<Generation>, Verdict> {
    let mut out = Vec::new();
    for (id, prompt) in &model.prompts {
        let req = request(prompt);
        let got = generate(engine, std::slice::from_ref(&req))?.remove(0);
        super::finish_contract(&req, &got).map_err(|e| Verdict::Fail(format!("prompt `{id}`, the plain oracle itself: {e}")))?;
        out.push(got);
    }
    Ok(out)
}

/// One request and what the plain output of prompt `prompt` says of it:
/// its first `keep` tokens, then `finish`.
struct Case {
    req: GenerationRequest,
    prompt: usize,
    keep: usize,
    finish: Finish,
}

/// Plain's top-2 margin at `step`, where it reported two logprobs there.
fn margin(plain: &Generation, step: usize) -> Option<f64> {
    match plain.logprobs.as_ref()?.get(step)?.top[..] {
        [(_, a), (_, b), ..] => Some(a - b),
        _ => None,
    }
}

/// Tallies over the requests of one check.
#[derive(Default)]
struct Tally {
    excused: usize,
    max_logprob_err: f64,
    proposed: Option<u64>,
    accepted: u64,
}

impl Tally {
    fn drafts(&mut self, g: &Generation, on: bool) {
        if let (true, Some(d)) = (on, g.drafts) {
            *self.proposed.get_or_insert(0) += d.proposed;
            self.accepted += d.accepted;
        }
    }

    fn note(&self) -> String {
        match self.proposed {
            Some(p) if p > 0 => format!("speculation accepted {} of {p} drafts ({:.1} %)", self.accepted, 100.0 * self.accepted as f64 / p as f64),
            Some(_) => "speculation drafted nothing".into(),
            None => String::new(),
        }
    }
}

/// Judges `got` against the plain output it is a cut of.
fn judge(model: &OwnModel, plain: &[Generation], case: &Case, got: &Generation, eps: f64, logprob_eps: f64, tally: &mut Tally) -> Result<(), String> {
    let r = &case.req;
    let (id, _) = &model.prompts[case.prompt];
    let label = format!("prompt `{id}` (speculation {}, max {}, eos {:?}, stop {:?})", if r.speculation { "on" } else { "off" }, r.max_new_tokens, r.eos, r.stop);
    super::finish_contract(r, got).map_err(|e| format!("{label}: {e}"))?;
    let want = &plain[case.prompt];
    let head = &want.tokens[..case.keep];
    let step = got.tokens.iter().zip(head).position(|(a, b)| a != b);
    let compared = step.unwrap_or(got.tokens.len().min(case.keep));
    if let (Some(a), Some(b)) = (&got.logprobs, &want.logprobs) {
        for (j, (x, y)) in a.iter().zip(b).take(compared).enumerate() {
            let err = (x.logprob - y.logprob).abs();
            if err > logprob_eps {
                return Err(format!("{label}: token {j}'s logprob is {:.6}, plain decoding reports {:.6} (beyond the stated epsilon {logprob_eps:e})", x.logprob, y.logprob));
            }
            tally.max_logprob_err = tally.max_logprob_err.max(err);
        }
    }
    if let Some(step) = step {
        let m = margin(want, step);
        if m.is_some_and(|m| m < eps) {
            tally.excused += 1;
            return Ok(());
        }
        let quote = |t: &[u32]| format!("{:?}", (model.text)(&t[step..t.len().min(step + QUOTED)]));
        let margin = m.map_or("no logprobs reported, so no margin to excuse it".into(), |m| format!("plain's top-2 margin {m:.3e} >= the engine's epsilon {eps:e}"));
        return Err(format!(
            "{label}: first divergence at token {step}: plain continues {} (ids {:?}), this request {} (ids {:?}); {margin}",
            quote(&want.tokens),
            &want.tokens[step..want.tokens.len().min(step + QUOTED)],
            quote(&got.tokens),
            &got.tokens[step..got.tokens.len().min(step + QUOTED)]
        ));
    }
    if got.tokens.len() != case.keep || got.finish != case.finish {
        return Err(format!("{label}: {} tokens finishing {:?}, plain decoding's cut ends after {} with {:?}", got.tokens.len(), got.finish, case.keep, case.finish));
    }
    Ok(())
}

/// Runs `cases` with `in_flight` requests per call and judges each.
fn run_cases(engine: &mut dyn GenerationEngine, model: &OwnModel, plain: &[Generation], cases: &[Case], in_flight: usize) -> Result<(Tally, Result<(), String>), Verdict> {
    let info = engine.info().clone();
    let (greedy_eps, logprob_eps) = own_epsilons(&info);
    let mut tally = Tally::default();
    for chunk in cases.chunks(in_flight) {
        let requests: Vec<GenerationRequest> = chunk.iter().map(|c| c.req.clone()).collect();
        let outputs = generate(engine, &requests)?;
        for (case, got) in chunk.iter().zip(&outputs) {
            tally.drafts(got, case.req.speculation);
            if let Err(e) = judge(model, plain, case, got, greedy_eps, logprob_eps, &mut tally) {
                return Ok((tally, Err(e)));
            }
        }
    }
    Ok((tally, Ok(())))
}

/// The exact checks; `Ok((verdict, note))` with the acceptance counts.
fn own_check(engine: &mut dyn GenerationEngine, model: &OwnModel, plain: &[Generation], item: &EngineItem) -> Result<(Verdict, String), Verdict> {
    let info = engine.info().clone();
    let whole = |p: usize, on: bool| Case { req: greedy(&info, model, &model.prompts[p].1, on), prompt: p, keep: plain[p].tokens.len(), finish: plain[p].finish };
    let both = |cases: Vec<Case>| -> Vec<Case> {
        let off: Vec<Case> = cases.iter().map(|c| Case { req: GenerationRequest { speculation: false, ..c.req.clone() }, ..*c }).collect();
        cases.into_iter().chain(off).collect()
    };
    let (cases, in_flight) = match (item.check, item.sampled) {
        ("own-greedy", _) => ((0..plain.len()).map(|p| whole(p, true)).collect(), 1),
        ("own-concurrency", Some((level, _))) => {
            let n = SWEEP[level];
            ((0..n).map(|i| whole(i % plain.len(), true)).collect::<Vec<_>>(), n)
        }
        ("own-eos", _) => {
            if !info.eos_ids {
                return Ok((Verdict::NotSupported("the engine takes no eos ids per request (its transport cuts its output after an eos, which this check would judge instead)".into()), String::new()));
            }
            let mut cases = Vec::new();
            for (p, g) in plain.iter().enumerate() {
                // The first id the output emits for the first time at a position >= 2
                // and before its last token: given as the eos, it must cut there.
                let first_new = (2..g.tokens.len().saturating_sub(1)).find(|&j| !g.tokens[..j].contains(&g.tokens[j]) && !model.eos.contains(&g.tokens[j]));
                if let Some(j) = first_new {
                    let req = GenerationRequest { eos: vec![g.tokens[j]], ..whole(p, true).req };
                    cases.push(Case { req, prompt: p, keep: j + 1, finish: Finish::Eos });
                }
            }
            if cases.is_empty() {
                return Err(Verdict::Fail("no plain output emits a new id mid-way: the check would not test anything".into()));
            }
            (both(cases), 1)
        }
        ("own-stop", _) => {
            if !info.stop_strings {
                return Ok((Verdict::NotSupported("the engine does not take stop strings".into()), String::new()));
            }
            let mut cases = Vec::new();
            for (p, g) in plain.iter().enumerate() {
                // A stop completing at a final eos would leave eos and stop both right.
                let cut = cuts(&g.tokens, &CUTS, &|t| (model.text)(t)).into_iter().filter(|&(_, keep)| keep < g.tokens.len() || g.finish != Finish::Eos);
                for (s, keep) in cut {
                    let req = GenerationRequest { stop: vec![s], ..whole(p, true).req };
                    cases.push(Case { req, prompt: p, keep, finish: Finish::Stop });
                }
            }
            if cases.is_empty() {
                return Err(Verdict::Fail("no plain output is long enough to take a stop string from".into()));
            }
            (both(cases), 1)
        }
        ("own-length", _) => {
            let mut cases = Vec::new();
            for (p, g) in plain.iter().enumerate() {
                for &n in CUTS.iter().filter(|&&n| n < g.tokens.len()) {
                    cases.push(Case { req: GenerationRequest { max_new_tokens: n, ..whole(p, true).req }, prompt: p, keep: n, finish: Finish::Length });
                }
            }
            if cases.is_empty() {
                return Err(Verdict::Fail("no plain output is long enough to cap".into()));
            }
            (both(cases), 1)
        }
        ("own-seeded", _) => return seeded(engine, model).map(|v| (v, String::new())),
        (other, _) => return Err(Verdict::Fail(format!("unknown check `{other}`"))),
    };
    let (tally, judged) = run_cases(engine, model, plain, &cases, in_flight)?;
    let note = tally.note();
    if let Err(e) = judged {
        // Whether the load alone moves plain decoding too: the engine's batched
        // forward then differs from its single-request one, speculation or not.
        let load = if item.check == "own-concurrency" && in_flight > 1 {
            let off: Vec<Case> = cases.iter().map(|c| Case { req: GenerationRequest { speculation: false, ..c.req.clone() }, ..*c }).collect();
            match run_cases(engine, model, plain, &off, in_flight) {
                Ok((_, Ok(()))) => format!("; plain decoding at {in_flight} in flight equals plain alone, so the divergence is speculation's under load"),
                Ok((_, Err(_))) => format!("; plain decoding at {in_flight} in flight diverges from plain alone too: the engine's batched forward is not batch-invariant"),
                Err(_) => String::new(),
            }
        } else {
            String::new()
        };
        return Ok((Verdict::Fail(format!("{e}{load}")), note));
    }
    if matches!(item.check, "own-greedy" | "own-concurrency") && tally.proposed == Some(0) {
        return Ok((Verdict::Fail("speculation on drafted nothing: the check would not exercise the engine's verify".into()), note));
    }
    Ok((Verdict::Pass { excused: tally.excused, max_abs_err: tally.max_logprob_err }, note))
}

/// ENGINE-6 (ENGINE-10's form): each prompt's sampled request, twice with
/// each seed, on and off, gives the same tokens both times.
fn seeded(engine: &mut dyn GenerationEngine, model: &OwnModel) -> Result<Verdict, Verdict> {
    for (id, prompt) in &model.prompts {
        for seed in SEEDS {
            for on in [true, false] {
                let req = GenerationRequest { eos: model.eos.clone(), ..GenerationRequest::sampled(prompt.clone(), LARGE_SETTING.1, seed, OWN_TOKENS, on) };
                let a = generate(engine, std::slice::from_ref(&req))?.remove(0);
                let b = generate(engine, std::slice::from_ref(&req))?.remove(0);
                if a.tokens != b.tokens {
                    let step = a.tokens.iter().zip(&b.tokens).position(|(x, y)| x != y).unwrap_or(a.tokens.len().min(b.tokens.len()));
                    return Ok(Verdict::Fail(format!(
                        "prompt `{id}`, seed {seed}, speculation {}: the same request twice differs from token {step}: {:?} then {:?}",
                        if on { "on" } else { "off" },
                        (model.text)(&a.tokens[step.min(a.tokens.len())..]),
                        (model.text)(&b.tokens[step.min(b.tokens.len())..])
                    )));
                }
            }
        }
    }
    Ok(Verdict::Pass { excused: 0, max_abs_err: 0.0 })
}

/// `constrained`: each prompt of the model's constrained mix, greedy, alone:
/// speculation on equals the engine's own constrained plain decoding (as
/// `greedy`, margins excused alike), and every plain output that ends at
/// eos is a match of the constraint (CONSTRAIN-4); at least one must.
fn constrained(engine: &mut dyn GenerationEngine, model: &OwnModel) -> Result<(Verdict, String), Verdict> {
    let mix = match &model.constrained {
        Ok(mix) => mix,
        Err(why) => return Ok((Verdict::NotSupported(why.clone()), String::new())),
    };
    if mix.prompts.is_empty() || mix.eos.is_empty() {
        return Err(Verdict::Fail("the constrained mix has no prompts or no eos: the check would test nothing".into()));
    }
    let constraint = Constraint::new(&mix.spec).map_err(|e| Verdict::Fail(format!("the mix's constraint: {e}")))?;
    // The mix as a model of its own: its prompts, its eos, the model's text.
    let asked = OwnModel { prompts: mix.prompts.clone(), eos: mix.eos.clone(), constrained: Err("the mix itself".into()), ..model.clone() };
    let info = engine.info().clone();
    let request = |prompt: &[u32], on: bool| GenerationRequest { constraint: Some(mix.spec.clone()), max_new_tokens: mix.max_new_tokens, ..greedy(&info, &asked, prompt, on) };
    let plain = plain_of(engine, &asked, &|prompt| request(prompt, false))?;
    for ((id, _), got) in mix.prompts.iter().zip(&plain).filter(|(_, g)| g.finish == Finish::Eos) {
        let text = (model.text)(&got.tokens[..got.tokens.len() - 1]);
        let judged = if matches!(mix.spec, ConstraintSpec::JsonSchema(_)) { without_json_whitespace(&text) } else { text.clone() };
        if !constraint.matches(judged.as_bytes()) {
            return Ok((Verdict::Fail(format!("prompt `{id}`: plain decoding's constrained output {text:?} ends at eos but does not match the {} constraint", mix.spec.kind())), String::new()));
        }
    }
    if plain.iter().all(|g| g.finish != Finish::Eos) {
        return Ok((Verdict::Fail(format!("no plain constrained output ends at eos within {} tokens: the check would not see a match", mix.max_new_tokens)), String::new()));
    }
    let cases: Vec<Case> = mix.prompts.iter().enumerate().map(|(p, (_, prompt))| Case { req: request(prompt, true), prompt: p, keep: plain[p].tokens.len(), finish: plain[p].finish }).collect();
    let (tally, judged) = run_cases(engine, &asked, &plain, &cases, 1)?;
    let verdict = match judged {
        Err(e) => Verdict::Fail(e),
        Ok(()) if tally.proposed == Some(0) => Verdict::Fail("speculation on drafted nothing: the check would not exercise the engine's verify".into()),
        Ok(()) => Verdict::Pass { excused: tally.excused, max_abs_err: tally.max_logprob_err },
    };
    Ok((verdict, tally.note()))
}

/// JSON text without the whitespace between its tokens (outside strings),
/// as the compact JSON CONSTRAIN-5's schemas are written in.
fn without_json_whitespace(text: &str) -> String {
    let (mut out, mut in_string, mut escaped) = (String::with_capacity(text.len()), false, false);
    for c in text.chars() {
        if in_string {
            in_string = escaped || c != '"';
            escaped = !escaped && c == '\\';
        } else if c == '"' {
            in_string = true;
        } else if matches!(c, ' ' | '\t' | '\n' | '\r') {
            continue;
        }
        out.push(c);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::without_json_whitespace;

    /// Whitespace between JSON tokens goes; inside strings, escaped quotes
    /// and backslashes included, it stays.
    #[test]
    fn json_whitespace_goes_outside_strings_only() {
        for (text, want) in
            [("{\n  \"a\": [1, 2],\t\"b\" : \"x y\"\r\n}", r#"{"a":[1,2],"b":"x y"}"#), (r#"{ "q": "say \" hi \\" , "n": 1 }"#, r#"{"q":"say \" hi \\","n":1}"#), ("\"a b\"", "\"a b\"")]
        {
            assert_eq!(without_json_whitespace(text), want, "{text:?}");
        }
    }
}
