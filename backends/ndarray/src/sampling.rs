//! Drawing tokens (SAMPLE-1/2) and turning logits into the distribution
//! sampled from (LOGITS-1 .. LOGITS-6), row-wise over whole arrays.

use ndarray::{Array1, Array2, ArrayD, ArrayView1, ArrayView2, Axis, Zip, aview0, s};

use crate::check::{d1, d2, exponentials_ok, uniforms_ok, weight_rows_ok};
use crate::kernels::{Float, arange, argmax_last, argmax_rows_checked, argsort_rows, cumsum_last, for_rows, row_argmax, sum_last, take_along_last, take_along_last2};

/// SAMPLE-1: per row, the smallest `i` with `v * S < C_i`; if rounding
/// leaves none, the last id of positive weight. One fused scan per row
/// ([`inverse_cdf_row`], sums in index order as the reference's), not
/// whole-array cumulative sums: a greedy DFlash step draws its target
/// predictions from one-hot rows this way, and the whole-array form cost
/// it several milliseconds of allocations and passes over the vocabulary.
pub(crate) fn inverse_cdf(w: ArrayView2<'_, f64>, v: ArrayView1<'_, f64>) -> Array1<usize> {
    Zip::from(w.rows()).and(&v).map_collect(|row, &v| inverse_cdf_row(row, None, 0, false, v))
}

/// One sequence's decision row with uniform draw noise `v`: REJECT-3's
/// residual where the row was `rejected` and the residual has mass (RESID-3),
/// else the target row (REJECT-4), drawn by SAMPLE-1, fused into passes over
/// the row instead of whole-array temporaries. Every sum runs in index
/// order from 0, as the whole-array path's (and the reference's) does, so
/// the draw is the same bit for bit; the scan stops at the drawn id.
pub(crate) fn inverse_cdf_row<F: Float>(p: ArrayView1<'_, F>, q: Option<ArrayView1<'_, F>>, drafted: usize, rejected: bool, v: f64) -> usize {
    let mut mass = 0.0;
    if rejected {
        for_weights(p, q, drafted, true, |_, w| {
            mass += w;
            true
        });
    }
    let residual = rejected && mass > 0.0;
    let total = if residual {
        mass
    } else {
        let mut total = 0.0;
        for_weights(p, q, drafted, false, |_, w| {
            total += w;
            true
        });
        total
    };
    // C_i is non-decreasing, so the first `i` with `target < C_i` is the
    // smallest; if rounding leaves none, the last id of positive weight.
    let target = v * total;
    let (mut cumulative, mut drawn, mut last_positive) = (0.0, None, 0);
    for_weights(p, q, drafted, residual, |j, w| {
        cumulative += w;
        if w > 0.0 {
            last_positive = j;
        }
        let found = target < cumulative;
        if found {
            drawn = Some(j);
        }
        !found
    });
    drawn.unwrap_or(last_positive)
}

/// `f(id, weight)` in id order until it returns `false`: the residual
/// weights `max(0, p - q)` (or `p` with the drafted id zeroed, without `q`)
/// when `residual`, else `p`.
fn for_weights<F: Float>(p: ArrayView1<'_, F>, q: Option<ArrayView1<'_, F>>, drafted: usize, residual: bool, mut f: impl FnMut(usize, f64) -> bool) {
    match (residual, q) {
        (true, Some(q)) => {
            for (j, (&p, &q)) in p.iter().zip(q).enumerate() {
                if !f(j, (p.into() - q.into()).max(0.0)) {
                    return;
                }
            }
        }
        (true, None) => {
            for (j, &p) in p.iter().enumerate() {
                if !f(j, if j == drafted { 0.0 } else { p.into() }) {
                    return;
                }
            }
        }
        (false, _) => {
            for (j, &p) in p.iter().enumerate() {
                if !f(j, p.into()) {
                    return;
                }
            }
        }
    }
}

