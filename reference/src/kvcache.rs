//! A batched KV cache with per-sequence lengths, its trims, the rollback
//! rules of a verify step, and the paged gather (KV-1 .. KV-9).

use crate::error::{Result, SpecError};
use crate::tensor::Tensor;
use crate::validate;

/// KV-1: keys and values `[B, H, C, D]`; sequence `b` owns positions
/// `0..len[b]` of every head. Positions past `len[b]` are never read.
#[derive(Debug, Clone, PartialEq)]
pub struct BatchKvCache {
    batch: usize,
    heads: usize,
    head_dim: usize,
    capacity: usize,
    keys: Vec<f64>,
    values: Vec<f64>,
    lens: Vec<usize>,
}

impl BatchKvCache {
    /// An empty cache; every dimension must be at least 1.
    pub fn new(batch: usize, heads: usize, head_dim: usize, capacity: usize) -> Result<Self> {
        for (name, v) in [("batch", batch), ("heads", heads), ("head_dim", head_dim), ("capacity", capacity)] {
            if v == 0 {
                return Err(SpecError::param(name, v, "must be >= 1"));
            }
        }
        let n = [heads, capacity, head_dim].iter().try_fold(batch, |n, &d| n.checked_mul(d));
        let Some(n) = n.filter(|&n| n.checked_mul(2 * size_of::<f64>()).is_some()) else {
            return Err(SpecError::param("capacity", capacity, "the cache size overflows"));
        };
        let alloc = || {
            let mut v = Vec::new();
            v.try_reserve_exact(n).map_err(|_| SpecError::param("capacity", capacity, "the cache does not fit in memory"))?;
            v.resize(n, 0.0);
            Ok::<_, SpecError>(v)
        };
        Ok(BatchKvCache { batch, heads, head_dim, capacity, keys: alloc()?, values: alloc()?, lens: vec![0; batch] })
    }

    pub fn lens(&self) -> &[usize] {
        &self.lens
    }

    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// `(B, H, D)`.
    pub fn dims(&self) -> (usize, usize, usize) {
        (self.batch, self.heads, self.head_dim)
    }

    fn offset(&self, b: usize, h: usize, pos: usize) -> usize {
        ((b * self.heads + h) * self.capacity + pos) * self.head_dim
    }

    /// The valid keys and values of sequence `b`, each `[H, len, D]`.
    pub fn sequence(&self, b: usize) -> Option<(Tensor<f64>, Tensor<f64>)> {
        let len = *self.lens.get(b)?;
        let take = |store: &[f64]| {
            let mut out = Vec::with_capacity(self.heads * len * self.head_dim);
            for h in 0..self.heads {
                let o = self.offset(b, h, 0);
                out.extend_from_slice(&store[o..o + len * self.head_dim]);
            }
            Tensor::new(vec![self.heads, len, self.head_dim], out).expect("shape matches data")
        };
        Some((take(&self.keys), take(&self.values)))
    }

    /// KV-2: appends `counts[b]` positions of `new_keys`/`new_values`
    /// `[B, H, T, D]` at each sequence's own length (no shared write cursor).
    pub fn append(&mut self, new_keys: &Tensor<f64>, new_values: &Tensor<f64>, counts: &Tensor<i64>) -> Result<()> {
        let dims = validate::rank("new_keys", new_keys.shape(), 4, "[B, H, T, D]")?;
        let t = dims[2];
        let want = [self.batch, self.heads, t, self.head_dim];
        validate::shape("new_keys", new_keys.shape(), &want, "[B, H, T, D]")?;
        validate::shape("new_values", new_values.shape(), &want, "[B, H, T, D]")?;
        validate::shape("counts", counts.shape(), &[self.batch], "[B]")?;
        for (b, &c) in counts.data().iter().enumerate() {
            if c < 0 || c as u64 > t as u64 {
                return Err(SpecError::LengthOutOfRange { arg: "counts", seq: b, len: c, max: t });
            }
            if self.lens[b] + c as usize > self.capacity {
                return Err(SpecError::CapacityExceeded { seq: b, len: self.lens[b], add: c, capacity: self.capacity });
            }
        }
        for (arg, x) in [("new_keys", new_keys), ("new_values", new_values)] {
            if let Some(i) = x.data().iter().position(|v| !v.is_finite()) {
                let index = crate::tensor::unravel(x.shape(), i);
                return Err(SpecError::NonFinite { arg, index, value: x.data()[i] });
            }
        }
        for b in 0..self.batch {
            let c = *counts.at(&[b]) as usize;
            if c == 0 {
                continue; // also covers T = 0, where no source offset exists
            }
            for h in 0..self.heads {
                let src = new_keys.offset(&[b, h, 0, 0]).expect("validated");
                let dst = self.offset(b, h, self.lens[b]);
                let n = c * self.head_dim;
                self.keys[dst..dst + n].copy_from_slice(&new_keys.data()[src..src + n]);
                self.values[dst..dst + n].copy_from_slice(&new_values.data()[src..src + n]);
            }
            self.lens[b] += c;
        }
        Ok(())
    }

