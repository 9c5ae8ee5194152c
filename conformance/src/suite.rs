//! The conformance suite: which checks exist, which a vendor runs, and what
//! each one's status is (SUITE-1 .. SUITE-4).

use std::time::Instant;

use serde::{Deserialize, Serialize};
use specdec_backend::{Backend, Op};

use crate::case::{Case, CaseError, Loaded, parse};
use crate::compare::{Verdict, judge_measured, reference_margins};
use crate::execute::{case_op, execute};
use crate::{diff, stat};

include!(concat!(env!("OUT_DIR"), "/golden_files.rs"));

/// The default run seed; `SPECDEC_SEED` or `--seed` override it (STAT-1).
pub const DEFAULT_SEED: u64 = 20_261_122;

/// The seed of a run: `SPECDEC_SEED` if set and valid, else [`DEFAULT_SEED`].
pub fn seed_from_env() -> Result<u64, String> {
    match std::env::var("SPECDEC_SEED") {
        Ok(s) => s.trim().parse().map_err(|_| format!("SPECDEC_SEED={s:?} is not a u64")),
        Err(_) => Ok(DEFAULT_SEED),
    }
}

/// What kind of check an item is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    Golden,
    Differential,
    /// The exact output law, integrated over the backend's noise (STAT-7).
    Exact,
    Statistical,
    /// A model forward-pass check (MODEL-8 .. MODEL-14).
    Model,
    /// A speculative decoder end to end (DECODE-2 .. DECODE-5).
    EndToEnd,
}

/// The status of one check (SUITE-2).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum Status {
    Pass,
    Fail,
    /// Failed, and listed as an expected failure.
    XFail,
    /// Passed although listed as an expected failure: the list is stale.
    XPass,
    /// The backend lacks the operation: reported, never a pass.
    NotSupported,
    /// Not selected by the include/exclude lists or the filter.
    Skipped,
}

impl Status {
    /// Whether this status fails a run (SUITE-3).
    pub fn is_failure(self) -> bool {
        matches!(self, Status::Fail | Status::XPass)
    }
}

/// A vendor's selection file (SUITE-1), TOML:
///
/// ```toml
/// include = ["*"]             # glob patterns over check names ('*' matches anything)
/// exclude = ["stat/*"]
/// xfail   = ["golden/rejection/*"]
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Selection {
    #[serde(default)]
    pub include: Vec<String>,
    #[serde(default)]
    pub exclude: Vec<String>,
    #[serde(default)]
    pub xfail: Vec<String>,
}

impl Selection {
    pub fn parse(toml_text: &str) -> Result<Selection, String> {
        toml::from_str(toml_text).map_err(|e| format!("invalid selection file: {e}"))
    }

    fn selects(&self, name: &str) -> bool {
        let included = self.include.is_empty() || self.include.iter().any(|p| glob(p, name));
        included && !self.exclude.iter().any(|p| glob(p, name))
    }

    fn expects_failure(&self, name: &str) -> bool {
        self.xfail.iter().any(|p| glob(p, name))
    }
}

/// `*` matches any run of characters; everything else matches itself.
pub fn glob(pattern: &str, name: &str) -> bool {
    let parts: Vec<&str> = pattern.split('*').collect();
    if parts.len() == 1 {
        return pattern == name;
    }
    let (first, last) = (parts[0], parts[parts.len() - 1]);
    if !name.starts_with(first) || name.len() < first.len() + last.len() || !name.ends_with(last) {
        return false;
    }
    let mut rest = &name[first.len()..name.len() - last.len()];
    for part in &parts[1..parts.len() - 1] {
        match rest.find(part) {
            Some(i) => rest = &rest[i + part.len()..],
            None => return false,
        }
    }
    true
}

/// How a run is configured.
#[derive(Debug, Clone)]
pub struct SuiteConfig {
    pub seed: u64,
    /// Only checks whose name contains this (or matches it as a glob).
    pub filter: Option<String>,
    pub selection: Selection,
    pub diff_cases_per_op: usize,
    /// Run the statistical checks (they dominate the run time).
    pub statistical: bool,
}

