//! Dequantization of ggml blocks (F32, F16, Q8_0, Q4_0, Q4_1) to f32, and
//! which of them a matrix keeps as stored ([`stored_format`]).

use half::f16;
use specdec_rowmat::BlockFormat;

use super::types::{GGML_F16, GGML_F32, GGML_Q4_0, GGML_Q4_1, GGML_Q8_0, GgmlType};

/// Dequantizes `n` elements of a supported type. `bytes` holds exactly
/// `n / block_size` blocks (checked when the file was opened); a block
/// never straddles a row because the fastest dimension is a multiple of
/// the block size, so the flat order is the row-major order.
pub(super) fn dequantize(ty: GgmlType, bytes: &[u8], n: usize) -> Vec<f32> {
    let mut out = Vec::with_capacity(n);
    let half = |b: &[u8], i: usize| f16::from_bits(u16::from_le_bytes([b[i], b[i + 1]])).to_f32();
    match ty.id {
        GGML_F32 => out.extend(bytes.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))),
        GGML_F16 => out.extend(bytes.chunks_exact(2).map(|c| half(c, 0))),
        // block_q8_0 { f16 d; i8 qs[32]; }: x = qs·d. block_q4_1 { f16 d;
        // f16 m; u8 qs[16]; }: x = nibble·d + m, same nibble order as Q4_0.
        // One definition for the reader and the products that read the
        // blocks as stored (`specdec_rowmat::BlockFormat::decode`).
        GGML_Q8_0 => BlockFormat::Q8_0.decode_all(bytes, &mut out),
        GGML_Q4_1 => BlockFormat::Q4_1.decode_all(bytes, &mut out),
        // block_q4_0 { f16 d; u8 qs[16]; }: element j is the low nibble of
        // qs[j], element j+16 its high nibble; x = (nibble − 8)·d.
        GGML_Q4_0 => {
            for b in bytes.chunks_exact(18) {
                let d = half(b, 0);
                let qs = &b[2..18];
                out.extend(qs.iter().map(|&q| f32::from((q & 0x0F) as i8 - 8) * d));
                out.extend(qs.iter().map(|&q| f32::from((q >> 4) as i8 - 8) * d));
            }
        }
        _ => {}
    }
    out
}

/// The block format a 2-D tensor of this type keeps beside its values, for
/// a backend that multiplies the blocks as stored (Q8_0 and Q4_1).
pub(super) fn stored_format(ty: GgmlType) -> Option<BlockFormat> {
    match ty.id {
        GGML_Q8_0 => Some(BlockFormat::Q8_0),
        GGML_Q4_1 => Some(BlockFormat::Q4_1),
        _ => None,
    }
}
