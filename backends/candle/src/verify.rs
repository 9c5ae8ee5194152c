//! Greedy, DFlash and rejection-sampling verification on validated input.
//!
//! Every draft position is tested at once; the accepted count is the length
//! of the leading run of accepts (`sum(cumprod(..))`), and the next token is
//! then drawn from the one row each sequence needs. No host round trip.

use candle_core::{D, DType, Result, Tensor};
use specdec_backend::Comparator;

use crate::kernels::{PAD, and, argmax_lowest, first_false, gather_last, ids, row_select, scalar, select};
use crate::sampling::{inverse_cdf, race};

/// Draw noise of a verify, already validated.
#[derive(Debug, Clone, Copy)]
pub enum Draw<'a> {
    /// `[B, k+1]` uniforms.
    InverseCdf(&'a Tensor),
    /// `[B, k+1, V]` exponentials.
    Race(&'a Tensor),
}

/// `[B, k]` mask of the slots a sequence proposed: `j < len_b`.
pub fn active_slots(k: usize, lens: &Tensor) -> Result<Tensor> {
    ids(k, lens.device())?.unsqueeze(0)?.broadcast_lt(&lens.unsqueeze(1)?)
}

/// `[B, k+1]` mask of the target rows a sequence reads: `j <= len_b` (CONV-7).
pub fn readable_rows(k: usize, lens: &Tensor) -> Result<Tensor> {
    ids(k + 1, lens.device())?.unsqueeze(0)?.broadcast_le(&lens.unsqueeze(1)?)
}

/// GREEDY-4 / REJECT-5 output: drafts before `n`, `next` at `n`, PAD after.
fn assemble(drafts: &Tensor, n: &Tensor, next: &Tensor) -> Result<Tensor> {
    let (b, k) = drafts.dims2()?;
    let dev = drafts.device();
    let padded = Tensor::cat(&[drafts, &Tensor::full(PAD, (b, 1), dev)?], 1)?;
    let pos = ids(k + 1, dev)?.unsqueeze(0)?;
    let n = n.unsqueeze(1)?;
    let tail = select(&pos.broadcast_eq(&n)?, &next.unsqueeze(1)?, &scalar(PAD, dev)?)?;
    select(&pos.broadcast_lt(&n)?, &padded, &tail)
}

/// GREEDY-2 .. GREEDY-4: `scores [B, k+1, V]` f32, `drafts [B, k]`, `lens [B]`.
pub fn greedy(scores: &Tensor, drafts: &Tensor, lens: &Tensor) -> Result<(Tensor, Tensor)> {
    let k = drafts.dim(1)?;
    // Padding rows may hold NaN: zero them so the argmax never sees them.
    let readable = readable_rows(k, lens)?.unsqueeze(2)?;
    let scores = select(&readable, scores, &scalar(0f32, scores.device())?)?;
    let top = argmax_lowest(&scores)?; // [B, k+1]
    let hit = and(&drafts.eq(&top.narrow(1, 0, k)?)?, &active_slots(k, lens)?)?;
    let n = first_false(&hit)?; // GREEDY-3: stop at the first mismatch
    let next = gather_last(&top, &n)?;
    Ok((assemble(drafts, &n, &next)?, n))
}

/// DFLASH-2/3: `accept_len = sum(cumprod(cand[:, 1:] == pred[:, :-1]))`,
/// `bonus = pred[accept_len]`.
pub fn dflash(candidates: &Tensor, predict: &Tensor) -> Result<(Tensor, Tensor)> {
    let block = candidates.dim(1)?;
    let hit = candidates.narrow(1, 1, block - 1)?.eq(&predict.narrow(1, 0, block - 1)?)?;
    let len = first_false(&hit)?;
    let bonus = gather_last(predict, &len)?;
    Ok((len, bonus))
}

/// ACCEPT-1 .. ACCEPT-3 elementwise on `[B, k]` f32 tensors.
fn accept(cmp: Comparator, u: &Tensor, p_x: &Tensor, q_x: &Tensor) -> Result<Tensor> {
    match cmp {
        Comparator::Strict => (u * q_x)?.lt(p_x),
        Comparator::Seed004LessEq => {
            // u <= min(1, p/q); with q = 0, accept iff p > 0. No division by 0.
            let q_pos = q_x.gt(0.0)?;
            let q_safe = select(&q_pos, q_x, &scalar(1f32, q_x.device())?)?;
            let ratio = (p_x / q_safe)?.minimum(1.0)?;
            select(&q_pos, &u.le(&ratio)?, &p_x.gt(0.0)?)
        }
    }
}

/// RESID-1 .. RESID-3 for one row per sequence, in f64: the f32 inputs are
/// exact in f64, so `p - q` loses nothing to cancellation. `p`, `q` `[R, V]`,
/// `x [R]` the drafted ids (used when `q` is absent, RESID-2). Returns the
/// unnormalised draw weights and the residual mass `[R]`.
pub fn residual_weights(p: &Tensor, q: Option<&Tensor>, x: &Tensor) -> Result<(Tensor, Tensor)> {
    let p = p.to_dtype(DType::F64)?;
    let r = match q {
        Some(q) => (&p - q.to_dtype(DType::F64)?)?.maximum(0.0)?,
        None => {
            let at_x = ids(p.dim(1)?, p.device())?.unsqueeze(0)?.broadcast_eq(&x.unsqueeze(1)?)?;
            select(&at_x, &scalar(0f64, p.device())?, &p)?
        }
    };
    let mass = r.sum(D::Minus1)?;
    // RESID-3: a zero residual draws from p itself.
    let weights = select(&mass.gt(0.0)?.unsqueeze(1)?, &r, &p)?;
    Ok((weights, mass))
}

/// The probabilities and drafts of a validated rejection verify.
pub struct RejectInputs<'a> {
    /// `[B, k+1, V]` f32.
    pub p: &'a Tensor,
    /// `[B, k, V]` f32 or none (RESID-2).
    pub q: Option<&'a Tensor>,
    /// `[B, k]` i64.
    pub drafts: &'a Tensor,
    /// `[B]` i64.
    pub lens: &'a Tensor,
}

