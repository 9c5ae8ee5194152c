//! GGUF dequantization against hand-computed blocks (MODEL-3): F16, Q8_0,
//! Q4_0 and Q4_1 as ggml lays them out, the HF-style shape of a 2-D tensor,
//! and unsupported types named with the tensor.

mod common;

use common::GgufBuilder;
use specdec_models::gguf::GgufFile;

const F32: u32 = 0;
const F16: u32 = 1;
const Q4_0: u32 = 2;
const Q4_1: u32 = 3;
const Q8_0: u32 = 8;

/// One dequantization case: a tensor's type, dims (fastest first) and
/// bytes, and the values and shape it must give.
struct Case {
    name: &'static str,
    ty: u32,
    dims: Vec<u64>,
    bytes: Vec<u8>,
    shape: Vec<usize>,
    values: Vec<f32>,
}

/// Runs every case under `rules`.
fn check(rules: &str, cases: Vec<Case>) {
    for c in cases {
        let file = GgufBuilder::default().tensor("t", &c.dims, c.ty, c.bytes.clone()).build();
        let g = GgufFile::from_bytes(c.name, file).unwrap_or_else(|e| panic!("{rules}: {}: {e}", c.name));
        let m = g.tensor_f32("t").unwrap_or_else(|e| panic!("{rules}: {}: {e}", c.name));
        assert_eq!(m.shape, c.shape, "{rules}: {}: shape", c.name);
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&m.data), bits(&c.values), "{rules}: {}: values {:?} != {:?}", c.name, m.data, c.values);
        // A 2-D Q8_0 or Q4_1 matrix keeps its blocks as the file stores them.
        let keeps = c.shape.len() == 2 && (c.ty == Q8_0 || c.ty == Q4_1);
        assert_eq!(m.stored().map(|(_, b)| b.to_vec()), keeps.then(|| c.bytes.clone()), "{rules}: {}: stored blocks", c.name);
    }
}

/// Little-endian f16 bits.
fn h(bits: u16) -> [u8; 2] {
    bits.to_le_bytes()
}

fn cat(parts: &[&[u8]]) -> Vec<u8> {
    parts.concat()
}

/// `qs[j] = j | (15 − j) << 4`: low nibbles count up, high nibbles down.
fn nibble_ramp() -> Vec<u8> {
    (0..16u8).map(|j| j | ((15 - j) << 4)).collect()
}

#[test]
fn f32_and_f16() {
    let cases = vec![
        Case {
            name: "F32",
            ty: F32,
            dims: vec![3],
            bytes: cat(&[&1.5f32.to_le_bytes(), &(-0.0f32).to_le_bytes(), &f32::MIN_POSITIVE.to_le_bytes()]),
            shape: vec![3],
            values: vec![1.5, -0.0, f32::MIN_POSITIVE],
        },
        Case {
            name: "F16",
            ty: F16,
            dims: vec![6],
            // 1, -2, 1/3 rounded (0x3555), the largest f16, the smallest subnormal, -0.
            bytes: cat(&[&h(0x3C00), &h(0xC000), &h(0x3555), &h(0x7BFF), &h(0x0001), &h(0x8000)]),
            shape: vec![6],
            values: vec![1.0, -2.0, 0.333_251_95, 65504.0, 5.960_464_5e-8, -0.0],
        },
    ];
    check("MODEL-3: F32 is read as is, F16 widened exactly", cases);
}

#[test]
fn q8_0_blocks() {
    // Block 1: d = 0.5 (0x3800), qs = -128, -1, 0, 1, 127, then 27 twos.
    // Block 2: d = -0.25 (0xB400), qs = 0..32.
    let mut qs1: Vec<u8> = [-128i8, -1, 0, 1, 127].iter().map(|&q| q as u8).collect();
    qs1.extend([2u8; 27]);
    let qs2: Vec<u8> = (0..32u8).collect();
    let mut values = vec![-64.0, -0.5, 0.0, 0.5, 63.5];
    values.extend([1.0; 27]);
    values.extend((0..32).map(|q| q as f32 * -0.25));
    check("MODEL-3: Q8_0 is d · q", vec![Case { name: "Q8_0", ty: Q8_0, dims: vec![64], bytes: cat(&[&h(0x3800), &qs1, &h(0xB400), &qs2]), shape: vec![64], values }]);
}

