//! The three implementations of the canonical dot product (crate doc):
//! AVX-512 tiles (one 16-lane register per lane set), AVX2 + FMA tiles (two
//! 8-lane registers per lane set) and the portable lanes with
//! `f32::mul_add`. All three accumulate element `i` into lane `i mod 16`
//! in increasing `i` and end in [`reduce`], so they agree bit for bit.

use std::cell::RefCell;
use std::sync::OnceLock;

use crate::{BlockMatrix, LANES};

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
            // F16C widens the blocks' f16 scales in registers; the AVX-512
            // path fills its block buffer with the AVX2 decoding (every CPU
            // with AVX-512F has AVX2, FMA and F16C; checked all the same).
            let avx2 = std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma") && std::is_x86_feature_detected!("f16c");
            if std::is_x86_feature_detected!("avx512f") && avx2 {
                return Isa::Avx512;
            }
            if avx2 {
                return Isa::Avx2;
            }
        }
        Isa::Portable
    })
}

pub(crate) fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut out = [0.0f32];
    // SAFETY: the block writes row 0, column 0: `out[0]`, owned here.
    let dest = unsafe { Dest::new(out.as_mut_ptr(), 1) };
    block_f32(b, 1, a.len(), a, 1, dest, isa());
    out[0]
}

/// Where a block's results go: the dot product of input row `r` and the
/// block's weight row `j` at `ptr + r · ld + j`, so a task writes its
/// columns of a row-major `[n, out]` result in place (no transpose, no
/// second buffer) beside the tasks writing the other columns.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Dest {
    ptr: *mut f32,
    ld: usize,
}

// SAFETY: a `Dest` is only made by `Dest::new`, whose caller guarantees that
// the places it names are written by one block alone.
unsafe impl Send for Dest {}
unsafe impl Sync for Dest {}

impl Dest {
    /// # Safety
    /// Every `ptr + r · ld + j` the block writes (`r` below its input rows,
    /// `j` below its weight rows) is inside one live allocation, and no
    /// other thread reads or writes those places until the block returns.
    pub(crate) unsafe fn new(ptr: *mut f32, ld: usize) -> Dest {
        Dest { ptr, ld }
    }

    /// The columns from `first` on: the same rows, the block's column 0 at
    /// `first`. Blocks written through different offsets must keep to
    /// disjoint columns (the places `Dest::new`'s caller vouched for).
    pub(crate) fn at(self, first: usize) -> Dest {
        Dest { ptr: self.ptr.wrapping_add(first), ld: self.ld }
    }

    fn put(self, r: usize, j: usize, v: f32) {
        // SAFETY: in bounds and exclusive by `Dest::new`'s contract.
        unsafe { *self.ptr.add(r * self.ld + j) = v }
    }
}

