//! The cached Python environment of the NumPy adapter (`adapters/python`):
//! `.cache/venv-numpy` with a pinned NumPy from PyPI, created once
//! (idempotent: a stamp file records the installed pin). Where Debian lacks
//! `python3-venv`, NumPy goes into `.cache/pydeps` with `pip --target`
//! instead, and the adapter finds it through `PYTHONPATH`.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::run_command;

/// The NumPy release the adapter is checked with.
pub const NUMPY_PIN: &str = "numpy==2.2.6";
/// The official OpenAI client, which the serve tests drive `specdec serve` with.
pub const OPENAI_PIN: &str = "openai==2.8.1";
/// What the environment holds, as its stamp records it.
const STAMP: &str = "numpy==2.2.6 openai==2.8.1";

/// The variable the exec backend's suite test reads: the Python to run the adapter with.
pub const PYTHON_ENV: &str = "SPECDEC_PYTHON";

/// The environment the NumPy adapter needs: `SPECDEC_PYTHON`, and
/// `PYTHONPATH` in the `--target` fallback.
pub fn ensure_numpy_venv(root: &Path) -> Result<Vec<(String, PathBuf)>, String> {
    let cache = root.join(".cache");
    let venv = cache.join("venv-numpy");
    let python = venv.join("bin/python");
    let stamp = venv.join(".specdec-numpy");
    if stamp_matches(&stamp) && python.exists() {
        return Ok(vec![(PYTHON_ENV.into(), python)]);
    }
    std::fs::create_dir_all(&cache).map_err(|e| format!("cannot create {}: {e}", cache.display()))?;
    if run_command(Command::new("python3").args(["-m", "venv", "--clear"]).arg(&venv)).is_ok() {
        run_command(Command::new(&python).args(["-m", "pip", "install", "--quiet", "--disable-pip-version-check", NUMPY_PIN, OPENAI_PIN]))?;
        std::fs::write(&stamp, STAMP).map_err(|e| format!("cannot write {}: {e}", stamp.display()))?;
        return Ok(vec![(PYTHON_ENV.into(), python)]);
    }
    // No venv module (Debian without python3-venv): a plain target directory.
    let target = cache.join("pydeps");
    let stamp = target.join(".specdec-numpy");
    if !stamp_matches(&stamp) {
        run_command(Command::new("python3").args(["-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--upgrade", "--target"]).arg(&target).args([NUMPY_PIN, OPENAI_PIN]))?;
        std::fs::write(&stamp, STAMP).map_err(|e| format!("cannot write {}: {e}", stamp.display()))?;
    }
    let python = which_python3()?;
    Ok(vec![(PYTHON_ENV.into(), python), ("PYTHONPATH".into(), target)])
}

fn stamp_matches(stamp: &Path) -> bool {
    std::fs::read_to_string(stamp).is_ok_and(|s| s.trim() == STAMP)
}

fn which_python3() -> Result<PathBuf, String> {
    let out = Command::new("python3").args(["-c", "import sys; print(sys.executable)"]).output().map_err(|e| format!("cannot run python3: {e}"))?;
    Ok(PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()))
}