    /// KV-3: trims `n` positions from every sequence; strict (KV-3).
    pub fn trim_uniform(&mut self, n: i64) -> Result<()> {
        let amounts = Tensor::from_vec(vec![n; self.batch]);
        self.trim_variable(&amounts)
    }

    /// KV-4: trims `amounts[b]` positions from sequence `b`; an amount beyond
    /// the length is an error and nothing is trimmed.
    pub fn trim_variable(&mut self, amounts: &Tensor<i64>) -> Result<()> {
        let amounts = self.trim_amounts(amounts)?;
        for (b, &a) in amounts.iter().enumerate() {
            if a > self.lens[b] as u64 {
                return Err(SpecError::TrimBeyondLength { seq: b, len: self.lens[b], trim: a as i64 });
            }
        }
        for (len, a) in self.lens.iter_mut().zip(amounts) {
            *len -= a as usize;
        }
        Ok(())
    }

    /// KV-5: mlx-lm semantics: trims `min(amounts[b], len[b])` and returns
    /// what was actually trimmed, so a clamp is never silent.
    pub fn trim_clamped(&mut self, amounts: &Tensor<i64>) -> Result<Vec<usize>> {
        let amounts = self.trim_amounts(amounts)?;
        Ok(self
            .lens
            .iter_mut()
            .zip(amounts)
            .map(|(len, a)| {
                let cut = (a.min(*len as u64)) as usize;
                *len -= cut;
                cut
            })
            .collect())
    }

    fn trim_amounts(&self, amounts: &Tensor<i64>) -> Result<Vec<u64>> {
        validate::shape("amounts", amounts.shape(), &[self.batch], "[B]")?;
        amounts.data().iter().enumerate().map(|(b, &a)| if a < 0 { Err(SpecError::TrimBeyondLength { seq: b, len: self.lens[b], trim: a }) } else { Ok(a as u64) }).collect()
    }
}

/// KV-6: positions to trim after a verify forward that appended, for each
/// sequence, its last token plus its `proposal_lens[b]` drafts: every
/// rejected draft, `proposal_lens[b] - num_accepted[b]`. The kept positions
/// are the last token and the accepted drafts; the correction or bonus token
/// is not in the cache yet (it is the next step's input).
pub fn rollback_amounts(proposal_lens: &[usize], num_accepted: &[usize]) -> Result<Vec<usize>> {
    validate::shape("num_accepted", &[num_accepted.len()], &[proposal_lens.len()], "[B]")?;
    proposal_lens
        .iter()
        .zip(num_accepted)
        .enumerate()
        .map(|(b, (&len, &n))| if n > len { Err(SpecError::LengthOutOfRange { arg: "num_accepted", seq: b, len: n as i64, max: len }) } else { Ok(len - n) })
        .collect()
}

/// KV-7: the min-accepted uniform strategy (seed 001, Phase 1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MinAcceptedPlan {
    /// Every sequence emits its first `emit` tokens of the verify output.
    pub emit: usize,
    /// One uniform trim of the padded verify width minus the kept positions.
    pub uniform_trim: usize,
}