/// `dest(r, j) = dot(x row r, w row j)` for the `count` weight rows in `w`
/// (`[count, cols]`; `cols` may be 0, when every product is 0) and the `n`
/// input rows in `x`.
pub(crate) fn block_f32(w: &[f32], count: usize, cols: usize, x: &[f32], n: usize, dest: Dest, isa: Isa) {
    #[cfg(target_arch = "x86_64")]
    if isa != Isa::Portable {
        // Input rows outer: a window of up to `max_x` rows passes the
        // weights once, each weight chunk loaded into a register once for
        // all of the tile's input rows.
        let max_x = if isa == Isa::Avx512 { AVX512_MAX_X } else { AVX2_MAX_X };
        let chunks = cols / LANES;
        for r in (0..n).step_by(max_x) {
            let nx = max_x.min(n - r);
            let nw = if isa == Isa::Avx512 { avx512_tile_w(nx) } else { AVX2_TILE_W };
            // Long rows: the columns in spans whose input rows fit in L1
            // (AVX-512 only; AVX2's two-row tiles always fit).
            let spans = if isa == Isa::Avx512 { chunks.div_ceil((X_SPAN_BYTES / (nx * LANES * 4)).max(1)).max(1) } else { 1 };
            let per = chunks.div_ceil(spans).max(1);
            SPILL.with(|spill| {
                let mut spill = spill.borrow_mut();
                if spans > 1 {
                    spill.resize(count * nx * LANES, 0.0);
                }
                for span in 0..spans {
                    let mut j = 0;
                    while j < count {
                        // Whole tiles, then single weight rows for the remainder.
                        let take = if count - j >= nw { nw } else { 1 };
                        let xr = |i: usize| &x[(r + i) * cols..(r + i + 1) * cols];
                        let wr = |i: usize| &w[(j + i) * cols..(j + i + 1) * cols];
                        let at = dest.at(j);
                        // The weights PREFETCH_TILES tiles on, asked for while this tile computes.
                        let ahead = w.as_ptr().wrapping_add((j + PREFETCH_TILES * take) * cols);
                        let span = Span { from: span * per, to: ((span + 1) * per).min(chunks), first: span == 0, last: span + 1 == spans, spill: spill.as_mut_ptr().wrapping_add(j * nx * LANES) };
                        if isa == Isa::Avx512 {
                            each_tile!((nx, take), avx512, xr, wr, cols, ahead, span, at, r; (1, 1), (1, 2), (1, 3), (1, 4), (1, 5), (1, 6), (2, 1), (2, 2), (2, 3), (2, 4), (2, 5), (2, 6), (3, 1), (3, 2), (3, 3), (3, 4), (3, 5), (3, 6), (4, 1), (4, 2), (4, 3), (4, 4), (4, 5), (4, 6), (5, 1), (5, 2), (5, 3), (5, 4), (5, 5), (5, 6), (6, 1), (6, 2), (6, 3), (6, 4), (6, 5), (6, 6), (7, 1), (7, 2), (7, 3), (7, 4), (7, 5), (7, 6), (8, 1), (8, 2), (8, 3), (8, 4), (8, 5), (8, 6), (9, 1), (9, 2), (9, 3), (9, 4), (9, 5), (9, 6));
                        } else {
                            each_tile!((nx, take), avx2, xr, wr, cols, ahead, span, at, r; (1, 1), (1, 3), (2, 1), (2, 3));
                        }
                        j += take;
                    }
                }
            });
        }
        return;
    }
    let _ = isa;
    for j in 0..count {
        for r in 0..n {
            dest.put(r, j, dot_portable(&x[r * cols..(r + 1) * cols], &w[j * cols..(j + 1) * cols]));
        }
    }
}

/// A tile's share of the columns, in 16-value chunks `from .. to`: the
/// first span starts its accumulators at zero, a later one reloads them
/// from `spill` (`NR · NW` registers' worth, stored by the span before),
/// and only the last reduces them. Each lane still takes its elements in
/// increasing order, so spans change where the accumulators wait, never
/// the arithmetic.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Span {
    from: usize,
    to: usize,
    first: bool,
    last: bool,
    spill: *mut f32,
}

/// The input rows' share of L1 in a span: for a 9-row window of SmolLM2's
/// 1536-wide down projection, the 55 KiB of whole rows would not fit in
/// Zen 5's 48 KiB L1 beside the weights streaming past, and reloading them
/// from L2 for every tile cost the product 1.7 times its one-row time.
#[cfg(target_arch = "x86_64")]
const X_SPAN_BYTES: usize = 24 * 1024;

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
/// Input rows up to which AVX2 multiplies blocks decoded in registers
/// (a window of k + 1 = 5 tokens at the decoder's default k), each block
/// decoded once for all of them ([`block_quant`]).
#[cfg(target_arch = "x86_64")]
const AVX2_BLOCK_MAX_X: usize = 5;

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
    /// A block's accumulators between spans ([`Span`]).
    static SPILL: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// Weight rows per AVX-512 block tile for `nx` input rows: the tile's
/// `nx · nw` accumulators, its `2 · nw` decoded halves of a block, two
/// input registers and the decoding's constants fit the 32 registers; at
/// most 4 (one more row saves nothing the decoding costs).
#[cfg(target_arch = "x86_64")]
fn avx512_block_tile_w(nx: usize) -> usize {
    (28 / (nx + 2)).clamp(1, 4)
}