/// SAMPLE-2: per row, `argmax` of `w / e` over positive weights, ties to
/// the lowest id; zero-weight ids score `-inf` and never win. As in the
/// reference, a row where any ratio overflows to `+inf` (tiny `e`, huge `w`)
/// is scored by `ln w - ln e` instead, which orders the same ratios without
/// overflowing; scoring it by `w / e` would tie every overflowed id and
/// hand the draw to the lowest one.
pub(crate) fn exponential_race(w: ArrayView2<'_, f64>, e: ArrayView2<'_, f64>) -> Array1<usize> {
    let ratio = Zip::from(&w).and(&e).map_collect(|&w, &e| if w > 0.0 { w / e } else { f64::NEG_INFINITY });
    let overflow = ratio.map(|&r| r == f64::INFINITY).fold_axis(Axis(1), false, |a, &x| *a || x);
    let score = Zip::from(&ratio).and(&w).and(&e).and_broadcast(overflow.view().insert_axis(Axis(1))).map_collect(|&r, &w, &e, &o| if o && w > 0.0 { w.ln() - e.ln() } else { r });
    argmax_last(score.view())
}

/// The `draw` op's fast check: `weights [R, V]`, `[R]` uniforms or `[R, V]`
/// exponentials, every weight row drawable.
pub(crate) fn draw_ok(weights: &ArrayD<f64>, noise: &ArrayD<f64>, uniforms: bool) -> bool {
    let Some(w) = d2(weights) else { return false };
    let (rows, vocab) = w.dim();
    let noise_ok = if uniforms { noise.shape() == [rows] && uniforms_ok(noise) } else { noise.shape() == [rows, vocab] && exponentials_ok(noise) };
    rows >= 1 && vocab >= 1 && noise_ok && weight_rows_ok(w)
}

/// LOGITS-1 fast check of the logits' shape and the per-row parameters; the
/// score rows are checked by [`process_logits`] as it reads them.
pub(crate) fn logits_ok(shape: &[usize], temperature: &ArrayD<f64>, top_k: &ArrayD<i64>, top_p: &ArrayD<f64>) -> bool {
    let &[rows, vocab] = shape else { return false };
    let (Some(t), Some(k), Some(p)) = (d1(temperature), d1(top_k), d1(top_p)) else { return false };
    let shapes = rows >= 1 && vocab >= 1 && t.len() == rows && k.len() == rows && p.len() == rows;
    shapes && Zip::from(&t).and(&k).and(&p).all(|&t, &k, &p| t.is_finite() && t >= 0.0 && k >= 0 && p > 0.0 && p <= 1.0)
}

/// `softmax((z - max) / T)` over the kept ids, exactly 0 elsewhere (LOGITS-3/6).
fn masked_softmax(z: ArrayView2<'_, f64>, keep: ArrayView2<'_, bool>, max: ArrayView1<'_, f64>, t: ArrayView1<'_, f64>) -> Array2<f64> {
    let w = Zip::from(&z).and(&keep).and_broadcast(max.insert_axis(Axis(1))).and_broadcast(t.insert_axis(Axis(1))).map_collect(|&l, &k, &m, &t| if k { ((l - m) / t).exp() } else { 0.0 });
    let total = sum_last(w.view());
    Zip::from(&w).and_broadcast(total.view().insert_axis(Axis(1))).map_collect(|&w, &s| w / s)
}

/// LOGITS-4: keep ids whose logit reaches the k-th largest (ties kept);
/// rows with `k = 0` or `k >= V` keep everything.
fn top_k_keep(z: ArrayView2<'_, f64>, top_k: ArrayView1<'_, i64>) -> Array2<bool> {
    let vocab = z.ncols();
    let desc = argsort_rows(z, |a, b| b.total_cmp(&a));
    let kth_id = take_along_last(desc.view(), top_k.mapv(|k| (k.max(1) as usize) - 1).view());
    let kth = take_along_last(z, kth_id.view());
    let active = top_k.mapv(|k| k > 0 && (k as usize) < vocab);
    Zip::from(&z).and_broadcast(kth.view().insert_axis(Axis(1))).and_broadcast(active.view().insert_axis(Axis(1))).map_collect(|&x, &kth, &a| !a || x >= kth)
}

