//! Conformance reports a vendor can file: JSON (complete), Markdown
//! (readable, with per-op and per-rule coverage), JUnit XML (for CI systems).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::Duration;

use quick_junit::{NonSuccessKind, Report as JunitReport, TestCase, TestCaseStatus, TestSuite};
use serde::{Deserialize, Serialize};
use specdec_backend::{Backend, Precision};

use crate::check::{CheckResult, Kind, Shard, Status};

/// A whole run (or one shard of it: [`crate::shard`] merges them back).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Report {
    pub backend: String,
    pub device: String,
    pub precision: StatedPrecision,
    pub seed: u64,
    pub specdec_version: String,
    /// The version an engine under test states (ENGINE-1); none for a backend.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub engine_version: Option<String>,
    /// The shard this report holds; none for a whole run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shard: Option<Shard>,
    pub summary: Summary,
    pub results: Vec<CheckResult>,
}

/// A backend's [`Precision`] as a report states it (and reads it back).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StatedPrecision {
    pub float_dtype: String,
    pub accumulate_dtype: String,
    pub margin_epsilon: f64,
    pub value_tolerance: f64,
}

impl From<Precision> for StatedPrecision {
    fn from(p: Precision) -> Self {
        StatedPrecision { float_dtype: p.float_dtype.into(), accumulate_dtype: p.accumulate_dtype.into(), margin_epsilon: p.margin_epsilon, value_tolerance: p.value_tolerance }
    }
}

/// Counts by status, and the numeric differences seen.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Summary {
    pub counts: BTreeMap<Status, usize>,
    /// Rows excused within the margin epsilon, over all checks.
    pub excused_rows: usize,
    /// Largest absolute difference of a float output from the reference.
    pub max_abs_err: f64,
    pub failed: bool,
}

impl Summary {
    /// The summary of `results`.
    pub fn of(results: &[CheckResult]) -> Summary {
        let mut summary = Summary::default();
        for r in results {
            *summary.counts.entry(r.status).or_default() += 1;
            summary.excused_rows += r.excused;
            summary.max_abs_err = summary.max_abs_err.max(r.max_abs_err);
            summary.failed |= r.status.is_failure();
        }
        summary
    }
}

impl Report {
    pub fn new<B: Backend>(backend: &B, seed: u64, results: Vec<CheckResult>) -> Report {
        Report::of(backend.name(), backend.device(), backend.precision(), seed, results)
    }

    /// The report of an engine under test (ENGINE-1): its name and
    /// version, and its greedy epsilon as the margin epsilon.
    pub fn for_engine(name: &str, version: &str, greedy_epsilon: f64, seed: u64, results: Vec<CheckResult>) -> Report {
        let precision = Precision { float_dtype: "engine", accumulate_dtype: "engine", margin_epsilon: greedy_epsilon, value_tolerance: 0.0 };
        Report { engine_version: Some(version.to_string()), ..Report::of(name.to_string(), "engine".into(), precision, seed, results) }
    }

    fn of(backend: String, device: String, precision: Precision, seed: u64, results: Vec<CheckResult>) -> Report {
        let summary = Summary::of(&results);
        Report { backend, device, precision: precision.into(), seed, specdec_version: env!("CARGO_PKG_VERSION").into(), engine_version: None, shard: None, summary, results }
    }

    pub fn count(&self, status: Status) -> usize {
        self.summary.counts.get(&status).copied().unwrap_or(0)
    }

