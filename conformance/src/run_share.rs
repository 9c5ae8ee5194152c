//! What one test run computes once for all its suite binaries: the f64 reference's greedy
//! decoding of SmolLM2 (about a minute, the model section's oracle for every backend).
//! `cargo xtask test` names a folder made fresh for the run in [`RUN_DIR_ENV`]; without it
//! each process computes its own, as a lone `cargo test` always did.
//!
//! Invariants: a value is shared only within one run (the folder is new for each run and
//! removed after it), so an oracle read here is still the reference computed in the same
//! run, never a stored copy. The first process to ask computes it holding a lock file;
//! the others wait for its result, and compute it themselves if the lock goes without one
//! (its owner failed or died) or after [`WAIT`]. A result is written whole (a temporary
//! file renamed into place) or not at all, and one that does not parse is recomputed.

use std::hash::{Hash, Hasher};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use serde::Serialize;
use serde::de::DeserializeOwned;

/// The environment variable naming the run's folder.
pub const RUN_DIR_ENV: &str = "SPECDEC_RUN_DIR";

/// How long a process waits for another's result before computing its own.
pub const WAIT: Duration = Duration::from_secs(600);

/// `compute()`'s value, computed once per run for every process asking with the same
/// `name` and `inputs` (hashed into the file name).
pub fn shared<T: Serialize + DeserializeOwned>(name: &str, inputs: &impl Hash, compute: impl FnOnce() -> Result<T, String>) -> Result<T, String> {
    shared_in(std::env::var_os(RUN_DIR_ENV).filter(|d| !d.is_empty()).map(PathBuf::from), name, inputs, compute)
}

/// [`shared`] in the run folder `dir`, or no sharing without one.
fn shared_in<T: Serialize + DeserializeOwned>(dir: Option<PathBuf>, name: &str, inputs: &impl Hash, compute: impl FnOnce() -> Result<T, String>) -> Result<T, String> {
    let Some(dir) = dir else { return compute() };
    let mut h = std::collections::hash_map::DefaultHasher::new();
    inputs.hash(&mut h);
    let stem = dir.join(format!("{name}-{:016x}", h.finish()));
    let (result, lock) = (stem.with_extension("json"), stem.with_extension("lock"));
    let read = || std::fs::read_to_string(&result).ok().and_then(|t| serde_json::from_str::<T>(&t).ok());
    let start = Instant::now();
    loop {
        if let Some(v) = read() {
            return Ok(v);
        }
        match std::fs::OpenOptions::new().write(true).create_new(true).open(&lock) {
            Ok(_) => break,
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists && start.elapsed() < WAIT => std::thread::sleep(Duration::from_millis(200)),
            // No folder, no permission, or waited long enough: this process's own value.
            Err(_) => return compute(),
        }
    }
    // This process holds the lock: compute, publish whole, release (also on failure).
    let value = compute();
    if let Ok(v) = &value
        && let Ok(text) = serde_json::to_string(v)
    {
        let tmp = stem.with_extension(format!("tmp{}", std::process::id()));
        if std::fs::write(&tmp, text).is_ok() {
            let _ = std::fs::rename(&tmp, &result);
        }
    }
    let _ = std::fs::remove_file(&lock);
    value
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Within a run the value is computed once, whoever asks, and read back bit for bit;
    /// other inputs are another value; a failure is not shared; without a run folder
    /// nothing is shared.
    #[test]
    fn a_value_is_computed_once_per_run() {
        let dir = std::env::temp_dir().join(format!("specdec-run-share-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let calls = std::cell::Cell::new(0);
        let compute = || {
            calls.set(calls.get() + 1);
            Ok(vec![0.1f64, 1.0 / 3.0])
        };
        let run = || Some(dir.clone());
        let a: Vec<f64> = shared_in(run(), "v", &(1u32, "x"), compute).unwrap();
        let b: Vec<f64> = shared_in(run(), "v", &(1u32, "x"), compute).unwrap();
        assert_eq!((a.clone(), calls.get()), (b, 1), "computed once, read back bit for bit");
        let c: Vec<f64> = shared_in(run(), "v", &(2u32, "x"), compute).unwrap();
        assert_eq!((c, calls.get()), (a, 2), "other inputs, another value");
        let failed: Result<Vec<f64>, String> = shared_in(run(), "f", &0u8, || Err("no".into()));
        assert!(failed.is_err());
        let again: Vec<f64> = shared_in(run(), "f", &0u8, compute).unwrap();
        assert_eq!((again.len(), calls.get()), (2, 3), "a failure is not shared");
        let _: Vec<f64> = shared_in(None, "v", &(1u32, "x"), compute).unwrap();
        assert_eq!(calls.get(), 4, "no run folder, no sharing");
        assert!(!std::fs::read_dir(&dir).unwrap().any(|e| e.unwrap().path().extension().is_some_and(|x| x == "lock")), "every lock released");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
