//! Verification: greedy (GREEDY-1 .. 4), DFlash (DFLASH-1 .. 3), rejection
//! sampling with explicit or seeded noise (REJECT-1 .. 5) and the residual
//! (RESID-1 .. 3), as whole-batch array operations except greedy's one
//! fused pass over each live score row.

use std::cmp::Ordering;

use ndarray::{Array1, Array2, ArrayD, ArrayView1, ArrayView2, ArrayView3, Axis, IxDyn, Zip, concatenate, s};
use rand::{RngExt, SeedableRng};
use rand_pcg::Pcg64;
use specdec_backend::{Comparator, DrawMethod, PAD};

use crate::check::{Layout, d1, d2, d3, draft_layout, exponentials_ok, prob_rows_ok, rows_of, uniforms_ok, valid_id};
use crate::kernels::{Float, argmax_rows_checked, below, leading_run, take_along_last, take_ids, take_rows};
use crate::sampling::{exponential_race, inverse_cdf_row};

/// Verify outputs: `tokens [B, k+1]` and `num_accepted [B]`.
pub(crate) type Emitted = (Array2<i64>, Array1<i64>);

/// GREEDY-4 / REJECT-5: accepted drafts, then `next`, then PAD.
fn emit(drafts: ArrayView2<'_, i64>, next: ArrayView1<'_, i64>, n: ArrayView1<'_, usize>) -> Emitted {
    let batch = drafts.nrows();
    let pad = Array2::from_elem((batch, 1), PAD);
    let padded = concatenate(Axis(1), &[drafts, pad.view()]).expect("same number of rows");
    let pos = crate::kernels::arange(padded.ncols());
    let tokens = Zip::from(&padded).and_broadcast(pos.view().insert_axis(Axis(0))).and_broadcast(n.insert_axis(Axis(1))).and_broadcast(next.insert_axis(Axis(1))).map_collect(|&d, &j, &n, &t| match j
        .cmp(&n)
    {
        Ordering::Less => d,
        Ordering::Equal => t,
        Ordering::Greater => PAD,
    });
    (tokens, n.mapv(|n| n as i64))
}

/// Row `j` of `[B, K]` is live when `j < bound[b]`, flattened to `[B*K]`.
fn live_flat(bound: ArrayView1<'_, usize>, width: usize) -> Array1<bool> {
    let live = below(bound, width);
    let n = live.len();
    live.into_shape_with_order(n).expect("same element count")
}

/// Which checks a verify runs: all of them, or (GLUE-6, the unchecked ops)
/// shapes and the draft layout only. The layout (ids, PAD, lengths) is
/// O(B k) and keeps every later index in range; the O(B k V) value checks
/// of probability, score and noise rows are what an unchecked call skips.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Checks {
    All,
    LayoutOnly,
}

/// GREEDY-1's shapes and CONV-5 draft layout; the score rows are checked
/// by [`greedy`] in its one pass over them.
pub(crate) fn greedy_ok<F>(scores: &ArrayD<F>, drafts: &ArrayD<i64>, lens: &ArrayD<i64>) -> Option<Layout> {
    let s = d3(scores)?;
    let vocab = s.dim().2;
    let layout = draft_layout(drafts, lens, vocab).filter(|_| vocab > 0)?;
    (s.dim() == (layout.batch, layout.k + 1, vocab)).then_some(layout)
}

/// GREEDY-1 (score rows, with `Checks::All`) and GREEDY-2 .. GREEDY-4 on
/// input [`greedy_ok`] passed; `None` when a live score row is invalid.
/// Only the live rows (CONV-7) are read, each once.
pub(crate) fn greedy<F: Float>(scores: ArrayView3<'_, F>, drafts: ArrayView2<'_, i64>, layout: &Layout, checks: Checks) -> Option<Emitted> {
    let (batch, k1, _) = scores.dim();
    let live = live_flat((&layout.lens + 1).view(), k1);
    let (top, valid) = argmax_rows_checked(rows_of(&scores).view(), live.view());
    if checks == Checks::All && !valid {
        return None;
    }
    let top = top.into_shape_with_order((batch, k1)).expect("one argmax per row");
    let live_drafts = below(layout.lens.view(), layout.k);
    let matches = Zip::from(&drafts).and(top.slice(s![.., ..layout.k])).and(&live_drafts).map_collect(|&d, &t, &l| l && d == t as i64);
    let n = leading_run(matches.view());
    let next = take_along_last(top.view(), n.view()).mapv(|t| t as i64);
    Some(emit(drafts, next.view(), n.view()))
}

/// DFLASH-1 fast check: `[bs, Bk]` ids with `Bk >= 2`, every id valid.
pub(crate) fn dflash_ok(candidates: &ArrayD<i64>, predict: &ArrayD<i64>, vocab: usize) -> bool {
    let (Some(c), Some(p)) = (d2(candidates), d2(predict)) else { return false };
    let (bs, block) = c.dim();
    bs >= 1 && block >= 2 && vocab > 0 && p.dim() == (bs, block) && Zip::from(&c).and(&p).all(|&c, &p| valid_id(c, vocab) && valid_id(p, vocab))
}

