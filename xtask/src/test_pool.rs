//! `cargo xtask test`'s runner: every test binary of one `cargo test --no-run` build, run by
//! as many workers as the machine has cores, the longest first, then the doc tests.
//!
//! Why: `cargo test` runs its binaries one after another, and the suite's longest ones
//! (each backend's conformance suite, whose checks run in order because a backend may keep
//! global generator state) use about one core each, so on CI's two cores half the machine
//! idled through most of the run. Measured here (2026-12-06, two cores): the binaries' times
//! sum to 2464 s, and two at once run them in 1247 s.
//!
//! Invariants: the jobs are what `cargo test --workspace` runs: every artifact of the build
//! whose profile is `test` (each crate's unit tests, each integration test, each
//! `harness = false` suite; [`test_binaries`]) and the doc tests, each run as cargo runs it
//! (in its package's directory, with `CARGO_MANIFEST_DIR`, the arguments after `--`), its
//! compute pools held to one thread ([`POOL_THREADS`]) so that jobs side by side never
//! oversubscribe the cores. A
//! job's output is printed whole when it ends, never interleaved with another's. The run
//! fails if any job fails, names every failed job at the end, and ends with one line summing
//! every `test result:` line ([`Tally`]). After five minutes with no job started or ended,
//! a line names the jobs running and their time, so a job that hangs is named before CI's
//! limit cuts the log.

use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::Value;

/// The longest test binaries, longest first, as measured on a clean clone (2026-12-06, two
/// cores, two at once, one compute thread each: 484 s for the candle suite down to 60 s for
/// the NumPy one): started first, they end beside the many short ones rather than after
/// them. A binary not named here starts after these, in the build's order.
pub const LONGEST: [&str; 13] = [
    "specdec-candle/conformance",
    "specdec-ndarray/conformance",
    "specdec-tch/conformance",
    "specdec-cli/serve",
    "specdec-ndarray/conformance_q8_0",
    "specdec-ndarray/conformance_f32",
    "specdec-conformance/conformance",
    "specdec-conformance/engine_section",
    "specdec-ndarray/fault_list",
    "specdec-conformance/e2e_section",
    "specdec-cli/engine",
    "specdec-cli/generate",
    "specdec-exec/numpy_suite",
];

/// The environment variable naming a folder made fresh for the run, where its suites share
/// what they would each compute alike (`specdec_conformance::run_share`, which reads it).
pub const RUN_DIR_ENV: &str = "SPECDEC_RUN_DIR";

/// The environment variables that size a job's compute pools: rayon's (the ndarray and candle
/// ports') and libtorch's OpenMP pool.
pub const POOL_THREADS: [&str; 2] = ["RAYON_NUM_THREADS", "OMP_NUM_THREADS"];

/// One test binary of the build.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TestBinary {
    /// `package/target` for an integration test or suite, `package (lib)` for a library's
    /// unit tests, `package (bin NAME)` for a binary's.
    pub label: String,
    pub executable: PathBuf,
    /// The package's directory, where cargo runs its tests.
    pub dir: PathBuf,
}

/// The test binaries that `cargo test --no-run --message-format=json` reported building (its
/// standard output, one JSON message a line; other lines are ignored).
pub fn test_binaries(messages: &str) -> Result<Vec<TestBinary>, String> {
    let mut out: Vec<TestBinary> = Vec::new();
    for line in messages.lines().filter(|l| l.starts_with('{')) {
        let v: Value = serde_json::from_str(line).map_err(|e| format!("a message of cargo's is not JSON ({e}): {line}"))?;
        if v["reason"] != "compiler-artifact" || v["profile"]["test"] != true {
            continue;
        }
        let Some(executable) = v["executable"].as_str() else { continue };
        let field = |name: &str, value: &Value| value.as_str().map(str::to_string).ok_or_else(|| format!("a test artifact without `{name}`: {line}"));
        let manifest = field("manifest_path", &v["manifest_path"])?;
        let dir = Path::new(&manifest).parent().ok_or_else(|| format!("manifest path {manifest} has no folder"))?.to_path_buf();
        let package = package_name(&field("package_id", &v["package_id"])?);
        let target = field("target.name", &v["target"]["name"])?;
        let kind = field("target.kind", &v["target"]["kind"][0])?;
        let label = match kind.as_str() {
            "lib" | "rlib" | "dylib" | "cdylib" | "staticlib" | "proc-macro" => format!("{package} (lib)"),
            "bin" => format!("{package} (bin {target})"),
            _ => format!("{package}/{target}"),
        };
        if !out.iter().any(|b| b.executable.as_os_str() == executable) {
            out.push(TestBinary { label, executable: PathBuf::from(executable), dir });
        }
    }
    if out.is_empty() {
        return Err("cargo's build named no test binary".into());
    }
    Ok(out)
}

