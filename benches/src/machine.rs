//! The machine the report ran on: cores, CPU model, and its measured copy
//! bandwidth, the yardstick every memory-bound limit in the report uses.

use std::hint::black_box;
use std::time::Instant;

use serde::Serialize;

/// What the report says about the machine.
#[derive(Debug, Clone, Serialize)]
pub struct Machine {
    pub cores: usize,
    pub cpu: String,
    /// Copy bandwidth in bytes per second, counting each byte read and each
    /// byte written (the STREAM "copy" convention), best of the repetitions.
    pub copy_bytes_per_s: f64,
    /// The buffer copied (bytes), far larger than any cache.
    pub copy_buffer_bytes: usize,
}

/// 256 MiB: far beyond the last-level cache of any CPU this runs on, so the
/// copy measures memory, not cache.
const BUFFER: usize = 256 << 20;
const REPEATS: usize = 7;

impl Machine {
    /// Measures the copy bandwidth now, in this process (the same conditions
    /// the kernels meet), with one thread: the kernels' hot loops are single
    /// threaded except for the forward's matmuls.
    pub fn measure() -> Machine {
        let words = BUFFER / 8;
        let src: Vec<u64> = (0..words as u64).collect();
        let mut dst = vec![0u64; words];
        dst.copy_from_slice(&src); // fault every page in before timing
        let mut best = f64::INFINITY;
        for _ in 0..REPEATS {
            let start = Instant::now();
            dst.copy_from_slice(black_box(&src));
            black_box(&mut dst);
            best = best.min(start.elapsed().as_secs_f64());
        }
        Machine {
            cores: std::thread::available_parallelism().map_or(1, |p| p.get()),
            cpu: cpu_model().unwrap_or_else(|| "unknown CPU".into()),
            copy_bytes_per_s: 2.0 * BUFFER as f64 / best,
            copy_buffer_bytes: BUFFER,
        }
    }

    /// The time (seconds) to read `bytes` once at this machine's bandwidth:
    /// the memory-bound limit of a kernel that must read them.
    pub fn read_limit_s(&self, bytes: f64) -> f64 {
        // A copy moves each byte twice (read and write); a read-only stream
        // moves it once, at the same bytes-per-second rate.
        bytes / self.copy_bytes_per_s
    }
}

fn cpu_model() -> Option<String> {
    let info = std::fs::read_to_string("/proc/cpuinfo").ok()?;
    info.lines().find(|l| l.starts_with("model name")).and_then(|l| l.split_once(':')).map(|(_, v)| v.trim().to_string())
}
