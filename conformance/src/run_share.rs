//! What one test run computes once for all its suite binaries: the f64 reference's greedy
//! decoding of SmolLM2 (about a minute, the model section's oracle for every backend).
//! `cargo xtask test` names a folder made fresh for the run in [`RUN_DIR_ENV`]; without it
//! each process computes its own, as a lone `cargo test` always did.
//!
//! Invariants: a value is shared only within one run (the folder is new for each run and
//! removed after it), so an oracle read here is still the reference computed in the same
//! run, never a stored copy. The first process to ask computes it holding an exclusive
//! lock on a lock file; the others wait on that lock and then read its result, or compute
//! it themselves where there is none (its owner failed, panicked or died: the system
//! releases a dead process's lock). A result is written whole (a temporary file renamed
//! into place) or not at all, and one that does not parse is recomputed.

use std::hash::{Hash, Hasher};
use std::path::PathBuf;

use serde::Serialize;
use serde::de::DeserializeOwned;

/// The environment variable naming the run's folder.
pub const RUN_DIR_ENV: &str = "SPECDEC_RUN_DIR";

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
    if let Some(v) = read() {
        return Ok(v);
    }
    // No folder or no lock to be had: this process's own value.
    let Ok(file) = std::fs::OpenOptions::new().create(true).truncate(false).write(true).open(&lock) else { return compute() };
    if file.lock().is_err() {
        return compute();
    }
    // Held (released when `file` drops, or by the system if this process dies): a value
    // another holder published, else this one's, published whole.
    if let Some(v) = read() {
        return Ok(v);
    }
    let value = compute();
    if let Ok(v) = &value
        && let Ok(text) = serde_json::to_string(v)
    {
        // Only the lock's holder writes it.
        let tmp = stem.with_extension("tmp");
        if std::fs::write(&tmp, text).is_ok() {
            let _ = std::fs::rename(&tmp, &result);
        }
    }
    drop(file);
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
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// Askers at once (threads here, each with its own open file as processes have):
    /// one computes while the others wait on its lock, and all get its value; an owner
    /// that panics releases the lock, and the next asker computes.
    #[test]
    fn askers_at_once_wait_for_one_computation() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        let dir = std::env::temp_dir().join(format!("specdec-run-share-race-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let calls = AtomicUsize::new(0);
        let values: Vec<u64> = std::thread::scope(|s| {
            let askers: Vec<_> = (0..4)
                .map(|_| {
                    s.spawn(|| {
                        shared_in(Some(dir.clone()), "slow", &7u8, || {
                            calls.fetch_add(1, Ordering::SeqCst);
                            std::thread::sleep(std::time::Duration::from_millis(200));
                            Ok(42u64)
                        })
                        .unwrap()
                    })
                })
                .collect();
            askers.into_iter().map(|t| t.join().unwrap()).collect()
        });
        assert_eq!((values, calls.load(Ordering::SeqCst)), (vec![42; 4], 1), "computed once, every asker served");
        let panicked = std::thread::spawn({
            let dir = dir.clone();
            move || shared_in(Some(dir), "dies", &0u8, || -> Result<u64, String> { panic!("the owner dies") })
        })
        .join();
        assert!(panicked.is_err());
        assert_eq!(shared_in(Some(dir.clone()), "dies", &0u8, || Ok(5u64)).unwrap(), 5, "the lock went with its owner");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
