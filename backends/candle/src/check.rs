//! The fast validation path (ERR-1): shapes on the host from tensor dims,
//! values as device masks that the caller reduces to one flag and reads
//! back once. A mask only says *that* something is wrong; the reference
//! names it (`BackendError::named_by_reference`).
//!
//! Each `*_dims` function answers `Some(dims)` exactly when the reference's
//! shape and emptiness checks pass; each `*_masks` function sets a bit
//! exactly where one of its value checks fails. Padding rows (CONV-7) are
//! masked out with `select`/`and` before any reduction.

use candle_core::{D, Result, Tensor};
use specdec_backend::NgramConfig;
use specdec_reference::SUM_TOLERANCE;

use crate::kernels::{PAD, and, bad_exponential, bad_id, bad_uniform, non_finite, not, or, scalar, sum64};
use crate::verify::{active_slots, readable_rows};

/// `(B, k)` of a padded draft batch (CONV-5 shapes): `B >= 1`, `k >= 1`.
pub fn draft_dims(drafts: &[usize], lens: &[usize]) -> Option<(usize, usize)> {
    match *drafts {
        [b, k] if b >= 1 && k >= 1 && lens == [b] => Some((b, k)),
        _ => None,
    }
}

/// `(B, k, V)` when `target [B, k+1, V]` matches the draft batch, `V >= 1`.
pub fn verify_dims(target: &[usize], drafts: &[usize], lens: &[usize]) -> Option<(usize, usize, usize)> {
    let v = match *target {
        [_, _, v] if v >= 1 => v,
        _ => return None,
    };
    let (b, k) = draft_dims(drafts, lens)?;
    (target == [b, k + 1, v]).then_some((b, k, v))
}

/// Score rows (CONV-8): NaN, +inf, or entirely -inf. `x [.., V]` -> `[..]`.
pub fn bad_score_rows(x: &Tensor) -> Result<Tensor> {
    let element = or(&x.ne(x)?, &x.eq(f64::INFINITY)?)?.max(D::Minus1)?;
    or(&element, &x.max(D::Minus1)?.eq(f64::NEG_INFINITY)?)
}

/// Probability rows (CONV-2): non-finite, negative, or an f64 sum off 1 by
/// more than `SUM_TOLERANCE`. `x [.., V]` -> `[..]`.
pub fn bad_prob_rows(x: &Tensor) -> Result<Tensor> {
    let element = or(&non_finite(x)?, &x.lt(0.0)?)?.max(D::Minus1)?;
    let off = sum64(x, false)?.affine(1.0, -1.0)?.abs()?.gt(SUM_TOLERANCE)?;
    or(&element, &off)
}

/// CONV-5 values: lengths in `[0, k]`, valid ids before, PAD after.
pub fn draft_masks(drafts: &Tensor, lens: &Tensor, vocab: usize) -> Result<Vec<Tensor>> {
    let k = drafts.dim(1)?;
    let len_ok = and(&lens.ge(0i64)?, &lens.le(k as i64)?)?;
    let active = active_slots(k, lens)?;
    Ok(vec![not(&len_ok)?, and(&active, &bad_id(drafts, vocab)?)?, and(&not(&active)?, &drafts.ne(PAD)?)?])
}

/// GREEDY-1: the draft batch and the readable score rows `j <= len_b`.
pub fn greedy_masks(scores: &Tensor, drafts: &Tensor, lens: &Tensor) -> Result<Vec<Tensor>> {
    let (k, v) = (drafts.dim(1)?, scores.dim(2)?);
    let mut masks = draft_masks(drafts, lens, v)?;
    masks.push(and(&bad_score_rows(scores)?, &readable_rows(k, lens)?)?);
    Ok(masks)
}

