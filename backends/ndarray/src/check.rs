//! Fast validity checks (ERR-1, CONV-1 .. CONV-8).
//!
//! Each op checks shapes from the array dims, then folds every value
//! condition into one boolean with array reductions. The checks accept
//! exactly what the reference accepts; when one fails, the op hands host
//! copies to the reference backend, whose error names the first defect.

use ndarray::{Array1, ArrayD, ArrayView1, ArrayView2, Axis, Ix1, Ix2, Ix3, Zip};
use specdec_backend::PAD;
use specdec_reference::{MAX_EXPONENTIAL, MIN_EXPONENTIAL, SUM_TOLERANCE};

use crate::kernels::{Float, below, sum_last};

/// A validated padded draft batch (CONV-5).
pub(crate) struct Layout {
    pub batch: usize,
    pub k: usize,
    pub lens: Array1<usize>,
}

pub(crate) fn dims<T, D: ndarray::Dimension>(a: &ArrayD<T>) -> Option<ndarray::ArrayView<'_, T, D>> {
    a.view().into_dimensionality::<D>().ok()
}

pub(crate) fn d1<T>(a: &ArrayD<T>) -> Option<ArrayView1<'_, T>> {
    dims::<T, Ix1>(a)
}

pub(crate) fn d2<T>(a: &ArrayD<T>) -> Option<ArrayView2<'_, T>> {
    dims::<T, Ix2>(a)
}

pub(crate) fn d3<T>(a: &ArrayD<T>) -> Option<ndarray::ArrayView3<'_, T>> {
    dims::<T, Ix3>(a)
}

/// `len` as a usize when it lies in `[lo, hi]`.
fn in_range(len: i64, lo: usize, hi: usize) -> bool {
    len >= 0 && (lo as u64..=hi as u64).contains(&(len as u64))
}

pub(crate) fn valid_id(t: i64, vocab: usize) -> bool {
    t >= 0 && (t as u64) < vocab as u64
}

/// CONV-5: `drafts [B, k]`, `lens [B]` in `[0, k]`, ids below the length,
/// PAD after; `None` if anything is wrong.
pub(crate) fn draft_layout(drafts: &ArrayD<i64>, lens: &ArrayD<i64>, vocab: usize) -> Option<Layout> {
    let d = d2(drafts)?;
    let (batch, k) = d.dim();
    let l = d1(lens).filter(|l| batch >= 1 && k >= 1 && l.len() == batch)?;
    if !Zip::from(&l).all(|&n| in_range(n, 0, k)) {
        return None;
    }
    let lens = l.mapv(|n| n as usize);
    let live = below(lens.view(), k);
    let ok = Zip::from(&d).and(&live).all(|&t, &l| if l { valid_id(t, vocab) } else { t == PAD });
    ok.then_some(Layout { batch, k, lens })
}

/// CONV-2 on rows `[N, V]` whose `live` flag is set; other rows (padding,
/// CONV-7) are masked out before any reduction, so NaN there is ignored.
pub(crate) fn prob_rows_ok<F: Float>(rows: ArrayView2<'_, F>, live: ArrayView1<'_, bool>) -> bool {
    let live2 = live.insert_axis(Axis(1));
    let elems = Zip::from(&rows).and_broadcast(live2).all(|&x, &l| !l || (x.into().is_finite() && x.into() >= 0.0));
    if !elems {
        return false;
    }
    let masked = Zip::from(&rows).and_broadcast(live2).map_collect(|&x, &l| if l { x.into() } else { 0.0 });
    Zip::from(&sum_last(masked.view())).and(live).all(|&s, &l| !l || (s - 1.0).abs() <= SUM_TOLERANCE)
}

/// SAMPLE-1/2 weight rows: finite, `>= 0`, positive and finite total.
pub(crate) fn weight_rows_ok(rows: ArrayView2<'_, f64>) -> bool {
    Zip::from(&rows).all(|&x| x.is_finite() && x >= 0.0) && Zip::from(&sum_last(rows)).all(|&s| s > 0.0 && s.is_finite())
}

/// CONV-3: every value in `[0, 1)` (NaN fails).
pub(crate) fn uniforms_ok(u: &ArrayD<f64>) -> bool {
    Zip::from(u).all(|&x| (0.0..1.0).contains(&x))
}

/// SAMPLE-2: every value within `[2^-126, 2^126]`.
pub(crate) fn exponentials_ok(e: &ArrayD<f64>) -> bool {
    Zip::from(e).all(|x| (MIN_EXPONENTIAL..=MAX_EXPONENTIAL).contains(x))
}

pub(crate) fn all_finite(a: &ArrayD<f64>) -> bool {
    Zip::from(a).all(|x| x.is_finite())
}

/// Flattens `[B, K, V]` to `[B*K, V]` rows (a view when contiguous).
pub(crate) fn rows_of<'a, T: Clone>(a: &'a ndarray::ArrayView3<'_, T>) -> ndarray::CowArray<'a, T, Ix2> {
    let (b, k, v) = a.dim();
    a.to_shape((b * k, v)).expect("same element count")
}

/// `lens [B]` of a batch given in `[lo, hi]`, as usize.
pub(crate) fn lens_in(lens: &ArrayD<i64>, batch: usize, lo: usize, hi: usize) -> Option<Array1<usize>> {
    let l = d1(lens).filter(|l| l.len() == batch)?;
    Zip::from(&l).all(|&n| in_range(n, lo, hi)).then(|| l.mapv(|n| n as usize))
}