/// A package's name from its id: `path+file:///r/backends/candle#specdec-candle@0.1.0`, or
/// `path+file:///r/xtask#0.1.0` where the name is the folder's, or the older
/// `specdec-candle 0.1.0 (path+file:///r/backends/candle)`.
fn package_name(id: &str) -> String {
    if let Some((url, fragment)) = id.split_once('#') {
        return match fragment.split_once('@') {
            Some((name, _version)) => name.to_string(),
            None => url.rsplit('/').next().unwrap_or(url).to_string(),
        };
    }
    id.split(' ').next().unwrap_or(id).to_string()
}

/// `binaries` with those of [`LONGEST`] first, in its order, the rest after them as built.
pub fn longest_first(mut binaries: Vec<TestBinary>) -> Vec<TestBinary> {
    binaries.sort_by_key(|b| LONGEST.iter().position(|l| *l == b.label).unwrap_or(LONGEST.len()));
    binaries
}

/// One command of the run.
pub struct Job {
    pub label: String,
    pub command: Command,
}

/// A job that ended.
#[derive(Debug, Clone)]
pub struct Finished {
    pub label: String,
    pub seconds: f64,
    /// Its exit status said success.
    pub success: bool,
    /// Its standard output and error, as written.
    pub output: String,
}

enum Event {
    Started(String),
    Done(Finished),
}

/// Runs `jobs` in their order on `workers` threads, each job's output into its own file under
/// `log_dir`; `report` gets each job as it starts and ends and, every `heartbeat`, the jobs
/// running and their seconds. Returns every job's end, in the order they ended.
pub fn run_pool(jobs: Vec<Job>, workers: usize, log_dir: &Path, heartbeat: Duration, report: &mut dyn FnMut(PoolEvent<'_>)) -> Result<Vec<Finished>, String> {
    std::fs::create_dir_all(log_dir).map_err(|e| format!("cannot create {}: {e}", log_dir.display()))?;
    let total = jobs.len();
    let queue = Arc::new(Mutex::new(jobs.into_iter().enumerate().collect::<VecDeque<_>>()));
    let (tx, rx) = mpsc::channel::<Event>();
    let threads: Vec<_> = (0..workers.max(1))
        .map(|_| {
            let (queue, tx, log_dir) = (Arc::clone(&queue), tx.clone(), log_dir.to_path_buf());
            std::thread::spawn(move || {
                loop {
                    let Some((index, mut job)) = queue.lock().expect("no worker panics holding the queue").pop_front() else { return };
                    let _ = tx.send(Event::Started(job.label.clone()));
                    let start = Instant::now();
                    let log = log_dir.join(format!("{index:03}.log"));
                    let (success, output) = match run_logged(&mut job.command, &log) {
                        Ok((success, output)) => (success, output),
                        Err(e) => (false, e),
                    };
                    let _ = tx.send(Event::Done(Finished { label: job.label, seconds: start.elapsed().as_secs_f64(), success, output }));
                }
            })
        })
        .collect();
    drop(tx);
    let mut running: Vec<(String, Instant)> = Vec::new();
    let mut finished = Vec::with_capacity(total);
    loop {
        match rx.recv_timeout(heartbeat) {
            Ok(Event::Started(label)) => {
                report(PoolEvent::Started { label: &label, done: finished.len(), total });
                running.push((label, Instant::now()));
            }
            Ok(Event::Done(f)) => {
                running.retain(|(l, _)| *l != f.label);
                finished.push(f);
                report(PoolEvent::Done { job: finished.last().expect("just pushed"), done: finished.len(), total });
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {
                let now: Vec<(&str, f64)> = running.iter().map(|(l, t)| (l.as_str(), t.elapsed().as_secs_f64())).collect();
                report(PoolEvent::Running(&now));
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => break,
        }
    }
    for t in threads {
        t.join().map_err(|_| "a test worker panicked".to_string())?;
    }
    Ok(finished)
}

/// What [`run_pool`] reports as it goes.
pub enum PoolEvent<'a> {
    Started {
        label: &'a str,
        done: usize,
        total: usize,
    },
    Done {
        job: &'a Finished,
        done: usize,
        total: usize,
    },
    /// The jobs running, with their seconds so far.
    Running(&'a [(&'a str, f64)]),
}

