//! A small cache of large float buffers, so that per-call outputs
//! (`ndarray-f32`'s probabilities and reshaped copies, the forward's logits
//! in both ports) reuse memory already mapped instead of faulting in fresh
//! zeroed pages on every call.
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
//! only allocations of at least [`MIN_BYTES`] are kept, at most
//! [`MAX_BUFFERS`] of them and [`MAX_BYTES`] of capacity in all, per element
//! type, so the caches never hold more than 1 GiB each. A 9-token window's
//! logits over a 49152-token vocabulary are 1.8 MB in f32: allocated fresh,
//! their page faults cost the window more than its attention did. A buffer grows only through
//! `resize`, so no uninitialised value is exposed.

use std::sync::Mutex;

/// Below this (1 MiB) the allocator's own free lists do the job.
const MIN_BYTES: usize = 1 << 20;
const MAX_BUFFERS: usize = 8;
/// The capacity one element type's cache may hold in all (1 GiB).
const MAX_BYTES: usize = 1 << 30;

/// The element types with a cache: f32 (`ndarray-f32`'s outputs) and f64
/// (the forward's widened logits in the f64 port).
pub(crate) trait Pooled: Copy + Default + Send + 'static {
    fn cache() -> &'static Mutex<Vec<Vec<Self>>>;
}

impl Pooled for f32 {
    fn cache() -> &'static Mutex<Vec<Vec<f32>>> {
        static CACHE: Mutex<Vec<Vec<f32>>> = Mutex::new(Vec::new());
        &CACHE
    }
}

impl Pooled for f64 {
    fn cache() -> &'static Mutex<Vec<Vec<f64>>> {
        static CACHE: Mutex<Vec<Vec<f64>>> = Mutex::new(Vec::new());
        &CACHE
    }
}

fn min_len<T>() -> usize {
    MIN_BYTES / size_of::<T>()
}

fn max_len<T>() -> usize {
    MAX_BYTES / size_of::<T>()
}

/// A buffer of `len` values with arbitrary contents: the smallest cached one
/// whose allocation holds them (grown within it by zeros where it was
/// truncated shorter: its pages are mapped already), else a fresh zeroed one.
pub(crate) fn take<T: Pooled>(len: usize) -> Vec<T> {
    if len >= min_len::<T>() {
        let mut pool = T::cache().lock().unwrap_or_else(|e| e.into_inner());
        let best = pool.iter().enumerate().filter(|(_, b)| b.capacity() >= len).min_by_key(|(_, b)| b.capacity()).map(|(i, _)| i);
        if let Some(i) = best {
            let mut buffer = pool.remove(i);
            buffer.resize(len, T::default());
            return buffer;
        }
    }
    vec![T::default(); len]
}

/// Returns a buffer to the cache (or to the allocator, when it is small;
/// when the cache is full, the buffers returned longest ago go first, so a
/// workload whose shapes change keeps the buffers of its current shape).
pub(crate) fn give<T: Pooled>(buffer: Vec<T>) {
    if buffer.capacity() < min_len::<T>() || buffer.capacity() > max_len::<T>() {
        return;
    }
    let mut pool = T::cache().lock().unwrap_or_else(|e| e.into_inner());
    pool.push(buffer);
    while pool.len() > MAX_BUFFERS || pool.iter().map(Vec::capacity).sum::<usize>() > max_len::<T>() {
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
        const MIN_LEN: usize = MIN_BYTES / 4;
        let big = MIN_LEN + 5;
        give(vec![1.0f32; big]);
        let again = take::<f32>(big - 3);
        assert_eq!(again.len(), big - 3);
        assert!(again.iter().all(|&x| x == 1.0), "a cached buffer, truncated");
        give(again);
        let grown = take::<f32>(big);
        assert_eq!(grown.len(), big, "a truncated buffer serves its whole allocation again");
        assert!(grown[..big - 3].iter().all(|&x| x == 1.0));
        give(vec![2.0f32; 10]);
        assert_eq!(take::<f32>(10), vec![0.0; 10]);
        for _ in 0..MAX_BUFFERS {
            give(vec![3.0f32; MIN_LEN]);
        }
        give(vec![4.0f32; 4 * MIN_LEN]);
        let larger = take::<f32>(4 * MIN_LEN);
        assert!(larger.iter().all(|&x| x == 4.0), "the newest buffer was dropped");
        assert!(f32::cache().lock().unwrap().len() <= MAX_BUFFERS);
    }
}
