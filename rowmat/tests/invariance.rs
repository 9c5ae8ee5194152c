//! The crate's promise, checked as data: an output row's bits depend only on
//! its input row and the weights (not on the row count, the task split or
//! the instruction set), and Q8_0 equals f32 on the dequantized weights.

use specdec_rowmat::{Q8_0_BLOCK, Weights, dot, matmul, matmul_each_path, matmul_serial};

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
    for (path, y) in matmul_each_path(&x, 9, w) {
        assert_eq!(bits(&y), bits(&window), "the {path} path agrees ({} x {cols})", w.rows());
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