/// KV-7 for a verify forward of padded width `width` (= max proposal + 1).
pub fn min_accepted_plan(num_accepted: &[usize], width: usize) -> Result<MinAcceptedPlan> {
    let Some(&m) = num_accepted.iter().min() else {
        return Err(SpecError::EmptyBatch { arg: "num_accepted" });
    };
    if let Some((b, &n)) = num_accepted.iter().enumerate().find(|&(_, &n)| n + 1 > width) {
        return Err(SpecError::LengthOutOfRange { arg: "num_accepted", seq: b, len: n as i64, max: width.saturating_sub(1) });
    }
    Ok(MinAcceptedPlan { emit: m + 1, uniform_trim: width - (m + 1) })
}

/// KV-8/9: gathers contiguous K (or V) from a paged pool, seed 002's extractor
/// with every index checked.
///
/// * `pages` `[P, S, H, D]`: `P` pages of `S` positions.
/// * `block_table` `[B, M]`: page ids in use order; slots past the needed
///   `ceil(len / S)` are not read (PAD there is fine).
/// * `context_lens` `[B]`: in `[1, M * S]`.
///
/// Returns `[B, max(len), H, D]`, zero beyond each sequence's length.
pub fn gather_paged(pages: &Tensor<f64>, block_table: &Tensor<i64>, context_lens: &Tensor<i64>) -> Result<Tensor<f64>> {
    let dims = validate::rank("pages", pages.shape(), 4, "[P, S, H, D]")?;
    let (num_pages, page, heads, head_dim) = (dims[0], dims[1], dims[2], dims[3]);
    for (name, v) in [("page_size", page), ("heads", heads), ("head_dim", head_dim)] {
        if v == 0 {
            return Err(SpecError::param(name, v, "must be >= 1"));
        }
    }
    let bt = validate::rank("block_table", block_table.shape(), 2, "[B, M]")?;
    let (batch, slots) = (bt[0], bt[1]);
    if batch == 0 {
        return Err(SpecError::EmptyBatch { arg: "block_table" });
    }
    validate::shape("context_lens", context_lens.shape(), &[batch], "[B]")?;
    let mut lens = Vec::with_capacity(batch);
    for (b, &len) in context_lens.data().iter().enumerate() {
        if len == 0 {
            return Err(SpecError::EmptyContext { arg: "context_lens", seq: b });
        }
        let max = slots.saturating_mul(page);
        if len < 0 || len as u64 > max as u64 {
            return Err(SpecError::LengthOutOfRange { arg: "context_lens", seq: b, len, max });
        }
        let len = len as usize;
        for slot in 0..len.div_ceil(page) {
            let block = *block_table.at(&[b, slot]);
            if block < 0 || block as u64 >= num_pages as u64 {
                // Seed 002 indexed with this id: -1 silently read the last page.
                return Err(SpecError::InvalidBlock { seq: b, slot, block, num_pages });
            }
        }
        lens.push(len);
    }
    if let Some(i) = pages.data().iter().position(|v| !v.is_finite()) {
        return Err(SpecError::NonFinite { arg: "pages", index: crate::tensor::unravel(pages.shape(), i), value: pages.data()[i] });
    }

    let max_len = lens.iter().copied().max().unwrap_or(0);
    let row = heads * head_dim; // bounded: `pages` holds at least this many values
    let Some(size) = batch.checked_mul(max_len).and_then(|n| n.checked_mul(row)) else {
        return Err(SpecError::param("context_lens", max_len, "the gathered tensor size overflows"));
    };
    let mut out = vec![0.0; size];
    for (b, &len) in lens.iter().enumerate() {
        for pos in 0..len {
            let block = *block_table.at(&[b, pos / page]) as usize;
            let src = pages.offset(&[block, pos % page, 0, 0]).expect("validated");
            let dst = (b * max_len + pos) * row;
            out[dst..dst + row].copy_from_slice(&pages.data()[src..src + row]);
        }
    }
    Tensor::new(vec![batch, max_len, heads, head_dim], out)
}
