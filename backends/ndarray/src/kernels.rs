//! Array primitives every op is built from: index-order reductions and
//! scans, lowest-id argmax, gathers, `where`, and the per-lane sort that
//! ndarray lacks.
//!
//! Sums use `fold_axis` and `accumulate_axis_inplace`, which visit a lane in
//! index order, so every f64 sum rounds exactly as the reference's loop
//! (CONV-9). `sum_axis`/`sum` are avoided: they use an unrolled order.
//! Gathers index with values the caller has validated or computed in range;
//! they clamp anyway so that no index can panic.

use std::borrow::Cow;
use std::cmp::Ordering;

use ndarray::{Array1, Array2, ArrayView1, ArrayView2, ArrayView3, ArrayViewMut2, Axis, Zip};

/// The float types the row kernels read: f64, and f32 for `ndarray-f32`'s
/// probabilities and f32 uploads. Widening to f64 is exact.
pub(crate) trait Float: Copy + PartialOrd + Into<f64> + Send + Sync + 'static {
    const NEG_INFINITY: Self;
}

impl Float for f64 {
    const NEG_INFINITY: Self = f64::NEG_INFINITY;
}

impl Float for f32 {
    const NEG_INFINITY: Self = f32::NEG_INFINITY;
}

/// Row sums over the last axis, accumulated in index order.
pub(crate) fn sum_last(a: ArrayView2<'_, f64>) -> Array1<f64> {
    a.fold_axis(Axis(1), 0.0, |s, &x| s + x)
}

/// Inclusive cumulative sums over the last axis, in index order.
pub(crate) fn cumsum_last(a: ArrayView2<'_, f64>) -> Array2<f64> {
    let mut c = a.to_owned();
    c.accumulate_axis_inplace(Axis(1), |&prev, cur| *cur += prev);
    c
}

/// `sum(cumprod(flags))` over the last axis: the length of each row's
/// leading run of `true` (GREEDY-3, DFLASH-2, REJECT-2).
pub(crate) fn leading_run(flags: ArrayView2<'_, bool>) -> Array1<usize> {
    let mut c = flags.mapv(usize::from);
    c.accumulate_axis_inplace(Axis(1), |&prev, cur| *cur *= prev);
    c.fold_axis(Axis(1), 0, |s, &x| s + x)
}

/// `0..n` as an array, the position axis of masks and gathers.
pub(crate) fn arange(n: usize) -> Array1<usize> {
    Array1::from_iter(0..n)
}

/// `mask[b, j] = j < bound[b]` for `j < width`.
pub(crate) fn below(bound: ArrayView1<'_, usize>, width: usize) -> Array2<bool> {
    let pos = arange(width);
    let grid = pos.broadcast((bound.len(), width)).expect("a row broadcasts to any number of rows");
    Zip::from(grid).and_broadcast(bound.insert_axis(Axis(1))).map_collect(|&j, &n| j < n)
}

/// Argmax over the last axis with ties to the lowest id (CONV-8), one
/// [`row_argmax`] pass per row. Rows must be NaN-free.
pub(crate) fn argmax_last(a: ArrayView2<'_, f64>) -> Array1<usize> {
    a.rows().into_iter().map(|row| row_argmax(&row.as_slice().map_or_else(|| Cow::Owned(row.to_vec()), Cow::Borrowed)).0).collect()
}

/// Lowest-id argmax (CONV-8) of every live row of `[R, V]`, and whether
/// every live row is a valid score row (GREEDY-1: no NaN, no `+inf`, some
/// finite value), reading each live row once. Dead rows (CONV-7) are not
/// read: their argmax is 0. A greedy verify needs nothing else from the
/// scores, so this one pass is the whole of its O(B k V) work; with enough
/// to read, the rows are split across threads.
pub(crate) fn argmax_rows_checked<F: Float>(a: ArrayView2<'_, F>, live: ArrayView1<'_, bool>) -> (Array1<usize>, bool) {
    let mut out = Array2::zeros((a.nrows(), 1));
    let valid = for_rows(a, live, out.view_mut(), |_, row, top| {
        let (i, ok) = row_argmax(row);
        top[0] = i;
        ok
    });
    (out.remove_axis(Axis(1)), valid)
}

