//! The crate's promise, checked as data: an output row's bits depend only on
//! its input row and the weights (not on the row count, the task split or
//! the instruction set), and Q8_0 equals f32 on the dequantized weights.
//!
//! Each path runs only where the CPU has its instructions: the portable one
//! everywhere, AVX2's on x86 machines with AVX2, FMA and F16C, AVX-512's on
//! those with AVX-512F too (a machine without them cannot check those
//! kernels; `check` prints the paths it compared).

use half::f16;
use specdec_rowmat::{BLOCK, BlockFormat, Q8_0_BLOCK, Weights, dot, matmul, matmul_each_path, matmul_serial};

/// A small deterministic generator (xorshift), values in [-1, 1) with a
/// spread of magnitudes so that rounding order matters.
fn values(seed: u64, n: usize) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|i| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            let unit = (s >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0;
            unit * if i % 5 == 0 { 37.0 } else { 0.013 }
        })
        .collect()
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// (weight rows, columns): columns that are and are not multiples of the 8
/// lanes and the 32-value block, rows around the task and tile sizes, and
/// rows long enough to be split in column spans at 9 input rows (1536, and
/// 1000 with a tail past its last whole chunk).
const SHAPES: [(usize, usize); 8] = [(1, 8), (5, 13), (17, 64), (33, 100), (64, 576), (7, 1536), (40, 96), (13, 1000)];

fn check(w: &Weights, seed: u64) {
    let cols = w.cols();
    let x = values(seed, 9 * cols);
    let window = matmul(&x, 9, w);
    // Every path at every row count: some kernels serve only up to five rows.
    let paths: Vec<&str> = matmul_each_path(&x[..cols], 1, w).into_iter().map(|(path, _)| path).collect();
    eprintln!("{} x {cols} ({}): paths compared {paths:?}", w.rows(), w.dtype());
    for n in 1..=9 {
        for (path, y) in matmul_each_path(&x[..n * cols], n, w) {
            assert_eq!(bits(&y), bits(&window[..n * w.rows()]), "the {path} path agrees ({} x {cols}, {n} rows)", w.rows());
        }
    }
    if let Weights::F32 { data, .. } = w {
        assert_eq!(bits(&matmul_serial(&x, 9, data, cols)), bits(&window), "the serial product is the same arithmetic");
    }
    for n in 1..=9 {
        let part = matmul(&x[..n * cols], n, w);
        assert_eq!(bits(&part), bits(&window[..n * w.rows()]), "{n} rows round like 9 ({} x {cols})", w.rows());
    }
    for r in 0..9 {
        let one = matmul(&x[r * cols..(r + 1) * cols], 1, w);
        assert_eq!(bits(&one), bits(&window[r * w.rows()..(r + 1) * w.rows()]), "row {r} alone rounds like in the window");
        for (o, &v) in one.iter().enumerate() {
            assert_eq!(v.to_bits(), dot(&x[r * cols..(r + 1) * cols], &w.row(o)).to_bits(), "matmul is the canonical dot");
        }
    }
}

#[test]
fn f32_rows_round_alike_whatever_their_count() {
    for (i, &(rows, cols)) in SHAPES.iter().enumerate() {
        check(&Weights::f32(rows, cols, values(100 + i as u64, rows * cols)), i as u64);
    }
}

