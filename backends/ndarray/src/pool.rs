//! A small cache of large f32 buffers, so that `ndarray-f32`'s per-call
//! outputs (probabilities, reshaped copies) reuse memory already mapped
//! instead of faulting in fresh zeroed pages on every verify.
//!
//! Why: a verify from logits at batch 32 writes about 40 MB of outputs per
//! call. The C allocator serves blocks that size from fresh `mmap`s and
//! returns them on free, so every call paid a page fault per 4 KiB; that was
//! two thirds of the call (measured: 26.7 ms against 8.7 ms with the
//! allocator told to keep its memory). Torch's CPU path meets the same
//! faults; HF's verify dodges them by working one sequence at a time.
//!
//! Invariants: a buffer handed out has exactly the length asked for and
//! arbitrary (initialised) contents, so the caller must write every element;
//! only allocations of at least [`MIN_LEN`] values are kept, at most
//! [`MAX_BUFFERS`] of them and [`MAX_VALUES`] values of capacity in all, so
//! the cache never holds more than 1 GiB. A buffer grows only through
//! `resize`, so no uninitialised value is exposed.

use std::sync::Mutex;

/// Below this (1 MiB of f32) the allocator's own free lists do the job.
const MIN_LEN: usize = 1 << 18;
const MAX_BUFFERS: usize = 8;
const MAX_VALUES: usize = 1 << 28;

static POOL: Mutex<Vec<Vec<f32>>> = Mutex::new(Vec::new());

/// A buffer of `len` values with arbitrary contents: the smallest cached one
/// whose allocation holds them (grown within it by zeros where it was
/// truncated shorter: its pages are mapped already), else a fresh zeroed one.
pub(crate) fn take(len: usize) -> Vec<f32> {
    if len >= MIN_LEN {
        let mut pool = POOL.lock().unwrap_or_else(|e| e.into_inner());
        let best = pool.iter().enumerate().filter(|(_, b)| b.capacity() >= len).min_by_key(|(_, b)| b.capacity()).map(|(i, _)| i);
        if let Some(i) = best {
            let mut buffer = pool.remove(i);
            buffer.resize(len, 0.0);
            return buffer;
        }
    }
    vec![0.0; len]
}

/// Returns a buffer to the cache (or to the allocator, when it is small;
/// when the cache is full, the buffers returned longest ago go first, so a
/// workload whose shapes change keeps the buffers of its current shape).
pub(crate) fn give(buffer: Vec<f32>) {
    if buffer.capacity() < MIN_LEN || buffer.capacity() > MAX_VALUES {
        return;
    }
    let mut pool = POOL.lock().unwrap_or_else(|e| e.into_inner());
    pool.push(buffer);
    while pool.len() > MAX_BUFFERS || pool.iter().map(Vec::capacity).sum::<usize>() > MAX_VALUES {
        pool.remove(0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One test, as the pool is global: lengths, the small-buffer bypass,
    /// and that a full cache drops the buffers returned longest ago (so a
    /// new, larger shape is not starved by the old shape's buffers).
    #[test]
    fn the_pool_hands_out_exact_lengths_and_keeps_the_recent_buffers() {
        let big = MIN_LEN + 5;
        give(vec![1.0; big]);
        let again = take(big - 3);
        assert_eq!(again.len(), big - 3);
        assert!(again.iter().all(|&x| x == 1.0), "a cached buffer, truncated");
        give(again);
        let grown = take(big);
        assert_eq!(grown.len(), big, "a truncated buffer serves its whole allocation again");
        assert!(grown[..big - 3].iter().all(|&x| x == 1.0));
        give(vec![2.0; 10]);
        assert_eq!(take(10), vec![0.0; 10]);
        for _ in 0..MAX_BUFFERS {
            give(vec![3.0; MIN_LEN]);
        }
        give(vec![4.0; 4 * MIN_LEN]);
        let larger = take(4 * MIN_LEN);
        assert!(larger.iter().all(|&x| x == 4.0), "the newest buffer was dropped");
        assert!(POOL.lock().unwrap().len() <= MAX_BUFFERS);
    }
}