/// `f(r, row, out_row)` for every live row `r` of `a` (as a slice) and its
/// row of `out`, returning whether every call returned `true` (and `false`
/// if an output row is not contiguous, which a fresh standard-layout `out`
/// never has). With enough values
/// to read, the rows are split across the machine's threads (each writes
/// only its own output rows, so the result does not depend on the split).
pub(crate) fn for_rows<F: Float, T: Send>(a: ArrayView2<'_, F>, live: ArrayView1<'_, bool>, mut out: ArrayViewMut2<'_, T>, f: impl Fn(usize, &[F], &mut [T]) -> bool + Sync) -> bool {
    /// Below this many live values a thread costs more than it saves.
    const PER_THREAD: usize = 1 << 18;
    let rows = a.nrows();
    let read = live.iter().filter(|&&l| l).count() * a.ncols();
    let threads = specdec_models::parallel::threads_for(read, PER_THREAD).min(rows.max(1));
    let run = |first: usize, a: ArrayView2<'_, F>, live: ArrayView1<'_, bool>, mut out: ArrayViewMut2<'_, T>| {
        let mut ok = true;
        for (r, ((row, &l), mut o)) in a.rows().into_iter().zip(live).zip(out.rows_mut()).enumerate() {
            if l {
                let row = row.to_slice().map_or_else(|| Cow::Owned(row.to_vec()), Cow::Borrowed);
                // The callers' `out` is a fresh standard-layout array: its rows are slices.
                ok &= o.as_slice_mut().is_some_and(|o| f(first + r, &row, o));
            }
        }
        ok
    };
    if threads == 1 {
        return run(0, a, live, out);
    }
    let per = rows.div_ceil(threads);
    std::thread::scope(|s| {
        let run = &run;
        let handles: Vec<_> = a
            .axis_chunks_iter(Axis(0), per)
            .zip(live.axis_chunks_iter(Axis(0), per))
            .zip(out.axis_chunks_iter_mut(Axis(0), per))
            .enumerate()
            .map(|(i, ((a, live), out))| s.spawn(move || run(i * per, a, live, out)))
            .collect();
        // Join every thread before judging, so none outlives a failed row.
        let oks: Vec<bool> = handles.into_iter().map(|h| h.join().unwrap_or_else(|e| std::panic::resume_unwind(e))).collect();
        oks.into_iter().all(|ok| ok)
    })
}

/// One row's lowest-id argmax and GREEDY-1 validity. The maximum and the
/// NaN flag are kept in eight independent lanes so the compiler can
/// vectorise the one pass over the row (`x > m` ignores NaN, and a row with
/// a NaN is invalid whatever its maximum); the first id holding the maximum
/// is then found with an early-exit scan of a row still in cache.
// `x != x` is the NaN test of any float type.
#[allow(clippy::eq_op)]
pub(crate) fn row_argmax<F: Float>(row: &[F]) -> (usize, bool) {
    const LANES: usize = 8;
    let mut max = [F::NEG_INFINITY; LANES];
    let mut nan = [false; LANES];
    let chunks = row.chunks_exact(LANES);
    let tail = chunks.remainder();
    for c in chunks {
        for j in 0..LANES {
            nan[j] |= c[j] != c[j];
            max[j] = if c[j] > max[j] { c[j] } else { max[j] };
        }
    }
    let (mut m, mut any_nan) = (F::NEG_INFINITY, nan.contains(&true));
    for &x in max.iter().chain(tail) {
        any_nan |= x != x;
        m = if x > m { x } else { m };
    }
    // `m` is `+inf` (invalid), `-inf` (every id masked: invalid) or finite.
    (row.iter().position(|&x| x == m).unwrap_or(0), !any_nan && m.into().is_finite())
}

