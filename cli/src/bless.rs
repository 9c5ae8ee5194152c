//! `specdec bless`: the expected outputs of `expected_by: reference` cases
//! come from the reference, and `fixtures/cases/blessed/` is regenerated
//! from the differential generators at a fixed seed (CASE-3). `--check`
//! compares instead of writing, so drift fails CI.

use std::path::{Path, PathBuf};

use serde_json::Value;
use specdec_backend::Op;
use specdec_conformance::bless::{bless, expect_block};
use specdec_conformance::case::{self, Case, CaseFile, ExpectedBy, FORMAT, to_pretty_json};
use specdec_conformance::{diff, host};

/// The seed of the blessed differential cases.
pub const BLESS_SEED: u64 = 1;
/// Blessed cases per operation.
pub const BLESSED_PER_OP: usize = 12;

/// The rules a blessed case of `op` exercises.
fn rules(op: Op) -> Vec<String> {
    let r: &[&str] = match op {
        Op::GreedyVerify => &["GREEDY-2", "GREEDY-3", "GREEDY-4", "CONV-7"],
        Op::DflashAccept => &["DFLASH-2", "DFLASH-3"],
        Op::RejectionVerify => &["REJECT-2", "REJECT-3", "REJECT-4", "RESID-1", "RESID-2", "SAMPLE-1", "SAMPLE-2"],
        Op::Residual => &["RESID-1", "RESID-2", "RESID-3"],
        Op::ProcessLogits => &["LOGITS-4", "LOGITS-5", "LOGITS-6"],
        Op::Draw => &["SAMPLE-1", "SAMPLE-2"],
        Op::NgramPropose => &["NGRAM-2", "NGRAM-5", "NGRAM-7"],
        Op::KvCache => &["KV-2", "KV-4", "KV-5"],
        Op::PagedGather => &["KV-8"],
        Op::RejectionVerifySeeded => &[],
    };
    r.iter().map(|s| s.to_string()).collect()
}

/// The blessed file for `op`, as it should be.
fn blessed_file(op: Op) -> Result<CaseFile, String> {
    let mut cases = Vec::new();
    for i in 0..BLESSED_PER_OP {
        let mut c = diff::case(op, i, BLESS_SEED).map_err(|e| e.to_string())?;
        c.id = format!("seed{BLESS_SEED}-{i:03}");
        c.rules = rules(op);
        cases.push(c);
    }
    Ok(CaseFile {
        format: FORMAT.into(),
        title: format!("`{}` cases generated at seed {BLESS_SEED}, expected outputs from the reference", op.name()),
        description: "Written by `specdec bless`; do not edit by hand.".into(),
        cases,
    })
}

/// A case with its expectation recomputed (host ops by the host runner).
fn rebless(c: &Case) -> Result<Case, String> {
    if c.expected_by == ExpectedBy::Hand {
        return Ok(c.clone());
    }
    if host::HOST_OPS.contains(&c.op.as_str()) {
        let observed = host::execute_host(c).map_err(|e| e.to_string())?;
        return Ok(Case { expect: expect_block(&observed), ..c.clone() });
    }
    bless(c).map_err(|e| e.to_string())
}

fn read_file(path: &Path) -> Result<CaseFile, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    serde_json::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))
}

/// Rewrites (or, with `check`, compares) every case file; `Ok(false)` on drift.
pub fn run(fixtures: &Path, check: bool) -> Result<bool, String> {
    let mut wanted: Vec<(PathBuf, CaseFile)> = Vec::new();
    for sub in ["cases", "host"] {
        for path in case::case_files(&fixtures.join(sub)) {
            if path.components().any(|c| c.as_os_str() == "blessed") {
                continue;
            }
            let mut file = read_file(&path)?;
            file.cases = file.cases.iter().map(rebless).collect::<Result<_, _>>()?;
            wanted.push((path, file));
        }
    }
    for op in diff::OPS {
        wanted.push((fixtures.join("cases/blessed").join(format!("{}.json", op.name())), blessed_file(op)?));
    }
    let mut drift = Vec::new();
    for (path, file) in &wanted {
        let value = serde_json::to_value(file).map_err(|e| e.to_string())?;
        let current: Option<Value> = std::fs::read_to_string(path).ok().and_then(|t| serde_json::from_str(&t).ok());
        if current.as_ref() != Some(&value) {
            drift.push(path.display().to_string());
        }
        if !check {
            if let Some(dir) = path.parent() {
                std::fs::create_dir_all(dir).map_err(|e| e.to_string())?;
            }
            std::fs::write(path, to_pretty_json(&value)).map_err(|e| format!("cannot write {}: {e}", path.display()))?;
        }
    }
    if check {
        if drift.is_empty() {
            println!("bless --check: {} case files match the reference", wanted.len());
            Ok(true)
        } else {
            println!("bless --check: drift in {} file(s) (run `cargo xtask bless`):\n  {}", drift.len(), drift.join("\n  "));
            Ok(false)
        }
    } else {
        println!("bless: wrote {} case files ({} changed)", wanted.len(), drift.len());
        Ok(true)
    }
}
