//! The device half of validation (ERR-1): value checks written as tensor predicates that an
//! operation fuses with [`all_of`] into one boolean, read back once. They only say *whether*
//! the input is valid; the reference names the defect when they say no. Every predicate
//! ignores padding rows (CONV-7) by selecting per-row verdicts with `where`, so NaN there
//! cannot turn a valid input invalid.

use specdec_backend::PAD;
use specdec_reference::SUM_TOLERANCE;
use tch::{Kind, Tensor};

use crate::kernels::{TResult, readable};

/// The conjunction of every predicate, as one 0-dim boolean tensor.
pub(crate) fn all_of(checks: &[Tensor]) -> TResult<Tensor> {
    let mut ok: Option<Tensor> = None;
    for c in checks {
        let c = c.f_all()?;
        ok = Some(match ok {
            Some(acc) => acc.f_logical_and(&c)?,
            None => c,
        });
    }
    match ok {
        Some(ok) => Ok(ok),
        None => Tensor::f_ones([], (Kind::Bool, tch::Device::Cpu)),
    }
}

/// Reads the fused verdict back to the host: the one transfer of a valid call.
pub(crate) fn verdict(checks: &[Tensor]) -> TResult<bool> {
    bool::try_from(&all_of(checks)?)
}

/// Values in `[lo, hi]` (integer lengths and counts).
pub(crate) fn in_range(t: &Tensor, lo: i64, hi: i64) -> TResult<Tensor> {
    t.f_ge(lo)?.f_logical_and(&t.f_le(hi)?)
}

/// Ids in `[0, vocab)`.
pub(crate) fn ids(t: &Tensor, vocab: i64) -> TResult<Tensor> {
    t.f_ge(0)?.f_logical_and(&t.f_lt(vocab)?)
}

/// CONV-5 slot rule for `slots [B, n]` with `lens [B]`: valid ids before the length, PAD after.
pub(crate) fn padded_ids(slots: &Tensor, lens: &Tensor, vocab: i64) -> TResult<Tensor> {
    let n = slots.size()[1];
    let used = readable(lens, n, false)?;
    ids(slots, vocab)?.f_where_self(&used, &slots.f_eq(PAD)?)
}

/// CONV-5: lengths in `[0, k]` and the draft slot layout.
pub(crate) fn draft_layout(drafts: &Tensor, lens: &Tensor, vocab: i64) -> TResult<Vec<Tensor>> {
    let k = drafts.size()[1];
    Ok(vec![in_range(lens, 0, k)?, padded_ids(drafts, lens, vocab)?])
}

/// CONV-3: uniforms in `[0, 1)`; NaN fails both comparisons.
pub(crate) fn uniforms(u: &Tensor) -> TResult<Tensor> {
    u.f_ge(0.0)?.f_logical_and(&u.f_lt(1.0)?)
}

/// SAMPLE-2: exponential noise within `[2^-126, 2^126]` (NaN fails both).
pub(crate) fn exponentials(e: &Tensor) -> TResult<Tensor> {
    e.f_ge(specdec_reference::MIN_EXPONENTIAL)?.f_logical_and(&e.f_le(specdec_reference::MAX_EXPONENTIAL)?)
}

/// CONV-2 per last-axis row: finite, `>= 0`, f64 sum within [`SUM_TOLERANCE`] of 1.
pub(crate) fn prob_rows(p: &Tensor) -> TResult<Tensor> {
    let clean = p.f_isfinite()?.f_logical_and(&p.f_ge(0.0)?)?.f_all_dim(-1, false)?;
    let sum = p.f_sum_dim_intlist(-1, false, Kind::Double)?;
    clean.f_logical_and(&sum.f_sub_scalar(1.0)?.f_abs()?.f_le(SUM_TOLERANCE)?)
}

/// CONV-8 per last-axis row: no NaN or `+inf`, and not only `-inf`.
pub(crate) fn score_rows(s: &Tensor) -> TResult<Tensor> {
    let clean = s.f_isnan()?.f_logical_or(&s.f_isposinf()?)?.f_logical_not()?.f_all_dim(-1, false)?;
    clean.f_logical_and(&s.f_isfinite()?.f_any_dim(-1, false)?)
}

/// SAMPLE-1/2 weight rows: finite, `>= 0`, positive f64 total.
pub(crate) fn weight_rows(w: &Tensor) -> TResult<Tensor> {
    let clean = w.f_isfinite()?.f_logical_and(&w.f_ge(0.0)?)?.f_all_dim(-1, false)?;
    clean.f_logical_and(&w.f_sum_dim_intlist(-1, false, Kind::Double)?.f_gt(0.0)?)
}

/// A per-row verdict `[B, n]` that only counts where `read [B, n]` holds (CONV-7).
pub(crate) fn where_read(row_ok: &Tensor, read: &Tensor) -> TResult<Tensor> {
    row_ok.f_logical_or(&read.f_logical_not()?)
}
