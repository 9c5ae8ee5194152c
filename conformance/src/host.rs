//! Host cases (CASE-7): worked examples of the reference-only algorithms
//! (seed 004's accept function, the lossy verifiers, the controller, DFlash
//! drafting pieces, rollback plans and theory). They are data in
//! `fixtures/host/` like the golden cases, and run against the reference
//! through the same judge.

use serde_json::Value;
use specdec_backend::{Backend, BackendError, HostTensor, Precision};
use specdec_reference::controller::{DynamicController, SpecConfig, StepCounts};
use specdec_reference::dflash::{self, Schedule};
use specdec_reference::ngram::{self, NgramConfig, NgramIndex};
use specdec_reference::{Comparator, SpecError, kvcache, lossy, speculative_accept, theory};

use crate::check::{CheckResult, Kind, SuiteConfig, catch, settle};
use crate::compare::{Verdict, judge_measured};
use crate::execute::{Observed, OutValue};
use crate::fixtures::{HOST_FILES, parsed};
use crate::format::{Case, CaseError};
use crate::ops::HOST_OPS;
use crate::section::Section;

/// Named outputs of a host op, or the reference's error for its input; the
/// outer `Err` is a malformed case.
type HostResult = Result<Result<Vec<(&'static str, OutValue)>, SpecError>, CaseError>;

fn ints(v: Vec<i64>) -> OutValue {
    OutValue::Ints(HostTensor::from_vec(v))
}

fn floats(v: Vec<f64>) -> OutValue {
    OutValue::Floats(HostTensor::from_vec(v))
}

fn usizes(v: &[usize]) -> OutValue {
    ints(v.iter().map(|&x| x as i64).collect())
}

/// Runs a host case on the reference.
pub fn execute_host(case: &Case) -> Result<Observed, CaseError> {
    let mut obs = Observed::default();
    let result: Result<Vec<(&str, OutValue)>, SpecError> = match case.op.as_str() {
        "speculative_accept" => {
            let drafts = case.input_i("draft_tokens")?;
            let (p, q, r) = (case.input_f("p")?, case.input_f("q")?, case.input_f("r")?);
            let cmp = case.param("comparator", Some(Comparator::Strict))?;
            speculative_accept(drafts.data(), &p, &q, r.data(), cmp).map(|a| vec![("accepted", ints(a))])
        }
        "lossy_threshold_verify" => {
            let (p, d, l) = (case.input_f("target_probs")?, case.input_i("draft_tokens")?, case.input_i("proposal_lens")?);
            let t: f64 = case.param("threshold", None)?;
            lossy::lossy_threshold_verify(&p, &d, &l, t).map(|o| vec![("tokens", OutValue::Ints(o.tokens)), ("num_accepted", usizes(&o.num_accepted))])
        }
        "lossy_typical_verify" => {
            let (p, d, l) = (case.input_f("target_probs")?, case.input_i("draft_tokens")?, case.input_i("proposal_lens")?);
            let u = case.input_f("draw_uniforms")?;
            let (eps, delta): (f64, f64) = (case.param("epsilon", None)?, case.param("delta", None)?);
            lossy::lossy_typical_verify(&p, &d, &l, eps, delta, &u).map(|o| vec![("tokens", OutValue::Ints(o.tokens)), ("num_accepted", usizes(&o.num_accepted))])
        }
        "ngram_lookup" => {
            let (prompt, generated) = (case.input_i("prompt")?, case.input_i("generated")?);
            let lookup: bool = case.param("prompt_lookup", None)?;
            let (vocab, cfg): (usize, NgramConfig) = (case.param("vocab", None)?, case.param("config", None)?);
            let context = ngram::lookup_context(prompt.data(), generated.data(), lookup);
            ngram::propose(&context, vocab, &cfg).map(|p| vec![("proposal", ints(p))])
        }
        "ngram_index" => {
            let chunks = case.inputs.get("chunks").and_then(Value::as_array).ok_or_else(|| case.error("inputs", "chunks", "must be an array of id arrays"))?;
            let (vocab, cfg): (usize, NgramConfig) = (case.param("vocab", None)?, case.param("config", None)?);
            let chunks: Vec<Vec<i64>> = chunks.iter().map(|c| serde_json::from_value(c.clone()).map_err(|e| case.error("inputs", "chunks", e))).collect::<Result<_, _>>()?;
            ngram_index(&chunks, vocab, cfg)
        }
        "controller" => controller(case)?,
        "spec_config" => {
            let cfg: SpecConfig = case.param("config", None)?;
            cfg.validate().map(|()| vec![("valid", ints(vec![1]))])
        }
        "unmask_order" => {
            let (n, t, s): (usize, usize, Schedule) = (case.param("positions", None)?, case.param("steps", None)?, case.param("schedule", None)?);
            dflash::unmask_order(n, t, s).map(|o| vec![("order", usizes(&o))])
        }
        "mask_ratio" => {
            let (s, t): (Schedule, f64) = (case.param("schedule", None)?, case.param("t", None)?);
            s.mask_ratio(t).map(|r| vec![("ratio", floats(vec![r]))])
        }
        "select_unmask" => {
            let (c, m) = (case.input_f("confidence")?, case.input_i("masked")?);
            let n: usize = case.param("count", None)?;
            let masked: Vec<bool> = m.data().iter().map(|&x| x != 0).collect();
            dflash::select_unmask(c.data(), &masked, n).map(|p| vec![("positions", usizes(&p))])
        }
        "block_input" => {
            let v = case.input_i("verified")?;
            let (block, mask, vocab, rows): (usize, i64, usize, usize) = (case.param("block", None)?, case.param("mask_id", None)?, case.param("vocab", None)?, case.param("embed_rows", None)?);
            dflash::block_input(v.data(), block, mask, vocab, rows).map(|t| vec![("block", OutValue::Ints(t))])
        }
        "rollback_amounts" => {
            let (l, n): (Vec<usize>, Vec<usize>) = (case.param("proposal_lens", None)?, case.param("num_accepted", None)?);
            kvcache::rollback_amounts(&l, &n).map(|t| vec![("trim", usizes(&t))])
        }
        "min_accepted_plan" => {
            let (n, w): (Vec<usize>, usize) = (case.param("num_accepted", None)?, case.param("width", None)?);
            kvcache::min_accepted_plan(&n, w).map(|p| vec![("emit", usizes(&[p.emit])), ("uniform_trim", usizes(&[p.uniform_trim]))])
        }
        "theory" => theory_case(case)?,
        other => {
            return Err(case.error("", "op", format!("unknown host op \"{other}\"; known: {}", HOST_OPS.join(", "))));
        }
    };
    match result {
        Ok(outputs) => obs.outputs.extend(outputs.into_iter().map(|(n, v)| (n.to_string(), v))),
        Err(e) => obs.error = Some(BackendError::Invalid(e)),
    }
    Ok(obs)
}

/// Appends the chunks one by one; the output row `i` is the proposal after
/// chunk `i`, PAD-padded to `k`, next to the linear search's answer.
fn ngram_index(chunks: &[Vec<i64>], vocab: usize, cfg: NgramConfig) -> Result<Vec<(&'static str, OutValue)>, SpecError> {
    let mut index = NgramIndex::new(cfg, vocab)?;
    let (mut rows, mut linear) = (Vec::new(), Vec::new());
    for chunk in chunks {
        index.extend(chunk)?;
        let pad = |mut p: Vec<i64>| {
            p.resize(cfg.k, specdec_reference::PAD);
            p
        };
        rows.extend(pad(index.propose()?));
        linear.extend(pad(ngram::propose(index.context(), vocab, &cfg)?));
    }
    let shape = vec![chunks.len(), cfg.k];
    Ok(vec![("index_proposals", OutValue::Ints(HostTensor::new(shape.clone(), rows)?)), ("linear_proposals", OutValue::Ints(HostTensor::new(shape, linear)?))])
}

/// Drives a controller through `events`: `{"update": {...}}`,
/// `{"fallback": true}` or `{"query": batch_size}`.
fn controller(case: &Case) -> HostResult {
    let cfg: SpecConfig = case.param("config", None)?;
    let events = case.inputs.get("events").and_then(Value::as_array).ok_or_else(|| case.error("inputs", "events", "must be an array"))?;
    let mut c = match DynamicController::new(cfg) {
        Ok(c) => c,
        Err(e) => return Ok(Err(e)),
    };
    let (mut should, mut ks, mut emas) = (Vec::new(), Vec::new(), Vec::new());
    for (i, ev) in events.iter().enumerate() {
        let field = format!("events[{i}]");
        // One event per object, and an update has exactly its four counts (CASE-9).
        if ev.as_object().is_none_or(|o| o.len() != 1) {
            return Err(case.error("inputs", &field, "must be an object with one key: update, fallback or query"));
        }
        if let Some(k) = ev.get("update").and_then(Value::as_object).and_then(|o| o.keys().find(|k| !matches!(k.as_str(), "sequences" | "proposed" | "accepted" | "bonus"))) {
            return Err(case.error("inputs", &field, format!("unknown field `{k}` in update (it has sequences, proposed, accepted, bonus)")));
        }
        if let Some(u) = ev.get("update") {
            let get = |n: &str| u.get(n).and_then(Value::as_u64).ok_or_else(|| case.error("inputs", &field, format!("update needs integer `{n}`")));
            let step = StepCounts { sequences: get("sequences")?, proposed: get("proposed")?, accepted: get("accepted")?, bonus: get("bonus")? };
            if let Err(e) = c.update(step) {
                return Ok(Err(e));
            }
            emas.push(c.acceptance_rate_ema());
        } else if ev.get("fallback").is_some() {
            c.record_fallback();
        } else if let Some(b) = ev.get("query").and_then(Value::as_u64) {
            should.push(i64::from(c.should_speculate(b as usize)));
            ks.push(c.k(b as usize) as i64);
        } else {
            return Err(case.error("inputs", &field, "must be {\"update\": ..}, {\"fallback\": true} or {\"query\": batch}"));
        }
    }
    let s = c.stats();
    Ok(Ok(vec![
        ("should_speculate", ints(should)),
        ("k", ints(ks)),
        ("ema_after_updates", floats(emas)),
        ("acceptance_rate", floats(vec![s.acceptance_rate()])),
        ("tokens_per_sequence_step", floats(vec![s.tokens_per_sequence_step()])),
        ("counters", ints(vec![s.steps as i64, s.sequence_steps as i64, s.proposed as i64, s.accepted as i64, s.bonus_tokens as i64, s.fallback_steps as i64])),
    ]))
}

/// `theory` cases name a function in `params.fn` and its arguments.
fn theory_case(case: &Case) -> HostResult {
    let f: String = case.param("fn", None)?;
    let beta = || case.param::<f64>("beta", None);
    let gamma = || case.param::<usize>("gamma", None);
    let row = |n: &str| case.input_f(n).map(HostTensor::into_data);
    Ok(match f.as_str() {
        "acceptance" => theory::acceptance(&row("p")?, &row("q")?).map(|v| vec![("value", floats(vec![v]))]),
        "kl_divergence" => theory::kl_divergence(&row("p")?, &row("q")?).map(|v| vec![("value", floats(vec![v]))]),
        "one_position_output_law" => theory::one_position_output_law(&row("p")?, &row("q")?).map(|v| vec![("law", floats(v))]),
        "accepted_length_law" => theory::accepted_length_law(&case.param::<Vec<f64>>("betas", None)?).map(|v| vec![("law", floats(v))]),
        "expected_tokens" => theory::expected_tokens(&case.param::<Vec<f64>>("betas", None)?).map(|v| vec![("value", floats(vec![v]))]),
        "expected_tokens_geometric" => theory::expected_tokens_geometric(beta()?, gamma()?).map(|v| vec![("value", floats(vec![v]))]),
        "expected_speedup" => theory::expected_speedup(beta()?, gamma()?, case.param("cost_ratio", None)?).map(|v| vec![("value", floats(vec![v]))]),
        "seed003_speedup_approximation" => theory::seed003_speedup_approximation(beta()?, gamma()?, case.param("rho", None)?).map(|v| vec![("value", floats(vec![v]))]),
        "best_draft_length" => {
            theory::best_draft_length(beta()?, case.param("cost_ratio", None)?, case.param("max_gamma", None)?).map(|(g, s)| vec![("gamma", ints(vec![g as i64])), ("speedup", floats(vec![s]))])
        }
        "pinsker_acceptance_bound" => theory::pinsker_acceptance_bound(case.param("kl", None)?).map(|v| vec![("value", floats(vec![v]))]),
        "bretagnolle_huber_acceptance_bound" => theory::bretagnolle_huber_acceptance_bound(case.param("kl", None)?).map(|v| vec![("value", floats(vec![v]))]),
        other => return Err(case.error("params", "fn", format!("unknown theory function \"{other}\""))),
    })
}

/// Runs and judges one host case.
pub fn check_host_case(case: &Case) -> Verdict {
    check_host_case_measured(case).0
}

/// [`check_host_case`] and the largest absolute float difference, pass or fail.
pub fn check_host_case_measured(case: &Case) -> (Verdict, f64) {
    let exact = Precision { float_dtype: "f64", accumulate_dtype: "f64", margin_epsilon: 0.0, value_tolerance: 0.0 };
    match execute_host(case) {
        Ok(obs) => judge_measured(case, &obs, &exact, None),
        Err(e) => (Verdict::Fail(format!("case file defect: {e}")), 0.0),
    }
}

/// Host cases as a section: each case is a check named `<prefix>/<case id>`,
/// judged on the reference whatever the backend (the algorithms exist only
/// there); a case or file that does not load fails as its own check.
pub struct HostSection {
    checks: Vec<(String, Result<Case, String>)>,
}

impl HostSection {
    /// The shipped host cases (`fixtures/host/`), named `host/<file stem>/<case id>`.
    pub fn shipped() -> Self {
        let mut checks = Vec::new();
        for (stem, loaded) in parsed(HOST_FILES) {
            match loaded {
                Err(e) => checks.push((format!("host/{stem}"), Err(e.to_string()))),
                Ok(loaded) => {
                    checks.extend(loaded.errors.into_iter().map(|e| (format!("host/{stem}/{}", e.case.clone().unwrap_or_else(|| "file".into())), Err(e.to_string()))));
                    checks.extend(loaded.cases.into_iter().map(|c| (format!("host/{stem}/{}", c.id), Ok(c))));
                }
            }
        }
        HostSection { checks }
    }

    /// Given host cases, named `<prefix>/<case id>` (`specdec check` on a file).
    pub fn from_cases(prefix: &str, cases: Vec<Case>) -> Self {
        HostSection { checks: cases.into_iter().map(|c| (format!("{prefix}/{}", c.id), Ok(c))).collect() }
    }
}

impl<B: Backend> Section<B> for HostSection {
    fn names(&self) -> Vec<String> {
        self.checks.iter().map(|(n, _)| n.clone()).collect()
    }

    fn run(&self, backend: &B, cfg: &SuiteConfig, progress: &mut dyn FnMut(&CheckResult)) -> Vec<CheckResult> {
        let mut results = Vec::with_capacity(self.checks.len());
        for (name, case) in &self.checks {
            let (op, rules): (String, Vec<&str>) = match case {
                Ok(c) => (c.op.clone(), c.rules.iter().map(String::as_str).collect()),
                Err(_) => ("-".into(), Vec::new()),
            };
            let mut result = CheckResult::unselected(name, Kind::Host, op, &rules, &backend.name(), cfg.seed);
            if cfg.wants(name) {
                let start = std::time::Instant::now();
                let (verdict, max_abs_err) = match case {
                    Ok(c) => catch(|| check_host_case_measured(c)).unwrap_or_else(|msg| (Verdict::Fail(msg), 0.0)),
                    Err(msg) => (Verdict::Fail(format!("case file defect: {msg}")), 0.0),
                };
                result.millis = start.elapsed().as_secs_f64() * 1e3;
                result.max_abs_err = max_abs_err;
                settle(&mut result, verdict, &cfg.selection);
                if result.message.is_empty() {
                    result.message = "run on the reference".into();
                }
            }
            progress(&result);
            results.push(result);
        }
        results
    }
}
