//! `ndarray-f32`'s softmax rows (LOGITS-2/3 without top-k or top-p, the
//! decoder's hot path): f32 probabilities, the exponentials' polynomial in
//! f32 and vectorised, instead of the reference's scalar f64 `exp`.
//!
//! The f64 path must call the C library's `exp` once per logit to match the
//! reference bit for bit, and that call is most of a verify from logits. Here
//! each weight is [`exp_f32_poly`]`((l - max) / T)`: the argument reduction
//! `x = n ln 2 + r` and the scaling by `2^n` in f64 (exact but for one
//! rounding), and `exp(r)` for `|r| <= ln 2 / 2` by Cephes' `expf`
//! degree-6 polynomial in f32, all branch-free so the compiler vectorises
//! it. The weights are stored in f32, their stored values summed in f64
//! (eight lanes), and scaled by the sum's inverse in f64.
//!
//! Error, which [`crate::NdarrayBackend::f32_softmax`] states: every weight
//! is within `EXP_REL_ERROR` (1e-7) of `exp` relative (the test below
//! checks a dense sweep), and the two f32 roundings (the stored weight and
//! the stored probability) add 2^-24 each, so a probability is within
//! about 2.2e-7 of the reference relative, and so absolute since `p <= 1`;
//! a ratio `p / q` within twice that. Weights below f32's normal range
//! (1.2e-38) lose relative precision and arguments below [`UNDERFLOW`] give
//! exactly 0, both at absolute errors below 1e-37. Mul and add are never fused
//! (Rust does not contract them), so the AVX-512, AVX2 and portable builds
//! give the same bits.

/// Relative error bound of [`exp_f32_poly`] against f64 `exp`.
#[cfg(test)]
pub(crate) const EXP_REL_ERROR: f64 = 1e-7;

/// Below this, `exp(x)` is under f64's smallest normal and is taken as 0.
const UNDERFLOW: f64 = -708.0;

const LANES: usize = 16;

use ndarray::{Array1, ArrayView1, ArrayView2, ArrayViewMut2};

use crate::NdTensor;

use crate::kernels::{Float, for_rows, row_argmax};
use crate::widest::widest;

/// 1.5 * 2^52: adding it rounds a float below 2^51 to an integer, which then
/// sits in the low bits of the sum's representation.
const ROUNDER: f64 = 6_755_399_441_055_744.0;

/// `exp(x)` for `x <= 0` (NaN and `-inf` included: NaN rows are rejected
/// before, and `-inf` gives 0).
#[inline(always)]
pub(crate) fn exp_f32_poly(x: f64) -> f64 {
    let clamped = x.max(UNDERFLOW);
    let shifted = clamped * std::f64::consts::LOG2_E + ROUNDER;
    let n = shifted - ROUNDER;
    let ni = (shifted.to_bits() as i64).wrapping_sub(ROUNDER.to_bits() as i64);
    let r = (clamped - n * std::f64::consts::LN_2) as f32;
    let poly = ((((1.987_569_2e-4 * r + 1.398_199_9e-3) * r + 8.333_452e-3) * r + 4.166_579_6e-2) * r + 1.666_666_5e-1) * r + 0.5;
    let y = poly * (r * r) + r + 1.0;
    let scale = f64::from_bits(((ni + 1023) << 52) as u64);
    let e = f64::from(y) * scale;
    if x < UNDERFLOW { 0.0 } else { e }
}

/// LOGITS-2/3 on every row of `z [R, V]` (f32 or f64 logits), none using
/// top-k or top-p, into f32 probabilities in a pooled buffer (every value is
/// written); `None` when a row is not a valid score row (LOGITS-1). Rows are
/// split across threads as in the f64 path.
pub(crate) fn process<F: Float>(z: ArrayView2<'_, F>, t: ArrayView1<'_, f64>) -> Option<NdTensor> {
    let every = Array1::from_elem(z.nrows(), true);
    NdTensor::pooled_f32(&[z.nrows(), z.ncols()], |buffer| {
        let out = ArrayViewMut2::from_shape(z.dim(), buffer).expect("rows · vocab values");
        for_rows(z, every.view(), out, |r, row, out| softmax_row(row, t[r], out))
    })
}

/// One row, like the f64 path's `softmax_row`: one-hot at the lowest-id
/// argmax when `t = 0`, else the weights over their f64 sum. Returns the
/// row's LOGITS-1 validity.
pub(crate) fn softmax_row<F: Float>(z: &[F], t: f64, out: &mut [f32]) -> bool {
    let (top, valid) = row_argmax(z);
    if t == 0.0 {
        out.fill(0.0);
        out[top] = 1.0;
        return valid;
    }
    if !valid {
        return false; // NaN or +inf: the output is discarded
    }
    let (max, inv_t) = (z[top].into(), 1.0 / t);
    let total = if inv_t.is_finite() {
        dispatch(z, max, inv_t, out)
    } else {
        // A subnormal temperature: `1 / t` overflows, and `0 · inf` would
        // make the maximum's weight NaN. Divide, as the reference does.
        divided(z, max, t, out)
    };
    let scale = 1.0 / total;
    for o in out.iter_mut() {
        *o = (f64::from(*o) * scale) as f32;
    }
    true
}

/// Writes each weight into `out` and returns the sum of what was written,
/// on the widest instruction set the machine has.
fn dispatch<F: Float>(z: &[F], max: f64, inv_t: f64, out: &mut [f32]) -> f64 {
    widest(
        #[inline(always)]
        || weights(z, max, inv_t, out),
    )
}