#[test]
fn q8_0_equals_f32_on_its_dequantized_weights() {
    for (i, &(rows, cols)) in SHAPES.iter().enumerate() {
        let data = values(200 + i as u64, rows * cols);
        let Some(q) = Weights::q8_0(rows, cols, &data) else {
            assert_ne!(cols % Q8_0_BLOCK, 0, "only widths that are not a multiple of 32 stay f32");
            continue;
        };
        check(&q, i as u64);
        let dequantized: Vec<f32> = (0..rows).flat_map(|r| q.row(r)).collect();
        let f = Weights::f32(rows, cols, dequantized.clone());
        let x = values(300 + i as u64, 9 * cols);
        assert_eq!(bits(&matmul(&x, 9, &q)), bits(&matmul(&x, 9, &f)), "Q8_0 is f32 on d · q, bit for bit");
        // The quantization's own error: half a step (d / 2) per weight, d = max|block| / 127,
        // plus the scale's rounding to f16 (2^-11 relative) times |q| <= 127.
        for (block, dq) in data.chunks(Q8_0_BLOCK).zip(dequantized.chunks(Q8_0_BLOCK)) {
            let amax = block.iter().fold(0.0f32, |m, v| m.max(v.abs()));
            for (a, b) in block.iter().zip(dq) {
                assert!((a - b).abs() <= amax / 127.0 * (0.5 + 127.0 / 2048.0) * 1.001, "{a} quantized to {b}");
            }
        }
        assert_eq!(q.bytes(), rows * cols / 32 * 34);
    }
}

/// Blocks as a GGUF stores them, `[rows, cols]`: scales and minimums of
/// both signs and a spread of magnitudes (f16 subnormals included), every
/// quant value.
fn stored_blocks(format: BlockFormat, rows: usize, cols: usize, seed: u64) -> Vec<u8> {
    let v = values(seed, rows * cols / BLOCK * format.block_bytes());
    let mut bytes = Vec::new();
    for (b, block) in v.chunks_exact(format.block_bytes()).enumerate() {
        let scale = |x: f32, k: usize| f16::from_f32(x * if (b + k).is_multiple_of(11) { 1e-5 } else { 0.05 }).to_bits().to_le_bytes();
        bytes.extend(scale(block[0], 0));
        if format == BlockFormat::Q4_1 {
            bytes.extend(scale(block[1], 3));
        }
        let head = bytes.len() % format.block_bytes();
        bytes.extend(block[head..].iter().map(|x| (x.to_bits() >> 7) as u8));
    }
    bytes
}

/// A GGUF's own Q8_0 and Q4_1 blocks, multiplied as stored: the product is
/// the f32 product of their decoded values, bit for bit, on every path and
/// for every row count (`check`).
#[test]
fn stored_blocks_equal_f32_on_their_values() {
    for format in [BlockFormat::Q8_0, BlockFormat::Q4_1] {
        for (i, &(rows, cols)) in SHAPES.iter().enumerate().filter(|(_, s)| s.1.is_multiple_of(BLOCK)) {
            let bytes = stored_blocks(format, rows, cols, 600 + i as u64);
            let w = Weights::blocks(format, rows, cols, bytes.clone()).expect("whole blocks");
            assert_eq!((w.dtype(), w.bytes()), (format.name(), bytes.len()));
            check(&w, 700 + i as u64);
            let mut decoded = Vec::new();
            format.decode_all(&bytes, &mut decoded);
            let x = values(800 + i as u64, 9 * cols);
            assert_eq!(bits(&matmul(&x, 9, &w)), bits(&matmul(&x, 9, &Weights::f32(rows, cols, decoded))), "{} blocks are f32 on their values", format.name());
        }
    }
}

/// Negative control: a kernel that read Q4_1's nibbles in the other order
/// (high nibble first) is caught by `check`'s comparison with the canonical
/// dot product of the block's decoding. It is played here by the kernel
/// multiplying bytes whose nibbles were swapped.
#[test]
fn a_swapped_nibble_order_is_caught() {
    let (rows, cols) = (17, 64);
    let bytes = stored_blocks(BlockFormat::Q4_1, rows, cols, 9);
    let swapped: Vec<u8> = bytes.chunks_exact(20).flat_map(|b| b[..4].iter().copied().chain(b[4..].iter().map(|q| q.rotate_left(4))).collect::<Vec<_>>()).collect();
    let right = Weights::blocks(BlockFormat::Q4_1, rows, cols, bytes).unwrap();
    let x = values(10, cols);
    for (path, wrong) in matmul_each_path(&x, 1, &Weights::blocks(BlockFormat::Q4_1, rows, cols, swapped).unwrap()) {
        let caught = (0..rows).any(|o| wrong[o].to_bits() != dot(&x, &right.row(o)).to_bits());
        assert!(caught, "the {path} path's misread nibbles pass for the right ones");
    }
}

