//! GGUF's Q8_0 weight format: per row, blocks of 32 inputs, each one f16
//! scale `d` and 32 signed bytes `q`; a weight is `d · q`.

use half::f16;

/// Inputs per Q8_0 block.
pub const Q8_0_BLOCK: usize = 32;

/// A Q8_0 matrix `[rows, cols]`, `cols` a multiple of [`Q8_0_BLOCK`]. Scales
/// and quants are kept apart (scales already widened to f32, which is exact)
/// so the product loads each block's 32 bytes with one aligned read.
#[derive(Debug, Clone, PartialEq)]
pub struct Q8Matrix {
    rows: usize,
    cols: usize,
    /// `rows · cols / 32` scales, row-major by block.
    scales: Vec<f32>,
    /// `rows · cols` quants, row-major.
    quants: Vec<i8>,
}

impl Q8Matrix {
    /// Quantizes `data` `[rows, cols]` as GGUF's reference quantizer does:
    /// per block `d = max|x| / 127` rounded to f16, `q = round(x / d)`
    /// (a block of zeros has `d = 0` and `q = 0`). `None` when `cols` is not
    /// a multiple of 32.
    pub fn quantize(rows: usize, cols: usize, data: &[f32]) -> Option<Q8Matrix> {
        assert_eq!(data.len(), rows * cols, "a matrix [{rows}, {cols}] needs {} values", rows * cols);
        if !cols.is_multiple_of(Q8_0_BLOCK) {
            return None;
        }
        let mut scales = Vec::with_capacity(rows * cols / Q8_0_BLOCK);
        let mut quants = Vec::with_capacity(rows * cols);
        for block in data.chunks_exact(Q8_0_BLOCK) {
            let amax = block.iter().fold(0.0f32, |m, v| m.max(v.abs()));
            let d = amax / 127.0;
            let inv = if d == 0.0 { 0.0 } else { 1.0 / d };
            scales.push(f16::from_f32(d).to_f32());
            // |x · inv| <= 127 by construction; the cast saturates anyway.
            quants.extend(block.iter().map(|v| (v * inv).round() as i8));
        }
        Some(Q8Matrix { rows, cols, scales, quants })
    }

    pub fn rows(&self) -> usize {
        self.rows
    }

    pub fn cols(&self) -> usize {
        self.cols
    }

    /// Bytes as stored in GGUF (34 per block: an f16 scale and 32 quants).
    pub fn bytes(&self) -> usize {
        self.scales.len() * (2 + Q8_0_BLOCK)
    }

    /// Row `r`'s scales (one per block) and quants.
    pub(crate) fn row_parts(&self, r: usize) -> (&[f32], &[i8]) {
        let blocks = self.cols / Q8_0_BLOCK;
        (&self.scales[r * blocks..(r + 1) * blocks], &self.quants[r * self.cols..(r + 1) * self.cols])
    }

    /// Row `r` as the f32 weights the product multiplies (`d · q`, exact).
    pub fn dequantize_row(&self, r: usize) -> Vec<f32> {
        let (scales, quants) = self.row_parts(r);
        quants.chunks_exact(Q8_0_BLOCK).zip(scales).flat_map(|(q, &d)| q.iter().map(move |&v| d * f32::from(v))).collect()
    }
}
