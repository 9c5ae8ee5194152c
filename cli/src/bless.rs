//! `specdec bless`: the expected outputs of `expected_by: reference` cases
//! come from the reference, and `fixtures/cases/blessed/` is regenerated
//! from the differential generators at a fixed seed (CASE-3). `--check`
//! compares instead of writing, so drift fails CI.

use std::path::{Path, PathBuf};

use serde_json::Value;
use specdec_conformance::bless::rebless;
use specdec_conformance::blessed::blessed_file;
use specdec_conformance::case::{self, CaseFile, to_pretty_json};
use specdec_conformance::diff;

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
    for op in diff::ops() {
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
