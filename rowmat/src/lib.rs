//! Batch-invariant few-row matrix products for the CPU forward pass: every
//! projection of the ndarray port's Llama forward, and the few-row products
//! and Q8_0 head of the f32 DFlash drafter in `specdec-models`. A leaf crate
//! (only `half` and `rayon`), below the models and the backends.
//!
//! A speculative verify window of `k + 1` tokens and a one-token decode must
//! round the same way, or speculation changes what the model says. BLAS
//! kernels do not promise that: they pick another tiling, another
//! accumulation order or another instruction mix by the number of rows. This
//! crate computes `y = W x` for every row `x` of a few-row input with one
//! fixed arithmetic, so an output row's bits depend only on that row's input
//! and the weights, never on how many rows share the call, which threads
//! computed it, or which instruction set ran it:
//!
//! - **The canonical dot product** ([`dot`]): sixteen lanes; element `i`
//!   goes to lane `i mod 16` with one fused multiply-add (`acc = fma(w, x,
//!   acc)`), in increasing `i`, every lane starting at `+0.0`; the lanes are
//!   summed pairwise, `l[i] + l[i + 8]`, then `+ 4`, `+ 2`, `+ 1`. The
//!   AVX-512 path (one register per lane set), the AVX2 + FMA path (two) and
//!   the portable path (`f32::mul_add`) implement exactly this, so they
//!   agree bit for bit (`tests/invariance.rs`), and a machine's results do
//!   not depend on which one it has.
//! - **Weights stream once per call** ([`matmul`]): each task takes a block
//!   of weight rows and, while they sit in L1, multiplies them with every
//!   input row, writing its columns of the row-major result in place (AVX-512's 32 registers hold tiles of up to 9 input rows
//!   by 3 weight rows, so a verify window of up to 9 tokens loads each
//!   weight chunk into a register once; AVX2's 16 hold 2 by 3),
//!   so a 9-row window reads the weights from memory once, like a decode;
//!   the next tile's weights are prefetched while a tile computes.
//!   Rows too long for the window's inputs to stay in L1 beside the
//!   streaming weights (SmolLM2's 1536-wide down projection) go in column
//!   spans, the accumulators waiting in a buffer between spans; each lane
//!   still takes its elements in increasing order, so the bits are the same.
//!   Tasks split the weight rows across rayon's threads; a row's result
//!   does not depend on the split.
//! - **GGUF's blocks** ([`Weights::blocks`], [`Weights::q8_0`]; Q8_0 and
//!   Q4_1, kept byte for byte as the file stores them, `blocks.rs`): a
//!   weight is its block's f32 value as ggml's reference dequantizes it
//!   (`d · q`, `d · q + m`; the products are exact in f32, so each value
//!   rounds once), then the same dot product. So a block product equals the
//!   f32 product of the dequantized matrix bit for bit, and inherits its
//!   batch invariance: a backend multiplying a GGUF's own Q4_1 blocks
//!   computes what one multiplying the reader's f32 matrix computes, from a
//!   sixth of the bytes. Quantizing f32 weights to Q8_0 loses precision
//!   against them (stated by the backend that does it), never between
//!   windows and decodes. Where the blocks are decoded is the kernels'
//!   business: in registers inside the product for up to nine input rows
//!   on AVX-512 (a decode, any window up to k = 8) and up to five on AVX2
//!   (a window at k = 4), else once per task into an f32 buffer that stays
//!   in L2 while the rows pass.
//!
//! Inputs are trusted shapes from the caller (a model whose shapes were
//! validated when it loaded); a mismatch is a bug there, so it panics with
//! the shapes named rather than returning an error.

mod blocks;
mod simd;

use rayon::prelude::*;
use simd::{Dest, Isa};

pub use blocks::{BLOCK, BlockFormat, BlockMatrix, Q8_0_BLOCK};

/// The lanes of the canonical dot product.
pub const LANES: usize = 16;

/// Weight rows one task multiplies with every input row: a multiple of
/// every tile's weight rows (6, 5, 4, 3), and few enough that a block
/// task's dequantized rows stay in L2.
const ROWS_PER_TASK: usize = 60;

