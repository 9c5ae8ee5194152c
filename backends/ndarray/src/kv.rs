//! The batched KV cache (KV-1 .. KV-5) and the paged gather (KV-8/9).
//!
//! Appends scatter by gathering: every cache position computes which new
//! position (if any) lands on it, then one `select` and one `where` write
//! all sequences at their own lengths at once.

use ndarray::{Array1, Array3, Array4, ArrayD, ArrayView1, ArrayView2, ArrayView4, Axis, Ix4, Zip, s};
use specdec_backend::{BackendError, Result, TrimMode};
use specdec_reference::Tensor;
use specdec_reference::kvcache::BatchKvCache;

use crate::check::{all_finite, d1, d2, dims, lens_in};
use crate::kernels::{arange, below};
use crate::tensor::NAME;
use crate::tensor::{device, host};

/// KV-1: keys and values `[B, H, C, D]` with per-sequence lengths.
#[derive(Debug, Clone, PartialEq)]
pub struct NdKvCache {
    keys: Array4<f64>,
    values: Array4<f64>,
    lens: Array1<usize>,
}

fn d4<T>(a: &ArrayD<T>) -> Option<ArrayView4<'_, T>> {
    dims::<T, Ix4>(a)
}

impl NdKvCache {
    /// An empty cache; every dimension must be at least 1.
    pub(crate) fn new(batch: usize, heads: usize, head_dim: usize, capacity: usize) -> Result<Self> {
        if [batch, heads, head_dim, capacity].contains(&0) {
            return Err(BackendError::named_by_reference(NAME, BatchKvCache::new(batch, heads, head_dim, capacity).map_err(BackendError::from)));
        }
        // `Array4::zeros` panics when the element count overflows and aborts
        // when it cannot allocate: both are input defects here, answered as
        // the reference answers them (ERR-1, KV-1).
        let too_big = |reason| BackendError::from(specdec_reference::SpecError::InvalidParameter { name: "capacity", value: capacity.to_string(), reason });
        let n = [heads, capacity, head_dim].iter().try_fold(batch, |n, &d| n.checked_mul(d));
        let Some(n) = n.filter(|&n| n.checked_mul(2 * size_of::<f64>()).is_some_and(|b| b <= isize::MAX as usize)) else {
            return Err(too_big("the cache size overflows"));
        };
        let alloc = || {
            let mut v = Vec::new();
            v.try_reserve_exact(n).map_err(|_| too_big("the cache does not fit in memory"))?;
            v.resize(n, 0.0);
            Array4::from_shape_vec((batch, heads, capacity, head_dim), v).map_err(|e| BackendError::device("ndarray", e.to_string()))
        };
        Ok(NdKvCache { keys: alloc()?, values: alloc()?, lens: Array1::zeros(batch) })
    }

    pub(crate) fn lens(&self) -> Array1<i64> {
        self.lens.mapv(|n| n as i64)
    }

    /// A reference cache with the same dims and lengths, to name a defect.
    fn replica(&self) -> Result<BatchKvCache> {
        let (batch, heads, capacity, dim) = self.keys.dim();
        let mut cache = BatchKvCache::new(batch, heads, dim, capacity)?;
        let longest = self.lens.fold(0, |m, &n| m.max(n));
        // An empty cache needs no append: it is as built.
        if longest > 0 {
            let zeros = Tensor::full(vec![batch, heads, longest, dim], 0.0);
            cache.append(&zeros, &zeros, &Tensor::from_vec(self.lens().to_vec()))?;
        }
        Ok(cache)
    }

    fn append_ok(&self, keys: &ArrayD<f64>, values: &ArrayD<f64>, counts: &ArrayD<i64>) -> bool {
        let (batch, heads, capacity, dim) = self.keys.dim();
        let Some(k) = d4(keys) else { return false };
        let t = k.dim().2;
        let shapes = k.dim() == (batch, heads, t, dim) && values.shape() == keys.shape();
        let counts_ok = lens_in(counts, batch, 0, t).is_some_and(|c| Zip::from(&c).and(&self.lens).all(|&c, &len| len + c <= capacity));
        shapes && counts_ok && all_finite(keys) && all_finite(values)
    }

    /// KV-2: validates everything, then writes each sequence at its own length.
    pub(crate) fn append(&mut self, keys: &ArrayD<f64>, values: &ArrayD<f64>, counts: &ArrayD<i64>) -> Result<()> {
        if !self.append_ok(keys, values, counts) {
            let named = self.replica()?.append(&host(keys), &host(values), &host(counts));
            return Err(BackendError::named_by_reference(NAME, named.map_err(BackendError::from)));
        }
        let (k, v) = (d4(keys).ok_or_else(|| device("keys lost rank 4"))?, d4(values).ok_or_else(|| device("values lost rank 4"))?);
        let counts = d1(counts).ok_or_else(|| device("counts lost rank 1"))?.mapv(|c| c as usize);
        if k.dim().2 > 0 {
            let src = self.sources(counts.view(), k.dim().2);
            write(&mut self.keys, k, &src);
            write(&mut self.values, v, &src);
        }
        self.lens += &counts;
        Ok(())
    }