/// The weights with `(l - max) / t` divided, not multiplied by `1 / t`.
fn divided<F: Float>(z: &[F], max: f64, t: f64, out: &mut [f32]) -> f64 {
    let mut total = 0.0;
    for (&l, o) in z.iter().zip(out.iter_mut()) {
        *o = exp_f32_poly((l.into() - max) / t) as f32;
        total += f64::from(*o);
    }
    total
}

/// The weights of a row in chunks of [`LANES`] (the loop the compiler
/// vectorises), their sum in eight f64 lanes, then the tail.
#[inline(always)]
fn weights<F: Float>(z: &[F], max: f64, inv_t: f64, out: &mut [f32]) -> f64 {
    let mut acc = [0.0f64; LANES];
    let mut zc = z.chunks_exact(LANES);
    let mut oc = out.chunks_exact_mut(LANES);
    for (zs, os) in (&mut zc).zip(&mut oc) {
        let mut e = [0.0f32; LANES];
        for j in 0..LANES {
            e[j] = exp_f32_poly((zs[j].into() - max) * inv_t) as f32;
        }
        os.copy_from_slice(&e);
        for j in 0..LANES {
            acc[j] += f64::from(e[j]);
        }
    }
    let mut total = acc.iter().sum::<f64>();
    for (&l, o) in zc.remainder().iter().zip(oc.into_remainder()) {
        *o = exp_f32_poly((l.into() - max) * inv_t) as f32;
        total += f64::from(*o);
    }
    total
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The worst relative error over a dense sweep of `[UNDERFLOW, 0]`
    /// (steps of about 2^-20 above -1 and 2^-9 below, off the grid so the
    /// reduction sees every residue).
    fn worst_error(exp: impl Fn(f64) -> f64) -> f64 {
        let mut worst = 0.0f64;
        let mut x = 0.0f64;
        while x >= UNDERFLOW {
            let want = x.exp();
            worst = worst.max((exp(x) - want).abs() / want);
            x -= if x > -1.0 { 0.953e-6 } else { 1.953e-3 };
        }
        worst
    }

    #[test]
    fn exp_f32_is_within_its_stated_error() {
        let worst = worst_error(exp_f32_poly);
        assert!(worst <= EXP_REL_ERROR, "worst relative error {worst:e}");
        assert_eq!(exp_f32_poly(f64::NEG_INFINITY), 0.0);
        assert_eq!(exp_f32_poly(-1000.0), 0.0);
        assert_eq!(exp_f32_poly(0.0), 1.0);
    }

    /// Negative control: the same reduction with a polynomial one degree
    /// shorter breaks the bound the sweep checks.
    #[test]
    fn a_shorter_polynomial_fails_the_bound() {
        let short = |x: f64| {
            let n = (x * std::f64::consts::LOG2_E).round();
            let r = (x - n * std::f64::consts::LN_2) as f32;
            let poly = ((8.333_452e-3 * r + 4.166_579_6e-2) * r + 1.666_666_5e-1) * r + 0.5;
            f64::from(poly * r * r + r + 1.0) * 2f64.powi(n as i32)
        };
        assert!(worst_error(short) > EXP_REL_ERROR);
    }

    /// A subnormal temperature (LOGITS-1 accepts it; `1 / t` overflows): the
    /// row is the reference's, one-hot on the maximum's ties.
    #[test]
    fn a_subnormal_temperature_gives_the_references_row() {
        let z = [1.0f64, 3.0, 2.0, 3.0];
        let mut out = [0.0f32; 4];
        assert!(softmax_row(&z, 1e-310, &mut out));
        assert_eq!(out, [0.0, 0.5, 0.0, 0.5]);
    }

    /// The vectorised row against the reference's f64 softmax, on rows with
    /// masked ids, a wide logit range, a tail, and a small temperature.
    #[test]
    fn rows_are_within_the_stated_tolerance_of_the_reference() {
        use rand::{RngExt, SeedableRng};
        let mut rng = rand_pcg::Pcg64::seed_from_u64(5);
        for (vocab, t) in [(1, 1.0), (17, 0.7), (4099, 1.0), (151_936, 1.0), (32_768, 0.05), (1000, 3.0)] {
            let mut z: Vec<f64> = (0..vocab).map(|_| rng.random_range(-30.0..30.0)).collect();
            if vocab > 1 {
                z[vocab / 2] = f64::NEG_INFINITY;
            }
            let max = z.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            let w: Vec<f64> = z.iter().map(|&l| ((l - max) / t).exp()).collect();
            let s: f64 = w.iter().sum();
            let mut out = vec![0.0f32; vocab];
            assert!(softmax_row(&z, t, &mut out));
            let worst = out.iter().zip(&w).map(|(&o, w)| (f64::from(o) - w / s).abs()).fold(0.0, f64::max);
            assert!(worst <= 3e-7, "V={vocab}, T={t}: {worst:e}");
            // Below f32's normal range the relative precision goes by design.
            let relative = out.iter().zip(&w).filter(|(_, w)| **w / s > 1e-37).map(|(&o, w)| (f64::from(o) - w / s).abs() / (w / s)).fold(0.0, f64::max);
            assert!(relative <= 3e-7, "V={vocab}, T={t}: relative {relative:e}");
        }
    }
}