/// A weight matrix `[out, in]` (one row per output feature) in one of the
/// formats [`matmul`] reads.
#[derive(Debug, Clone, PartialEq)]
pub enum Weights {
    /// Row-major f32.
    F32 { rows: usize, cols: usize, data: Vec<f32> },
    /// GGUF blocks, as stored (see [`BlockMatrix`]).
    Blocks(BlockMatrix),
}

impl Weights {
    /// f32 weights `[rows, cols]`, row-major.
    pub fn f32(rows: usize, cols: usize, data: Vec<f32>) -> Weights {
        assert_eq!(data.len(), rows * cols, "an f32 matrix [{rows}, {cols}] needs {} values", rows * cols);
        Weights::F32 { rows, cols, data }
    }

    /// `data` `[rows, cols]` quantized to Q8_0, or `None` when `cols` is not
    /// a multiple of the 32-value block (such a matrix stays f32).
    pub fn q8_0(rows: usize, cols: usize, data: &[f32]) -> Option<Weights> {
        BlockMatrix::quantize_q8_0(rows, cols, data).map(Weights::Blocks)
    }

    /// GGUF blocks as a file stores them, `[rows, cols]` row-major, or
    /// `None` when `cols` is not a multiple of 32 or `blocks` is not exactly
    /// `rows · cols / 32` blocks.
    pub fn blocks(format: BlockFormat, rows: usize, cols: usize, blocks: Vec<u8>) -> Option<Weights> {
        BlockMatrix::new(format, rows, cols, blocks).map(Weights::Blocks)
    }

    /// Output features (rows of `W`).
    pub fn rows(&self) -> usize {
        match self {
            Weights::F32 { rows, .. } => *rows,
            Weights::Blocks(q) => q.rows(),
        }
    }

    /// Input features (columns of `W`).
    pub fn cols(&self) -> usize {
        match self {
            Weights::F32 { cols, .. } => *cols,
            Weights::Blocks(q) => q.cols(),
        }
    }

    /// Bytes the weights occupy (what one product streams from memory).
    pub fn bytes(&self) -> usize {
        match self {
            Weights::F32 { data, .. } => data.len() * 4,
            Weights::Blocks(q) => q.bytes(),
        }
    }

    /// The format's name, as a backend states its weight dtype.
    pub fn dtype(&self) -> &'static str {
        match self {
            Weights::F32 { .. } => "f32",
            Weights::Blocks(q) => q.format().name(),
        }
    }

    /// Row `r` as f32 values (blocks dequantized exactly as the product reads them).
    pub fn row(&self, r: usize) -> Vec<f32> {
        match self {
            Weights::F32 { cols, data, .. } => data[r * cols..(r + 1) * cols].to_vec(),
            Weights::Blocks(q) => q.dequantize_row(r),
        }
    }
}

/// The canonical dot product of two equally long slices (module doc).
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len(), "dot of {} and {} values", a.len(), b.len());
    simd::dot(a, b)
}

/// `x · Wᵀ` for `x` `[n, in]` row-major: returns `[n, out]` row-major.
/// Every value is [`dot`] of an input row and a weight row (dequantized for
/// blocks), whatever `n` is.
pub fn matmul(x: &[f32], n: usize, w: &Weights) -> Vec<f32> {
    let mut y = vec![0.0f32; n * w.rows()];
    matmul_on(simd::isa(), x, n, w.view(), &mut y);
    y
}

/// [`matmul`] into `y` (`[n, out]`, every value overwritten): for a caller
/// that reuses its output buffers.
pub fn matmul_into(x: &[f32], n: usize, w: &Weights, y: &mut [f32]) {
    matmul_on(simd::isa(), x, n, w.view(), y)
}

/// [`matmul`] against borrowed row-major f32 weights `[w.len() / cols,
/// cols]`, split across rayon's threads like [`matmul`]: for weights the
/// caller owns in another type (a drafter's layers).
pub fn matmul_f32(x: &[f32], n: usize, w: &[f32], cols: usize) -> Vec<f32> {
    assert!(cols > 0 && w.len().is_multiple_of(cols), "weights of {} values in rows of {cols}", w.len());
    let view = View::F32 { data: w, rows: w.len() / cols, cols };
    let mut y = vec![0.0f32; n * (w.len() / cols)];
    matmul_on(simd::isa(), x, n, view, &mut y);
    y
}

