//! The batched KV cache on the device (KV-1 .. KV-5): keys and values `[B, H, C+1, D]` in
//! f32 and lengths `[B]` in i64, all device-resident. Position `C` is a write-off slot:
//! an append scatters every `[B, T]` source position at once, and the ones past a
//! sequence's count land there instead of needing a ragged write. It is never read.

use specdec_backend::{Backend, BackendError, ReferenceBackend, Result, TrimMode};
use specdec_reference::kvcache::BatchKvCache;
use tch::{Kind, Tensor};

use crate::check;
use crate::kernels::{TResult, arange};
use crate::{TchBackend, TchTensor};

/// A batched KV cache living on the backend's device (KV-1).
pub struct TchKvCache {
    keys: Tensor,
    values: Tensor,
    lens: Tensor,
    /// `[B, H, D, C]` as given to `kv_new`.
    dims: [usize; 4],
    /// The same dims as i64.
    sizes: [i64; 4],
}

impl std::fmt::Debug for TchKvCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let [batch, heads, head_dim, capacity] = self.dims;
        write!(f, "TchKvCache {{ batch: {batch}, heads: {heads}, head_dim: {head_dim}, capacity: {capacity}, device: {:?} }}", self.keys.device())
    }
}

impl TchKvCache {
    /// The lengths `[B]`; replaced, never mutated, so handing out a handle is safe.
    pub(crate) fn lens(&self) -> &Tensor {
        &self.lens
    }

    /// The valid keys and values, each `[B, H, max len, D]`, zero past each length.
    pub(crate) fn contents(&self) -> TResult<(Tensor, Tensor)> {
        let [b, ..] = self.sizes;
        let max = i64::try_from(&self.lens.f_max()?)?;
        let valid = arange(max, &self.lens)?.f_view([1, 1, max, 1])?.f_lt_tensor(&self.lens.f_view([b, 1, 1, 1])?)?;
        let take = |t: &Tensor| t.f_narrow(2, 0, max)?.f_where_scalarother(&valid, 0.0);
        Ok((take(&self.keys)?, take(&self.values)?))
    }
}

/// KV-1: an empty cache; every dimension must be at least 1.
pub(crate) fn new(be: &TchBackend, dims: [usize; 4]) -> Result<TchKvCache> {
    let [batch, heads, head_dim, capacity] = dims;
    if dims.contains(&0) {
        return Err(BackendError::named_by_reference(&be.name(), ReferenceBackend.kv_new(batch, heads, head_dim, capacity)));
    }
    let sizes = dims.map(i64::try_from);
    let [Ok(b), Ok(h), Ok(d), Ok(c)] = sizes else {
        return Err(specdec_backend::BackendError::device(&be.name(), format!("cache dims {dims:?} do not fit i64")));
    };
    let device = be.tch_device();
    let zeros = || Tensor::f_zeros([b, h, c + 1, d], (Kind::Float, device));
    let lens = be.dev(Tensor::f_zeros([b], (Kind::Int64, device)))?;
    Ok(TchKvCache { keys: be.dev(zeros())?, values: be.dev(zeros())?, lens, dims, sizes: [b, h, d, c] })
}

/// The same state as a reference cache, to let the reference name a defect.
fn reference_cache(be: &TchBackend, cache: &TchKvCache) -> Result<BatchKvCache> {
    let [batch, heads, head_dim, capacity] = cache.dims;
    let mut r = ReferenceBackend.kv_new(batch, heads, head_dim, capacity)?;
    let (k, v) = be.kv_contents(cache)?;
    // An empty cache needs no append (and T = 0 appends once panicked in the reference).
    if k.tensor().size()[2] > 0 {
        let lens = TchTensor::new(cache.lens.shallow_clone());
        ReferenceBackend.kv_append(&mut r, &be.ref_tensor(&k)?, &be.ref_tensor(&v)?, &be.ref_tensor(&lens)?)?;
    }
    Ok(r)
}

/// KV-2: writes `new[b, :, t]` at `len_b + t` for `t < counts_b`; nothing changes on error.
pub(crate) fn append(be: &TchBackend, cache: &mut TchKvCache, keys: &TchTensor, values: &TchTensor, counts: &TchTensor) -> Result<()> {
    let (k, v, n) = (be.float(keys, "new_keys")?, be.float(values, "new_values")?, be.int(counts, "counts")?);
    let [b, h, d, cap] = cache.sizes;
    let t = match k.size()[..] {
        [_, _, t, _] if k.size() == [b, h, t, d] && v.size() == [b, h, t, d] && n.size() == [b] => Some(t),
        _ => None,
    };
    let ok = match t {
        Some(t) => be.passes((|| {
            let fits = n.f_add(&cache.lens)?.f_le(cap)?;
            Ok(vec![check::in_range(&n, 0, t)?, fits, k.f_isfinite()?, v.f_isfinite()?])
        })())?,
        None => false,
    };
    let Some(t) = t.filter(|_| ok) else {
        let r = (|| {
            let mut r = reference_cache(be, cache)?;
            ReferenceBackend.kv_append(&mut r, &be.ref_tensor(keys)?, &be.ref_tensor(values)?, &be.ref_tensor(counts)?)
        })();
        return Err(BackendError::named_by_reference(&be.name(), r));
    };
    be.dev((|| {
        let j = arange(t, &n)?.f_unsqueeze(0)?;
        // Every sequence writes at its own length; positions past its count go to slot C.
        let at = cache.lens.f_unsqueeze(1)?.f_add(&j)?.f_where_scalarother(&j.f_lt_tensor(&n.f_unsqueeze(1)?)?, cap)?;
        let at = at.f_view([b, 1, t, 1])?.f_expand([b, h, t, d], false)?;
        // In place (the returned handles alias the cache): an append costs O(B H T D).
        let _ = cache.keys.f_scatter_(2, &at, &k)?;
        let _ = cache.values.f_scatter_(2, &at, &v)?;
        cache.lens = cache.lens.f_add(&n)?;
        Ok(())
    })())
}

/// KV-3 .. KV-5: returns the amounts trimmed `[B]`; nothing changes on error.
pub(crate) fn trim(be: &TchBackend, cache: &mut TchKvCache, amounts: &TchTensor, mode: TrimMode) -> Result<TchTensor> {
    let a = be.int(amounts, "amounts")?;
    let ok = a.size() == [cache.sizes[0]]
        && be.passes((|| {
            let mut c = vec![a.f_ge(0)?];
            if mode == TrimMode::Strict {
                c.push(a.f_le_tensor(&cache.lens)?);
            }
            Ok(c)
        })())?;
    if !ok {
        let r = (|| {
            let mut r = reference_cache(be, cache)?;
            ReferenceBackend.kv_trim(&mut r, &be.ref_tensor(amounts)?, mode)
        })();
        return Err(BackendError::named_by_reference(&be.name(), r));
    }
    let cut = match mode {
        TrimMode::Strict => a,
        TrimMode::Clamped => be.dev(a.f_minimum(&cache.lens))?,
    };
    cache.lens = be.dev(cache.lens.f_sub(&cut))?;
    Ok(TchTensor::new(cut))
}
