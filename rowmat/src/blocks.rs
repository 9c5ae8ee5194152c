//! GGUF's block formats, kept byte for byte as the file stores them: per
//! row, blocks of 32 inputs.
//!
//! - Q8_0, 34 bytes: an f16 scale `d`, then 32 signed bytes `q`; a weight is
//!   `d · q`.
//! - Q4_1, 20 bytes: an f16 scale `d`, an f16 minimum `m`, then 16 bytes
//!   whose low nibbles are inputs 0..16 and high nibbles inputs 16..32; a
//!   weight is `d · q + m`.
//!
//! [`BlockFormat::decode`] is the one definition of a block's f32 values:
//! ggml's reference dequantization (multiply, then add, in f32). Both
//! products are exact in f32 (an 11-bit significand times an integer of at
//! most 8 bits), so `d · q + m` rounds once, and every kernel that reads a
//! block computes exactly these values. The GGUF reader in `specdec-models`
//! dequantizes with the same function, so a backend that multiplies the
//! blocks and one that multiplies the reader's f32 matrix compute the same
//! bits.

use half::f16;

/// Inputs per block, in every format here.
pub const BLOCK: usize = 32;

/// Inputs per Q8_0 block (the name the crate has always exported).
pub const Q8_0_BLOCK: usize = BLOCK;

/// A GGUF block format a product reads as stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BlockFormat {
    Q8_0,
    Q4_1,
}

impl BlockFormat {
    /// Bytes per block of [`BLOCK`] inputs.
    pub const fn block_bytes(self) -> usize {
        match self {
            BlockFormat::Q8_0 => 2 + BLOCK,
            BlockFormat::Q4_1 => 4 + BLOCK / 2,
        }
    }

    /// Bytes of `rows · cols` values in this format, or `None` when `cols`
    /// is not a multiple of [`BLOCK`] or the count overflows.
    pub fn bytes_for(self, rows: usize, cols: usize) -> Option<usize> {
        cols.is_multiple_of(BLOCK).then_some(())?;
        rows.checked_mul(cols / BLOCK)?.checked_mul(self.block_bytes())
    }

    /// The format's name, as a backend states its weight dtype.
    pub const fn name(self) -> &'static str {
        match self {
            BlockFormat::Q8_0 => "q8_0",
            BlockFormat::Q4_1 => "q4_1",
        }
    }

    /// One block's 32 values into `out` (module doc). `block` holds
    /// [`Self::block_bytes`] bytes and `out` 32 values.
    #[inline]
    pub fn decode(self, block: &[u8], out: &mut [f32]) {
        let half = |i: usize| f16::from_bits(u16::from_le_bytes([block[i], block[i + 1]])).to_f32();
        match self {
            BlockFormat::Q8_0 => {
                let d = half(0);
                for (o, &q) in out[..BLOCK].iter_mut().zip(&block[2..2 + BLOCK]) {
                    *o = f32::from(q as i8) * d;
                }
            }
            BlockFormat::Q4_1 => {
                let (d, m) = (half(0), half(2));
                let (lo, hi) = out[..BLOCK].split_at_mut(BLOCK / 2);
                for ((l, h), &q) in lo.iter_mut().zip(hi).zip(&block[4..4 + BLOCK / 2]) {
                    *l = f32::from(q & 0x0F) * d + m;
                    *h = f32::from(q >> 4) * d + m;
                }
            }
        }
    }

    /// Whole blocks (`bytes.len()` a multiple of the block size) into their
    /// values, appended to `out`.
    pub fn decode_all(self, bytes: &[u8], out: &mut Vec<f32>) {
        let start = out.len();
        out.resize(start + bytes.len() / self.block_bytes() * BLOCK, 0.0);
        for (block, dst) in bytes.chunks_exact(self.block_bytes()).zip(out[start..].chunks_exact_mut(BLOCK)) {
            self.decode(block, dst);
        }
    }
}

/// A matrix `[rows, cols]` in a [`BlockFormat`], `cols` a multiple of
/// [`BLOCK`], its blocks row-major exactly as GGUF lays them out.
#[derive(Debug, Clone, PartialEq)]
pub struct BlockMatrix {
    format: BlockFormat,
    rows: usize,
    cols: usize,
    blocks: Vec<u8>,
}

impl BlockMatrix {
    /// `rows · cols / 32` blocks as stored, or `None` when `cols` is not a
    /// multiple of 32 or `blocks` is not exactly that many blocks long.
    pub fn new(format: BlockFormat, rows: usize, cols: usize, blocks: Vec<u8>) -> Option<BlockMatrix> {
        (format.bytes_for(rows, cols)? == blocks.len()).then_some(BlockMatrix { format, rows, cols, blocks })
    }

    /// Quantizes `data` `[rows, cols]` to Q8_0 as GGUF's reference quantizer
    /// does: per block `d = max|x| / 127` rounded to f16, `q = round(x / d)`
    /// (a block of zeros has `d = 0` and `q = 0`). `None` when `cols` is not
    /// a multiple of 32.
    pub fn quantize_q8_0(rows: usize, cols: usize, data: &[f32]) -> Option<BlockMatrix> {
        assert_eq!(data.len(), rows * cols, "a matrix [{rows}, {cols}] needs {} values", rows * cols);
        if !cols.is_multiple_of(BLOCK) {
            return None;
        }
        let mut blocks = Vec::with_capacity(rows * cols / BLOCK * BlockFormat::Q8_0.block_bytes());
        for block in data.chunks_exact(BLOCK) {
            let amax = block.iter().fold(0.0f32, |m, v| m.max(v.abs()));
            let d = amax / 127.0;
            let inv = if d == 0.0 { 0.0 } else { 1.0 / d };
            blocks.extend(f16::from_f32(d).to_bits().to_le_bytes());
            // |x · inv| <= 127 by construction; the cast saturates anyway.
            blocks.extend(block.iter().map(|v| (v * inv).round() as i8 as u8));
        }
        Some(BlockMatrix { format: BlockFormat::Q8_0, rows, cols, blocks })
    }

    pub fn format(&self) -> BlockFormat {
        self.format
    }

    pub fn rows(&self) -> usize {
        self.rows
    }

    pub fn cols(&self) -> usize {
        self.cols
    }

    /// Bytes as stored (what one product streams from memory).
    pub fn bytes(&self) -> usize {
        self.blocks.len()
    }

    /// Row `r`'s blocks.
    pub(crate) fn row_blocks(&self, r: usize) -> &[u8] {
        let per_row = self.bytes() / self.rows.max(1);
        &self.blocks[r * per_row..(r + 1) * per_row]
    }

    /// Row `r` as the f32 weights the product multiplies ([`BlockFormat::decode`]).
    pub fn dequantize_row(&self, r: usize) -> Vec<f32> {
        let mut out = Vec::with_capacity(self.cols);
        self.format.decode_all(self.row_blocks(r), &mut out);
        out
    }

    /// Row `r`'s values into `dst` (`cols` values).
    pub(crate) fn dequantize_into(&self, r: usize, dst: &mut [f32]) {
        for (block, out) in self.row_blocks(r).chunks_exact(self.format.block_bytes()).zip(dst.chunks_exact_mut(BLOCK)) {
            self.format.decode(block, out);
        }
    }
}
