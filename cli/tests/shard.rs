//! Sharded campaigns as a user runs them (SUITE-5): `specdec conform --shard I/N` and
//! `specdec stats --sweep N --shard I/N` in N processes, started by the local
//! stand-in of a scheduler (`recipes/sharded/local.sh`, with Slurm's,
//! Kubernetes' and a CI matrix's index variable), merged by `specdec report
//! merge` into the unsharded run's report, timings aside. The shards' own Holm
//! verdicts differ from the merged ones (so a merge that kept them would fail
//! the comparison), and a missing, duplicated or foreign shard is an error
//! naming it.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;

const SPECDEC: &str = env!("CARGO_BIN_EXE_specdec");

/// The checks of the sharded run: the kernel section's statistical family
/// (one Holm family across every shard), golden draw cases, and one
/// statistical check listed as an expected failure that passes (an XPass,
/// which the merge must keep).
const SELECTION: &str = r#"
include = ["stat/*", "golden/draw/*"]
xfail = ["stat/overlap/inverse-cdf/first-token"]
"#;

fn dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("specdec-shard-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn text(out: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
}

fn specdec(args: &[&str]) -> Output {
    Command::new(SPECDEC).args(args).output().expect("specdec runs")
}

fn json(path: &Path) -> Value {
    serde_json::from_str(&std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))).unwrap()
}

/// A report with every timing set to zero.
fn untimed(mut v: Value) -> Value {
    for r in v["results"].as_array_mut().expect("results") {
        r["millis"] = Value::from(0.0);
    }
    v
}

fn recipe(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../recipes/sharded").join(name)
}

#[test]
fn shards_of_a_conformance_run_merge_into_the_unsharded_report() {
    let base = dir("conform");
    let selection = base.join("selection.toml");
    std::fs::write(&selection, SELECTION).unwrap();
    let sel = selection.to_str().unwrap();
    let whole = base.join("whole");
    let out = specdec(&["conform", "--backend", "reference", "--xfails", sel, "--report", whole.to_str().unwrap()]);
    assert!(!out.status.success(), "the listed xfail passes, an XPass fails the run: {}", text(&out));
    let whole = json(&whole.join("reference.json"));
    let stats = whole["results"].as_array().unwrap().iter().filter(|r| r["statistics"].is_object()).count();
    assert!(stats >= 10, "the run holds the statistical family: {stats} checks");
    for (scheduler, shards) in [("slurm", 3), ("kubernetes", 2), ("matrix", 4)] {
        let campaign = base.join(scheduler);
        let out = Command::new(recipe("local.sh"))
            .env("SPECDEC", SPECDEC)
            .args([scheduler, &shards.to_string(), campaign.to_str().unwrap(), "conform", "--backend", "reference", "--xfails", sel])
            .output()
            .unwrap();
        assert!(!out.status.success(), "{scheduler}: the merged run fails as the whole one does: {}", text(&out));
        let merged = json(&campaign.join("merged/reference.json"));
        assert_eq!(untimed(merged), untimed(whole.clone()), "SUITE-5: {scheduler}: {shards} shards merge into the unsharded report");
        // A shard judged its members of the family among themselves only: some
        // per-shard alpha differs from the whole run's, so a merge that kept the
        // shards' verdicts would not equal it.
        let mut differs = 0;
        for i in 0..shards {
            let shard = json(&campaign.join(format!("shard-{i}/reference.json")));
            assert_eq!(shard["shard"]["index"], i, "{scheduler}: shard {i} says which it is");
            for (s, w) in shard["results"].as_array().unwrap().iter().zip(whole["results"].as_array().unwrap()) {
                if s["statistics"].is_object() {
                    differs += usize::from(s["statistics"]["alpha"] != w["statistics"]["alpha"]);
                }
            }
        }
        assert!(differs > 0, "{scheduler}: the shards' own Holm alphas equal the whole run's: the comparison could not see a merge that skipped judging");
    }
}

