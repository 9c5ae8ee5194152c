//! Device-generic tensor building blocks shared by every op.
//!
//! Masks are `u8` tensors of 0/1 (what candle's comparisons return); ids are
//! `i64`. Everything here is a composition of candle tensor ops, so it runs
//! unchanged on `Device::Cpu` and `Device::Cuda`. Reductions are only used on
//! dtypes candle's CUDA reduce kernels provide (f32, f64, u8, u32, i64).

use candle_core::{D, DType, Device, Result, Tensor};

/// The padding id (CONV-1).
pub const PAD: i64 = -1;

/// `[n]` i64: `0, 1, .., n-1`.
/// The device a tensor of `elements` elements is made on. CUDA cannot
/// allocate zero bytes (`cuMemAlloc` answers `CUDA_ERROR_INVALID_VALUE`;
/// seen on an H100 with candle 0.11 and cudarc 0.19), so a tensor without
/// elements lives on the CPU whatever the backend's device. It holds only a
/// shape: validation reads the shape, or downloads it for the reference to
/// name the defect, and an empty result is returned as it is. No kernel
/// mixes it with device tensors ([`any_of`] skips empty masks).
pub fn home(elements: usize, dev: &Device) -> Device {
    if elements == 0 { Device::Cpu } else { dev.clone() }
}

pub fn ids(n: usize, dev: &Device) -> Result<Tensor> {
    Tensor::arange(0i64, n as i64, dev)
}

/// A rank-0 tensor, broadcast by [`select`] and the `broadcast_*` ops.
pub fn scalar<T: candle_core::WithDType>(v: T, dev: &Device) -> Result<Tensor> {
    Tensor::new(v, dev)
}

/// `cond ? on_true : on_false` elementwise, broadcasting all three.
/// Unlike `cond * a`, a NaN in the branch not taken never leaks (CONV-7).
pub fn select(cond: &Tensor, on_true: &Tensor, on_false: &Tensor) -> Result<Tensor> {
    let shape = cond.shape().broadcast_shape_binary_op(on_true.shape(), "select")?;
    let shape = shape.broadcast_shape_binary_op(on_false.shape(), "select")?;
    cond.broadcast_as(&shape)?.where_cond(&on_true.broadcast_as(&shape)?, &on_false.broadcast_as(&shape)?)
}

pub fn and(a: &Tensor, b: &Tensor) -> Result<Tensor> {
    a.broadcast_mul(b)
}

pub fn or(a: &Tensor, b: &Tensor) -> Result<Tensor> {
    a.broadcast_maximum(b)
}

pub fn not(a: &Tensor) -> Result<Tensor> {
    a.eq(0u8)
}

/// Rank-0 `u8`: 1 if any element of `mask` is set.
pub fn any(mask: &Tensor) -> Result<Tensor> {
    if mask.elem_count() == 0 {
        return scalar(0u8, mask.device());
    }
    mask.flatten_all()?.max(0)
}

/// Rank-0 `u8`: 1 if any element of any mask is set. Empty masks (set
/// nowhere, and possibly on the CPU, see [`home`]) are skipped.
pub fn any_of(masks: &[Tensor]) -> Result<Tensor> {
    let flags = masks.iter().filter(|m| m.elem_count() > 0).map(any).collect::<Result<Vec<_>>>()?;
    if flags.is_empty() {
        return scalar(0u8, &Device::Cpu);
    }
    Tensor::stack(&flags, 0)?.max(0)
}

/// Reads rank-0 flags back with one transfer.
pub fn read_flags(flags: &[Tensor]) -> Result<Vec<bool>> {
    Ok(Tensor::stack(flags, 0)?.to_vec1::<u8>()?.into_iter().map(|f| f != 0).collect())
}

/// Per lane of the last axis: the first position where `mask` is set, or
/// the lane length if none is. `i64`, the last axis removed.
pub fn first_true(mask: &Tensor) -> Result<Tensor> {
    let n = mask.dim(D::Minus1)?;
    select(mask, &ids(n, mask.device())?, &scalar(n as i64, mask.device())?)?.min(D::Minus1)
}

/// Per lane: the first position where `mask` is clear, or the lane length.
/// This is `sum(cumprod(mask))`, the length of the leading run of ones.
pub fn first_false(mask: &Tensor) -> Result<Tensor> {
    first_true(&not(mask)?)
}

/// Per lane: the last position where `mask` is set, or -1.
pub fn last_true(mask: &Tensor) -> Result<Tensor> {
    let n = mask.dim(D::Minus1)?;
    select(mask, &ids(n, mask.device())?, &scalar(-1i64, mask.device())?)?.max(D::Minus1)
}

/// Argmax over the last axis with ties to the lowest id (CONV-8). candle's
/// `argmax` does not promise this (the CUDA kernel's tree reduction keeps
/// whichever tied index a thread met first), so it is built from `max`, `eq`
/// and a `min` over ids. The lane must hold no NaN.
pub fn argmax_lowest(x: &Tensor) -> Result<Tensor> {
    let top = x.max_keepdim(D::Minus1)?;
    first_true(&x.broadcast_eq(&top)?)
}

