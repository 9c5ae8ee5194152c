//! `cargo xtask peers`: the suite run on real public implementations (opt-in, not in CI).
//!
//! The peers are HF transformers' speculative sampling, called unchanged, and a torch
//! port of vLLM's rejection sampler (its Triton kernels need a GPU); their adapters and
//! the table of what their failures mean live in `adapters/peers/`. torch and
//! transformers are pinned and installed from PyPI into `.cache/venv-peers` (git-ignored,
//! created once, about 5 GB: PyPI's Linux torch wheel is the CUDA build and pulls the CUDA
//! libraries it links, although everything here runs on the CPU). The torch wheel the
//! libtorch step already cached is reused rather than downloaded again.
//!
//! Each peer runs the whole suite at the fixed seed the divergence table was confirmed
//! at, writing `reports/peers/<peer>.{json,md}`; the table goes to
//! `reports/peers/PEERS.md` and to stdout. A peer failing checks is the expected
//! outcome, not an error of this command: the table says which and why.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::{libtorch, run_command};

/// The transformers release the table was made with; torch is libtorch's pin.
pub const TRANSFORMERS_PIN: &str = "transformers==5.23.0";

/// The seed the divergence table's differential case names belong to.
pub const PEER_SEED: &str = "20261122";

/// (report name, adapter script under `adapters/peers/`).
pub const PEERS: &[(&str, &str)] = &[("hf-transformers", "hf_transformers.py"), ("vllm-rejection-torch", "vllm_rejection_torch.py")];

fn pins() -> String {
    format!("torch=={} {TRANSFORMERS_PIN}", libtorch::TORCH_VERSION)
}

/// The peers' Python when `cargo xtask peers` has installed the pinned peers, without installing.
pub fn installed_python(root: &Path) -> Option<PathBuf> {
    let venv = root.join(".cache/venv-peers");
    let python = venv.join("bin/python");
    let stamp_ok = std::fs::read_to_string(venv.join(".specdec-peers")).is_ok_and(|s| s.trim() == pins());
    (python.exists() && stamp_ok).then_some(python)
}

/// The peers' Python, creating its environment on first use.
pub fn ensure_peers_venv(root: &Path) -> Result<PathBuf, String> {
    if let Some(python) = installed_python(root) {
        return Ok(python);
    }
    let venv = root.join(".cache/venv-peers");
    let (python, stamp, pins) = (venv.join("bin/python"), venv.join(".specdec-peers"), pins());
    run_command(Command::new("python3").args(["-m", "venv", "--clear"]).arg(&venv))?;
    run_command(
        Command::new(&python)
            .args(["-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--no-cache-dir", "--find-links"])
            .arg(root.join(".cache/wheels"))
            .arg(format!("torch=={}", libtorch::TORCH_VERSION))
            .arg(TRANSFORMERS_PIN),
    )?;
    std::fs::write(&stamp, &pins).map_err(|e| format!("cannot write {}: {e}", stamp.display()))?;
    Ok(python)
}

/// Runs every peer through `specdec conform` (the binary given) and writes the table.
pub fn run_peers(root: &Path, specdec: &Path, python: &Path) -> Result<String, String> {
    let out = root.join("reports/peers");
    std::fs::create_dir_all(&out).map_err(|e| format!("cannot create {}: {e}", out.display()))?;
    let mut reports = Vec::new();
    for (name, script) in PEERS {
        let adapter = format!("exec:{} {}", python.display(), root.join("adapters/peers").join(script).display());
        let json = out.join(format!("{name}.json"));
        let status = Command::new(specdec)
            .args(["conform", "--seed", PEER_SEED, "--backend", &adapter, "--report"])
            .arg(&json)
            .arg("--report")
            .arg(out.join(format!("{name}.md")))
            // HF verifies one sequence per call in Python: the statistical batches need more than 30 s.
            .env("SPECDEC_EXEC_TIMEOUT", "900")
            .status()
            .map_err(|e| format!("cannot run {}: {e}", specdec.display()))?;
        eprintln!("xtask: peer {name}: specdec conform exited with {status} (failures are expected; the table explains them)");
        if !json.exists() {
            return Err(format!("peer {name} wrote no report ({status})"));
        }
        reports.push(json);
    }
    let table = Command::new(python)
        .arg(root.join("adapters/peers/peer_table.py"))
        .arg(root.join("adapters/peers/divergences.toml"))
        .args(&reports)
        .output()
        .map_err(|e| format!("cannot run peer_table.py: {e}"))?;
    if !table.status.success() {
        return Err(format!("peer_table.py failed: {}", String::from_utf8_lossy(&table.stderr)));
    }
    let text = String::from_utf8_lossy(&table.stdout).into_owned();
    let path = out.join("PEERS.md");
    std::fs::write(&path, &text).map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    Ok(text)
}