#[test]
fn missing_duplicated_and_foreign_shards_are_errors_naming_them() {
    let base = dir("bad");
    for i in 0..3 {
        let out = specdec(&["conform", "--backend", "reference", "--filter", "golden/draw/", "--shard", &format!("{i}/3"), "--report", base.join(format!("s{i}")).to_str().unwrap()]);
        assert!(out.status.success(), "{}", text(&out));
    }
    let s = |i: usize| base.join(format!("s{i}")).to_str().unwrap().to_string();
    let merged = base.join("merged");
    let merge = |inputs: &[String]| {
        let mut args = vec!["report".to_string(), "merge".into()];
        args.extend(inputs.iter().cloned());
        args.extend(["--out".to_string(), merged.to_str().unwrap().to_string()]);
        Command::new(SPECDEC).args(&args).output().unwrap()
    };
    let ok = merge(&[s(0), s(1), s(2)]);
    assert!(ok.status.success(), "{}", text(&ok));
    for (inputs, names) in
        [(vec![s(0), s(2)], "shard 1/3 is missing"), (vec![s(0), s(1), s(2), s(1)], "appears twice"), (vec![base.join("nowhere").to_str().unwrap().to_string()], "no such file or folder")]
    {
        let out = merge(&inputs);
        assert_eq!(out.status.code(), Some(2), "SUITE-5: {inputs:?}: {}", text(&out));
        assert!(text(&out).contains(names), "{inputs:?}: {}", text(&out));
    }
    // A shard that ran a check another shard owns (a tampered or mislabelled file).
    let path = base.join("s1/reference.json");
    let mut v = json(&path);
    let foreign = v["results"].as_array().unwrap().iter().position(|r| r["status"] == "Skipped").expect("shard 1 skips the others' checks");
    v["results"][foreign]["status"] = Value::from("Pass");
    std::fs::write(&path, v.to_string()).unwrap();
    let out = merge(&[s(0), s(1), s(2)]);
    assert!(text(&out).contains("which shard") && text(&out).contains("owns"), "{}", text(&out));
    // Not a report.
    std::fs::write(base.join("s1/reference.json"), "{oops").unwrap();
    let out = merge(&[s(0), s(1), s(2)]);
    assert!(text(&out).contains("not JSON"), "{}", text(&out));
    for bad in ["3/3", "1", "x/2"] {
        let out = specdec(&["conform", "--backend", "reference", "--shard", bad]);
        assert_eq!(out.status.code(), Some(2), "--shard {bad}: {}", text(&out));
    }
}

#[test]
fn a_sharded_sweep_merges_into_the_unsharded_sweep() {
    let base = dir("sweep");
    let whole = base.join("whole");
    let out = specdec(&["stats", "--sweep", "3", "--out", whole.to_str().unwrap()]);
    assert!(out.status.success(), "{}", text(&out));
    let campaign = base.join("campaign");
    let out = Command::new(recipe("local.sh")).env("SPECDEC", SPECDEC).args(["slurm", "2", campaign.to_str().unwrap(), "stats", "--sweep", "3"]).output().unwrap();
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(json(&campaign.join("merged/sweep.json")), json(&whole.join("sweep.json")));
    assert_eq!(std::fs::read_to_string(campaign.join("merged/sweep.md")).unwrap(), std::fs::read_to_string(whole.join("sweep.md")).unwrap());
    let shard = json(&campaign.join("shard-1/sweep.json"));
    assert_eq!((shard["seeds_run"].as_u64(), shard["kind"].as_str()), (Some(1), Some("stats-sweep")), "shard 1 of 2 runs seed 2 only");
    // One shard alone is not the sweep.
    let out = specdec(&["report", "merge", campaign.join("shard-0").to_str().unwrap(), "--out", base.join("m").to_str().unwrap()]);
    assert!(text(&out).contains("shard 1/2 is missing"), "{}", text(&out));
}