/// `x[..., idx[...]]` along the last axis: `x [.., n]`, `idx [..]` i64.
pub fn gather_last(x: &Tensor, idx: &Tensor) -> Result<Tensor> {
    let idx = idx.unsqueeze(D::Minus1)?.contiguous()?;
    x.contiguous()?.gather(&idx, D::Minus1)?.squeeze(D::Minus1)
}

/// Row `j[b]` of every batch entry: `x [B, J, V]`, `j [B]` i64 -> `[B, V]`.
pub fn row_select(x: &Tensor, j: &Tensor) -> Result<Tensor> {
    let (b, _, v) = x.dims3()?;
    let idx = j.reshape((b, 1, 1))?.broadcast_as((b, 1, v))?.contiguous()?;
    x.contiguous()?.gather(&idx, 1)?.squeeze(1)
}

/// Inclusive prefix sum over the last axis (Hillis-Steele: log2(n) shifted
/// adds). candle's own `cumsum` multiplies by an `n x n` triangular matrix,
/// which needs O(n^2) memory: 180 GB in f64 for a 150k vocabulary. Each
/// output is a pairwise tree sum, so the rounding error grows with log2(n),
/// not n.
pub fn inclusive_scan(x: &Tensor) -> Result<Tensor> {
    let n = x.dim(D::Minus1)?;
    let mut acc = x.contiguous()?;
    let mut shift = 1;
    while shift < n {
        let shifted = acc.narrow(D::Minus1, 0, n - shift)?.pad_with_zeros(D::Minus1, shift, 0)?;
        acc = (acc + shifted)?;
        shift *= 2;
    }
    Ok(acc)
}

/// Exclusive prefix sum over the last axis: the sum of everything before.
pub fn exclusive_scan(x: &Tensor) -> Result<Tensor> {
    let n = x.dim(D::Minus1)?;
    if n <= 1 {
        return x.zeros_like();
    }
    inclusive_scan(x)?.narrow(D::Minus1, 0, n - 1)?.pad_with_zeros(D::Minus1, 1, 0)
}

/// 1 where the value is NaN or infinite (`!(|x| < inf)` is true for NaN too).
pub fn non_finite(x: &Tensor) -> Result<Tensor> {
    not(&x.abs()?.lt(f64::INFINITY)?)
}

/// 1 where a uniform is outside [0, 1) (NaN included, CONV-3).
pub fn bad_uniform(u: &Tensor) -> Result<Tensor> {
    not(&and(&u.ge(0.0)?, &u.lt(1.0)?)?)
}

/// 1 where exponential noise is outside `[2^-126, 2^126]` (SAMPLE-2).
pub fn bad_exponential(e: &Tensor) -> Result<Tensor> {
    // `!(min <= e <= max)` also flags NaN.
    not(&and(&e.ge(specdec_reference::MIN_EXPONENTIAL)?, &e.le(specdec_reference::MAX_EXPONENTIAL)?)?)
}

/// 1 where an id is outside [0, vocab) (CONV-1).
pub fn bad_id(t: &Tensor, vocab: usize) -> Result<Tensor> {
    let vocab = i64::try_from(vocab).unwrap_or(i64::MAX);
    not(&and(&t.ge(0i64)?, &t.lt(vocab)?)?)
}

/// Float lane sums accumulated in f64 (CONV-9: f32 values, f64 sums).
pub fn sum64(x: &Tensor, keepdim: bool) -> Result<Tensor> {
    let x = x.to_dtype(DType::F64)?;
    if keepdim { x.sum_keepdim(D::Minus1) } else { x.sum(D::Minus1) }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dev() -> Device {
        Device::Cpu
    }

    #[test]
    fn argmax_breaks_ties_to_the_lowest_id() -> Result<()> {
        let x = Tensor::new(&[[1f32, 3., 3., 0.], [f32::NEG_INFINITY, -1., -1., -1.]], &dev())?;
        assert_eq!(argmax_lowest(&x)?.to_vec1::<i64>()?, [1, 1]);
        Ok(())
    }

    #[test]
    fn first_false_is_the_leading_run_length() -> Result<()> {
        let m = Tensor::new(&[[1u8, 1, 0, 1], [1, 1, 1, 1], [0, 1, 1, 1]], &dev())?;
        assert_eq!(first_false(&m)?.to_vec1::<i64>()?, [2, 4, 0]);
        assert_eq!(last_true(&m)?.to_vec1::<i64>()?, [3, 3, 3]);
        Ok(())
    }

    #[test]
    fn scans_match_running_sums() -> Result<()> {
        let x = Tensor::new(&[[1f64, 2., 3., 4., 5.]], &dev())?;
        assert_eq!(inclusive_scan(&x)?.to_vec2::<f64>()?, [[1., 3., 6., 10., 15.]]);
        assert_eq!(exclusive_scan(&x)?.to_vec2::<f64>()?, [[0., 1., 3., 6., 10.]]);
        Ok(())
    }

    #[test]
    fn select_does_not_leak_nan_from_the_branch_not_taken() -> Result<()> {
        let c = Tensor::new(&[1u8, 0], &dev())?;
        let a = Tensor::new(&[f32::NAN, f32::NAN], &dev())?;
        let out = select(&c, &scalar(0f32, &dev())?, &a)?.to_vec1::<f32>()?;
        assert_eq!(out[0], 0.0);
        assert!(out[1].is_nan());
        Ok(())
    }
}