/// Runs `cmd` with its standard output and error both into `log`, then reads `log` back.
fn run_logged(cmd: &mut Command, log: &Path) -> Result<(bool, String), String> {
    let file = std::fs::File::create(log).map_err(|e| format!("cannot create {}: {e}", log.display()))?;
    let err = file.try_clone().map_err(|e| format!("cannot reopen {}: {e}", log.display()))?;
    let status = cmd.stdout(file).stderr(err).status().map_err(|e| format!("cannot run {cmd:?}: {e}"))?;
    let bytes = std::fs::read(log).map_err(|e| format!("cannot read {}: {e}", log.display()))?;
    Ok((status.success(), String::from_utf8_lossy(&bytes).into_owned()))
}

/// The sum of `cargo test`'s `test result:` lines.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Tally {
    pub passed: u64,
    pub failed: u64,
    pub ignored: u64,
    /// Result lines that said FAILED.
    pub failed_results: u64,
}

impl Tally {
    /// Adds one line of output if it is a `test result:` line (libtest's and libtest-mimic's:
    /// `test result: ok. 943 passed; 0 failed; 48 ignored; 0 measured; 0 filtered out; ...`).
    pub fn add_line(&mut self, line: &str) {
        let Some(rest) = line.trim_start().strip_prefix("test result: ") else { return };
        let Some((verdict, counts)) = rest.split_once(". ") else { return };
        let count = |name: &str| counts.split(';').find_map(|part| part.trim().strip_suffix(name)?.trim().parse::<u64>().ok()).unwrap_or(0);
        self.passed += count(" passed");
        self.failed += count(" failed");
        self.ignored += count(" ignored");
        if verdict != "ok" {
            self.failed_results += 1;
        }
    }

    /// Adds every line of `text`.
    pub fn add_text(&mut self, text: &str) {
        text.lines().for_each(|l| self.add_line(l));
    }

