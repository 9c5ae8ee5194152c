//! Array primitives every op is built from: index-order reductions and
//! scans, lowest-id argmax, gathers, `where`, and the per-lane sort that
//! ndarray lacks.
//!
//! Sums use `fold_axis` and `accumulate_axis_inplace`, which visit a lane in
//! index order, so every f64 sum rounds exactly as the reference's loop
//! (CONV-9). `sum_axis`/`sum` are avoided: they use an unrolled order.
//! Gathers index with values the caller has validated or computed in range;
//! they clamp anyway so that no index can panic.

use std::cmp::Ordering;

use ndarray::{Array1, Array2, ArrayView1, ArrayView2, ArrayView3, Axis, Zip};

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

/// Argmax over the last axis with ties to the lowest id (CONV-8): the row
/// maximum, then the smallest position holding it. Rows must be NaN-free.
pub(crate) fn argmax_last(a: ArrayView2<'_, f64>) -> Array1<usize> {
    let v = a.ncols();
    let max = a.fold_axis(Axis(1), f64::NEG_INFINITY, |m, &x| m.max(x));
    let pos = arange(v);
    Zip::from(&a)
        .and_broadcast(pos.view().insert_axis(Axis(0)))
        .and_broadcast(max.view().insert_axis(Axis(1)))
        .map_collect(|&x, &i, &m| if x == m { i } else { v })
        .fold_axis(Axis(1), v, |best, &i| (*best).min(i))
        .mapv(|i| i.min(v.saturating_sub(1)))
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
pub(crate) fn take_ids(a: ArrayView3<'_, f64>, idx: ArrayView2<'_, usize>) -> Array2<f64> {
    let (batch, rows, v) = a.dim();
    let flat = a.to_shape((batch * rows, v)).expect("same element count");
    let idx = idx.to_shape(batch * rows).expect("same element count");
    take_along_last(flat.view(), idx.view()).into_shape_with_order((batch, rows)).expect("one value per row")
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