#[test]
fn fuzz_shards_sum_per_target_and_every_unit_runs_once() {
    let base = dir("fuzz");
    // Two targets, four shards: two replicas of each target, unit u in shard u mod 4
    // (the order `cargo xtask fuzz --shard` numbers them: replica-major).
    let unit = |target: &str, replica: u64, execs: u64, crashes: u64| serde_json::json!({"target": target, "replica": replica, "execs": execs, "crashes": crashes, "hangs": 0, "corpus": 3});
    let shard = |i: u64, units: Vec<Value>| serde_json::json!({"kind": "fuzz", "seconds": 60, "targets": ["gguf", "config"], "replicas": 2, "shard": {"index": i, "count": 4}, "units": units});
    let shards = [shard(0, vec![unit("gguf", 0, 100, 0)]), shard(1, vec![unit("config", 0, 50, 0)]), shard(2, vec![unit("gguf", 1, 120, 0)]), shard(3, vec![unit("config", 1, 70, 1)])];
    for (i, s) in shards.iter().enumerate() {
        std::fs::create_dir_all(base.join(format!("shard-{i}"))).unwrap();
        std::fs::write(base.join(format!("shard-{i}/fuzz.json")), s.to_string()).unwrap();
    }
    let merge = |inputs: &[&str]| {
        let mut args = vec!["report", "merge"];
        args.extend(inputs);
        let out = base.join("merged");
        args.extend(["--out", out.to_str().unwrap()]);
        Command::new(SPECDEC).args(&args).output().unwrap()
    };
    let all: Vec<String> = (0..4).map(|i| base.join(format!("shard-{i}")).to_str().unwrap().to_string()).collect();
    let all: Vec<&str> = all.iter().map(String::as_str).collect();
    let out = merge(&all);
    assert_eq!(out.status.code(), Some(1), "a crash in one unit fails the campaign: {}", text(&out));
    let md = std::fs::read_to_string(base.join("merged/fuzz.md")).unwrap();
    assert!(md.contains("| gguf | 220 | 0 | 0 |") && md.contains("| config | 120 | 1 | 0 |"), "{md}");
    let out = merge(&all[..3]);
    assert!(text(&out).contains("fuzz shard 3/4 is missing"), "{}", text(&out));
    // A shard that ran a unit another ran too.
    std::fs::write(base.join("shard-3/fuzz.json"), shard(3, vec![unit("config", 0, 70, 0)]).to_string()).unwrap();
    let out = merge(&all);
    assert!(text(&out).contains("run by two shards"), "{}", text(&out));
}

/// SUITE-5 for `engine-check` (issue 44's report a vendor attaches): the
/// engine section on specdec's decoder in three shards merges into the
/// unsharded run's report, timings aside, each shard running its own checks
/// only (the sampled laws left out: they cost minutes, and the kernel run
/// above merges a statistical family already).
#[test]
fn shards_of_an_engine_check_merge_into_the_unsharded_report() {
    let base = dir("engine");
    let run = |shard: Option<usize>, out: &Path| {
        let mut args = vec!["engine-check", "--engine", "decoder:reference:ngram", "--exclude", "*/sampled/*", "--exclude", "*/on", "--exclude", "*/off", "--exclude", "*/seed-pairs"];
        let label = shard.map(|i| format!("{i}/3"));
        if let Some(l) = &label {
            args.extend(["--shard", l.as_str()]);
        }
        args.extend(["--report", out.to_str().unwrap()]);
        let o = specdec(&args);
        assert!(o.status.success(), "{}", text(&o));
    };
    let whole = base.join("whole.json");
    run(None, &whole);
    let whole = json(&whole);
    let ran = |v: &Value| v["results"].as_array().unwrap().iter().filter(|r| r["status"] != "Skipped").count();
    assert!(ran(&whole) >= 10, "the run holds the section's exact checks: {}", ran(&whole));
    let mut sizes = Vec::new();
    for i in 0..3 {
        let dir = base.join(format!("shard-{i}"));
        std::fs::create_dir_all(&dir).unwrap();
        run(Some(i), &dir.join("engine.json"));
        sizes.push(ran(&json(&dir.join("engine.json"))));
    }
    assert!(sizes.iter().all(|&n| n > 0 && n < ran(&whole)) && sizes.iter().sum::<usize>() == ran(&whole), "each shard runs its part: {sizes:?} of {}", ran(&whole));
    let merged = base.join("merged");
    let shards: Vec<String> = (0..3).map(|i| base.join(format!("shard-{i}")).to_str().unwrap().to_string()).collect();
    let out = Command::new(SPECDEC).args(["report", "merge"]).args(&shards).args(["--out", merged.to_str().unwrap()]).output().unwrap();
    assert!(out.status.success(), "{}", text(&out));
    // The engine's name (`specdec/reference/ngram`) as one file name.
    let file = merged.join("specdec-reference-ngram.json");
    assert_eq!(untimed(json(&file)), untimed(whole), "SUITE-5: the engine check's shards merge into its unsharded report");
}