/// Expands to a `match` over the listed block tile shapes `(NX, NW)`,
/// calling `$m::tile_blocks::<NX, NW>` on the input rows and weight rows
/// `$j ..` of a block task and storing the results.
#[cfg(target_arch = "x86_64")]
macro_rules! each_block_tile {
    ($shape:expr, $m:ident, $q:expr, $x:expr, $first:expr, $j:expr, $dest:expr; $(($a:literal, $b:literal)),*) => {{
        let cols = $q.cols();
        let xr = |i: usize| &$x[i * cols..(i + 1) * cols];
        let wr = |i: usize| $q.row_blocks($first + $j + i);
        match $shape {
            $(($a, $b) => {
                let xs: [&[f32]; $a] = std::array::from_fn(xr);
                let ws: [&[u8]; $b] = std::array::from_fn(wr);
                // SAFETY: the caller checked the instruction set (`isa`); every input row
                // holds `cols` values and every weight row `cols / 32` blocks.
                store(unsafe { $m::tile_blocks::<$a, $b>($q.format(), ws, xs, cols / crate::BLOCK) }, $dest.at($j), 0)
            })*
            other => unreachable!("no block tile of shape {other:?}"),
        }
    }};
}

/// [`block_f32`] for block rows `first .. first + count`. For up to nine
/// input rows on AVX-512 (a decode, or a verify window up to k = 8) and up
/// to five on AVX2 (a window at the decoder's default k = 4) the blocks are
/// decoded in registers inside the product (`tile_blocks`: the weights
/// stream from memory in their stored bytes, no f32 copy, each block
/// decoded once for all the input rows). Otherwise (a prefill's many rows,
/// or more than AVX2's sixteen registers' accumulators hold, which would
/// decode each block again for every tile of input rows) the task's rows
/// are dequantized once ([`crate::BlockFormat::decode`], exact; with AVX2
/// by the same register decoding, on AVX-512 machines too) into a buffer
/// that stays in L2 while the input rows pass. Every path multiplies the
/// same f32 values in the canonical order.
///
/// Measured on SmolLM2 (RESULTS, tenth session, AVX2): a 5-token window
/// cost 1.87 decodes in registers against 2.84 through the buffer; Q8_0
/// (the head) took the buffer for decodes too until the decoding
/// prefetched the blocks ahead of it, and without the prefetch its
/// register tiles had decoded slower than the buffer (23-32 against 46-51
/// tokens/s).
pub(crate) fn block_quant(q: &BlockMatrix, first: usize, count: usize, x: &[f32], n: usize, dest: Dest, isa: Isa) {
    #[cfg(target_arch = "x86_64")]
    if isa == Isa::Avx512 && n <= AVX512_MAX_X {
        // One pass over the blocks for all the input rows, as many weight
        // rows at a time as the registers hold beside their accumulators.
        // Whole rows: a 9-row window over SmolLM2's 1536-wide down
        // projection reads its inputs from L2 for every tile (55 KiB), yet
        // spans of blocks as `block_f32`'s made that window slower, about
        // 24.5 ms against 21 (RESULTS, fourteenth session).
        let tile_w = avx512_block_tile_w(n);
        let mut j = 0;
        while j < count {
            let take = if count - j >= tile_w { tile_w } else { 1 };
            each_block_tile!((n, take), avx512, q, x, first, j, dest;
                (1, 1), (1, 4), (2, 1), (2, 4), (3, 1), (3, 4), (4, 1), (4, 4), (5, 1), (5, 4), (6, 1), (6, 3), (7, 1), (7, 3), (8, 1), (8, 2), (9, 1), (9, 2));
            j += take;
        }
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if isa == Isa::Avx2 && n <= AVX2_BLOCK_MAX_X {
        // A decode's one or two rows against three weight rows at a time, a
        // window's three to five against one (five rows' accumulators fill
        // the sixteen registers).
        let tile_w = if n <= AVX2_MAX_X { AVX2_TILE_W } else { 1 };
        let mut j = 0;
        while j < count {
            let take = if count - j >= tile_w { tile_w } else { 1 };
            each_block_tile!((n, take), avx2, q, x, first, j, dest; (1, 1), (1, 3), (2, 1), (2, 3), (3, 1), (4, 1), (5, 1));
            j += take;
        }
        return;
    }
    let cols = q.cols();
    SCRATCH.with(|s| {
        let mut buf = s.borrow_mut();
        buf.resize(count * cols, 0.0);
        for j in 0..count {
            let dst = &mut buf[j * cols..(j + 1) * cols];
            #[cfg(target_arch = "x86_64")]
            if isa != Isa::Portable {
                // SAFETY: the CPU has AVX2, FMA and F16C (`isa`, either SIMD one); the row holds `cols / 32` blocks.
                unsafe { avx2::dequantize(q.format(), q.row_blocks(first + j), dst) };
                continue;
            }
            q.dequantize_into(first + j, dst);
        }
        block_f32(&buf[..count * cols], count, cols, x, n, dest, isa);
    });
}

/// Expands to a `match` over the listed tile shapes `(NX, NW)`, calling
/// `$m::tile::<NX, NW>` with arrays of row slices.
#[cfg(target_arch = "x86_64")]
macro_rules! each_tile {
    ($shape:expr, $m:ident, $xr:expr, $wr:expr, $cols:expr, $ahead:expr, $span:expr, $dest:expr, $r:expr; $(($a:literal, $b:literal)),*) => {
        match $shape {
            $(($a, $b) => {
                let x: [&[f32]; $a] = std::array::from_fn($xr);
                let w: [&[f32]; $b] = std::array::from_fn($wr);
                let ahead = $ahead;
                // SAFETY: the caller checked the instruction set; every row slice holds `cols`
                // values; the span's spill holds the tile's accumulators.
                if let Some(tile) = unsafe { $m::tile::<$a, $b>(w, x, $cols, ahead, $span) } {
                    store(tile, $dest, $r)
                }
            })*
            other => unreachable!("no tile of shape {other:?}"),
        }
    };
}
#[cfg(target_arch = "x86_64")]
use each_tile;

/// Writes a tile's results for input rows `r ..` to `dest(r + i, j)`.
#[cfg(target_arch = "x86_64")]
fn store<const NR: usize, const NW: usize>(tile: [[f32; NW]; NR], dest: Dest, r: usize) {
    for (i, row) in tile.iter().enumerate() {
        for (j, &v) in row.iter().enumerate() {
            dest.put(r + i, j, v);
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod avx512 {
    use std::arch::x86_64::*;

    use super::{Span, reduce, tail};
    use crate::{BLOCK, BlockFormat, LANES};

    /// `out[i][j] = dot(x[i], w[j])` in the canonical order, each lane set
    /// in one 16-lane register.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn tile<const NR: usize, const NW: usize>(w: [&[f32]; NW], x: [&[f32]; NR], cols: usize, ahead: *const f32, span: Span) -> Option<[[f32; NW]; NR]> {
        if span.first && span.last {
            // SAFETY: the caller's CPU has AVX-512F; the rows hold `cols` values.
            let acc = unsafe { accumulate([[_mm512_setzero_ps(); NW]; NR], w, x, cols, 0, cols / LANES, ahead) };
            // SAFETY: as above.
            return Some(unsafe { finish(acc, w, x, cols) });
        }
        let acc = if span.first {
            [[_mm512_setzero_ps(); NW]; NR]
        } else {
            // SAFETY: the spill holds NR · NW registers of 16 lanes (Span).
            std::array::from_fn(|i| std::array::from_fn(|j| unsafe { _mm512_loadu_ps(span.spill.add((i * NW + j) * LANES)) }))
        };
        // SAFETY: as above.
        let acc = unsafe { accumulate(acc, w, x, cols, span.from, span.to, ahead) };
        if span.last {
            // SAFETY: as above.
            return Some(unsafe { finish(acc, w, x, cols) });
        }
        for (m, a) in acc.iter().flatten().enumerate() {
            // SAFETY: as above.
            unsafe { _mm512_storeu_ps(span.spill.add(m * LANES), *a) };
        }
        None
    }

    /// Chunks `from .. to` of every (input row, weight row) pair into its accumulator.
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn accumulate<const NR: usize, const NW: usize>(
        mut acc: [[__m512; NW]; NR],
        w: [&[f32]; NW],
        x: [&[f32]; NR],
        cols: usize,
        from: usize,
        to: usize,
        ahead: *const f32,
    ) -> [[__m512; NW]; NR] {
        for c in from..to {
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
        acc
    }

    /// The accumulators' dot products: the tail past the last whole chunk,
    /// then the fixed lane sum.
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn finish<const NR: usize, const NW: usize>(acc: [[__m512; NW]; NR], w: [&[f32]; NW], x: [&[f32]; NR], cols: usize) -> [[f32; NW]; NR] {
        let chunks = cols / LANES;
        let mut out = [[0.0f32; NW]; NR];
        // No tail: the tile's accumulators are reduced sixteen at a time (the
        // reachable tiles hold at most 27; a larger one, which the dispatch
        // lists but `avx512_tile_w` never picks, takes the scalar path).
        if cols.is_multiple_of(LANES) && NR * NW <= 32 {
            // SAFETY: the caller's CPU has AVX-512F.
            return unsafe { reduce_tile(acc) };
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

    /// [`reduce`] of every accumulator of a tile of at most 32, sixteen at a
    /// time ([`reduce16`]).
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn reduce_tile<const NR: usize, const NW: usize>(acc: [[__m512; NW]; NR]) -> [[f32; NW]; NR] {
        debug_assert!(NR * NW <= 32);
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
        std::array::from_fn(|i| std::array::from_fn(|j| sums[i * NW + j]))
    }

    /// A tile of block rows (`BlockFormat`), each block's 32 values decoded
    /// in two 16-lane registers as [`crate::BlockFormat::decode`] computes
    /// them (see `avx2::tile_blocks` for why the register arithmetic is the
    /// same) and accumulated in the canonical order: block `b`'s values
    /// 0..16 go to lanes 0..16, then its values 16..32 to the same lanes.
    /// The `NW` rows' blocks are decoded before the `NR` input rows pass,
    /// so each input chunk is loaded once per tile and each block decoded
    /// once for every input row.
    ///
    /// While a block decodes, the same block of the next tile's rows is
    /// asked for: the weights the next tile reads. (1 KiB ahead within a
    /// row, as AVX2 asks, lands on a row this tile is reading already once
    /// rows are about that long: SmolLM2's Q4_1 rows of 1536 are 960 bytes.
    /// Measured on SmolLM2's Q4_1, RESULTS fourteenth session: a decode
    /// 8.2-8.4 ms against 9.4-9.7.)
    #[target_feature(enable = "avx512f,avx2,fma,f16c")]
    pub(super) unsafe fn tile_blocks<const NR: usize, const NW: usize>(format: BlockFormat, w: [&[u8]; NW], x: [&[f32]; NR], blocks: usize) -> [[f32; NW]; NR] {
        let mut acc = [[_mm512_setzero_ps(); NW]; NR];
        let size = format.block_bytes();
        for b in 0..blocks {
            let mut v = [[_mm512_setzero_ps(); 2]; NW];
            for j in 0..NW {
                // The same block of the next tile's row j (a task's rows lie one after
                // another): a prefetch never faults, so past the last row is harmless.
                _mm_prefetch::<_MM_HINT_T0>(w[j].as_ptr().wrapping_add(NW * w[j].len() + b * size).cast());
                debug_assert!((b + 1) * size <= w[j].len());
                // SAFETY: block b of row j lies in w[j] (the caller's row of `blocks` blocks).
                v[j] = unsafe { decode(format, w[j].as_ptr().add(b * size)) };
            }
            for i in 0..NR {
                // SAFETY: b · 32 + 32 <= cols = x[i].len().
                let (x0, x1) = unsafe {
                    let xp = x[i].as_ptr().add(b * BLOCK);
                    (_mm512_loadu_ps(xp), _mm512_loadu_ps(xp.add(LANES)))
                };
                for j in 0..NW {
                    acc[i][j] = _mm512_fmadd_ps(v[j][0], x0, acc[i][j]);
                    acc[i][j] = _mm512_fmadd_ps(v[j][1], x1, acc[i][j]);
                }
            }
        }
        // SAFETY: as above.
        unsafe { reduce_tile(acc) }
    }

    /// One block's values 0..16 and 16..32.
    #[inline]
    #[target_feature(enable = "avx512f,avx2,fma,f16c")]
    unsafe fn decode(format: BlockFormat, block: *const u8) -> [__m512; 2] {
        // SAFETY (every read below): `block` starts a whole block of `format`.
        let scales = unsafe { super::avx2::scales(block) };
        let d = _mm512_broadcastss_ps(scales);
        match format {
            BlockFormat::Q8_0 => unsafe {
                let q0 = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(block.add(2).cast())));
                let q1 = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(block.add(2 + LANES).cast())));
                [_mm512_mul_ps(q0, d), _mm512_mul_ps(q1, d)]
            },
            BlockFormat::Q4_1 => {
                let m = _mm512_broadcastss_ps(_mm_movehdup_ps(scales));
                // SAFETY: as above; the 16 bytes of nibbles follow the two scales.
                let bytes = unsafe { _mm512_cvtepu8_epi32(_mm_loadu_si128(block.add(4).cast())) };
                let low = _mm512_and_si512(bytes, _mm512_set1_epi32(0x0F));
                let high = _mm512_srli_epi32::<4>(bytes);
                [_mm512_fmadd_ps(_mm512_cvtepi32_ps(low), d, m), _mm512_fmadd_ps(_mm512_cvtepi32_ps(high), d, m)]
            }
        }
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

    use super::{Span, reduce, tail};
    use crate::{BLOCK, BlockFormat, LANES};

    /// The same tile with each lane set in two 8-lane registers (lanes
    /// 0..8 and 8..16).
    /// Always a whole row's span (the caller never splits AVX2's two-row tiles).
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn tile<const NR: usize, const NW: usize>(w: [&[f32]; NW], x: [&[f32]; NR], cols: usize, ahead: *const f32, span: Span) -> Option<[[f32; NW]; NR]> {
        debug_assert!(span.first && span.last, "AVX2 tiles take whole rows");
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
                let mut lanes = lanes_of(lo[i][j], hi[i][j]);
                tail(&mut lanes, w[j], x[i], chunks * LANES);
                out[i][j] = reduce(lanes);
            }
        }
        Some(out)
    }

    /// A lane set held in two registers, lanes 0..8 and 8..16.
    #[inline]
    #[target_feature(enable = "avx2")]
    fn lanes_of(lo: __m256, hi: __m256) -> [f32; LANES] {
        let mut lanes = [0.0f32; LANES];
        // SAFETY: `lanes` holds 16 f32, two halves of 8.
        unsafe {
            _mm256_storeu_ps(lanes.as_mut_ptr(), lo);
            _mm256_storeu_ps(lanes.as_mut_ptr().add(8), hi);
        }
        lanes
    }

    /// A tile of block rows (`BlockFormat`), each block's 32 values decoded
    /// in registers as [`crate::BlockFormat::decode`] computes them (the
    /// f16 scales widened exactly; `d · q` exact in f32, so `fma(q, d, m)`
    /// rounds as `d · q + m` does) and accumulated in the canonical order:
    /// block `b`'s values 0..8 and 16..24 go to lanes 0..8 (the `lo`
    /// register), 8..16 and 24..32 to lanes 8..16 (`hi`), in that order.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn tile_blocks<const NR: usize, const NW: usize>(format: BlockFormat, w: [&[u8]; NW], x: [&[f32]; NR], blocks: usize) -> [[f32; NW]; NR] {
        let mut lo = [[_mm256_setzero_ps(); NW]; NR];
        let mut hi = [[_mm256_setzero_ps(); NW]; NR];
        let size = format.block_bytes();
        for b in 0..blocks {
            for j in 0..NW {
                prefetch_ahead(w[j].as_ptr().wrapping_add(b * size));
                debug_assert!((b + 1) * size <= w[j].len());
                // SAFETY: block b of row j lies in w[j] (the caller's row of `blocks` blocks).
                let v = unsafe { decode(format, w[j].as_ptr().add(b * size)) };
                for i in 0..NR {
                    // SAFETY: b · 32 + 32 <= cols = x[i].len().
                    let xp = unsafe { x[i].as_ptr().add(b * BLOCK) };
                    unsafe {
                        lo[i][j] = _mm256_fmadd_ps(v[0], _mm256_loadu_ps(xp), lo[i][j]);
                        hi[i][j] = _mm256_fmadd_ps(v[1], _mm256_loadu_ps(xp.add(8)), hi[i][j]);
                        lo[i][j] = _mm256_fmadd_ps(v[2], _mm256_loadu_ps(xp.add(16)), lo[i][j]);
                        hi[i][j] = _mm256_fmadd_ps(v[3], _mm256_loadu_ps(xp.add(24)), hi[i][j]);
                    }
                }
            }
        }
        let mut out = [[0.0f32; NW]; NR];
        for i in 0..NR {
            for j in 0..NW {
                out[i][j] = reduce(lanes_of(lo[i][j], hi[i][j]));
            }
        }
        out
    }

    /// Asks for the blocks [`BLOCKS_AHEAD_BYTES`] past `block`, the one
    /// being decoded: a task's rows lie one after another, so near a row's
    /// end this reaches into the rows after it (for a tile's last row, the
    /// next tile's). Decoding is slow enough per
    /// byte that the hardware prefetcher alone left the weights' stream
    /// waiting on memory (RESULTS, tenth session). A prefetch never faults,
    /// so the address may lie past the weights.
    #[inline]
    #[target_feature(enable = "avx2")]
    pub(super) fn prefetch_ahead(block: *const u8) {
        _mm_prefetch::<_MM_HINT_T0>(block.wrapping_add(BLOCKS_AHEAD_BYTES).cast());
    }

    /// How far ahead of the block being decoded the decoding asks for weights.
    const BLOCKS_AHEAD_BYTES: usize = 1024;

    /// A block's two leading f16 values widened exactly (lane 0 the scale
    /// `d`, lane 1 Q4_1's minimum `m`).
    ///
    /// # Safety
    /// `block` starts a whole block of at least 4 bytes; the CPU has F16C.
    #[inline]
    #[target_feature(enable = "avx2,f16c")]
    pub(super) unsafe fn scales(block: *const u8) -> __m128 {
        // SAFETY: by the caller's contract.
        _mm_cvtph_ps(_mm_cvtsi32_si128(unsafe { std::ptr::read_unaligned(block.cast::<i32>()) }))
    }

    /// One block's values 0..8, 8..16, 16..24 and 24..32.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn decode(format: BlockFormat, block: *const u8) -> [__m256; 4] {
        // SAFETY (every read below): `block` starts a whole block of `format`.
        let scales = unsafe { super::avx2::scales(block) };
        let d = _mm256_broadcastss_ps(scales);
        match format {
            BlockFormat::Q8_0 => unsafe {
                let q0 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(block.add(2).cast())));
                let q1 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(block.add(10).cast())));
                let q2 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(block.add(18).cast())));
                let q3 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(block.add(26).cast())));
                [_mm256_mul_ps(q0, d), _mm256_mul_ps(q1, d), _mm256_mul_ps(q2, d), _mm256_mul_ps(q3, d)]
            },
            BlockFormat::Q4_1 => {
                let m = _mm256_broadcastss_ps(_mm_movehdup_ps(scales));
                let (first, second) = unsafe { (_mm256_cvtepu8_epi32(_mm_loadl_epi64(block.add(4).cast())), _mm256_cvtepu8_epi32(_mm_loadl_epi64(block.add(12).cast()))) };
                let nibbles = _mm256_set1_epi32(0x0F);
                [
                    _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_and_si256(first, nibbles)), d, m),
                    _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_and_si256(second, nibbles)), d, m),
                    _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_srli_epi32::<4>(first)), d, m),
                    _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_srli_epi32::<4>(second)), d, m),
                ]
            }
        }
    }

    /// One row of blocks into its f32 values (`dst`, 32 per block), as
    /// [`decode`] computes them.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn dequantize(format: BlockFormat, row: &[u8], dst: &mut [f32]) {
        for (b, out) in dst.chunks_exact_mut(BLOCK).enumerate() {
            // SAFETY: block b lies in `row` (one block per 32 values of `dst`); `out` holds 32.
            unsafe {
                prefetch_ahead(row.as_ptr().add(b * format.block_bytes()));
                let v = decode(format, row.as_ptr().add(b * format.block_bytes()));
                for (k, part) in v.iter().enumerate() {
                    _mm256_storeu_ps(out.as_mut_ptr().add(8 * k), *part);
                }
            }
        }
    }
}
