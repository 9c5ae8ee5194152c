//! `specdec report merge`: one report from the shards of a sharded run
//! (`specdec conform --shard I/N`, `specdec stats --sweep N --shard I/N`,
//! `cargo xtask fuzz --shard I/N`), each shard's JSON read from the folders
//! or files given.
//!
//! Conformance shards merge into one report per backend whose Holm families
//! are judged over all shards (`specdec_conformance::shard`); sweep shards
//! into one tally judged only then. A missing or duplicated shard, shards of
//! different runs, a file that is neither kind or does not parse: an error
//! naming the file.

use std::path::{Path, PathBuf};

use serde_json::Value;
use specdec_conformance::report::Report;
use specdec_conformance::shard::{self, check_complete};

use crate::campaign::{SWEEP_KIND, SweepTally, merge_sweeps, write_sweep};

/// A shard file, by what it holds.
enum ShardFile {
    Conformance(Report),
    Sweep(SweepTally),
    /// `cargo xtask fuzz --shard`'s `fuzz.json`.
    Fuzz(Value),
}

/// Merges the shards in `inputs` and writes the merged report to `out`
/// (a folder: JSON, Markdown and JUnit per backend, or `sweep.json` and
/// `sweep.md`); `Ok(false)` when the merged conformance run failed.
pub fn run(inputs: &[PathBuf], out: &Path) -> Result<bool, String> {
    let mut conformance = Vec::new();
    let mut sweeps = Vec::new();
    let mut fuzz = Vec::new();
    for path in shard_files(inputs)? {
        let from = path.display().to_string();
        match read(&path)? {
            ShardFile::Conformance(r) => conformance.push((from, r)),
            ShardFile::Sweep(t) => sweeps.push((from, t)),
            ShardFile::Fuzz(v) => fuzz.push((from, v)),
        }
    }
    match (conformance.is_empty(), sweeps.is_empty(), fuzz.is_empty()) {
        (true, true, true) => Err(format!("no shard reports (`*.json`) in {}", inputs.iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join(", "))),
        (true, false, true) => write_sweep(&merge_sweeps(sweeps)?, out),
        (true, true, false) => merge_fuzz(fuzz, out),
        (false, true, true) => {
            let merged = shard::merge(conformance)?;
            let mut ok = true;
            for r in &merged {
                println!("{}", r.summary_line());
                ok &= !r.summary.failed;
                specdec_conformance::harness::write_reports(r, out).map_err(|e| format!("cannot write reports to {}: {e}", out.display()))?;
            }
            println!("merged {} backend(s) into {}: {}", merged.len(), out.display(), if ok { "PASS" } else { "FAIL" });
            Ok(ok)
        }
        _ => Err("shards of different kinds of run (conformance, sweep, fuzz) given together: merge each run on its own".into()),
    }
}

/// Sums a fuzz campaign's shards: every shard once, every unit (target,
/// replica) exactly once; `Ok(false)` when any unit found a crash or a hang.
fn merge_fuzz(shards: Vec<(String, Value)>, out: &Path) -> Result<bool, String> {
    let (first_from, first) = &shards[0];
    let plan = |v: &Value| (v["seconds"].clone(), v["targets"].clone(), v["replicas"].clone(), v["shard"]["count"].clone());
    let count = first["shard"]["count"].as_u64().ok_or_else(|| format!("{first_from}: a whole fuzz run, not a shard"))?;
    let targets: Vec<String> = serde_json::from_value(first["targets"].clone()).map_err(|e| format!("{first_from}: `targets`: {e}"))?;
    let replicas = first["replicas"].as_u64().ok_or_else(|| format!("{first_from}: no `replicas`"))?;
    let mut given = Vec::new();
    let mut units = std::collections::BTreeMap::new();
    for (from, v) in &shards {
        if plan(v) != plan(first) {
            return Err(format!("{from} and {first_from}: shards of different fuzz campaigns (seconds, targets, replicas or shard count differ)"));
        }
        let index = v["shard"]["index"].as_u64().and_then(|i| usize::try_from(i).ok()).ok_or_else(|| format!("{from}: no `shard.index`"))?;
        given.push((index, from.clone()));
        for u in v["units"].as_array().ok_or_else(|| format!("{from}: no `units`"))? {
            let key = (u["replica"].as_u64().unwrap_or(u64::MAX), u["target"].as_str().unwrap_or("?").to_string());
            if !targets.contains(&key.1) || key.0 >= replicas {
                return Err(format!("{from}: unit {key:?} is not of the campaign"));
            }
            if units.insert(key.clone(), u.clone()).is_some() {
                return Err(format!("{from}: unit {key:?} was run by two shards"));
            }
        }
    }
    check_complete("fuzz shard", usize::try_from(count).map_err(|e| e.to_string())?, given)?;
    if units.len() as u64 != replicas * targets.len() as u64 {
        return Err(format!("{} of {} units ran: a shard ran fewer than its own", units.len(), replicas * targets.len() as u64));
    }
    let mut md = format!("# specdec fuzz campaign, {count} shards\n\n| target | executions | crashes | hangs |\n|---|---|---|---|\n");
    let mut clean = true;
    for t in &targets {
        let of = |field: &str| units.iter().filter(|((_, target), _)| target == t).map(|(_, u)| u[field].as_u64()).sum::<Option<u64>>();
        let show = |x: Option<u64>| x.map_or("?".to_string(), |x| x.to_string());
        clean &= of("crashes") == Some(0) && of("hangs") == Some(0);
        md.push_str(&format!("| {t} | {} | {} | {} |\n", show(of("execs")), show(of("crashes")), show(of("hangs"))));
    }
    let merged = serde_json::json!({"kind": "fuzz", "seconds": first["seconds"], "targets": targets, "replicas": replicas, "shards": count, "units": units.into_values().collect::<Vec<_>>()});
    std::fs::create_dir_all(out).map_err(|e| format!("cannot create {}: {e}", out.display()))?;
    std::fs::write(out.join("fuzz.json"), serde_json::to_string_pretty(&merged).expect("serializes")).map_err(|e| format!("cannot write {}: {e}", out.display()))?;
    std::fs::write(out.join("fuzz.md"), &md).map_err(|e| format!("cannot write {}: {e}", out.display()))?;
    print!("{md}");
    Ok(clean)
}

/// Every `*.json` of the folders given (sorted), and the files given.
fn shard_files(inputs: &[PathBuf]) -> Result<Vec<PathBuf>, String> {
    let mut files = Vec::new();
    for input in inputs {
        if input.is_dir() {
            let mut found: Vec<PathBuf> = std::fs::read_dir(input)
                .map_err(|e| format!("cannot read {}: {e}", input.display()))?
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| p.extension().is_some_and(|x| x == "json"))
                .collect();
            found.sort();
            files.extend(found);
        } else if input.is_file() {
            files.push(input.clone());
        } else {
            return Err(format!("{}: no such file or folder", input.display()));
        }
    }
    Ok(files)
}

fn read(path: &Path) -> Result<ShardFile, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    let v: Value = serde_json::from_str(&text).map_err(|e| format!("{}: not JSON: {e}", path.display()))?;
    if v.get("kind").and_then(Value::as_str) == Some("fuzz") {
        return Ok(ShardFile::Fuzz(v));
    }
    if v.get("kind").and_then(Value::as_str) == Some(SWEEP_KIND) {
        return serde_json::from_value(v).map(ShardFile::Sweep).map_err(|e| format!("{}: not a sweep shard: {e}", path.display()));
    }
    serde_json::from_value(v).map(ShardFile::Conformance).map_err(|e| format!("{}: not a conformance report: {e}", path.display()))
}