impl Default for SuiteConfig {
    fn default() -> Self {
        SuiteConfig { seed: DEFAULT_SEED, filter: None, selection: Selection::default(), diff_cases_per_op: diff::DEFAULT_CASES_PER_OP, statistical: true }
    }
}

impl SuiteConfig {
    pub fn wants(&self, name: &str) -> bool {
        let filtered = match &self.filter {
            None => true,
            Some(f) if f.contains('*') => glob(f, name),
            Some(f) => name.contains(f.as_str()),
        };
        filtered && self.selection.selects(name)
    }
}

/// What an item runs.
#[derive(Debug, Clone)]
pub enum Source {
    Golden(Box<Case>),
    Differential(Op, usize),
    Statistical(stat::StatSpec),
    /// A fixed-row scenario whose exact law is integrated (STAT-7).
    Exact(&'static str),
    /// A case that could not be loaded: it fails with this message.
    Broken(String),
    /// GLUE-6: the unchecked variant of a verify op against its checked op.
    Unchecked(Op),
    /// BACKEND-6: the stated precision lies within its dtype's cap.
    PrecisionCap,
    /// A large-vocabulary case of `draw` or `rejection_verify` (`diff::large_vocab_case`).
    LargeVocab(Op, usize),
}

/// One check of the suite.
#[derive(Debug, Clone)]
pub struct Item {
    pub name: String,
    pub kind: Kind,
    pub op: String,
    pub rules: Vec<String>,
    pub source: Source,
}

/// The result of one check.
#[derive(Debug, Clone, Serialize)]
pub struct CheckResult {
    pub name: String,
    pub kind: Kind,
    pub op: String,
    pub rules: Vec<String>,
    pub status: Status,
    pub message: String,
    /// Rows whose difference from the reference lay within the margin epsilon.
    pub excused: usize,
    pub max_abs_err: f64,
    pub millis: f64,
    /// A command that reruns just this check.
    pub repro: String,
    /// The statistical detail, for statistical checks.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub statistics: Option<specdec_stats::TestReport>,
}

impl CheckResult {
    /// A check before it runs: `Skipped` ("not selected") until settled, with
    /// the command that reruns it alone.
    pub fn unselected(name: &str, kind: Kind, op: String, rules: &[&str], backend: &str, seed: u64) -> Self {
        CheckResult {
            name: name.to_string(),
            kind,
            op,
            rules: rules.iter().map(|r| r.to_string()).collect(),
            status: Status::Skipped,
            message: "not selected".into(),
            excused: 0,
            max_abs_err: 0.0,
            millis: 0.0,
            repro: repro(backend, seed, name),
            statistics: None,
        }
    }
}

/// Golden items from the embedded fixtures, named `golden/<file stem>/<case id>`.
pub fn golden_items() -> Vec<Item> {
    GOLDEN_FILES.iter().flat_map(|(path, text)| items_from_text(path, text)).collect()
}

/// Items from one case file's text; load errors become failing items.
pub fn items_from_text(path: &str, text: &str) -> Vec<Item> {
    let stem = path.trim_end_matches(".json");
    match parse(text, std::path::Path::new(path)) {
        Err(e) => vec![broken(format!("golden/{stem}"), e)],
        Ok(loaded) => items_from_loaded(stem, loaded),
    }
}

/// Items of a shipped golden file, named `golden/<stem>/<case id>`.
pub fn items_from_loaded(stem: &str, loaded: Loaded) -> Vec<Item> {
    items_named(&format!("golden/{stem}"), loaded)
}

/// Items named `<prefix>/<case id>` (`file/<stem>` for an external file).
pub fn items_named(prefix: &str, loaded: Loaded) -> Vec<Item> {
    let mut items: Vec<Item> = loaded
        .cases
        .into_iter()
        .map(|case| {
            let name = format!("{prefix}/{}", case.id);
            match case_op(&case) {
                Ok(_) => Item { name, kind: Kind::Golden, op: case.op.clone(), rules: case.rules.clone(), source: Source::Golden(Box::new(case)) },
                Err(e) => broken(name, e),
            }
        })
        .collect();
    items.extend(loaded.errors.into_iter().map(|e| {
        let id = e.case.clone().unwrap_or_else(|| "file".into());
        broken(format!("{prefix}/{id}"), e)
    }));
    items
}

fn broken(name: String, e: CaseError) -> Item {
    Item { name, kind: Kind::Golden, op: "-".into(), rules: Vec::new(), source: Source::Broken(e.to_string()) }
}

/// Every item of a run, before selection.
pub fn all_items(cfg: &SuiteConfig) -> Vec<Item> {
    let mut items = vec![Item { name: "precision/within-cap".into(), kind: Kind::Golden, op: "-".into(), rules: vec!["BACKEND-6".into()], source: Source::PrecisionCap }];
    items.extend(golden_items());
    for op in diff::ops() {
        for i in 0..cfg.diff_cases_per_op {
            items.push(Item { name: diff::name(op, i), kind: Kind::Differential, op: op.name().into(), rules: Vec::new(), source: Source::Differential(op, i) });
        }
    }
    for op in diff::LARGE_VOCAB_OPS {
        for i in 0..diff::LARGE_VOCAB_CASES {
            let (name, rules) = (diff::large_vocab_name(op, i), diff::large_vocab_rules(op));
            items.push(Item { name, kind: Kind::Differential, op: op.name().into(), rules, source: Source::LargeVocab(op, i) });
        }
    }
    for op in crate::unchecked::OPS {
        items.push(Item { name: format!("unchecked/{}", op.name()), kind: Kind::Differential, op: op.name().into(), rules: vec!["GLUE-6".into()], source: Source::Unchecked(op) });
    }
    for name in crate::exact::EXACT_SCENARIOS {
        items.push(Item { name: format!("exact/{name}"), kind: Kind::Exact, op: Op::RejectionVerify.name().into(), rules: vec!["STAT-7".into(), "REJECT-7".into()], source: Source::Exact(name) });
    }
    if cfg.statistical {
        for spec in stat::specs() {
            items.push(Item {
                name: spec.name(),
                kind: Kind::Statistical,
                op: specdec_backend::Op::RejectionVerifySeeded.name().into(),
                rules: spec.rules.iter().map(|r| r.to_string()).collect(),
                source: Source::Statistical(spec),
            });
        }
    }
    items
}

/// Runs the selected items on `backend`, calling `progress` after each.
/// Statistical checks are judged together at the end (Holm, STAT-2).
pub fn run<B: Backend>(backend: &B, items: &[Item], cfg: &SuiteConfig, progress: &mut dyn FnMut(&CheckResult)) -> Vec<CheckResult> {
    let mut results = Vec::with_capacity(items.len());
    let mut stats = Vec::new();
    for item in items {
        let selected = cfg.wants(&item.name);
        let mut result = CheckResult {
            name: item.name.clone(),
            kind: item.kind,
            op: item.op.clone(),
            rules: item.rules.clone(),
            status: Status::Skipped,
            message: String::new(),
            excused: 0,
            max_abs_err: 0.0,
            millis: 0.0,
            repro: repro(&backend.name(), cfg.seed, &item.name),
            statistics: None,
        };
        if !selected {
            result.message = "not selected".into();
            progress(&result);
            results.push(result);
            continue;
        }
        let start = Instant::now();
        if let Source::Statistical(spec) = &item.source {
            // Sampled now, judged with its family below (STAT-2).
            let outcome = catch(|| stat::run(backend, spec, cfg.seed)).unwrap_or_else(|msg| Err(Verdict::Fail(msg)));
            result.millis = start.elapsed().as_secs_f64() * 1e3;
            stats.push((results.len(), outcome));
            results.push(result);
            continue;
        }
        // A panicking backend fails its own check, never the whole run.
        let (verdict, max_abs_err) = catch(|| match &item.source {
            Source::Golden(case) => check_case_measured(backend, case),
            Source::Differential(op, i) => check_generated(backend, diff::case(*op, *i, cfg.seed)),
            Source::LargeVocab(op, i) => check_generated(backend, diff::large_vocab_case(*op, *i, cfg.seed)),
            Source::Broken(msg) => (Verdict::Fail(format!("case file defect: {msg}")), 0.0),
            Source::Unchecked(op) => (crate::unchecked::check(backend, *op, cfg), 0.0),
            Source::Exact(name) => {
                let scenario = stat::scenario(name).expect("known scenario");
                (crate::exact::check_scenario(backend, &scenario), 0.0)
            }
            Source::PrecisionCap => match backend.precision().cap_violation() {
                None => (Verdict::Pass { excused: 0, max_abs_err: 0.0 }, 0.0),
                Some(why) => (Verdict::Fail(why), 0.0),
            },
            Source::Statistical(_) => unreachable!("sampled above"),
        })
        .unwrap_or_else(|msg| (Verdict::Fail(msg), 0.0));
        result.millis = start.elapsed().as_secs_f64() * 1e3;
        // Failing checks count towards the report's largest difference too.
        result.max_abs_err = max_abs_err;
        settle(&mut result, verdict, &cfg.selection);
        progress(&result);
        results.push(result);
    }
    for (slot, verdict, report) in stat::judge_family(stats) {
        let result = &mut results[slot];
        result.statistics = report;
        settle(result, verdict, &cfg.selection);
        progress(result);
    }
    results
}

/// Runs a generated case; a case the generator could not build fails as its defect.
fn check_generated<B: Backend>(backend: &B, case: Result<Case, CaseError>) -> (Verdict, f64) {
    match case {
        Ok(case) => check_case_measured(backend, &case),
        Err(e) => (Verdict::Fail(format!("generator defect: {e}")), 0.0),
    }
}

/// Runs one case (golden, differential or external) on `backend`.
pub fn check_case<B: Backend>(backend: &B, case: &Case) -> Verdict {
    check_case_measured(backend, case).0
}

/// [`check_case`] and the largest absolute float difference, pass or fail.
pub fn check_case_measured<B: Backend>(backend: &B, case: &Case) -> (Verdict, f64) {
    // The executor reports a malformed case best; the margins read the same inputs.
    let observed = match execute(backend, case) {
        Ok(o) => o,
        Err(e) => return (Verdict::Fail(format!("case file defect: {e}")), 0.0),
    };
    match reference_margins(case) {
        // Judged with the capped precision (BACKEND-6): an overstated epsilon buys nothing.
        Ok(margins) => judge_measured(case, &observed, &backend.precision().judged(), margins.as_deref()),
        Err(e) => (Verdict::Fail(format!("case file defect: {e}")), 0.0),
    }
}

/// Runs `f`, turning a panic into an error message.
pub(crate) fn catch<T>(f: impl FnOnce() -> T) -> Result<T, String> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).map_err(|payload| {
        let msg = payload.downcast_ref::<&str>().map(|s| s.to_string()).or_else(|| payload.downcast_ref::<String>().cloned());
        format!("panicked: {}", msg.unwrap_or_else(|| "(no message)".into()))
    })
}

pub(crate) fn settle(result: &mut CheckResult, verdict: Verdict, selection: &Selection) {
    let xfail = selection.expects_failure(&result.name);
    (result.status, result.message) = match verdict {
        Verdict::Pass { excused, max_abs_err } => {
            result.excused = excused;
            result.max_abs_err = max_abs_err;
            let note = if excused > 0 { format!("{excused} row(s) excused within the margin epsilon") } else { String::new() };
            if xfail { (Status::XPass, format!("listed as xfail but passed; remove it from the list. {note}")) } else { (Status::Pass, note) }
        }
        Verdict::Fail(msg) if xfail => (Status::XFail, msg),
        Verdict::Fail(msg) => (Status::Fail, msg),
        Verdict::NotSupported(msg) => (Status::NotSupported, msg),
    };
}

pub(crate) fn repro(backend: &str, seed: u64, name: &str) -> String {
    format!("specdec conform --backend {backend} --seed {seed} --filter '{name}'")
}
