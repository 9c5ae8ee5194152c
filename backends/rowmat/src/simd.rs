//! The three implementations of the canonical dot product (crate doc):
//! AVX-512 tiles (one 16-lane register per lane set), AVX2 + FMA tiles (two
//! 8-lane registers per lane set) and the portable lanes with
//! `f32::mul_add`. All three accumulate element `i` into lane `i mod 16`
//! in increasing `i` and end in [`reduce`], so they agree bit for bit.

use std::cell::RefCell;
use std::sync::OnceLock;

use crate::{LANES, Q8Matrix};

/// The fixed lane sum: halves added pairwise, `l[i] + l[i + 8]`, then
/// `+ 4`, `+ 2`, `+ 1` (the order a 16 → 8 → 4 → 2 → 1 register
/// reduction takes).
#[inline]
pub(crate) fn reduce(l: [f32; LANES]) -> f32 {
    let mut s8 = [0.0f32; 8];
    for i in 0..8 {
        s8[i] = l[i] + l[i + 8];
    }
    let s4 = [s8[0] + s8[4], s8[1] + s8[5], s8[2] + s8[6], s8[3] + s8[7]];
    let s2 = [s4[0] + s4[2], s4[1] + s4[3]];
    s2[0] + s2[1]
}

/// Elements past the last whole 16-value chunk, into their lanes in order.
#[inline]
fn tail(lanes: &mut [f32; LANES], w: &[f32], x: &[f32], from: usize) {
    for k in from..w.len() {
        lanes[k % LANES] = w[k].mul_add(x[k], lanes[k % LANES]);
    }
}

/// The portable path.
pub(crate) fn dot_portable(a: &[f32], b: &[f32]) -> f32 {
    let mut lanes = [0.0f32; LANES];
    tail(&mut lanes, b, a, 0);
    reduce(lanes)
}

/// The instruction sets of this machine's path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Isa {
    Avx512,
    Avx2,
    Portable,
}

/// Detected once per process.
pub(crate) fn isa() -> Isa {
    static ISA: OnceLock<Isa> = OnceLock::new();
    *ISA.get_or_init(|| {
        #[cfg(target_arch = "x86_64")]
        {
            if std::is_x86_feature_detected!("avx512f") {
                return Isa::Avx512;
            }
            if std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma") {
                return Isa::Avx2;
            }
        }
        Isa::Portable
    })
}

pub(crate) fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut out = [0.0f32];
    block_f32(b, a.len(), a, 1, &mut out, isa());
    out[0]
}

/// `out[j · n + r] = dot(x row r, w row j)` for the `count = out.len() / n`
/// weight rows in `w` (`[count, cols]`).
pub(crate) fn block_f32(w: &[f32], cols: usize, x: &[f32], n: usize, out: &mut [f32], isa: Isa) {
    let count = out.len() / n;
    #[cfg(target_arch = "x86_64")]
    if isa != Isa::Portable {
        // Input rows outer: a window of up to `max_x` rows passes the
        // weights once, each weight chunk loaded into a register once for
        // all of the tile's input rows.
        let max_x = if isa == Isa::Avx512 { AVX512_MAX_X } else { AVX2_MAX_X };
        for r in (0..n).step_by(max_x) {
            let nx = max_x.min(n - r);
            let nw = if isa == Isa::Avx512 { avx512_tile_w(nx) } else { AVX2_TILE_W };
            let mut j = 0;
            while j < count {
                // Whole tiles, then single weight rows for the remainder.
                let take = if count - j >= nw { nw } else { 1 };
                let xr = |i: usize| &x[(r + i) * cols..(r + i + 1) * cols];
                let wr = |i: usize| &w[(j + i) * cols..(j + i + 1) * cols];
                let at = &mut out[j * n..(j + take) * n];
                // The weights PREFETCH_TILES tiles on, asked for while this tile computes.
                let ahead = w.as_ptr().wrapping_add((j + PREFETCH_TILES * take) * cols);
                if isa == Isa::Avx512 {
                    each_tile!((nx, take), avx512, xr, wr, cols, ahead, at, n, r; (1, 1), (1, 2), (1, 3), (1, 4), (1, 5), (1, 6), (2, 1), (2, 2), (2, 3), (2, 4), (2, 5), (2, 6), (3, 1), (3, 2), (3, 3), (3, 4), (3, 5), (3, 6), (4, 1), (4, 2), (4, 3), (4, 4), (4, 5), (4, 6), (5, 1), (5, 2), (5, 3), (5, 4), (5, 5), (5, 6), (6, 1), (6, 2), (6, 3), (6, 4), (6, 5), (6, 6), (7, 1), (7, 2), (7, 3), (7, 4), (7, 5), (7, 6), (8, 1), (8, 2), (8, 3), (8, 4), (8, 5), (8, 6), (9, 1), (9, 2), (9, 3), (9, 4), (9, 5), (9, 6));
                } else {
                    each_tile!((nx, take), avx2, xr, wr, cols, ahead, at, n, r; (1, 1), (1, 3), (2, 1), (2, 3));
                }
                j += take;
            }
        }
        return;
    }
    let _ = isa;
    for j in 0..count {
        for r in 0..n {
            out[j * n + r] = dot_portable(&x[r * cols..(r + 1) * cols], &w[j * cols..(j + 1) * cols]);
        }
    }
}

