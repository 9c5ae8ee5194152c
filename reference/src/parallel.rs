//! Splitting independent work across the machine's cores: the one thread
//! split of the host forwards (the f64 reference forward's projections, the
//! f32 DFlash drafter's few-row products), of the ndarray port's row kernels,
//! and the core count the n-gram index's bulk build reads.
//!
//! Invariant: each output row is computed by exactly one thread, from inputs
//! no thread writes, so results never depend on the split or the core count.

use std::sync::OnceLock;

/// The machine's cores, read once (`available_parallelism` may query the OS
/// on every call, too slow for a per-step hot path).
pub fn cores() -> usize {
    static CORES: OnceLock<usize> = OnceLock::new();
    *CORES.get_or_init(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
}

/// Threads for `work` units when a thread only pays for itself above
/// `min_per_thread` of them: between 1 and the cores.
pub fn threads_for(work: usize, min_per_thread: usize) -> usize {
    (work / min_per_thread.max(1)).clamp(1, cores())
}

/// `f(first_row, rows)` over `out`, a row-major array of rows of `row_len`
/// values, split into at most `threads` contiguous runs of whole rows, one
/// per scoped thread (no thread is spawned for a single run).
pub fn split_rows<T: Send>(out: &mut [T], row_len: usize, threads: usize, f: impl Fn(usize, &mut [T]) + Sync) {
    let rows = out.len() / row_len.max(1);
    let per = rows.div_ceil(threads.max(1)).max(1);
    if per >= rows {
        f(0, out);
        return;
    }
    std::thread::scope(|s| {
        for (i, part) in out.chunks_mut(per * row_len).enumerate() {
            let f = &f;
            s.spawn(move || f(i * per, part));
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every row is visited once, with its own index, whatever the split.
    #[test]
    fn split_rows_covers_each_row_once() {
        for (rows, threads) in [(0, 2), (1, 4), (7, 2), (7, 3), (8, 8), (5, 1)] {
            let mut out = vec![0usize; rows * 3];
            split_rows(&mut out, 3, threads, |first, part| {
                for (i, row) in part.chunks_mut(3).enumerate() {
                    row.iter_mut().for_each(|v| *v += first + i + 1);
                }
            });
            assert_eq!(out, (0..rows).flat_map(|r| [r + 1; 3]).collect::<Vec<_>>(), "{rows} rows, {threads} threads");
        }
        assert_eq!(threads_for(0, 10), 1);
    }
}