/// DFLASH-2/3: `accept_len = sum(cumprod(c[:, 1:] == p[:, :-1]))`, `bonus = p[b, accept_len]`.
pub(crate) fn dflash(candidates: ArrayView2<'_, i64>, predict: ArrayView2<'_, i64>) -> (Array1<i64>, Array1<i64>) {
    let matches = Zip::from(candidates.slice(s![.., 1..])).and(predict.slice(s![.., ..-1])).map_collect(|c, p| c == p);
    let len = leading_run(matches.view());
    let bonus = take_along_last(predict, len.view());
    (len.mapv(|n| n as i64), bonus)
}

/// Draw noise as given to a rejection verify.
#[derive(Clone, Copy)]
pub(crate) enum Noise<'a> {
    Uniforms(&'a ArrayD<f64>),
    Exponentials(&'a ArrayD<f64>),
}

/// Everything a rejection verify reads (REJECT-1). The probabilities are
/// f64, or f32 (`ndarray-f32`'s), read where needed and widened exactly.
pub(crate) struct RejectionIn<'a, F> {
    pub p: &'a ArrayD<F>,
    pub q: Option<&'a ArrayD<F>>,
    pub drafts: &'a ArrayD<i64>,
    pub lens: &'a ArrayD<i64>,
    pub u: &'a ArrayD<f64>,
    pub noise: Noise<'a>,
}

/// REJECT-1 fast check, in the reference's order of concerns.
pub(crate) fn rejection_ok<F: Float>(x: &RejectionIn<'_, F>, checks: Checks) -> Option<Layout> {
    let p = d3(x.p)?;
    let vocab = p.dim().2;
    let layout = draft_layout(x.drafts, x.lens, vocab).filter(|_| vocab > 0)?;
    let (b, k) = (layout.batch, layout.k);
    let q = match x.q {
        Some(q) => Some(d3(q).filter(|q| q.dim() == (b, k, vocab))?),
        None => None,
    };
    let all = checks == Checks::All;
    let noise_ok = match x.noise {
        Noise::Uniforms(v) => v.shape() == [b, k + 1] && (!all || uniforms_ok(v)),
        Noise::Exponentials(e) => e.shape() == [b, k + 1, vocab] && (!all || exponentials_ok(e)),
    };
    if p.dim() != (b, k + 1, vocab) || x.u.shape() != [b, k] || !noise_ok || (all && !uniforms_ok(x.u)) {
        return None;
    }
    if !all {
        return Some(layout);
    }
    // CONV-7: target rows j <= len and draft rows j < len only.
    let p_ok = prob_rows_ok(rows_of(&p).view(), live_flat((&layout.lens + 1).view(), k + 1).view());
    let q_ok = q.is_none_or(|q| prob_rows_ok(rows_of(&q).view(), live_flat(layout.lens.view(), k).view()));
    (p_ok && q_ok).then_some(layout)
}

/// ACCEPT-1/2 (Strict) or ACCEPT-3 (Seed004LessEq), elementwise.
fn accepts(cmp: Comparator, u: f64, p: f64, q: f64) -> bool {
    match cmp {
        Comparator::Strict => u * q < p,
        Comparator::Seed004LessEq if q > 0.0 => u <= (p / q).min(1.0),
        Comparator::Seed004LessEq => p > 0.0,
    }
}

/// RESID-1/2 weights `max(0, p - q)`, or `p` with the drafted id zeroed
/// when there are no draft probabilities.
pub(crate) fn residual_weights(p: ArrayView2<'_, f64>, q: Option<ArrayView2<'_, f64>>, drafted: ArrayView1<'_, usize>) -> Array2<f64> {
    match q {
        Some(q) => Zip::from(&p).and(&q).map_collect(|&p, &q| (p - q).max(0.0)),
        None => {
            let pos = crate::kernels::arange(p.ncols());
            Zip::from(&p).and_broadcast(pos.view().insert_axis(Axis(0))).and_broadcast(drafted.insert_axis(Axis(1))).map_collect(|&p, &j, &x| if j == x { 0.0 } else { p })
        }
    }
}

/// RESID-3: the residual where it has mass, `p` itself where it has none.
fn residual_or_target(p: ArrayView2<'_, f64>, q: Option<ArrayView2<'_, f64>>, drafted: ArrayView1<'_, usize>, rejected: ArrayView1<'_, bool>) -> Array2<f64> {
    let resid = residual_weights(p, q, drafted);
    let mass = crate::kernels::sum_last(resid.view());
    let use_resid = Zip::from(&mass).and(rejected).map_collect(|&m, &r| r && m > 0.0);
    Zip::from(&resid).and(&p).and_broadcast(use_resid.view().insert_axis(Axis(1))).map_collect(|&r, &p, &u| if u { r } else { p })
}

