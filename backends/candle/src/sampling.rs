//! Drawing tokens (SAMPLE-1/2), the residual op (RESID-1 .. RESID-3) and
//! temperature / top-k / top-p (LOGITS-2 .. LOGITS-6) on validated input.

use candle_core::{D, DType, Result, Tensor};

use crate::kernels::{and, argmax_lowest, exclusive_scan, first_true, gather_last, ids, inclusive_scan, last_true, not, or, scalar, select};

/// SAMPLE-1 row-wise: `w [R, V]` (any float dtype), `v [R]` -> `[R]` i64,
/// the smallest `i` with `v * S < C_i`, else the last positive-weight id.
///
/// The running sums are f64 tree sums. In exact arithmetic the first such
/// `i` has `w_i > 0`; requiring it explicitly keeps rounding in the sums from
/// ever drawing a zero-weight id.
pub fn inverse_cdf(w: &Tensor, v: &Tensor) -> Result<Tensor> {
    let w = w.to_dtype(DType::F64)?;
    let n = w.dim(D::Minus1)?;
    let c = inclusive_scan(&w)?;
    let total = c.narrow(D::Minus1, n - 1, 1)?;
    let target = v.to_dtype(DType::F64)?.unsqueeze(1)?.broadcast_mul(&total)?;
    let positive = w.gt(0.0)?;
    let first = first_true(&and(&c.broadcast_gt(&target)?, &positive)?)?;
    // `v * S` rounded up to `S`: no C_i exceeds it.
    select(&first.eq(n as i64)?, &last_true(&positive)?, &first)
}

/// SAMPLE-2 row-wise: `argmax_{w_i > 0} w_i / e_i`, lowest id on ties.
/// The quotient is taken in f64 so that tiny noise cannot overflow it to a
/// tie at +inf, as it could in f32.
pub fn race(w: &Tensor, e: &Tensor) -> Result<Tensor> {
    let w = w.to_dtype(DType::F64)?;
    let score = (&w / e.to_dtype(DType::F64)?)?;
    let score = select(&w.gt(0.0)?, &score, &scalar(f64::NEG_INFINITY, w.device())?)?;
    argmax_lowest(&score)
}

/// Per-row sampling parameters on the device, validated.
pub struct Params<'a> {
    /// `[R]` f32.
    pub temperature: &'a Tensor,
    /// `[R]` i64.
    pub top_k: &'a Tensor,
    /// `[R]` f32.
    pub top_p: &'a Tensor,
}

impl Params<'_> {
    fn greedy(&self) -> Result<Tensor> {
        self.temperature.eq(0.0)
    }

    /// Rank-0 flags: does any sampled row use top-k, top-p? The sorts they
    /// need are skipped when no row does (candle's CUDA argsort keeps a whole
    /// row in shared memory, which limits it to about 8k columns).
    pub fn needs(&self, vocab: usize) -> Result<[Tensor; 2]> {
        let sampled = not(&self.greedy()?)?;
        let top_k = and(&self.top_k.gt(0i64)?, &self.top_k.lt(vocab as i64)?)?;
        let top_p = self.top_p.lt(1.0)?;
        Ok([crate::kernels::any(&and(&top_k, &sampled)?)?, crate::kernels::any(&and(&top_p, &sampled)?)?])
    }
}

/// LOGITS-4: keep ids whose logit reaches the k-th largest (ties kept).
/// `[R, V]` mask; rows with top-k off keep everything.
fn top_k_mask(z: &Tensor, params: &Params<'_>) -> Result<Tensor> {
    let v = z.dim(1)?;
    let k = params.top_k;
    let on = and(&and(&k.gt(0i64)?, &k.lt(v as i64)?)?, &not(&params.greedy()?)?)?;
    let (sorted, _) = z.contiguous()?.sort_last_dim(false)?;
    let kth_pos = k.broadcast_sub(&scalar(1i64, z.device())?)?.clamp(0i64, v as i64 - 1)?;
    let kth = gather_last(&sorted, &kth_pos)?;
    or(&z.broadcast_ge(&kth.unsqueeze(1)?)?, &not(&on)?.unsqueeze(1)?)
}