/// LOGITS-5: in descending probability order (ties: lower id first), keep
/// an id iff the mass before it is `< top_p`. Ids dropped earlier have
/// probability 0, so they add nothing to any kept id's preceding mass.
fn top_p_keep(probs: ArrayView2<'_, f64>, top_p: ArrayView1<'_, f64>) -> Array2<bool> {
    let (rows, vocab) = probs.dim();
    let order = argsort_rows(probs, |a, b| b.total_cmp(&a));
    let cum = cumsum_last(take_along_last2(probs, order.view()).view());
    let mut before = Array2::zeros((rows, vocab));
    before.slice_mut(s![.., 1..]).assign(&cum.slice(s![.., ..-1]));
    let keep_sorted = Zip::from(&before).and_broadcast(top_p.insert_axis(Axis(1))).map_collect(|&b, &p| b < p);
    // The inverse permutation maps each id back to its sorted position.
    let rank = argsort_rows(order.view(), |a, b| a.cmp(&b));
    take_along_last2(keep_sorted.view(), rank.view())
}

#[derive(Clone, Copy)]
enum Mode {
    Greedy,
    Nucleus,
    Full,
}

/// LOGITS-1's score rows (CONV-8) and LOGITS-2 .. LOGITS-6 on input
/// [`logits_ok`] passed; `None` when a score row is invalid.
///
/// When no row uses top-k or top-p (the decoder's usual case), each row is
/// done by one fused kernel that reads its logits for the maximum and the
/// check (and again up to the first maximum, still in cache), once more for
/// the weights and their sum, then scales its output:
/// the same operations in the same order as the reference, so the same
/// bits, with rows split across threads. Otherwise the sorts dominate and
/// the whole-array path below runs.
pub(crate) fn process_logits(z: ArrayView2<'_, f64>, t: ArrayView1<'_, f64>, top_k: ArrayView1<'_, i64>, top_p: ArrayView1<'_, f64>) -> Option<Array2<f64>> {
    let (top_k_used, nucleus_used) = (top_k_used(z.ncols(), top_k), nucleus_used(t, top_p));
    let every = Array1::from_elem(z.nrows(), true);
    if top_k_used || nucleus_used {
        // The sorts dominate; one pass gives the argmax and the score check.
        let (top, valid) = argmax_rows_checked(z, every.view());
        return valid.then(|| sorted_process_logits(z, t, top_k, top_p, top.view(), top_k_used, nucleus_used));
    }
    let mut out = Array2::zeros(z.dim());
    for_rows(z, every.view(), out.view_mut(), |r, row, out| softmax_row(row, t[r], out)).then_some(out)
}

/// Whether some row keeps fewer than all `vocab` ids by top-k.
fn top_k_used(vocab: usize, top_k: ArrayView1<'_, i64>) -> bool {
    top_k.iter().any(|&k| k > 0 && (k as usize) < vocab)
}

/// Whether some sampled row uses top-p.
fn nucleus_used(t: ArrayView1<'_, f64>, top_p: ArrayView1<'_, f64>) -> bool {
    Zip::from(&t).and(&top_p).fold(false, |any, &t, &p| any || (t > 0.0 && p < 1.0))
}

/// Whether any row needs the sorted path (top-k or top-p); without it,
/// every row is one fused softmax row.
pub(crate) fn sorts_needed(vocab: usize, t: ArrayView1<'_, f64>, top_k: ArrayView1<'_, i64>, top_p: ArrayView1<'_, f64>) -> bool {
    top_k_used(vocab, top_k) || nucleus_used(t, top_p)
}

/// LOGITS-2/3 for one row without top-k or top-p: one-hot at the lowest-id
/// argmax when `t = 0`, else `exp((l - max) / t)` over the index-order sum
/// (CONV-9), exactly the reference's `process_row`. Returns the row's
/// LOGITS-1 validity (no NaN or `+inf`, some finite value).
fn softmax_row(z: &[f64], t: f64, out: &mut [f64]) -> bool {
    let (top, valid) = row_argmax(z);
    if t == 0.0 {
        out[top] = 1.0;
        return valid;
    }
    let max = z[top];
    let mut total = 0.0;
    for (o, &l) in out.iter_mut().zip(z) {
        *o = ((l - max) / t).exp();
        total += *o;
    }
    for o in out.iter_mut() {
        *o /= total;
    }
    valid
}