/// `a[r, idx[r]]`: one element per row (a gather on the flattened array).
pub(crate) fn take_along_last<T: Clone>(a: ArrayView2<'_, T>, idx: ArrayView1<'_, usize>) -> Array1<T> {
    let (rows, v) = a.dim();
    let flat = a.to_shape(rows * v).expect("same element count");
    let offsets: Vec<usize> = Zip::from(&arange(rows)).and(idx).map_collect(|&r, &j| r * v + j.min(v - 1)).into_iter().collect();
    flat.select(Axis(0), &offsets)
}

/// `a[r, idx[r, j]]`: a row-wise gather of a whole index matrix.
pub(crate) fn take_along_last2<T: Clone>(a: ArrayView2<'_, T>, idx: ArrayView2<'_, usize>) -> Array2<T> {
    let (rows, v) = a.dim();
    let flat = a.to_shape(rows * v).expect("same element count");
    let offsets = Zip::from(idx).and_broadcast(arange(rows).view().insert_axis(Axis(1))).map_collect(|&j, &r| r * v + j.min(v - 1));
    let picked = flat.select(Axis(0), &offsets.iter().copied().collect::<Vec<_>>());
    picked.into_shape_with_order(idx.dim()).expect("one value per index")
}

/// `a[b, idx[b], :]`: one row of the middle axis per batch entry.
pub(crate) fn take_rows<T: Clone>(a: ArrayView3<'_, T>, idx: ArrayView1<'_, usize>) -> Array2<T> {
    let (batch, rows, v) = a.dim();
    let flat = a.to_shape((batch * rows, v)).expect("same element count");
    let offsets: Vec<usize> = Zip::from(&arange(batch)).and(idx).map_collect(|&b, &j| b * rows + j.min(rows - 1)).into_iter().collect();
    flat.select(Axis(0), &offsets)
}

/// `a[b, j, idx[b, j]]`: one element per row of a `[B, K, V]` array.
/// Indexed in place: `a` may be a slice of a larger array (the first `k`
/// of `k + 1` rows), which flattening would copy whole.
pub(crate) fn take_ids<T: Clone>(a: ArrayView3<'_, T>, idx: ArrayView2<'_, usize>) -> Array2<T> {
    let v = a.dim().2;
    Array2::from_shape_fn(idx.dim(), |(b, j)| a[[b, j, idx[[b, j]].min(v - 1)]].clone())
}

/// Per-row argsort by `cmp`, ties to the lower id. ndarray has no sort, so
/// each lane is sorted with the standard slice sort: the loop runs over
/// rows only, never over vocabulary entries.
pub(crate) fn argsort_rows<T: Copy>(a: ArrayView2<'_, T>, cmp: impl Fn(T, T) -> Ordering) -> Array2<usize> {
    let mut order = Array2::from_shape_fn(a.dim(), |(_, j)| j);
    Zip::from(order.rows_mut()).and(a.rows()).for_each(|mut ids, row| {
        if let Some(ids) = ids.as_slice_mut() {
            ids.sort_by(|&i, &j| cmp(row[i], row[j]).then(i.cmp(&j)));
        }
    });
    order
}

#[cfg(test)]
mod tests {
    use ndarray::array;

    use super::*;

    #[test]
    fn argmax_ties_go_to_the_lowest_id() {
        let a = array![[1.0, 3.0, 3.0], [f64::NEG_INFINITY, -1.0, -1.0], [0.0, -0.0, 0.0]];
        assert_eq!(argmax_last(a.view()).to_vec(), vec![1, 1, 0]);
    }