    /// The plain closing line: `tests: N passed, N failed, N skipped`.
    pub fn closing_line(&self) -> String {
        format!("tests: {} passed, {} failed, {} skipped", self.passed, self.failed, self.ignored)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn result_lines_are_summed_and_other_lines_ignored() {
        let mut t = Tally::default();
        t.add_text(
            "running 3 tests\n\
             test a ... ok\n\
             test result: ok. 943 passed; 0 failed; 48 ignored; 0 measured; 0 filtered out; finished in 0.38s\n\
             test result: FAILED. 2 passed; 1 failed; 0 ignored; 0 measured; 0 filtered out; finished in 1.00s\n\
             test result: ok. 0 passed; 0 failed; 0 ignored; 0 measured; 0 filtered out; finished in 0.00s\n\
             test result passed\n",
        );
        assert_eq!(t, Tally { passed: 945, failed: 1, ignored: 48, failed_results: 1 });
        assert_eq!(t.closing_line(), "tests: 945 passed, 1 failed, 48 skipped");
    }

    /// Messages as cargo 1.95 writes them (shortened): a library's unit tests, a binary's, an
    /// integration test, a `harness = false` suite, a fresh artifact reported twice, and the
    /// artifacts that are not tests (a dependency, a build script, an example).
    const MESSAGES: &str = r#"{"reason":"compiler-artifact","package_id":"registry+https://github.com/rust-lang/crates.io-index#serde@1.0.228","manifest_path":"/c/serde/Cargo.toml","target":{"kind":["lib"],"name":"serde"},"profile":{"test":false},"executable":null,"fresh":true}
{"reason":"compiler-artifact","package_id":"path+file:///r/backends/candle#specdec-candle@0.1.0","manifest_path":"/r/backends/candle/Cargo.toml","target":{"kind":["lib"],"name":"specdec_candle"},"profile":{"test":true},"executable":"/r/target/debug/deps/specdec_candle-1","fresh":false}
{"reason":"compiler-artifact","package_id":"path+file:///r/backends/candle#specdec-candle@0.1.0","manifest_path":"/r/backends/candle/Cargo.toml","target":{"kind":["test"],"name":"conformance"},"profile":{"test":true},"executable":"/r/target/debug/deps/conformance-2","fresh":false}
{"reason":"compiler-artifact","package_id":"path+file:///r/cli#specdec-cli@0.1.0","manifest_path":"/r/cli/Cargo.toml","target":{"kind":["bin"],"name":"specdec"},"profile":{"test":true},"executable":"/r/target/debug/deps/specdec-3","fresh":false}
{"reason":"compiler-artifact","package_id":"path+file:///r/cli#specdec-cli@0.1.0","manifest_path":"/r/cli/Cargo.toml","target":{"kind":["bin"],"name":"specdec"},"profile":{"test":false},"executable":"/r/target/debug/specdec","fresh":false}
{"reason":"build-script-executed","package_id":"path+file:///r/conformance#specdec-conformance@0.1.0"}
{"reason":"compiler-artifact","package_id":"path+file:///r/xtask#0.1.0","manifest_path":"/r/xtask/Cargo.toml","target":{"kind":["test"],"name":"module_circles"},"profile":{"test":true},"executable":"/r/target/debug/deps/module_circles-4","fresh":true}
{"reason":"compiler-artifact","package_id":"path+file:///r/xtask#0.1.0","manifest_path":"/r/xtask/Cargo.toml","target":{"kind":["test"],"name":"module_circles"},"profile":{"test":true},"executable":"/r/target/debug/deps/module_circles-4","fresh":true}
{"reason":"compiler-artifact","package_id":"path+file:///r/benches#specdec-benches@0.1.0","manifest_path":"/r/benches/Cargo.toml","target":{"kind":["example"],"name":"probe"},"profile":{"test":false},"executable":"/r/target/debug/examples/probe","fresh":true}
{"reason":"build-finished","success":true}"#;

    #[test]
    fn every_test_artifact_once_and_nothing_else() {
        let bins = test_binaries(&format!("   Compiling specdec-candle\n{MESSAGES}")).unwrap();
        let labels: Vec<&str> = bins.iter().map(|b| b.label.as_str()).collect();
        assert_eq!(labels, ["specdec-candle (lib)", "specdec-candle/conformance", "specdec-cli (bin specdec)", "xtask/module_circles"]);
        assert_eq!(bins[1].executable, Path::new("/r/target/debug/deps/conformance-2"));
        assert_eq!(bins[1].dir, Path::new("/r/backends/candle"));
        assert_eq!(package_name("specdec-candle 0.1.0 (path+file:///r/backends/candle)"), "specdec-candle");
    }

    #[test]
    fn a_build_without_tests_or_a_broken_message_is_an_error() {
        assert!(test_binaries("").unwrap_err().contains("no test binary"));
        assert!(test_binaries(r#"{"reason":"build-finished","success":true}"#).is_err());
        assert!(test_binaries("{not json").unwrap_err().contains("not JSON"));
        let no_manifest = r#"{"reason":"compiler-artifact","package_id":"p#a@1","target":{"kind":["test"],"name":"t"},"profile":{"test":true},"executable":"/x"}"#;
        assert!(test_binaries(no_manifest).unwrap_err().contains("manifest_path"));
    }

    #[test]
    fn the_longest_start_first_in_their_order() {
        let bin = |label: &str| TestBinary { label: label.into(), executable: PathBuf::from(label), dir: PathBuf::new() };
        let ordered = longest_first(vec![bin("a (lib)"), bin(LONGEST[2]), bin("b/t"), bin(LONGEST[0])]);
        let labels: Vec<&str> = ordered.iter().map(|b| b.label.as_str()).collect();
        assert_eq!(labels, [LONGEST[0], LONGEST[2], "a (lib)", "b/t"]);
    }

    /// Every name of [`LONGEST`] is a test target of a workspace package, so none is silently
    /// a typo (a typo would start that binary among the short ones, late).
    #[test]
    fn every_longest_label_is_a_test_target() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
        let read = |path: &Path| -> toml::Value { toml::from_str(&std::fs::read_to_string(path).unwrap()).unwrap() };
        let workspace = read(&root.join("Cargo.toml"));
        let members: Vec<PathBuf> = workspace["workspace"]["members"].as_array().unwrap().iter().map(|m| root.join(m.as_str().unwrap())).collect();
        for label in LONGEST {
            let (package, target) = label.split_once('/').unwrap();
            let dir = members.iter().find(|d| read(&d.join("Cargo.toml"))["package"]["name"].as_str() == Some(package));
            let dir = dir.unwrap_or_else(|| panic!("{label}: no workspace package {package}"));
            assert!(dir.join("tests").join(format!("{target}.rs")).is_file(), "{label}: no tests/{target}.rs in {}", dir.display());
        }
    }

    /// The suites read the run folder under the name this runner sets.
    #[test]
    fn the_run_folder_is_named_as_the_suites_read_it() {
        let reader = include_str!("../../conformance/src/run_share.rs");
        assert!(reader.contains(&format!("pub const RUN_DIR_ENV: &str = \"{RUN_DIR_ENV}\";")), "conformance/src/run_share.rs reads another variable");
    }

    #[test]
    fn the_pool_runs_every_job_and_keeps_each_output_whole() {
        let dir = std::env::temp_dir().join(format!("specdec-test-pool-{}", std::process::id()));
        let job = |label: &str, script: &str| {
            let mut command = Command::new("sh");
            command.args(["-c", script]);
            Job { label: label.into(), command }
        };
        let jobs = vec![
            job("slow", "echo one; sleep 0.3; echo two >&2; echo 'test result: ok. 2 passed; 0 failed; 1 ignored;'"),
            job("fails", "echo 'test result: FAILED. 0 passed; 1 failed; 0 ignored;'; exit 101"),
            job("quick", "echo quick"),
        ];
        let (mut started, mut ended) = (Vec::new(), Vec::new());
        let finished = run_pool(jobs, 2, &dir, Duration::from_secs(60), &mut |e| match e {
            PoolEvent::Started { label, .. } => started.push(label.to_string()),
            PoolEvent::Done { job, done, total } => ended.push((job.label.clone(), done, total)),
            PoolEvent::Running(_) => {}
        })
        .unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        assert_eq!(finished.len(), 3);
        assert_eq!(started.len(), 3);
        assert_eq!(ended.iter().map(|(_, d, t)| (*d, *t)).collect::<Vec<_>>(), [(1, 3), (2, 3), (3, 3)]);
        let slow = finished.iter().find(|f| f.label == "slow").unwrap();
        assert!(slow.success && slow.output.contains("one\ntwo\n"), "{slow:?}");
        assert!(!finished.iter().find(|f| f.label == "fails").unwrap().success);
        // Two workers: the quick job does not wait for the slow one.
        assert_eq!(finished.last().unwrap().label, "slow");
        let mut tally = Tally::default();
        finished.iter().for_each(|f| tally.add_text(&f.output));
        assert_eq!(tally, Tally { passed: 2, failed: 1, ignored: 1, failed_results: 1 });
    }

    #[test]
    fn a_command_that_cannot_start_is_a_failed_job_naming_it() {
        let dir = std::env::temp_dir().join(format!("specdec-test-pool-missing-{}", std::process::id()));
        let jobs = vec![Job { label: "missing".into(), command: Command::new("/no/such/test-binary") }];
        let finished = run_pool(jobs, 1, &dir, Duration::from_secs(60), &mut |_| {}).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        assert!(!finished[0].success);
        assert!(finished[0].output.contains("/no/such/test-binary"), "{}", finished[0].output);
    }
}
