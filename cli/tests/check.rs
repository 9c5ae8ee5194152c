//! `specdec check FILE` as a vendor runs it (CASE-8, CASE-9, CASE-11): a
//! failing case, backend or host op, fails the exit status; each failure
//! prints a command rerunning that case from that file.

use std::path::PathBuf;
use std::process::{Command, Output};

fn specdec(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_specdec")).args(args).output().expect("the specdec binary runs")
}

fn write(name: &str, cases: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("specdec-check-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(name);
    std::fs::write(&path, format!(r#"{{"format": "specdec-cases/1", "title": "t", "cases": [{cases}]}}"#)).unwrap();
    path
}

const PASSING: &str = r#"{"id": "good", "op": "draw", "expected_by": "hand", "inputs": {"weights": [[0.5, 0.5]], "draw_uniforms": [0.75]}, "expect": {"tokens": [1]}}"#;
const FAILING: &str = r#"{"id": "bad", "op": "draw", "expected_by": "hand", "inputs": {"weights": [[0.5, 0.5]], "draw_uniforms": [0.1]}, "expect": {"tokens": [1]}}"#;
const HOST_FAILING: &str = r#"{"id": "host-bad", "op": "rollback_amounts", "expected_by": "hand", "params": {"proposal_lens": [2], "num_accepted": [1]}, "inputs": {}, "expect": {"trim": [5]}}"#;
const HOST_PASSING: &str = r#"{"id": "host-good", "op": "rollback_amounts", "expected_by": "hand", "params": {"proposal_lens": [2], "num_accepted": [1]}, "inputs": {}, "expect": {"trim": [1]}}"#;

fn text(out: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
}

/// CASE-11: any failing case fails the run; the summary counts every case run, host ops included.
#[test]
fn a_failure_fails_the_exit_status() {
    let path = write("mixed.json", &format!("{PASSING}, {FAILING}, {HOST_PASSING}"));
    for backend in ["reference", "ndarray"] {
        let out = specdec(&["check", path.to_str().unwrap(), "--backend", backend]);
        let t = text(&out);
        assert!(!out.status.success(), "CASE-11: a failing case fails the exit status: {t}");
        assert!(t.contains("2 pass, 1 fail"), "CASE-11: the summary counts every case, the host case too: {t}");
        assert!(t.contains("file/mixed/bad") && !t.contains("golden/"), "CASE-11: external checks are named file/<stem>/<id>: {t}");
    }
    let path = write("host.json", &format!("{PASSING}, {HOST_FAILING}"));
    let out = specdec(&["check", path.to_str().unwrap()]);
    assert!(!out.status.success(), "CASE-11: a failing host case fails the run: {}", text(&out));
    assert!(text(&out).contains("1 pass, 1 fail"), "CASE-11: {}", text(&out));
    let path = write("clean.json", &format!("{PASSING}, {HOST_PASSING}"));
    let out = specdec(&["check", path.to_str().unwrap()]);
    assert!(out.status.success(), "CASE-11: a file whose cases all pass passes: {}", text(&out));
}

/// CASE-9, CASE-11: a malformed case (`expect: {}`) fails the run, naming the case and field.
#[test]
fn a_malformed_case_fails() {
    let path = write("empty.json", r#"{"id": "nothing", "op": "draw", "expected_by": "hand", "inputs": {"weights": [[0.5, 0.5]], "draw_uniforms": [0.75]}, "expect": {}}"#);
    let out = specdec(&["check", path.to_str().unwrap()]);
    let t = text(&out);
    assert!(!out.status.success(), "CASE-11: a malformed case fails the run: {t}");
    assert!(t.contains("nothing") && t.contains("expect.tokens"), "CASE-9: the error names the case and the field: {t}");
}

/// CASE-11: the printed repro reruns exactly the failing case from that file.
#[test]
fn the_repro_reruns_the_case() {
    let path = write("repro.json", &format!("{PASSING}, {FAILING}, {HOST_FAILING}"));
    let out = specdec(&["check", path.to_str().unwrap(), "--backend", "ndarray"]);
    let t = text(&out);
    let want = format!("specdec check {} --backend ndarray --case bad", path.display());
    assert!(t.contains(&want), "CASE-11: each failure prints `specdec check FILE --backend B --case ID`: {t}");
    assert!(t.contains("--case host-bad"), "CASE-11: a failing host case too: {t}");
    let again = specdec(&["check", path.to_str().unwrap(), "--backend", "ndarray", "--case", "bad"]);
    let t = text(&again);
    assert!(!again.status.success() && t.contains("0 pass, 1 fail") && t.contains("file/repro/bad"), "CASE-11: the repro reruns that case alone: {t}");
    let good = specdec(&["check", path.to_str().unwrap(), "--case", "good"]);
    assert!(good.status.success() && text(&good).contains("1 pass, 0 fail"), "{}", text(&good));
    let missing = specdec(&["check", path.to_str().unwrap(), "--case", "nope"]);
    assert!(!missing.status.success() && text(&missing).contains("no case with id `nope`"), "{}", text(&missing));
}

/// SUITE-4: `specdec conform` runs the suite and writes the JSON, Markdown
/// and JUnit reports, with a repro command for every failure (here a stale
/// xfail: a check listed as failing that passes, an XPass).
#[test]
fn conform_writes_the_reports_with_a_repro_for_every_failure() {
    let dir = std::env::temp_dir().join(format!("specdec-conform-reports-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let selection = dir.join("selection.toml");
    std::fs::write(&selection, "xfail = [\"golden/draw/exp-race\"]\n").unwrap();
    let reports = dir.join("reports");
    let args = ["conform", "--backend", "reference", "--filter", "golden/draw/", "--no-stat", "--diff-cases", "0", "--seed", "5"];
    let out = specdec(&[&args[..], &["--xfails", selection.to_str().unwrap(), "--report", reports.to_str().unwrap()]].concat());
    let t = text(&out);
    assert!(!out.status.success(), "SUITE-4: the XPass fails the run: {t}");
    let repro = "specdec conform --backend reference --seed 5 --filter";
    assert!(t.contains(&format!("{repro} 'golden/draw/exp-race'")), "SUITE-4: the failure prints its repro: {t}");
    for file in ["reference.json", "reference.md", "reference.junit.xml"] {
        let report = std::fs::read_to_string(reports.join(file)).unwrap_or_else(|e| panic!("SUITE-4: no {file}: {e}"));
        assert!(report.contains("golden/draw/exp-race") && report.contains(repro), "SUITE-4: {file} holds the failure and its repro:\n{report}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// A conformance run ends by naming the backends that ran and how many
/// checks each executed, and the backends that did not run.
#[test]
fn conform_says_which_backends_ran_and_how_much() {
    let out = specdec(&["conform", "--backend", "all", "--filter", "golden/draw/", "--no-stat"]);
    let t = text(&out);
    assert!(out.status.success(), "{t}");
    let tail = &t[t.find("backends that ran:").expect("the closing summary")..];
    for backend in ["reference", "ndarray", "candle-cpu"] {
        let line = tail.lines().find(|l| l.trim_start().starts_with(&format!("{backend}:"))).unwrap_or_else(|| panic!("{backend} is not listed: {tail}"));
        let executed: usize = line.split(": ").nth(1).and_then(|s| s.split(' ').next()).and_then(|n| n.parse().ok()).expect("a count");
        assert!(executed > 0 && line.contains("not selected"), "{line}");
    }
    // Without the cuda feature candle-cuda cannot run, and the summary says so.
    assert!(tail.contains("backends that did not run:") && tail.contains("candle-cuda"), "{tail}");
}