    /// For every cache position, the index of the new `[B*H*T]` row that
    /// lands on it, or `None` (KV-2: position `len_b + t` takes `new[b, :, t]`).
    fn sources(&self, counts: ArrayView1<'_, usize>, t: usize) -> Array3<Option<usize>> {
        let (batch, heads, capacity, _) = self.keys.dim();
        let pos = arange(capacity);
        let grid = pos.broadcast((batch, capacity)).expect("a row broadcasts to any number of rows");
        let offset = Zip::from(grid).and_broadcast(self.lens.view().insert_axis(Axis(1))).and_broadcast(counts.insert_axis(Axis(1))).map_collect(|&p, &len, &c| p.checked_sub(len).filter(|&o| o < c));
        Array3::from_shape_fn((batch, heads, capacity), |(b, h, p)| offset[[b, p]].map(|o| (b * heads + h) * t + o))
    }

    fn trim_ok(&self, amounts: &ArrayD<i64>, mode: TrimMode) -> bool {
        let Some(a) = d1(amounts).filter(|a| a.len() == self.lens.len()) else { return false };
        Zip::from(&a).and(&self.lens).all(|&a, &len| a >= 0 && (mode == TrimMode::Clamped || a as u64 <= len as u64))
    }

    /// KV-3 .. KV-5: returns the amounts trimmed.
    pub(crate) fn trim(&mut self, amounts: &ArrayD<i64>, mode: TrimMode) -> Result<Array1<i64>> {
        if !self.trim_ok(amounts, mode) {
            let mut replica = self.replica()?;
            let amounts = host(amounts);
            let named = match mode {
                TrimMode::Strict => replica.trim_variable(&amounts),
                TrimMode::Clamped => replica.trim_clamped(&amounts).map(drop),
            };
            return Err(BackendError::named_by_reference(NAME, named.map_err(BackendError::from)));
        }
        let a = d1(amounts).ok_or_else(|| device("amounts lost rank 1"))?;
        let cut = Zip::from(&a).and(&self.lens).map_collect(|&a, &len| (a as usize).min(len));
        self.lens -= &cut;
        Ok(cut.mapv(|c| c as i64))
    }

    /// The valid keys and values, `[B, H, max len, D]`, zero past each length.
    pub(crate) fn contents(&self) -> (Array4<f64>, Array4<f64>) {
        let longest = self.lens.fold(0, |m, &n| m.max(n));
        let live = below(self.lens.view(), longest);
        let live = live.view().insert_axis(Axis(1));
        let live = live.insert_axis(Axis(3));
        let take = |store: &Array4<f64>| Zip::from(store.slice(s![.., .., ..longest, ..])).and_broadcast(live).map_collect(|&x, &l| if l { x } else { 0.0 });
        (take(&self.keys), take(&self.values))
    }
}

/// Writes `new [B, H, T, D]` into `store [B, H, C, D]` where `src` names a row.
fn write(store: &mut Array4<f64>, new: ArrayView4<'_, f64>, src: &Array3<Option<usize>>) {
    let (b, h, t, d) = new.dim();
    let capacity = store.dim().2;
    let rows = new.to_shape((b * h * t, d)).expect("same element count");
    let index: Vec<usize> = src.iter().map(|s| s.unwrap_or(0)).collect();
    let gathered = rows.select(Axis(0), &index).into_shape_with_order((b, h, capacity, d)).expect("one row per position");
    Zip::from(store).and(&gathered).and_broadcast(src.view().insert_axis(Axis(3))).for_each(|x, &g, s| {
        if s.is_some() {
            *x = g;
        }
    });
}

/// KV-8/9 fast check: returns the context lengths when valid.
pub(crate) fn paged_ok(pages: &ArrayD<f64>, table: &ArrayD<i64>, lens: &ArrayD<i64>) -> Option<Array1<usize>> {
    let (num_pages, page, heads, dim) = d4(pages)?.dim();
    let t = d2(table)?;
    let (batch, slots) = t.dim();
    if page == 0 || heads == 0 || dim == 0 || batch == 0 {
        return None;
    }
    let lens = lens_in(lens, batch, 1, slots * page)?;
    // Only the first ceil(len / S) slots are read; PAD beyond them is fine.
    let needed = below(lens.mapv(|n| n.div_ceil(page)).view(), slots);
    let blocks_ok = Zip::from(&t).and(&needed).all(|&blk, &n| !n || (blk >= 0 && (blk as u64) < num_pages as u64));
    (blocks_ok && all_finite(pages)).then_some(lens)
}

/// KV-8: `[B, max len, H, D]`; position `t` of `b` from page
/// `table[b, t / S]`, offset `t mod S`; zeros past each length.
pub(crate) fn paged_gather(pages: ArrayView4<'_, f64>, table: ArrayView2<'_, i64>, lens: ArrayView1<'_, usize>) -> Array4<f64> {
    let (num_pages, page, heads, dim) = pages.dim();
    let batch = table.nrows();
    let longest = lens.fold(0, |m, &n| m.max(n));
    let pos = arange(longest);
    let slots = pos.mapv(|t| t / page).to_vec();
    let blocks = table.select(Axis(1), &slots);
    let live = below(lens, longest);
    let rows = Zip::from(&blocks).and_broadcast(pos.view().insert_axis(Axis(0))).and(&live).map_collect(|&blk, &t, &l| if l { blk as usize * page + t % page } else { 0 });
    let flat = pages.to_shape((num_pages * page, heads * dim)).expect("same element count");
    let index: Vec<usize> = rows.iter().copied().collect();
    let gathered = flat.select(Axis(0), &index).into_shape_with_order((batch, longest, heads, dim)).expect("one row per position");
    let live = live.view().insert_axis(Axis(2));
    Zip::from(&gathered).and_broadcast(live.insert_axis(Axis(3))).map_collect(|&x, &l| if l { x } else { 0.0 })
}