/// Weights as a product reads them, owned by a [`Weights`] or borrowed.
#[derive(Debug, Clone, Copy)]
enum View<'a> {
    F32 { data: &'a [f32], rows: usize, cols: usize },
    Blocks(&'a BlockMatrix),
}

impl Weights {
    fn view(&self) -> View<'_> {
        match self {
            Weights::F32 { rows, cols, data } => View::F32 { data, rows: *rows, cols: *cols },
            Weights::Blocks(q) => View::Blocks(q),
        }
    }
}

fn matmul_on(isa: Isa, x: &[f32], n: usize, w: View<'_>, y: &mut [f32]) {
    let (out, cols) = match w {
        View::F32 { rows, cols, .. } => (rows, cols),
        View::Blocks(q) => (q.rows(), q.cols()),
    };
    assert_eq!(x.len(), n * cols, "input of {} values for {n} rows of {cols}", x.len());
    assert_eq!(y.len(), n * out, "output of {} values for {n} rows of {out}", y.len());
    if n == 0 || out == 0 {
        return;
    }
    // SAFETY: `y` holds `n` rows of `out` values and outlives the loop (rayon
    // joins every task); each task owns whole weight rows, so whole columns
    // of `y`: task `t` writes columns `t · ROWS_PER_TASK ..` of every row and
    // nothing else (`Dest::at`).
    let whole = unsafe { Dest::new(y.as_mut_ptr(), out) };
    (0..out.div_ceil(ROWS_PER_TASK)).into_par_iter().for_each(|task| {
        let first = task * ROWS_PER_TASK;
        let count = ROWS_PER_TASK.min(out - first);
        let dest = whole.at(first);
        match w {
            View::F32 { data, .. } => simd::block_f32(&data[first * cols..(first + count) * cols], count, cols, x, n, dest, isa),
            View::Blocks(q) => simd::block_quant(q, first, count, x, n, dest, isa),
        }
    });
}

/// [`matmul`] against borrowed row-major f32 weights `[w.len() / cols,
/// cols]` on the calling thread alone: for products too small to be worth
/// waking other threads (attention scores over a sequence's cached keys).
/// Every value is [`dot`] of an input row and a weight row, as in [`matmul`].
pub fn matmul_serial(x: &[f32], n: usize, w: &[f32], cols: usize) -> Vec<f32> {
    assert!(cols > 0 && w.len().is_multiple_of(cols) && x.len() == n * cols, "inputs [{n}, {cols}] ({} values) against weights of {} values", x.len(), w.len());
    let out = w.len() / cols;
    if n == 0 || out == 0 {
        return Vec::new();
    }
    let mut y = vec![0.0f32; n * out];
    // SAFETY: the block writes `n` rows of `out` columns of `y`, on this thread.
    let dest = unsafe { Dest::new(y.as_mut_ptr(), out) };
    simd::block_f32(w, out, cols, x, n, dest, simd::isa());
    y
}

/// Which instruction set [`dot`] and [`matmul`] run on this machine (the
/// results are the same on each).
pub fn instruction_set() -> &'static str {
    isa_name(simd::isa())
}

fn isa_name(isa: Isa) -> &'static str {
    match isa {
        Isa::Avx512 => "avx512",
        Isa::Avx2 => "avx2+fma",
        Isa::Portable => "portable",
    }
}

/// [`matmul`] on each instruction-set path this machine can run (the
/// portable one always), named: for the tests that compare the paths.
#[doc(hidden)]
pub fn matmul_each_path(x: &[f32], n: usize, w: &Weights) -> Vec<(&'static str, Vec<f32>)> {
    let mut paths = vec![Isa::Portable];
    match simd::isa() {
        Isa::Avx512 => paths.extend([Isa::Avx2, Isa::Avx512]),
        Isa::Avx2 => paths.push(Isa::Avx2),
        Isa::Portable => {}
    }
    // AVX-512 machines also have AVX2 and FMA (every x86 CPU with AVX-512F does).
    paths
        .into_iter()
        .map(|isa| {
            let mut y = vec![0.0f32; n * w.rows()];
            matmul_on(isa, x, n, w.view(), &mut y);
            (isa_name(isa), y)
        })
        .collect()
}