/// REJECT-2 .. REJECT-5 on validated input.
pub(crate) fn rejection<F: Float>(x: &RejectionIn<'_, F>, layout: &Layout, cmp: Comparator) -> Option<Emitted> {
    let (p, drafts, u) = (d3(x.p)?, d2(x.drafts)?, d2(x.u)?);
    let q = match x.q {
        Some(q) => Some(d3(q)?),
        None => None,
    };
    let k = layout.k;
    // PAD slots read id 0; they are masked out of every decision.
    let ids = drafts.mapv(|t| t.max(0) as usize);
    let widen = |a: Array2<F>| a.mapv(Into::<f64>::into);
    let p_x = widen(take_ids(p.slice(s![.., ..k, ..]), ids.view()));
    let q_x = q.map_or_else(|| Array2::ones((layout.batch, k)), |q| widen(take_ids(q, ids.view())));
    let live = below(layout.lens.view(), k);
    let accepted = Zip::from(&u).and(&p_x).and(&q_x).and(&live).map_collect(|&u, &p, &q, &l| l && accepts(cmp, u, p, q));
    let n = leading_run(accepted.view());

    // The decision row n of each sequence: residual of row n on a rejection
    // (REJECT-3), target row n = len for the bonus (REJECT-4).
    let rejected = Zip::from(&n).and(&layout.lens).map_collect(|&n, &len| n < len);
    let q_row = n.mapv(|n| n.min(k - 1));
    let drafted = take_along_last(ids.view(), q_row.view());
    let next = match x.noise {
        Noise::Uniforms(v) => {
            let v = take_along_last(d2(v)?, n.view());
            Array1::from_shape_fn(layout.batch, |b| {
                let q = q.as_ref().map(|q| q.slice(s![b, q_row[b], ..]));
                inverse_cdf_row(p.slice(s![b, n[b], ..]), q, drafted[b], rejected[b], v[b])
            })
        }
        Noise::Exponentials(e) => {
            let p_row = widen(take_rows(p, n.view()));
            let q_rows = q.map(|q| widen(take_rows(q, q_row.view())));
            let weights = residual_or_target(p_row.view(), q_rows.as_ref().map(|q| q.view()), drafted.view(), rejected.view());
            exponential_race(weights.view(), take_rows(d3(e)?, n.view()).view())
        }
    };
    Some(emit(drafts, next.mapv(|t| t as i64).view(), n.view()))
}

/// The residual op's fast check (RESID-1, CONV-2): `[R, V]` rows, ids valid.
pub(crate) fn residual_ok(p: &ArrayD<f64>, q: Option<&ArrayD<f64>>, drafted: &ArrayD<i64>) -> bool {
    let Some(p2) = d2(p) else { return false };
    let (rows, vocab) = p2.dim();
    let all = Array1::from_elem(rows, true);
    let q_ok = match q.map(d2) {
        None => true,
        Some(None) => false,
        Some(Some(q)) => q.dim() == (rows, vocab) && prob_rows_ok(q, all.view()),
    };
    let ids_ok = d1(drafted).is_some_and(|x| x.len() == rows && Zip::from(&x).all(|&t| valid_id(t, vocab)));
    rows >= 1 && ids_ok && prob_rows_ok(p2, all.view()) && q_ok
}

/// RESID-1 .. RESID-3 as normalised rows `r / R`.
pub(crate) fn residual(p: ArrayView2<'_, f64>, q: Option<ArrayView2<'_, f64>>, drafted: ArrayView1<'_, i64>) -> Array2<f64> {
    let drafted = drafted.mapv(|t| t.max(0) as usize);
    let rejected = Array1::from_elem(p.nrows(), true);
    let weights = residual_or_target(p, q, drafted.view(), rejected.view());
    let total = crate::kernels::sum_last(weights.view());
    Zip::from(&weights).and_broadcast(total.view().insert_axis(Axis(1))).map_collect(|&w, &t| w / t)
}

/// The seeded noise of `rejection_verify_seeded`: one `Pcg64` stream seeded
/// by `seed_from_u64(seed)` fills, in row-major order, the accept uniforms
/// `[B, k]`, then the draw noise (`[B, k+1]` uniforms or `[B, k+1, V]`
/// Exp(1) values `-ln(1 - u)`, redrawing `u = 0`). Every row takes its own
/// stretch of the stream, so rows get independent noise.
pub(crate) fn seeded_noise(seed: u64, batch: usize, k: usize, vocab: usize, method: DrawMethod) -> (ArrayD<f64>, ArrayD<f64>) {
    let mut rng = Pcg64::seed_from_u64(seed);
    let accept = filled(&[batch, k], || rng.random::<f64>());
    let draw = match method {
        DrawMethod::InverseCdf => filled(&[batch, k + 1], || rng.random::<f64>()),
        DrawMethod::ExponentialRace => filled(&[batch, k + 1, vocab], || {
            loop {
                let u: f64 = rng.random();
                if u > 0.0 {
                    break -(-u).ln_1p();
                }
            }
        }),
    };
    (accept, draw)
}

/// An array of `shape` filled by `f` in row-major order.
fn filled(shape: &[usize], f: impl FnMut() -> f64) -> ArrayD<f64> {
    let n = shape.iter().product();
    ArrayD::from_shape_vec(IxDyn(shape), std::iter::repeat_with(f).take(n).collect()).expect("n values fill the shape")
}