/// REJECT-1 without the noise: drafts, target rows `j <= len_b`, draft rows `j < len_b`.
pub fn rejection_masks(p: &Tensor, q: Option<&Tensor>, drafts: &Tensor, lens: &Tensor) -> Result<Vec<Tensor>> {
    let (k, v) = (drafts.dim(1)?, p.dim(2)?);
    let mut masks = draft_masks(drafts, lens, v)?;
    masks.push(and(&bad_prob_rows(p)?, &readable_rows(k, lens)?)?);
    if let Some(q) = q {
        masks.push(and(&bad_prob_rows(q)?, &active_slots(k, lens)?)?);
    }
    Ok(masks)
}

/// Draw noise values (all validated, padding or not): uniforms or exponentials.
pub fn noise_mask(noise: &Tensor, uniform: bool) -> Result<Tensor> {
    if uniform { bad_uniform(noise) } else { bad_exponential(noise) }
}

/// SAMPLE-1/2 weight rows: finite, `>= 0`, positive total.
pub fn weight_masks(w: &Tensor) -> Result<Vec<Tensor>> {
    let element = or(&non_finite(w)?, &w.lt(0.0)?)?;
    Ok(vec![element, sum64(w, false)?.le(0.0)?])
}

/// LOGITS-1 parameters and CONV-8 score rows.
pub fn logits_masks(z: &Tensor, t: &Tensor, k: &Tensor, p: &Tensor) -> Result<Vec<Tensor>> {
    Ok(vec![or(&non_finite(t)?, &t.lt(0.0)?)?, k.lt(0i64)?, not(&and(&p.gt(0.0)?, &p.le(1.0)?)?)?, bad_score_rows(z)?])
}

/// NGRAM-4/5/7: lengths in `[1, L]`, valid ids before, PAD after, and no
/// context longer than `max_model_len`.
pub fn ngram_masks(ctx: &Tensor, lens: &Tensor, vocab: usize, cfg: &NgramConfig) -> Result<Vec<Tensor>> {
    let width = ctx.dim(1)?;
    let active = active_slots(width, lens)?;
    let mut masks = vec![not(&and(&lens.ge(1i64)?, &lens.le(width as i64)?)?)?, and(&active, &bad_id(ctx, vocab)?)?, and(&not(&active)?, &ctx.ne(PAD)?)?];
    if let Some(max) = cfg.max_model_len {
        masks.push(lens.gt(max as i64)?);
    }
    Ok(masks)
}

/// KV-2: counts in `[0, T]`, no overflow of the capacity, finite values.
pub fn append_masks(lens: &Tensor, capacity: usize, keys: &Tensor, values: &Tensor, counts: &Tensor) -> Result<Vec<Tensor>> {
    let t = keys.dim(2)?;
    Ok(vec![
        not(&and(&counts.ge(0i64)?, &counts.le(t as i64)?)?)?,
        // `counts > C - len`, not `len + counts > C`: a huge count must not overflow.
        counts.broadcast_gt(&scalar(capacity as i64, lens.device())?.broadcast_sub(lens)?)?,
        non_finite(keys)?,
        non_finite(values)?,
    ])
}

/// KV-8/9: lengths in `[1, M * S]`, the first `ceil(len / S)` slots name a
/// page in `[0, P)`, finite pages.
pub fn paged_masks(pages: &Tensor, table: &Tensor, lens: &Tensor) -> Result<Vec<Tensor>> {
    let (num_pages, page) = (pages.dim(0)?, pages.dim(1)?);
    let slots = table.dim(1)?;
    let dev = lens.device();
    // ceil(len / S) = (len + S - 1) / S, on lengths clamped first so that a
    // huge length cannot overflow (it is flagged by the first mask anyway).
    let clamped = lens.clamp(0i64, (slots * page) as i64)?;
    let needed = clamped.broadcast_add(&scalar(page as i64 - 1, dev)?)?.broadcast_div(&scalar(page as i64, dev)?)?;
    Ok(vec![not(&and(&lens.ge(1i64)?, &lens.le((slots * page) as i64)?)?)?, and(&active_slots(slots, &needed)?, &bad_id(table, num_pages)?)?, non_finite(pages)?])
}
