//! The machine the report ran on: cores, CPU model, and its measured copy
//! and read bandwidths, the yardsticks of the report's memory-bound limits.

use std::hint::black_box;
use std::time::Instant;

use serde::Serialize;

/// What the report says about the machine.
#[derive(Debug, Clone, Serialize)]
pub struct Machine {
    pub cores: usize,
    pub cpu: String,
    /// Copy bandwidth in bytes per second, counting each byte read and each
    /// byte written (the STREAM "copy" convention), best of the repetitions:
    /// the larger of one thread's and all threads' (the stricter yardstick).
    pub copy_bytes_per_s: f64,
    pub one_thread_bytes_per_s: f64,
    pub all_threads_bytes_per_s: f64,
    /// The buffer copied (bytes), far larger than any cache.
    pub copy_buffer_bytes: usize,
    /// Read bandwidth in bytes per second: a sum over the same buffer (a
    /// read-only stream, which is what a decode's pass over its weights
    /// is), the larger of one thread's and all threads', best of the
    /// repetitions. On the 2-core development machine it measured within
    /// about 13 % of the copy convention's figure, above or below it.
    pub read_bytes_per_s: f64,
}

/// 256 MiB: far beyond the last-level cache of any CPU this runs on, so the
/// copy measures memory, not cache.
const BUFFER: usize = 256 << 20;
const REPEATS: usize = 7;

impl Machine {
    /// Measures the copy bandwidth now, in this process (the same conditions
    /// the kernels meet), with one thread and with one thread per core: some
    /// kernels and the forward's matmuls use every core.
    pub fn measure() -> Machine {
        let cores = std::thread::available_parallelism().map_or(1, |p| p.get());
        let words = BUFFER / 8;
        let src: Vec<u64> = (0..words as u64).collect();
        let mut dst = vec![0u64; words];
        dst.copy_from_slice(&src); // fault every page in before timing
        let one = best_copy(&src, &mut dst, 1);
        let all = best_copy(&src, &mut dst, cores);
        let read = best_read(&src, 1).max(best_read(&src, cores));
        Machine {
            cores,
            cpu: cpu_model().unwrap_or_else(|| "unknown CPU".into()),
            copy_bytes_per_s: one.max(all),
            one_thread_bytes_per_s: one,
            all_threads_bytes_per_s: all,
            copy_buffer_bytes: BUFFER,
            read_bytes_per_s: read,
        }
    }

    /// The time (seconds) to read `bytes` once at this machine's copy
    /// bandwidth: the memory-bound limit the report gives every kernel.
    pub fn read_limit_s(&self, bytes: f64) -> f64 {
        // A copy moves each byte twice (read and write), counted as such; the
        // limit assumes a read-only stream moves bytes at that rate. The
        // measured read bandwidth ([`Machine::read_only_limit_s`]) was within
        // about 13 % of it on the development machine, on either side.
        bytes / self.copy_bytes_per_s
    }

    /// The time (seconds) to read `bytes` once at the measured read-only
    /// bandwidth: a decode's weight-bandwidth roofline as a read stream
    /// meets it on this machine.
    pub fn read_only_limit_s(&self, bytes: f64) -> f64 {
        bytes / self.read_bytes_per_s
    }
}

/// Best of [`REPEATS`] sums of `src` split across `threads`, in bytes read per second.
fn best_read(src: &[u64], threads: usize) -> f64 {
    let chunk = src.len().div_ceil(threads);
    let mut best = f64::INFINITY;
    for _ in 0..REPEATS {
        let start = Instant::now();
        std::thread::scope(|s| {
            for part in src.chunks(chunk) {
                s.spawn(move || black_box(sum(black_box(part))));
            }
        });
        best = best.min(start.elapsed().as_secs_f64());
    }
    std::mem::size_of_val(src) as f64 / best
}

/// A wrapping sum in eight independent lanes, so the loop is bound by the
/// loads, not by one chain of adds.
fn sum(words: &[u64]) -> u64 {
    let mut lanes = [0u64; 8];
    let mut chunks = words.chunks_exact(8);
    for c in &mut chunks {
        for (l, &w) in lanes.iter_mut().zip(c) {
            *l = l.wrapping_add(w);
        }
    }
    chunks.remainder().iter().chain(&lanes).fold(0u64, |s, &w| s.wrapping_add(w))
}

/// Best of [`REPEATS`] copies of `src` into `dst` split across `threads`, in bytes per second.
fn best_copy(src: &[u64], dst: &mut [u64], threads: usize) -> f64 {
    let chunk = src.len().div_ceil(threads);
    let mut best = f64::INFINITY;
    for _ in 0..REPEATS {
        let start = Instant::now();
        std::thread::scope(|s| {
            for (d, from) in dst.chunks_mut(chunk).zip(src.chunks(chunk)) {
                s.spawn(move || d.copy_from_slice(black_box(from)));
            }
        });
        black_box(&mut *dst);
        best = best.min(start.elapsed().as_secs_f64());
    }
    2.0 * std::mem::size_of_val(src) as f64 / best
}

fn cpu_model() -> Option<String> {
    let info = std::fs::read_to_string("/proc/cpuinfo").ok()?;
    info.lines().find(|l| l.starts_with("model name")).and_then(|l| l.split_once(':')).map(|(_, v)| v.trim().to_string())
}