/// The residual op: `r / R` per row (or `p` when `R = 0`), f32.
pub fn residual(p: &Tensor, q: Option<&Tensor>, x: &Tensor) -> Result<Tensor> {
    let (w, _) = residual_weights(p, q, x)?;
    w.broadcast_div(&w.sum_keepdim(D::Minus1)?)?.to_dtype(DType::F32)
}

/// REJECT-2 .. REJECT-5 with `u [B, k]` accept uniforms.
pub fn rejection(inp: &RejectInputs<'_>, u: &Tensor, draw: Draw<'_>, cmp: Comparator) -> Result<(Tensor, Tensor)> {
    let RejectInputs { p, q, drafts, lens } = *inp;
    let (k, dev) = (drafts.dim(1)?, drafts.device());
    let active = active_slots(k, lens)?;
    // PAD slots index id 0; whatever they read is masked by `active`.
    let x = select(&active, drafts, &scalar(0i64, dev)?)?;
    let p_x = gather_last(&p.narrow(1, 0, k)?, &x)?;
    let q_x = match q {
        Some(q) => gather_last(q, &x)?,
        None => p_x.ones_like()?, // one-hot q: accept iff u < p(x)
    };
    let hit = and(&accept(cmp, u, &p_x, &q_x)?, &active)?;
    let n = first_false(&hit)?; // REJECT-2: stop at the first rejection
    let rejected = n.lt(lens)?;

    // REJECT-3/4: the correction (residual of row n) or the bonus (p of row
    // n = len): either way the draw reads row n of p and of the noise.
    let p_row = row_select(p, &n)?;
    let n_q = n.minimum(k as i64 - 1)?; // row n exists in q only when rejected
    let q_row = q.map(|q| row_select(q, &n_q)).transpose()?;
    let (resid, _) = residual_weights(&p_row, q_row.as_ref(), &gather_last(&x, &n_q)?)?;
    let weights = select(&rejected.unsqueeze(1)?, &resid, &p_row.to_dtype(DType::F64)?)?;
    let next = match draw {
        Draw::InverseCdf(v) => inverse_cdf(&weights, &gather_last(v, &n)?)?,
        Draw::Race(e) => race(&weights, &row_select(e, &n)?)?,
    };
    Ok((assemble(drafts, &n, &next)?, n))
}