/// LOGITS-5 on the kept weights `w [R, V]`: keep an id iff the mass before it,
/// in (probability desc, id asc) order, is below `top_p`.
///
/// candle's CUDA argsort is an unstable bitonic sort, so the order is made
/// total instead of relying on stability: the key `prob * (1 - id * 2^-48)`
/// (f64) keeps probabilities of distinct f32 weights in order while V < 2^24,
/// and splits equal probabilities by id. Zero probabilities tie at the end,
/// where their order changes nothing.
fn top_p_mask(w: &Tensor, params: &Params<'_>) -> Result<Tensor> {
    let v = w.dim(1)?;
    let w = w.to_dtype(DType::F64)?;
    let probs = w.broadcast_div(&w.sum_keepdim(1)?)?;
    let tie_break = ids(v, w.device())?.to_dtype(DType::F64)?.affine(-(2f64.powi(-48)), 1.0)?;
    let order = probs.broadcast_mul(&tie_break.unsqueeze(0)?)?.arg_sort_last_dim(false)?;
    let before_sorted = exclusive_scan(&probs.gather(&order, 1)?)?;
    let before = before_sorted.gather(&order.arg_sort_last_dim(true)?, 1)?;
    let on = and(&params.top_p.lt(1.0)?, &not(&params.greedy()?)?)?;
    let top_p = params.top_p.to_dtype(DType::F64)?.unsqueeze(1)?;
    or(&before.broadcast_lt(&top_p)?, &not(&on)?.unsqueeze(1)?)
}

/// LOGITS-2 .. LOGITS-6 on `z [R, V]` f32 score rows (validated). `need_k`
/// and `need_p` come from [`Params::needs`].
pub fn process_logits(z: &Tensor, params: &Params<'_>, need_k: bool, need_p: bool) -> Result<Tensor> {
    let (dev, v) = (z.device(), z.dim(1)?);
    let greedy = params.greedy()?.unsqueeze(1)?;
    // LOGITS-2: T = 0 is one-hot at the argmax.
    let one_hot = ids(v, dev)?.unsqueeze(0)?.broadcast_eq(&argmax_lowest(z)?.unsqueeze(1)?)?.to_dtype(DType::F32)?;
    // LOGITS-3: exp((l - max) / T) lies in [0, 1] for any T > 0. Greedy rows
    // divide by 1 instead of 0; their values are replaced below.
    let t = select(&greedy, &scalar(1f32, dev)?, &params.temperature.unsqueeze(1)?)?;
    let mut w = z.broadcast_sub(&z.max_keepdim(1)?)?.broadcast_div(&t)?.exp()?;
    let zero = scalar(0f32, dev)?;
    if need_k {
        w = select(&top_k_mask(z, params)?, &w, &zero)?;
    }
    if need_p {
        w = select(&top_p_mask(&w, params)?, &w, &zero)?;
    }
    // LOGITS-6: softmax over the kept ids, normalised with an f64 sum.
    let w = w.to_dtype(DType::F64)?;
    let probs = w.broadcast_div(&w.sum_keepdim(1)?)?.to_dtype(DType::F32)?;
    select(&greedy, &one_hot, &probs)
}

#[cfg(test)]
mod tests {
    use candle_core::Device;

    use super::*;

    #[test]
    fn inverse_cdf_skips_zero_weights_and_falls_back_to_the_last_positive() -> Result<()> {
        let w = Tensor::new(&[[0f32, 2., 0., 2., 0.], [1., 0., 1., 0., 0.]], &Device::Cpu)?;
        let v = Tensor::new(&[0.5f32, 0.9999999], &Device::Cpu)?;
        assert_eq!(inverse_cdf(&w, &v)?.to_vec1::<i64>()?, [3, 2]);
        Ok(())
    }

    #[test]
    fn race_ignores_zero_weights_whatever_their_noise() -> Result<()> {
        let w = Tensor::new(&[[0f32, 1., 1.]], &Device::Cpu)?;
        let e = Tensor::new(&[[1e-30f32, 2., 2.]], &Device::Cpu)?;
        assert_eq!(race(&w, &e)?.to_vec1::<i64>()?, [1]);
        Ok(())
    }
}
