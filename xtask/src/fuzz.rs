//! `cargo xtask fuzz`: AFL++ on the targets of `specdec-fuzz` (opt-in, not in CI).
//!
//! Why AFL++: it runs on the stable toolchain (libFuzzer through cargo-fuzz
//! needs nightly's sanitizer flags), and its Rust driver `cargo-afl` installs
//! from crates.io and builds AFL++ itself from the source it ships, so nothing
//! comes from another host. `cargo-afl` goes to `.cache/cargo-afl/` (once),
//! AFL++'s runtime to cargo-afl's own data directory (once). Each target
//! starts from its committed seeds (`fuzz/corpus/<target>/`); findings go to
//! `reports/fuzz/<target>-r<replica>/`, and the run ends with each target's
//! executions and crash count from AFL's `fuzzer_stats`, also written to
//! `reports/fuzz/fuzz.json`. `--shard I/N` runs one shard of a campaign spread
//! over machines: its units are the targets times enough replicas (AFL seeds)
//! for N shards, the u-th unit in shard u mod N; `specdec report merge` sums
//! the shards' figures.

use std::path::{Path, PathBuf};
use std::process::Command;

/// The targets of `fuzz/src/lib.rs`, in the order `all` runs them.
pub const TARGETS: [&str; 7] = ["case_file", "gguf", "safetensors", "config", "tokenizer", "exec_reply", "ngram_index"];

fn run(cmd: &mut Command, what: &str) -> Result<(), String> {
    let status = cmd.status().map_err(|e| format!("{what}: cannot start: {e}"))?;
    if status.success() { Ok(()) } else { Err(format!("{what} failed ({status})")) }
}

/// `cargo-afl`, installed once under `.cache/cargo-afl/`, with AFL++ built.
fn ensure_cargo_afl(root: &Path) -> Result<PathBuf, String> {
    let install = root.join(".cache/cargo-afl");
    let bin = install.join("bin/cargo-afl");
    if !bin.is_file() {
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        run(Command::new(cargo).args(["install", "cargo-afl", "--version", "0.18.2", "--locked", "--root"]).arg(&install), "cargo install cargo-afl")?;
    }
    // `config --build` is idempotent: it rebuilds nothing once AFL++ is there.
    let built = Command::new(&bin).args(["afl", "config", "--build"]).output().map_err(|e| format!("cargo-afl: {e}"))?;
    if !built.status.success() {
        let text = String::from_utf8_lossy(&built.stderr);
        if !text.contains("already built") {
            return Err(format!("cargo afl config --build failed: {text}"));
        }
    }
    Ok(bin)
}

/// One unit of a campaign: a target and a replica of it (its own AFL seed and
/// output folder), so that a campaign of more shards than targets still splits.
struct Unit<'a> {
    target: &'a str,
    replica: usize,
}

/// `I/N` (I counted from 0), as `specdec conform --shard` takes it.
pub fn parse_shard(s: &str) -> Result<(usize, usize), String> {
    let bad = || format!("--shard `{s}`: expected I/N with 0 <= I < N");
    let (i, n) = s.split_once('/').ok_or_else(bad)?;
    let (i, n): (usize, usize) = (i.trim().parse().map_err(|_| bad())?, n.trim().parse().map_err(|_| bad())?);
    if n == 0 || i >= n { Err(bad()) } else { Ok((i, n)) }
}

