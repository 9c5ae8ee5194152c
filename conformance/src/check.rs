//! What a check is, before any section runs it: its kind and status
//! (SUITE-2), a vendor's selection (SUITE-1), a run's configuration (its
//! shard among them, SUITE-5), the result of one check, and how a verdict
//! settles into a status. Every
//! section (`suite`, `model_section`, `e2e_section`) and the reports read
//! these; nothing here runs a backend.

use serde::{Deserialize, Serialize};

use crate::compare::Verdict;

/// How many differential cases each op gets by default.
pub const DEFAULT_CASES_PER_OP: usize = 48;

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
    /// A worked example of a reference-only algorithm (CASE-7), judged on the reference.
    Host,
    /// A whole engine through the generation-level contract (ENGINE-1 .. ENGINE-6).
    Engine,
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

    pub fn selects(&self, name: &str) -> bool {
        let included = self.include.is_empty() || self.include.iter().any(|p| glob(p, name));
        included && !self.exclude.iter().any(|p| glob(p, name))
    }

    pub fn expects_failure(&self, name: &str) -> bool {
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
    /// Run only this shard's checks (the others stay `Skipped`); the shards'
    /// reports are merged into the run's ([`crate::shard::merge`]).
    pub shard: Option<Shard>,
}

impl Default for SuiteConfig {
    fn default() -> Self {
        SuiteConfig { seed: DEFAULT_SEED, filter: None, selection: Selection::default(), diff_cases_per_op: DEFAULT_CASES_PER_OP, statistical: true, shard: None }
    }
}

impl SuiteConfig {
    pub fn wants(&self, name: &str) -> bool {
        let filtered = match &self.filter {
            None => true,
            Some(f) if f.contains('*') => glob(f, name),
            Some(f) => name.contains(f.as_str()),
        };
        filtered && self.selection.selects(name) && self.shard.is_none_or(|s| s.owns(name))
    }
}

/// The result of one check.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
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
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub statistics: Option<specdec_stats::TestReport>,
    /// The Holm family a statistical check was judged in (STAT-2), named
    /// within its report, so that a merge judges it again over all shards.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub family: Option<String>,
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
            family: None,
        }
    }
}

/// Runs `f`, turning a panic into an error message.
pub fn catch<T>(f: impl FnOnce() -> T) -> Result<T, String> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).map_err(|payload| {
        let msg = payload.downcast_ref::<&str>().map(|s| s.to_string()).or_else(|| payload.downcast_ref::<String>().cloned());
        format!("panicked: {}", msg.unwrap_or_else(|| "(no message)".into()))
    })
}

pub fn settle(result: &mut CheckResult, verdict: Verdict, selection: &Selection) {
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

pub fn repro(backend: &str, seed: u64, name: &str) -> String {
    format!("specdec conform --backend {backend} --seed {seed} --filter '{name}'")
}

/// Shard `index` of `count` (`index < count`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Shard {
    pub index: usize,
    pub count: usize,
}

impl std::str::FromStr for Shard {
    type Err = String;

    /// `I/N`, with `I` counted from 0 (a scheduler's 1-based index minus one).
    fn from_str(s: &str) -> Result<Shard, String> {
        let (i, n) = s.split_once('/').ok_or_else(|| format!("shard `{s}`: expected I/N (e.g. 0/4)"))?;
        let parse = |x: &str, what: &str| x.trim().parse::<usize>().map_err(|_| format!("shard `{s}`: {what} `{x}` is not a count"));
        let (index, count) = (parse(i, "index")?, parse(n, "shard count")?);
        if count == 0 || index >= count {
            return Err(format!("shard `{s}`: the index must be below the shard count (0 <= I < N, N >= 1)"));
        }
        Ok(Shard { index, count })
    }
}

impl std::fmt::Display for Shard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.index, self.count)
    }
}

impl Shard {
    /// Whether this shard owns the check `name`: FNV-1a of the name modulo
    /// the count, so the partition depends on the name alone.
    pub fn owns(&self, name: &str) -> bool {
        Shard::owner(name, self.count) == *self
    }

    /// The shard of `count` that owns the check `name`.
    pub fn owner(name: &str, count: usize) -> Shard {
        let h = name.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3));
        Shard { index: (h % count as u64) as usize, count }
    }

    /// Whether this shard owns item `i` of a numbered campaign (seeds, corpus
    /// entries): every `count`-th from `index`.
    pub fn owns_index(&self, i: u64) -> bool {
        i % self.count as u64 == self.index as u64
    }
}
