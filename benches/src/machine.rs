//! The machine the report ran on: cores, CPU model, its measured copy and
//! read bandwidths, the yardsticks of the report's memory-bound limits, and
//! its measured f32 FMA throughput, the yardstick of a prefill's
//! compute-bound limit.

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
    /// f32 floating-point operations per second (an FMA counts two) of
    /// independent FMA chains on every core at once, the widest vector path
    /// the CPU has, best of the repetitions: what a compute-bound product
    /// could reach at most.
    pub fma_flops_per_s: f64,
    /// The instructions that measured it (`avx512f`, `avx2+fma`, or
    /// `scalar` where neither runs, a far lower ceiling than the CPU's).
    pub fma_path: &'static str,
}

pub use fma::CHAINS as FMA_CHAINS;

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
        let (fma_flops_per_s, fma_path) = fma::best_flops(cores, REPEATS);
        Machine {
            cores,
            cpu: cpu_model().unwrap_or_else(|| "unknown CPU".into()),
            copy_bytes_per_s: one.max(all),
            one_thread_bytes_per_s: one,
            all_threads_bytes_per_s: all,
            copy_buffer_bytes: BUFFER,
            read_bytes_per_s: read,
            fma_flops_per_s,
            fma_path,
        }
    }

    /// The time (seconds) to do `flops` f32 operations at the measured FMA
    /// throughput: a compute-bound forward's roofline on this machine.
    pub fn fma_limit_s(&self, flops: f64) -> f64 {
        flops / self.fma_flops_per_s
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

/// Peak f32 FMA throughput: each thread runs [`fma::CHAINS`] independent
/// vector FMA chains (enough to cover the instruction's latency on the cores
/// this runs on), so the loop is bound by the FMA ports, not by one chain.
mod fma {
    use std::hint::black_box;
    use std::time::Instant;

    /// Independent accumulators per thread.
    pub const CHAINS: usize = 12;
    /// FMA rounds per thread per timing: 0.05-0.2 s on a core, long enough
    /// for the core to settle at its vector-unit clock.
    const ROUNDS: usize = 1 << 24;

    /// The widest FMA path this CPU runs, detected once.
    #[derive(Clone, Copy)]
    enum Path {
        Avx512,
        Avx2,
        Scalar,
    }

    impl Path {
        fn detect() -> Path {
            #[cfg(target_arch = "x86_64")]
            {
                if std::arch::is_x86_feature_detected!("avx512f") {
                    return Path::Avx512;
                }
                if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma") {
                    return Path::Avx2;
                }
            }
            Path::Scalar
        }

        /// (f32 lanes per FMA, its name in the report).
        fn lanes_and_name(self) -> (usize, &'static str) {
            match self {
                Path::Avx512 => (16, "avx512f"),
                Path::Avx2 => (8, "avx2+fma"),
                Path::Scalar => (1, "scalar"),
            }
        }

        /// The chains on this path; returns a sum so no chain is dead code.
        fn run(self, seed: f32) -> f32 {
            match self {
                #[cfg(target_arch = "x86_64")]
                // SAFETY: `detect` found AVX-512F on this CPU.
                Path::Avx512 => unsafe { x86::avx512(seed) },
                #[cfg(target_arch = "x86_64")]
                // SAFETY: `detect` found AVX2 and FMA on this CPU.
                Path::Avx2 => unsafe { x86::avx2(seed) },
                _ => {
                    let mut acc = [seed; CHAINS];
                    for _ in 0..ROUNDS {
                        for a in &mut acc {
                            *a = a.mul_add(0.999_999, 1e-7);
                        }
                    }
                    acc.iter().sum()
                }
            }
        }
    }

    /// (flops per second on `threads` threads, best of `repeats`; the path).
    pub fn best_flops(threads: usize, repeats: usize) -> (f64, &'static str) {
        let path = Path::detect();
        let mut best = f64::INFINITY;
        for _ in 0..repeats {
            let start = Instant::now();
            std::thread::scope(|s| {
                for t in 0..threads {
                    s.spawn(move || black_box(path.run(black_box(1.0 + t as f32 * 1e-7))));
                }
            });
            best = best.min(start.elapsed().as_secs_f64());
        }
        let (lanes, name) = path.lanes_and_name();
        let flops = 2.0 * (lanes * CHAINS * ROUNDS * threads) as f64;
        (flops / best, name)
    }

    #[cfg(target_arch = "x86_64")]
    mod x86 {
        use super::{CHAINS, ROUNDS};
        use std::arch::x86_64::*;

        #[target_feature(enable = "avx512f")]
        pub unsafe fn avx512(seed: f32) -> f32 {
            let (m, c) = (_mm512_set1_ps(0.999_999), _mm512_set1_ps(1e-7));
            let mut acc = [_mm512_set1_ps(seed); CHAINS];
            for _ in 0..ROUNDS {
                for a in &mut acc {
                    *a = _mm512_fmadd_ps(*a, m, c);
                }
            }
            acc.iter().map(|&a| _mm512_reduce_add_ps(a)).sum()
        }

        #[target_feature(enable = "avx2,fma")]
        pub unsafe fn avx2(seed: f32) -> f32 {
            let (m, c) = (_mm256_set1_ps(0.999_999), _mm256_set1_ps(1e-7));
            let mut acc = [_mm256_set1_ps(seed); CHAINS];
            for _ in 0..ROUNDS {
                for a in &mut acc {
                    *a = _mm256_fmadd_ps(*a, m, c);
                }
            }
            let (mut lanes, mut total) = ([0f32; 8], 0.0);
            for a in acc {
                // SAFETY: `lanes` holds 8 f32.
                unsafe { _mm256_storeu_ps(lanes.as_mut_ptr(), a) };
                total += lanes.iter().sum::<f32>();
            }
            total
        }
    }
}