/// Runs `targets` for `seconds` each (with `shard` = (I, N): only the units, targets
/// times replicas, numbered u with u mod N = I), then prints each one's figures and writes
/// them to `out/fuzz.json` (`specdec report merge` sums a sharded campaign's).
pub fn fuzz(root: &Path, targets: &[String], seconds: u64, shard: Option<(usize, usize)>, out: &Path) -> Result<(), String> {
    let names: Vec<&str> = if targets.iter().any(|t| t == "all") || targets.is_empty() { TARGETS.to_vec() } else { targets.iter().map(String::as_str).collect() };
    if let Some(bad) = names.iter().find(|n| !TARGETS.contains(n)) {
        return Err(format!("unknown fuzz target {bad:?}; one of {TARGETS:?} or `all`"));
    }
    let shards = shard.map_or(1, |(_, n)| n);
    let replicas = shards.div_ceil(names.len()).max(1);
    let units: Vec<Unit<'_>> = (0..replicas).flat_map(|replica| names.iter().map(move |&target| Unit { target, replica })).collect();
    let mine: Vec<&Unit<'_>> = units.iter().enumerate().filter(|(u, _)| shard.is_none_or(|(i, n)| u % n == i)).map(|(_, unit)| unit).collect();
    let afl = ensure_cargo_afl(root)?;
    run(Command::new(&afl).current_dir(root).args(["afl", "build", "--release", "-p", "specdec-fuzz", "--features", "afl", "--bin", "specdec-fuzz"]), "cargo afl build")?;
    let binary = root.join("target/release/specdec-fuzz");
    let mut summary = Vec::new();
    for unit in mine {
        let findings = out.join(format!("{}-r{}", unit.target, unit.replica));
        // A fresh output directory per run: AFL refuses to mix runs.
        let _ = std::fs::remove_dir_all(&findings);
        std::fs::create_dir_all(&findings).map_err(|e| format!("{}: {e}", findings.display()))?;
        let mut cmd = Command::new(&afl);
        cmd.current_dir(root)
            .args(["afl", "fuzz", "-i"])
            .arg(root.join("fuzz/corpus").join(unit.target))
            .arg("-o")
            .arg(&findings)
            .args(["-s", &(unit.replica + 1).to_string(), "-V", &seconds.to_string(), "-m", "4096", "-t", "5000", "--"])
            .arg(&binary)
            .arg(unit.target)
            // Containers often forbid changing the core pattern or the CPU
            // governor; neither changes what is found, only how fast.
            .env("AFL_I_DONT_CARE_ABOUT_MISSING_CRASHES", "1")
            .env("AFL_SKIP_CPUFREQ", "1")
            .env("AFL_NO_UI", "1");
        run(&mut cmd, &format!("afl-fuzz {} (replica {})", unit.target, unit.replica))?;
        summary.push((unit, stats(&findings.join("default/fuzzer_stats"))));
    }
    println!("\ntarget        replica  executions   crashes  hangs  corpus");
    for (unit, s) in &summary {
        println!("{:<13} {:>7}  {:>10}  {:>8}  {:>5}  {:>6}", unit.target, unit.replica, s.0, s.1, s.2, s.3);
    }
    let count = |x: &str| x.parse::<u64>().ok();
    let json = serde_json::json!({
        "kind": "fuzz", "seconds": seconds, "targets": names, "replicas": replicas,
        "shard": shard.map(|(index, count)| serde_json::json!({"index": index, "count": count})),
        "units": summary.iter().map(|(u, s)| serde_json::json!({"target": u.target, "replica": u.replica, "execs": count(&s.0), "crashes": count(&s.1), "hangs": count(&s.2), "corpus": count(&s.3)})).collect::<Vec<_>>(),
    });
    std::fs::create_dir_all(out).map_err(|e| format!("{}: {e}", out.display()))?;
    let path = out.join("fuzz.json");
    std::fs::write(&path, serde_json::to_string_pretty(&json).expect("serializes")).map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    println!("findings under {}/<target>-r<replica>/default/{{crashes,hangs}}; add each, once fixed, to fuzz/corpus/<target>/; figures in {}", out.display(), path.display());
    if summary.iter().any(|(_, s)| s.1 != "0" || s.2 != "0") { Err("the fuzzer found crashes or hangs".into()) } else { Ok(()) }
}

/// (executions, crashes, hangs, corpus size) from AFL's `fuzzer_stats`.
fn stats(path: &Path) -> (String, String, String, String) {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let field = |key: &str| text.lines().filter_map(|l| l.split_once(':')).find(|(k, _)| k.trim() == key).map_or("?".to_string(), |(_, v)| v.trim().to_string());
    (field("execs_done"), field("saved_crashes"), field("saved_hangs"), field("corpus_count"))
}