/// How far ahead (in tiles of weight rows) the kernels prefetch: the
/// weights of one tile are a few short rows, too short for the hardware
/// prefetcher to ramp up on while the tile's arithmetic runs.
#[cfg(target_arch = "x86_64")]
const PREFETCH_TILES: usize = 1;

/// Input rows per AVX-512 tile: a whole verify window of up to 9 tokens (k <= 8).
#[cfg(target_arch = "x86_64")]
const AVX512_MAX_X: usize = 9;
/// Input and weight rows per AVX2 tile (2 x 3 x 2 accumulators, 3 weight
/// and 1 input register: 16).
#[cfg(target_arch = "x86_64")]
const AVX2_MAX_X: usize = 2;
#[cfg(target_arch = "x86_64")]
const AVX2_TILE_W: usize = 3;

/// Weight rows per AVX-512 tile for `nx` input rows: as many as the 32
/// registers hold beside `nx · nw` accumulators and one input register,
/// at most 6.
#[cfg(target_arch = "x86_64")]
const BUDGET: usize = 31;
fn avx512_tile_w(nx: usize) -> usize {
    (BUDGET / (nx + 1)).min(6)
}

thread_local! {
    /// A task's dequantized weight rows.
    static SCRATCH: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// [`block_f32`] for Q8_0 rows `first .. first + count`: the task's rows
/// are dequantized (exactly, `d · q`) into a buffer that stays in L2 while
/// the input rows pass.
pub(crate) fn block_q8(q: &Q8Matrix, first: usize, count: usize, x: &[f32], n: usize, out: &mut [f32], isa: Isa) {
    let cols = q.cols();
    SCRATCH.with(|s| {
        let mut buf = s.borrow_mut();
        buf.resize(count * cols, 0.0);
        for j in 0..count {
            let dst = &mut buf[j * cols..(j + 1) * cols];
            #[cfg(target_arch = "x86_64")]
            if isa == Isa::Avx512 {
                let (scales, quants) = q.row_parts(first + j);
                // SAFETY: the CPU has AVX-512F (the caller's `isa`); the slices are one row's.
                unsafe { avx512::dequantize(scales, quants, dst) };
                continue;
            }
            dequantize_into(q, first + j, dst);
        }
        block_f32(&buf[..count * cols], cols, x, n, out, isa);
    });
}

fn dequantize_into(q: &Q8Matrix, r: usize, dst: &mut [f32]) {
    let (scales, quants) = q.row_parts(r);
    for ((d_out, q_in), &d) in dst.chunks_exact_mut(crate::Q8_0_BLOCK).zip(quants.chunks_exact(crate::Q8_0_BLOCK)).zip(scales) {
        for (o, &v) in d_out.iter_mut().zip(q_in) {
            *o = d * f32::from(v);
        }
    }
}

/// Expands to a `match` over the listed tile shapes `(NX, NW)`, calling
/// `$m::tile::<NX, NW>` with arrays of row slices.
#[cfg(target_arch = "x86_64")]
macro_rules! each_tile {
    ($shape:expr, $m:ident, $xr:expr, $wr:expr, $cols:expr, $ahead:expr, $out:expr, $n:expr, $r:expr; $(($a:literal, $b:literal)),*) => {
        match $shape {
            $(($a, $b) => {
                let x: [&[f32]; $a] = std::array::from_fn($xr);
                let w: [&[f32]; $b] = std::array::from_fn($wr);
                let ahead = $ahead;
                // SAFETY: the caller checked the instruction set; every row slice holds `cols` values.
                store(unsafe { $m::tile::<$a, $b>(w, x, $cols, ahead) }, $out, $n, $r)
            })*
            other => unreachable!("no tile of shape {other:?}"),
        }
    };
}
#[cfg(target_arch = "x86_64")]
use each_tile;

/// Writes a tile's results for input rows `r ..` into `out[j · n + r + i]`.
#[cfg(target_arch = "x86_64")]
fn store<const NR: usize, const NW: usize>(tile: [[f32; NW]; NR], out: &mut [f32], n: usize, r: usize) {
    for (i, row) in tile.iter().enumerate() {
        for (j, &v) in row.iter().enumerate() {
            out[j * n + r + i] = v;
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod avx512 {
    use std::arch::x86_64::*;

    use super::{reduce, tail};
    use crate::{LANES, Q8_0_BLOCK};

    /// One Q8_0 row into f32: `d · q`, sixteen at a time (the same exact
    /// products as the portable loop).
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn dequantize(scales: &[f32], quants: &[i8], dst: &mut [f32]) {
        for (b, &d) in scales.iter().enumerate() {
            let dv = _mm512_set1_ps(d);
            for half in 0..Q8_0_BLOCK / LANES {
                let at = b * Q8_0_BLOCK + half * LANES;
                // SAFETY: at + 16 <= quants.len() = dst.len() (a whole number of blocks).
                unsafe {
                    let q = _mm_loadu_si128(quants.as_ptr().add(at).cast());
                    let v = _mm512_mul_ps(dv, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q)));
                    _mm512_storeu_ps(dst.as_mut_ptr().add(at), v);
                }
            }
        }
    }

    /// `out[i][j] = dot(x[i], w[j])` in the canonical order, each lane set
    /// in one 16-lane register.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn tile<const NR: usize, const NW: usize>(w: [&[f32]; NW], x: [&[f32]; NR], cols: usize, ahead: *const f32) -> [[f32; NW]; NR] {
        let mut acc = [[_mm512_setzero_ps(); NW]; NR];
        let chunks = cols / LANES;
        for c in 0..chunks {
            for j in 0..NW {
                // A prefetch never faults; the address may lie past the weights.
                _mm_prefetch::<_MM_HINT_T0>(ahead.wrapping_add(j * cols + c * LANES).cast());
            }
            let mut wv = [_mm512_setzero_ps(); NW];
            for j in 0..NW {
                // SAFETY: c · 16 + 16 <= cols = w[j].len().
                wv[j] = unsafe { _mm512_loadu_ps(w[j].as_ptr().add(c * LANES)) };
            }
            for i in 0..NR {
                // SAFETY: as above, for x[i].
                let xv = unsafe { _mm512_loadu_ps(x[i].as_ptr().add(c * LANES)) };
                for j in 0..NW {
                    acc[i][j] = _mm512_fmadd_ps(wv[j], xv, acc[i][j]);
                }
            }
        }
        let mut out = [[0.0f32; NW]; NR];
        // No tail: the tile's accumulators are reduced sixteen at a time (the
        // reachable tiles hold at most 27; a larger one, which the dispatch
        // lists but `avx512_tile_w` never picks, takes the scalar path).
        if cols.is_multiple_of(LANES) && NR * NW <= 32 {
            let mut flat = [_mm512_setzero_ps(); 32];
            for i in 0..NR {
                for j in 0..NW {
                    flat[i * NW + j] = acc[i][j];
                }
            }
            let mut sums = [0.0f32; 32];
            for (group, at) in [(0, 0), (1, 16)] {
                if at < NR * NW {
                    let v: [__m512; 16] = std::array::from_fn(|m| flat[at + m]);
                    // SAFETY: the caller's CPU has AVX-512F.
                    sums[group * 16..group * 16 + 16].copy_from_slice(&unsafe { reduce16(v) });
                }
            }
            for i in 0..NR {
                for j in 0..NW {
                    out[i][j] = sums[i * NW + j];
                }
            }
            return out;
        }
        for i in 0..NR {
            for j in 0..NW {
                let mut lanes = [0.0f32; LANES];
                // SAFETY: `lanes` holds 16 f32.
                unsafe { _mm512_storeu_ps(lanes.as_mut_ptr(), acc[i][j]) };
                tail(&mut lanes, w[j], x[i], chunks * LANES);
                out[i][j] = reduce(lanes);
            }
        }
        out
    }

    /// [`reduce`] of sixteen accumulators at once: `out[m] = reduce(v[m])`.
    /// Shuffles line up, in one register, the lane pairs the scalar tree
    /// adds (`l[i] + l[i + 8]`, then `+ 4`, `+ 2`, `+ 1`), and each vector
    /// add is those same additions, so every result has the scalar tree's
    /// bits (`tests/invariance.rs` checks the paths against each other).
    /// A scalar reduction per accumulator cost a 9-row window about 2 ms of
    /// SmolLM2's 22 (measured 2026-11-26).
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn reduce16(v: [__m512; 16]) -> [f32; 16] {
        // Halves of 256 bits: t[m] holds l[i] + l[i + 8] of v[2m] in lanes
        // 0..8 and of v[2m + 1] in lanes 8..16.
        let t: [__m512; 8] = std::array::from_fn(|m| _mm512_add_ps(_mm512_shuffle_f32x4::<0x44>(v[2 * m], v[2 * m + 1]), _mm512_shuffle_f32x4::<0xEE>(v[2 * m], v[2 * m + 1])));
        // Quarters: u[m]'s 128-bit block j holds the 4-lane sums of v[4m + j].
        let u: [__m512; 4] = std::array::from_fn(|m| _mm512_add_ps(_mm512_shuffle_f32x4::<0x88>(t[2 * m], t[2 * m + 1]), _mm512_shuffle_f32x4::<0xDD>(t[2 * m], t[2 * m + 1])));
        // Pairs within each block: block j of w[m] holds the 2-lane sums of
        // v[8m + j] (lanes 0, 1) and v[8m + 4 + j] (lanes 2, 3).
        let w: [__m512; 2] = std::array::from_fn(|m| _mm512_add_ps(_mm512_shuffle_ps::<0x44>(u[2 * m], u[2 * m + 1]), _mm512_shuffle_ps::<0xEE>(u[2 * m], u[2 * m + 1])));
        // The last pair: lane 4j + i holds the sum of v[4i + j].
        let r = _mm512_add_ps(_mm512_shuffle_ps::<0x88>(w[0], w[1]), _mm512_shuffle_ps::<0xDD>(w[0], w[1]));
        let mut lanes = [0.0f32; 16];
        // SAFETY: `lanes` holds 16 f32.
        unsafe { _mm512_storeu_ps(lanes.as_mut_ptr(), r) };
        std::array::from_fn(|m| lanes[4 * (m % 4) + m / 4])
    }
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use std::arch::x86_64::*;

    use super::{reduce, tail};
    use crate::LANES;

    /// The same tile with each lane set in two 8-lane registers (lanes
    /// 0..8 and 8..16).
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn tile<const NR: usize, const NW: usize>(w: [&[f32]; NW], x: [&[f32]; NR], cols: usize, ahead: *const f32) -> [[f32; NW]; NR] {
        let _ = ahead;
        let mut lo = [[_mm256_setzero_ps(); NW]; NR];
        let mut hi = [[_mm256_setzero_ps(); NW]; NR];
        let chunks = cols / LANES;
        for c in 0..chunks {
            for (half, acc) in [(0, &mut lo), (8, &mut hi)] {
                let at = c * LANES + half;
                let mut wv = [_mm256_setzero_ps(); NW];
                for j in 0..NW {
                    // SAFETY: at + 8 <= cols = w[j].len().
                    wv[j] = unsafe { _mm256_loadu_ps(w[j].as_ptr().add(at)) };
                }
                for i in 0..NR {
                    // SAFETY: as above, for x[i].
                    let xv = unsafe { _mm256_loadu_ps(x[i].as_ptr().add(at)) };
                    for j in 0..NW {
                        acc[i][j] = _mm256_fmadd_ps(wv[j], xv, acc[i][j]);
                    }
                }
            }
        }
        let mut out = [[0.0f32; NW]; NR];
        for i in 0..NR {
            for j in 0..NW {
                let mut lanes = [0.0f32; LANES];
                // SAFETY: `lanes` holds 16 f32, two halves of 8.
                unsafe {
                    _mm256_storeu_ps(lanes.as_mut_ptr(), lo[i][j]);
                    _mm256_storeu_ps(lanes.as_mut_ptr().add(8), hi[i][j]);
                }
                tail(&mut lanes, w[j], x[i], chunks * LANES);
                out[i][j] = reduce(lanes);
            }
        }
        out
    }
}
