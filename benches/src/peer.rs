//! The peer timed in the same run: HF transformers' verify from logits and a
//! torch greedy verify (`adapters/peers/bench_hf.py`), when `cargo xtask
//! peers` has installed it (`SPECDEC_PEERS_PYTHON` names its Python).

use serde::{Deserialize, Serialize};

use crate::kernels::Shape;

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PeerTime {
    pub op: String,
    pub shape: Shape,
    pub median_s: f64,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PeerTimes {
    /// The peer and its versions, as the script reports them.
    pub peer: String,
    pub times: Vec<PeerTime>,
}

impl PeerTimes {
    pub fn get(&self, op: &str, shape: &Shape) -> Option<f64> {
        self.times.iter().find(|t| t.op == op && t.shape == *shape).map(|t| t.median_s)
    }
}

/// Runs the peer script at `shapes` with `python`; `Err` says why there is no peer row.
pub fn measure(python: &std::path::Path, shapes: &[Shape]) -> Result<PeerTimes, String> {
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../adapters/peers/bench_hf.py");
    let args: Vec<String> = shapes.iter().map(|s| format!("{},{},{}", s.batch, s.k, s.vocab)).collect();
    let out = std::process::Command::new(python).arg(&script).args(&args).output().map_err(|e| format!("cannot run {}: {e}", python.display()))?;
    if !out.status.success() {
        return Err(format!("the peer script failed ({}): {}", out.status, String::from_utf8_lossy(&out.stderr).lines().last().unwrap_or("")));
    }
    serde_json::from_slice(&out.stdout).map_err(|e| format!("the peer script printed no timings: {e}"))
}