/// LOGITS-2 .. LOGITS-6 on validated input with each row's argmax `top`,
/// as whole-array operations (top-k and top-p sort every row that uses
/// them; `top_k_used` and `nucleus_used` say whether any row does).
fn sorted_process_logits(
    z: ArrayView2<'_, f64>,
    t: ArrayView1<'_, f64>,
    top_k: ArrayView1<'_, i64>,
    top_p: ArrayView1<'_, f64>,
    top: ArrayView1<'_, usize>,
    top_k_used: bool,
    nucleus_used: bool,
) -> Array2<f64> {
    let max = take_along_last(z, top);
    // T = 0 rows are one-hot; a stand-in T keeps their unused softmax finite.
    let t_safe = t.mapv(|t| if t > 0.0 { t } else { 1.0 });
    // The sorts behind top-k and top-p cost nearly all the time; skip each
    // when no row uses it (its mask would keep every id: the same result).
    let every = aview0(&true);
    let top_k_rows;
    let keep = if top_k_used {
        top_k_rows = top_k_keep(z, top_k);
        top_k_rows.view()
    } else {
        every.broadcast(z.dim()).expect("a scalar broadcasts to any shape") // no allocation
    };
    let probs = masked_softmax(z, keep, max.view(), t_safe.view());
    let nucleus_rows;
    let nucleus = if nucleus_used {
        let keep_p = top_p_keep(probs.view(), top_p);
        let both = Zip::from(keep).and(&keep_p).map_collect(|&a, &b| a && b);
        nucleus_rows = masked_softmax(z, both.view(), max.view(), t_safe.view());
        nucleus_rows.view()
    } else {
        probs.view() // no row reads it
    };
    // Per row: greedy (LOGITS-2), nucleus (top_p < 1) or the top-k softmax.
    let mode = Zip::from(&t).and(&top_p).map_collect(|&t, &p| {
        if t == 0.0 {
            Mode::Greedy
        } else if p < 1.0 {
            Mode::Nucleus
        } else {
            Mode::Full
        }
    });
    let pos = arange(z.ncols());
    Zip::from(&probs).and(nucleus).and_broadcast(pos.view().insert_axis(Axis(0))).and_broadcast(top.insert_axis(Axis(1))).and_broadcast(mode.view().insert_axis(Axis(1))).map_collect(
        |&all, &nucleus, &j, &top, &mode| match mode {
            Mode::Greedy => f64::from(u8::from(j == top)),
            Mode::Nucleus => nucleus,
            Mode::Full => all,
        },
    )
}

#[cfg(test)]
mod tests {
    use rand::{RngExt, SeedableRng};

    use super::*;

    /// The fused per-row path (threaded at this size) gives the same bits as
    /// the whole-array path on rows without top-k or top-p, greedy rows
    /// included, and reports an invalid row wherever it is.
    #[test]
    fn fused_rows_match_the_whole_array_path_bit_for_bit() {
        let mut rng = rand_pcg::Pcg64::seed_from_u64(11);
        let (rows, vocab) = (6, 100_003);
        let z = Array2::from_shape_fn((rows, vocab), |_| rng.random_range(-20.0..20.0));
        let t = ndarray::array![1.0, 0.0, 0.7, 2.5, 1e-3, 1.0];
        let (k, p) = (Array1::zeros(rows), Array1::ones(rows));
        let fused = process_logits(z.view(), t.view(), k.view(), p.view()).expect("valid rows");
        let whole = sorted_process_logits(z.view(), t.view(), k.view(), p.view(), argmax_last(z.view()).view(), false, false);
        assert!(fused.iter().zip(&whole).all(|(a, b)| a.to_bits() == b.to_bits()));
        for (r, bad) in [(0, f64::NAN), (5, f64::INFINITY)] {
            let mut broken = z.clone();
            broken[[r, vocab - 1]] = bad;
            assert!(process_logits(broken.view(), t.view(), k.view(), p.view()).is_none(), "row {r}: {bad}");
        }
        let mut masked = z.clone();
        masked.row_mut(3).fill(f64::NEG_INFINITY);
        assert!(process_logits(masked.view(), t.view(), k.view(), p.view()).is_none(), "an all -inf row");
    }
}
