//! The ggml tensor types a GGUF file may hold, and which of them we read.

/// One ggml tensor type: its id in the file, its name, and its block layout
/// (`block_size` elements stored in `type_size` bytes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GgmlType {
    pub id: u32,
    pub name: &'static str,
    pub block_size: usize,
    pub type_size: usize,
}

impl GgmlType {
    const fn new(id: u32, name: &'static str, block_size: usize, type_size: usize) -> Self {
        GgmlType { id, name, block_size, type_size }
    }

    /// The type with this id, if ggml defines it. Every known type's size is
    /// listed (not only the ones we dequantize) so that a file holding, say,
    /// Q6_K tensors can still be opened and described; reading such a tensor
    /// is an `UnsupportedTensorType` error.
    pub fn from_id(id: u32) -> Option<GgmlType> {
        GGML_TYPES.iter().copied().find(|t| t.id == id)
    }

    /// Whether [`GgufFile::tensor_f32`] can dequantize this type.
    pub fn is_supported(&self) -> bool {
        matches!(self.id, GGML_F32 | GGML_F16 | GGML_Q4_0 | GGML_Q4_1 | GGML_Q8_0)
    }
}

pub(super) const GGML_F32: u32 = 0;

pub(super) const GGML_F16: u32 = 1;

pub(super) const GGML_Q4_0: u32 = 2;

pub(super) const GGML_Q4_1: u32 = 3;

pub(super) const GGML_Q8_0: u32 = 8;

/// ggml's type table (ids, block sizes and block byte sizes as in `ggml.c`).
/// Ids 4, 5 and 31..=33, 36..=38 were removed from ggml and are rejected.
pub(super) const GGML_TYPES: &[GgmlType] = &[
    GgmlType::new(0, "F32", 1, 4),
    GgmlType::new(1, "F16", 1, 2),
    GgmlType::new(2, "Q4_0", 32, 18),
    GgmlType::new(3, "Q4_1", 32, 20),
    GgmlType::new(6, "Q5_0", 32, 22),
    GgmlType::new(7, "Q5_1", 32, 24),
    GgmlType::new(8, "Q8_0", 32, 34),
    GgmlType::new(9, "Q8_1", 32, 36),
    GgmlType::new(10, "Q2_K", 256, 84),
    GgmlType::new(11, "Q3_K", 256, 110),
    GgmlType::new(12, "Q4_K", 256, 144),
    GgmlType::new(13, "Q5_K", 256, 176),
    GgmlType::new(14, "Q6_K", 256, 210),
    GgmlType::new(15, "Q8_K", 256, 292),
    GgmlType::new(16, "IQ2_XXS", 256, 66),
    GgmlType::new(17, "IQ2_XS", 256, 74),
    GgmlType::new(18, "IQ3_XXS", 256, 98),
    GgmlType::new(19, "IQ1_S", 256, 50),
    GgmlType::new(20, "IQ4_NL", 32, 18),
    GgmlType::new(21, "IQ3_S", 256, 110),
    GgmlType::new(22, "IQ2_S", 256, 82),
    GgmlType::new(23, "IQ4_XS", 256, 136),
    GgmlType::new(24, "I8", 1, 1),
    GgmlType::new(25, "I16", 1, 2),
    GgmlType::new(26, "I32", 1, 4),
    GgmlType::new(27, "I64", 1, 8),
    GgmlType::new(28, "F64", 1, 8),
    GgmlType::new(29, "IQ1_M", 256, 56),
    GgmlType::new(30, "BF16", 1, 2),
    GgmlType::new(34, "TQ1_0", 256, 54),
    GgmlType::new(35, "TQ2_0", 256, 66),
    GgmlType::new(39, "MXFP4", 32, 17),
];