    /// One line: `backend: N pass, N fail, ...`.
    pub fn summary_line(&self) -> String {
        let c = |s| self.count(s);
        format!(
            "{} ({}): {} pass, {} fail, {} xfail, {} xpass, {} not supported, {} skipped; {} rows excused within epsilon {:e}; max abs err {:.3e}",
            self.backend,
            self.device,
            c(Status::Pass),
            c(Status::Fail),
            c(Status::XFail),
            c(Status::XPass),
            c(Status::NotSupported),
            c(Status::Skipped),
            self.summary.excused_rows,
            self.precision.margin_epsilon,
            self.summary.max_abs_err,
        )
    }

    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).expect("reports serialize")
    }

    /// Per-op coverage table, like the ONNX backend test report.
    pub fn coverage_by_op(&self) -> String {
        let mut rows: BTreeMap<&str, BTreeMap<Status, usize>> = BTreeMap::new();
        for r in &self.results {
            *rows.entry(r.op.as_str()).or_default().entry(r.status).or_default() += 1;
        }
        let statuses = [Status::Pass, Status::Fail, Status::XFail, Status::XPass, Status::NotSupported, Status::Skipped];
        let mut out = String::from("| op | pass | fail | xfail | xpass | not supported | skipped |\n|---|---|---|---|---|---|---|\n");
        for (op, counts) in rows {
            let _ = write!(out, "| `{op}` |");
            for s in statuses {
                let _ = write!(out, " {} |", counts.get(&s).copied().unwrap_or(0));
            }
            out.push('\n');
        }
        out
    }

    /// The spec rules named by checks that ran, and their outcome.
    pub fn coverage_by_rule(&self) -> String {
        let mut rules: BTreeMap<&str, (usize, usize)> = BTreeMap::new();
        for r in &self.results {
            if matches!(r.status, Status::Skipped | Status::NotSupported) {
                continue;
            }
            for rule in &r.rules {
                let e = rules.entry(rule.as_str()).or_default();
                e.0 += 1;
                if r.status.is_failure() || r.status == Status::XFail {
                    e.1 += 1;
                }
            }
        }
        let mut out = String::from("| rule | checks | failing |\n|---|---|---|\n");
        for (rule, (n, bad)) in rules {
            let _ = writeln!(out, "| {rule} | {n} | {bad} |");
        }
        out
    }

    pub fn to_markdown(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(out, "# specdec conformance report: `{}`\n", self.backend);
        let _ = writeln!(out, "- device: `{}`", self.device);
        let p = &self.precision;
        let _ = writeln!(out, "- precision: {} values, {} accumulation, margin epsilon {:e}, value tolerance {:e}", p.float_dtype, p.accumulate_dtype, p.margin_epsilon, p.value_tolerance);
        let _ = writeln!(out, "- seed: {} (rerun with `--seed {}`)", self.seed, self.seed);
        let _ = writeln!(out, "- specdec {}", self.specdec_version);
        let _ = writeln!(out, "- result: **{}**\n", if self.summary.failed { "FAIL" } else { "PASS" });
        let _ = writeln!(out, "{}\n", self.summary_line());
        let _ = writeln!(out, "## Coverage by operation\n\n{}", self.coverage_by_op());
        let problems: Vec<&CheckResult> = self.results.iter().filter(|r| r.status.is_failure() || r.status == Status::XFail).collect();
        if !problems.is_empty() {
            let _ = writeln!(out, "## Failures and expected failures\n");
            for r in problems {
                let _ = writeln!(out, "- **{:?}** `{}`: {}\n  - repro: `{}`", r.status, r.name, r.message, r.repro);
            }
            out.push('\n');
        }
        let stats: Vec<&CheckResult> = self.results.iter().filter(|r| r.kind == Kind::Statistical && r.statistics.is_some()).collect();
        if !stats.is_empty() {
            let _ = writeln!(out, "## Statistical checks (family-wise alpha {:e}, Holm)\n", crate::stat::FAMILY_ALPHA);
            let _ = writeln!(out, "| check | n | cells | statistic | df | p-value | Holm alpha | detectable TV | status |\n|---|---|---|---|---|---|---|---|---|");
            for r in stats {
                let s = r.statistics.as_ref().expect("filtered");
                let opt = |x: Option<f64>| x.map_or("-".into(), |v| format!("{v:.3e}"));
                let _ = writeln!(
                    out,
                    "| `{}` | {} | {} | {} | {} | {} | {} | {} | {:?} |",
                    r.name,
                    s.n,
                    s.cells,
                    opt(s.statistic),
                    s.df.map_or("-".into(), |d| d.to_string()),
                    opt(s.p_value),
                    opt(s.alpha),
                    opt(s.power.map(|p| p.detectable_delta)),
                    r.status
                );
            }
            out.push('\n');
        }
        // What a passing check says beside its verdict (an engine's acceptance counts).
        let noted: Vec<&CheckResult> = self.results.iter().filter(|r| r.status == Status::Pass && !r.message.is_empty()).collect();
        if !noted.is_empty() {
            let _ = writeln!(out, "## Notes on passing checks\n");
            for r in noted {
                let _ = writeln!(out, "- `{}`: {}", r.name, r.message);
            }
            out.push('\n');
        }
        let excused: Vec<&CheckResult> = self.results.iter().filter(|r| r.excused > 0).collect();
        if !excused.is_empty() {
            let _ = writeln!(out, "## Excused near-boundary rows\n");
            for r in excused {
                let _ = writeln!(out, "- `{}`: {} row(s)", r.name, r.excused);
            }
            out.push('\n');
        }
        let _ = writeln!(out, "## Coverage by spec rule\n\n{}", self.coverage_by_rule());
        out
    }

    pub fn to_junit(&self) -> String {
        let mut report = JunitReport::new(format!("specdec-conformance-{}", self.backend));
        let mut suites: BTreeMap<String, TestSuite> = BTreeMap::new();
        for r in &self.results {
            let suite_name = format!("{}.{}", self.backend, r.name.split('/').next().unwrap_or("checks"));
            let suite = suites.entry(suite_name.clone()).or_insert_with(|| TestSuite::new(suite_name));
            let status = match r.status {
                Status::Pass | Status::XFail => TestCaseStatus::success(),
                Status::Fail | Status::XPass => {
                    let mut s = TestCaseStatus::non_success(NonSuccessKind::Failure);
                    s.set_message(r.message.clone()).set_description(format!("repro: {}", r.repro));
                    s
                }
                Status::NotSupported | Status::Skipped => {
                    let mut s = TestCaseStatus::skipped();
                    s.set_message(format!("{:?}: {}", r.status, r.message));
                    s
                }
            };
            let mut case = TestCase::new(r.name.clone(), status);
            case.set_classname(r.op.clone()).set_time(Duration::from_secs_f64(r.millis / 1e3));
            if r.status == Status::Pass && !r.message.is_empty() {
                case.set_system_out(r.message.clone());
            }
            suite.add_test_case(case);
        }
        report.add_test_suites(suites.into_values());
        report.to_string().expect("junit serializes")
    }
}