#[test]
fn q4_0_block() {
    // d = 2: element j = (j − 8)·2, element 16 + j = ((15 − j) − 8)·2.
    let values = vec![
        -16.0, -14.0, -12.0, -10.0, -8.0, -6.0, -4.0, -2.0, 0.0, 2.0, 4.0, 6.0, 8.0, 10.0, 12.0, 14.0, //
        14.0, 12.0, 10.0, 8.0, 6.0, 4.0, 2.0, 0.0, -2.0, -4.0, -6.0, -8.0, -10.0, -12.0, -14.0, -16.0,
    ];
    check("MODEL-3: Q4_0 is d · (q - 8), low nibbles first", vec![Case { name: "Q4_0", ty: Q4_0, dims: vec![32], bytes: cat(&[&h(0x4000), &nibble_ramp()]), shape: vec![32], values }]);
}

#[test]
fn q4_1_block() {
    // d = 0.5, m = -1: element j = j·0.5 − 1, element 16 + j = (15 − j)·0.5 − 1.
    let values = vec![
        -1.0, -0.5, 0.0, 0.5, 1.0, 1.5, 2.0, 2.5, 3.0, 3.5, 4.0, 4.5, 5.0, 5.5, 6.0, 6.5, //
        6.5, 6.0, 5.5, 5.0, 4.5, 4.0, 3.5, 3.0, 2.5, 2.0, 1.5, 1.0, 0.5, 0.0, -0.5, -1.0,
    ];
    check("MODEL-3: Q4_1 is d · q + m, low nibbles first", vec![Case { name: "Q4_1", ty: Q4_1, dims: vec![32], bytes: cat(&[&h(0x3800), &h(0xBC00), &nibble_ramp()]), shape: vec![32], values }]);
}

/// GGUF dims `[32, 2]` (fastest first) are a 2 x 32 matrix; each row is one
/// block, stored one after the other.
#[test]
fn two_dimensional_shape_is_reversed() {
    let row0 = cat(&[&h(0x3C00), &h(0x0000), &[0x11; 16]]); // d = 1, m = 0, nibbles 1: all 1
    let row1 = cat(&[&h(0x4000), &h(0x3C00), &[0x21; 16]]); // d = 2, m = 1: low 1 -> 3, high 2 -> 5
    let mut values = vec![1.0; 32];
    values.extend([3.0; 16]);
    values.extend([5.0; 16]);
    check("MODEL-3: dimensions are listed fastest-first", vec![Case { name: "Q4_1 2-D", ty: Q4_1, dims: vec![32, 2], bytes: cat(&[&row0, &row1]), shape: vec![2, 32], values }]);
}

/// An unsupported type is reported with the tensor's name and the type's.
#[test]
fn unsupported_types_are_named() {
    for (ty, name, bytes) in [(14u32, "Q6_K", 210usize), (12, "Q4_K", 144), (30, "BF16", 512), (6, "Q5_0", 22 * 8)] {
        let file = GgufBuilder::default().tensor("blk.3.ffn_down.weight", &[256], ty, vec![0; bytes]).build();
        let g = GgufFile::from_bytes("types.gguf", file).unwrap();
        assert_eq!(g.tensors()[0].type_name(), name);
        let e = g.tensor_f32("blk.3.ffn_down.weight").unwrap_err();
        assert_eq!(e.kind(), "UnsupportedTensorType", "MODEL-3: any other tensor type is an error: {name}: {e}");
        let msg = e.to_string();
        assert!(msg.contains("blk.3.ffn_down.weight") && msg.contains(name) && msg.contains("types.gguf"), "MODEL-3: the error names the tensor and the type: {msg}");
    }
    let g = GgufFile::from_bytes("types.gguf", GgufBuilder::default().build()).unwrap();
    assert_eq!(g.tensor_f32("nope").unwrap_err().kind(), "MissingTensor");
}