/// Hand-worked blocks: Q8_0 `d · q`; Q4_1 `d · nibble + m`, low nibbles
/// first (ggml's `dequantize_row_q4_1`).
#[test]
fn blocks_decode_as_ggml_defines_them() {
    let mut q8 = f16::from_f32(0.5).to_bits().to_le_bytes().to_vec();
    q8.extend((0..32).map(|i| (i as i8 - 16) as u8));
    let mut out = [0.0f32; 32];
    BlockFormat::Q8_0.decode(&q8, &mut out);
    assert_eq!(out[0], -8.0);
    assert_eq!(out[31], 7.5);
    let mut q4 = [f16::from_f32(0.25).to_bits().to_le_bytes(), f16::from_f32(-1.0).to_bits().to_le_bytes()].concat();
    // Byte k: low nibble k, high nibble 15 - k.
    q4.extend((0..16u8).map(|k| k | ((15 - k) << 4)));
    BlockFormat::Q4_1.decode(&q4, &mut out);
    assert_eq!(&out[..3], &[-1.0, -0.75, -0.5]);
    assert_eq!(&out[16..18], &[2.75, 2.5]);
    assert_eq!(out[31], -1.0);
    // Blocks that do not fill the shape are refused.
    assert!(Weights::blocks(BlockFormat::Q4_1, 1, 32, q4[..19].to_vec()).is_none());
    assert!(Weights::blocks(BlockFormat::Q4_1, 1, 16, q4.clone()).is_none());
    assert!(Weights::blocks(BlockFormat::Q4_1, usize::MAX, 64, q4).is_none());
}

/// More input rows than a tile holds (9, 9 and 2 here): groups of
/// different sizes, so with different column spans, in one call, each row
/// still rounding as it does alone.
#[test]
fn many_rows_round_like_one_row_each() {
    for (i, &(rows, cols)) in [(13, 1000), (7, 1536), (64, 576)].iter().enumerate() {
        let w = Weights::f32(rows, cols, values(400 + i as u64, rows * cols));
        let x = values(500 + i as u64, 20 * cols);
        let all = matmul(&x, 20, &w);
        for (path, y) in matmul_each_path(&x, 20, &w) {
            assert_eq!(bits(&y), bits(&all), "the {path} path agrees ({rows} x {cols}, 20 rows)");
        }
        for r in 0..20 {
            let one = matmul(&x[r * cols..(r + 1) * cols], 1, &w);
            assert_eq!(bits(&one), bits(&all[r * rows..(r + 1) * rows]), "row {r} of 20 rounds alone ({rows} x {cols})");
        }
    }
}

/// Empty rows: every product is the empty sum, +0.
#[test]
fn zero_width_products_are_zero() {
    assert_eq!(dot(&[], &[]).to_bits(), 0.0f32.to_bits());
    assert_eq!(matmul(&[], 2, &Weights::f32(3, 0, Vec::new())), vec![0.0; 6]);
}

#[test]
fn a_zero_block_has_scale_zero() {
    let q = Weights::q8_0(1, 32, &[0.0; 32]).unwrap();
    assert_eq!(q.row(0), vec![0.0; 32]);
}

/// Negative control: the bit comparisons above can fail. A left-to-right
/// dot product (what a naive kernel computes) rounds differently from the
/// canonical eight-lane order on these data, so a kernel that switched to it
/// for some row counts would be caught.
#[test]
fn a_different_summation_order_is_caught() {
    let (a, b) = (values(7, 576), values(8, 576));
    let sequential = a.iter().zip(&b).fold(0.0f32, |s, (x, y)| x.mul_add(*y, s));
    assert_ne!(sequential.to_bits(), dot(&a, &b).to_bits());
}