    /// The one-pass kernel against a plain scan, on rows whose maxima and
    /// defects sit in every lane and in the tail, split across threads and not.
    #[test]
    fn one_pass_argmax_and_score_check_match_a_plain_scan() {
        use rand::{RngExt, SeedableRng};
        fn plain(row: &[f64]) -> (usize, bool) {
            let m = row.iter().copied().filter(|x| !x.is_nan()).fold(f64::NEG_INFINITY, f64::max);
            let valid = !row.iter().any(|x| x.is_nan() || *x == f64::INFINITY) && row.iter().any(|x| x.is_finite());
            (row.iter().position(|&x| x == m).unwrap_or(0), valid)
        }
        // Each defect alone, in the eight lanes and in the tail of a 19-id row.
        for at in [0, 5, 7, 15, 16, 18] {
            for bad in [f64::NAN, f64::INFINITY] {
                let mut row = vec![1.0; 19];
                row[at] = bad;
                assert_eq!(row_argmax(&row), plain(&row), "{bad} at {at}");
            }
            let mut row = vec![f64::NEG_INFINITY; 19];
            row[at] = -3.0;
            assert_eq!(row_argmax(&row), (at, true), "one finite id at {at}");
        }
        assert_eq!(row_argmax(&[f64::NEG_INFINITY; 19]), (0, false));
        let mut rng = rand_pcg::Pcg64::seed_from_u64(7);
        for (rows, v) in [(3, 1), (5, 13), (9, 8), (4, 1 << 17), (64, 4099)] {
            let mut a = Array2::from_shape_fn((rows, v), |_| (rng.random_range(0..8) as f64) - 4.0);
            for r in 0..rows {
                let j = rng.random_range(0..v);
                match r % 5 {
                    0 => a[[r, j]] = f64::NAN,
                    1 => a[[r, j]] = f64::INFINITY,
                    2 => a.row_mut(r).fill(f64::NEG_INFINITY),
                    _ => a[[r, j]] = 9.0,
                }
            }
            for live_every in [1, 2] {
                let live = Array1::from_shape_fn(rows, |r| r % live_every == 0);
                let (top, valid) = argmax_rows_checked(a.view(), live.view());
                let want: Vec<(usize, bool)> = a.rows().into_iter().zip(&live).map(|(row, &l)| if l { plain(&row.to_vec()) } else { (0, true) }).collect();
                assert_eq!(top.to_vec(), want.iter().map(|w| w.0).collect::<Vec<_>>(), "{rows}x{v}, live every {live_every}");
                assert_eq!(valid, want.iter().all(|w| w.1), "{rows}x{v}, live every {live_every}");
                let clean: Vec<usize> = (0..rows).filter(|&r| r % 5 > 2 && live[r]).collect();
                let (top, valid) = argmax_rows_checked(a.select(Axis(0), &clean).view(), Array1::from_elem(clean.len(), true).view());
                assert!(valid && top.iter().zip(&clean).all(|(&t, &r)| t == plain(&a.row(r).to_vec()).0));
            }
        }
    }

    #[test]
    fn cumsum_rounds_in_index_order() {
        let a = array![[1e16, 1.0, 1.0, -1e16]];
        let c = cumsum_last(a.view());
        let mut running = 0.0;
        for (j, x) in [1e16, 1.0, 1.0, -1e16].into_iter().enumerate() {
            running += x;
            assert_eq!(c[[0, j]], running);
        }
        assert_eq!(sum_last(a.view())[0], running);
    }

    #[test]
    fn leading_run_stops_at_the_first_false() {
        let f = array![[true, true, false, true], [false, true, true, true], [true, true, true, true]];
        assert_eq!(leading_run(f.view()).to_vec(), vec![2, 0, 4]);
    }

    #[test]
    fn gathers_pick_per_row_indices() {
        let a = array![[0, 1, 2], [10, 11, 12]];
        assert_eq!(take_along_last(a.view(), array![2, 0].view()).to_vec(), vec![2, 10]);
        let idx = array![[1, 1], [2, 0]];
        assert_eq!(take_along_last2(a.view(), idx.view()), array![[1, 1], [12, 10]]);
        let b = array![[[0, 1], [2, 3]], [[4, 5], [6, 7]]];
        assert_eq!(take_rows(b.view(), array![1, 0].view()), array![[2, 3], [4, 5]]);
    }
}
