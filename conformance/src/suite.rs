//! The conformance suite: which checks exist, which a vendor runs, and what
//! each one's status is (SUITE-1 .. SUITE-4).

use std::time::Instant;

use specdec_backend::{Backend, Op};

use crate::case::{Case, CaseError, Loaded, parse};
use crate::compare::{Verdict, judge_measured, reference_margins};
use crate::execute::execute;
use crate::ops::case_op;
use crate::{diff, stat};

pub use crate::check::{CheckResult, DEFAULT_SEED, Kind, Selection, Status, SuiteConfig, catch, glob, seed_from_env};
use crate::check::{repro, settle};
use crate::fixtures::GOLDEN_FILES;
use crate::section::Section;

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
            family: None,
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
    stat::settle_family(&mut results, stats, "kernel", &cfg.selection, progress);
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

/// The kernel checks (golden, blessed, differential, large-vocabulary,
/// unchecked, exact-law and statistical) as a section.
pub struct KernelSection {
    items: Vec<Item>,
}

impl KernelSection {
    /// Every kernel check of a run configured by `cfg`.
    pub fn new(cfg: &SuiteConfig) -> Self {
        KernelSection { items: all_items(cfg) }
    }

    /// Given checks, such as the cases of one file (`specdec check`).
    pub fn from_items(items: Vec<Item>) -> Self {
        KernelSection { items }
    }
}

impl<B: Backend> Section<B> for KernelSection {
    fn names(&self) -> Vec<String> {
        self.items.iter().map(|i| i.name.clone()).collect()
    }

    fn run(&self, backend: &B, cfg: &SuiteConfig, progress: &mut dyn FnMut(&CheckResult)) -> Vec<CheckResult> {
        run(backend, &self.items, cfg, progress)
    }
}
