//! A hand-written GGUF v2/v3 reader and the `llama` loader on top of it
//! (MODEL-3, MODEL-4).
//!
//! Role: open a `.gguf` file (memory-mapped), parse its header, metadata and
//! tensor table, dequantize tensors to f32 (F32, F16, Q8_0, Q4_0, Q4_1), and
//! assemble a [`LlamaWeights`] in the host convention (HF names, `[out, in]`,
//! HF row order for `q`/`k`).
//!
//! Invariants (MODEL-16): the file is hostile until proven otherwise.
//! Every count and length read from the header is bounded by the bytes that
//! remain before anything is allocated from it (a count `n` of entries that
//! take at least `m` bytes each must satisfy `n·m <= remaining`), arrays nest
//! at most [`MAX_ARRAY_DEPTH`] deep, every tensor's byte range is checked to
//! lie inside the file when the file is opened, and every defect is a typed
//! [`ModelError`] naming the file and the key or tensor at fault. Nothing in
//! this module panics on file content.
//!
//! We parse GGUF ourselves (rather than through a tensor library) precisely
//! so that these checks happen before any allocation.

use std::collections::{HashMap, HashSet};
use std::ops::Deref;
use std::path::Path;

use half::f16;
use memmap2::Mmap;

use crate::config::LlamaConfig;
use crate::error::{ModelError, Result};
use crate::weights::{LlamaWeights, Matrix};

/// The four bytes every GGUF file starts with.
pub const GGUF_MAGIC: &[u8; 4] = b"GGUF";

/// Tensor data alignment when `general.alignment` is absent (GGUF spec).
pub const DEFAULT_ALIGNMENT: u64 = 32;

/// Deepest nesting of metadata arrays accepted; real files use depth 1, and
/// a bound keeps a hostile file from exhausting the stack.
pub const MAX_ARRAY_DEPTH: usize = 8;

/// Most dimensions a ggml tensor can have.
pub const MAX_DIMS: usize = 4;

/// The fewest bytes one tensor info can take: name length (8), `n_dims` (4),
/// type (4), offset (8).
const MIN_TENSOR_INFO_BYTES: usize = 24;

/// The fewest bytes one metadata entry can take: key length (8), value type
/// (4), a one-byte value.
const MIN_KV_BYTES: usize = 13;

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

const GGML_F32: u32 = 0;
const GGML_F16: u32 = 1;
const GGML_Q4_0: u32 = 2;
const GGML_Q4_1: u32 = 3;
const GGML_Q8_0: u32 = 8;

/// ggml's type table (ids, block sizes and block byte sizes as in `ggml.c`).
/// Ids 4, 5 and 31..=33, 36..=38 were removed from ggml and are rejected.
const GGML_TYPES: &[GgmlType] = &[
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

/// A metadata value.
#[derive(Debug, Clone, PartialEq)]
pub enum GgufValue {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    F32(f32),
    Bool(bool),
    String(String),
    Array(GgufArray),
    U64(u64),
    I64(i64),
    F64(f64),
}

/// A metadata array. Arrays are stored typed (not as a `Vec<GgufValue>`) so
/// that memory stays within a small factor of the file size: a hostile
/// million-element `u8` array costs a megabyte, not forty.
#[derive(Debug, Clone, PartialEq)]
pub enum GgufArray {
    U8(Vec<u8>),
    I8(Vec<i8>),
    U16(Vec<u16>),
    I16(Vec<i16>),
    U32(Vec<u32>),
    I32(Vec<i32>),
    F32(Vec<f32>),
    Bool(Vec<bool>),
    String(Vec<String>),
    Array(Vec<GgufArray>),
    U64(Vec<u64>),
    I64(Vec<i64>),
    F64(Vec<f64>),
}

impl GgufValue {
    /// The GGUF name of the value's type (for error messages).
    pub fn type_name(&self) -> &'static str {
        match self {
            GgufValue::U8(_) => "u8",
            GgufValue::I8(_) => "i8",
            GgufValue::U16(_) => "u16",
            GgufValue::I16(_) => "i16",
            GgufValue::U32(_) => "u32",
            GgufValue::I32(_) => "i32",
            GgufValue::F32(_) => "f32",
            GgufValue::Bool(_) => "bool",
            GgufValue::String(_) => "string",
            GgufValue::Array(a) => a.type_name(),
            GgufValue::U64(_) => "u64",
            GgufValue::I64(_) => "i64",
            GgufValue::F64(_) => "f64",
        }
    }

    /// The value as an integer, whatever its integer width.
    pub fn as_i128(&self) -> Option<i128> {
        Some(match *self {
            GgufValue::U8(v) => v.into(),
            GgufValue::I8(v) => v.into(),
            GgufValue::U16(v) => v.into(),
            GgufValue::I16(v) => v.into(),
            GgufValue::U32(v) => v.into(),
            GgufValue::I32(v) => v.into(),
            GgufValue::U64(v) => v.into(),
            GgufValue::I64(v) => v.into(),
            _ => return None,
        })
    }
}

impl GgufArray {
    /// The GGUF name of the array's type, e.g. `array<string>`.
    pub fn type_name(&self) -> &'static str {
        match self {
            GgufArray::U8(_) => "array<u8>",
            GgufArray::I8(_) => "array<i8>",
            GgufArray::U16(_) => "array<u16>",
            GgufArray::I16(_) => "array<i16>",
            GgufArray::U32(_) => "array<u32>",
            GgufArray::I32(_) => "array<i32>",
            GgufArray::F32(_) => "array<f32>",
            GgufArray::Bool(_) => "array<bool>",
            GgufArray::String(_) => "array<string>",
            GgufArray::Array(_) => "array<array>",
            GgufArray::U64(_) => "array<u64>",
            GgufArray::I64(_) => "array<i64>",
            GgufArray::F64(_) => "array<f64>",
        }
    }

    pub fn len(&self) -> usize {
        match self {
            GgufArray::U8(v) => v.len(),
            GgufArray::I8(v) => v.len(),
            GgufArray::U16(v) => v.len(),
            GgufArray::I16(v) => v.len(),
            GgufArray::U32(v) => v.len(),
            GgufArray::I32(v) => v.len(),
            GgufArray::F32(v) => v.len(),
            GgufArray::Bool(v) => v.len(),
            GgufArray::String(v) => v.len(),
            GgufArray::Array(v) => v.len(),
            GgufArray::U64(v) => v.len(),
            GgufArray::I64(v) => v.len(),
            GgufArray::F64(v) => v.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The elements as integers, if this is an array of an integer type.
    pub fn to_i128(&self) -> Option<Vec<i128>> {
        fn widen<T: Copy + Into<i128>>(v: &[T]) -> Vec<i128> {
            v.iter().map(|&x| x.into()).collect()
        }
        Some(match self {
            GgufArray::U8(v) => widen(v),
            GgufArray::I8(v) => widen(v),
            GgufArray::U16(v) => widen(v),
            GgufArray::I16(v) => widen(v),
            GgufArray::U32(v) => widen(v),
            GgufArray::I32(v) => widen(v),
            GgufArray::U64(v) => widen(v),
            GgufArray::I64(v) => widen(v),
            _ => return None,
        })
    }
}

/// One entry of the tensor table.
#[derive(Debug, Clone, PartialEq)]
pub struct GgufTensor {
    pub name: String,
    /// Dimensions as the file lists them: fastest-varying first.
    pub dims: Vec<usize>,
    pub ggml_type: GgmlType,
    /// Offset relative to the start of the data section (as in the file).
    pub offset: u64,
    /// Absolute byte range in the file (checked to lie inside it).
    start: usize,
    n_bytes: usize,
}

impl GgufTensor {
    /// The shape HF-style, slowest-varying first (the file's dims reversed):
    /// `token_embd.weight` listed as `[576, 49152]` is a `[49152, 576]` matrix.
    pub fn shape(&self) -> Vec<usize> {
        self.dims.iter().rev().copied().collect()
    }

    /// Number of elements (checked not to overflow when the file was opened).
    pub fn n_elements(&self) -> usize {
        self.dims.iter().product()
    }

    /// Bytes the tensor's data takes in the file.
    pub fn n_bytes(&self) -> usize {
        self.n_bytes
    }

    pub fn type_name(&self) -> &'static str {
        self.ggml_type.name
    }
}

/// The bytes of an open file: memory-mapped, or owned (tests, in-memory files).
enum Bytes {
    Mapped(Mmap),
    Owned(Vec<u8>),
}

impl Deref for Bytes {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match self {
            Bytes::Mapped(m) => m,
            Bytes::Owned(v) => v,
        }
    }
}

/// Maps a whole file read-only.
pub(crate) fn map_file(path: &Path) -> Result<Mmap> {
    let file = std::fs::File::open(path).map_err(|e| ModelError::io(path, e))?;
    // SAFETY: the map is read-only and private to this process. Like every
    // reader of memory-mapped model files we assume nobody truncates or
    // rewrites the file while it is open; every access below is
    // bounds-checked against the length seen at open time.
    unsafe { Mmap::map(&file) }.map_err(|e| ModelError::io(path, e))
}

/// A parsed GGUF file (MODEL-3): header, metadata and tensor table, with the
/// tensor data left in the mapped file until a tensor is asked for.
pub struct GgufFile {
    file: String,
    bytes: Bytes,
    version: u32,
    alignment: u64,
    metadata: Vec<(String, GgufValue)>,
    metadata_index: HashMap<String, usize>,
    tensors: Vec<GgufTensor>,
    tensor_index: HashMap<String, usize>,
}

impl std::fmt::Debug for GgufFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GgufFile").field("file", &self.file).field("version", &self.version).field("metadata", &self.metadata.len()).field("tensors", &self.tensors.len()).finish()
    }
}

impl GgufFile {
    /// Memory-maps and parses `path`.
    pub fn open(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        let map = map_file(path)?;
        Self::parse(path.display().to_string(), Bytes::Mapped(map))
    }

    /// Parses a file already in memory; `name` names it in errors.
    pub fn from_bytes(name: &str, bytes: Vec<u8>) -> Result<Self> {
        Self::parse(name.to_string(), Bytes::Owned(bytes))
    }

    fn parse(file: String, bytes: Bytes) -> Result<Self> {
        let header = {
            let mut r = Reader { file: &file, buf: &bytes, pos: 0 };
            parse_header(&mut r)?
        };
        Ok(GgufFile {
            file,
            bytes,
            version: header.version,
            alignment: header.alignment,
            metadata: header.metadata,
            metadata_index: header.metadata_index,
            tensors: header.tensors,
            tensor_index: header.tensor_index,
        })
    }

    /// The file's name as used in errors.
    pub fn file(&self) -> &str {
        &self.file
    }

    pub fn version(&self) -> u32 {
        self.version
    }

    pub fn alignment(&self) -> u64 {
        self.alignment
    }

    /// Every metadata entry, in file order.
    pub fn metadata(&self) -> &[(String, GgufValue)] {
        &self.metadata
    }

    /// Every tensor, in file order.
    pub fn tensors(&self) -> &[GgufTensor] {
        &self.tensors
    }

    pub fn tensor(&self, name: &str) -> Option<&GgufTensor> {
        self.tensor_index.get(name).and_then(|&i| self.tensors.get(i))
    }

    pub fn get(&self, key: &str) -> Option<&GgufValue> {
        self.metadata_index.get(key).and_then(|&i| self.metadata.get(i)).map(|(_, v)| v)
    }

    fn missing(&self, key: &str) -> ModelError {
        ModelError::MissingField { file: self.file.clone(), field: key.to_string() }
    }

    fn wrong_type(&self, key: &str, want: &str, got: &GgufValue) -> ModelError {
        ModelError::invalid(&self.file, key, format!("expected {want}, found {}", got.type_name()))
    }

    fn require(&self, key: &str) -> Result<&GgufValue> {
        self.get(key).ok_or_else(|| self.missing(key))
    }

    /// An integer value that fits `u32`, whatever integer type stores it
    /// (converters disagree on widths).
    pub fn get_u32(&self, key: &str) -> Result<u32> {
        let v = self.require(key)?;
        let i = v.as_i128().ok_or_else(|| self.wrong_type(key, "an integer", v))?;
        u32::try_from(i).map_err(|_| ModelError::invalid(&self.file, key, format!("{i} does not fit u32")))
    }

    /// [`Self::get_u32`], `None` when the key is absent.
    pub fn opt_u32(&self, key: &str) -> Result<Option<u32>> {
        self.get(key).map(|_| self.get_u32(key)).transpose()
    }

    /// An `f32` value exactly as stored.
    pub fn get_f32(&self, key: &str) -> Result<f32> {
        match self.require(key)? {
            GgufValue::F32(x) => Ok(*x),
            v => Err(self.wrong_type(key, "f32", v)),
        }
    }

    /// An `f32` or `f64` value, widened exactly to `f64`.
    pub fn get_f64(&self, key: &str) -> Result<f64> {
        match self.require(key)? {
            GgufValue::F32(x) => Ok(f64::from(*x)),
            GgufValue::F64(x) => Ok(*x),
            v => Err(self.wrong_type(key, "f32 or f64", v)),
        }
    }

    /// [`Self::get_f64`], `None` when the key is absent.
    pub fn opt_f64(&self, key: &str) -> Result<Option<f64>> {
        self.get(key).map(|_| self.get_f64(key)).transpose()
    }

    pub fn get_bool(&self, key: &str) -> Result<bool> {
        match self.require(key)? {
            GgufValue::Bool(b) => Ok(*b),
            v => Err(self.wrong_type(key, "bool", v)),
        }
    }

    /// [`Self::get_bool`], `None` when the key is absent.
    pub fn opt_bool(&self, key: &str) -> Result<Option<bool>> {
        self.get(key).map(|_| self.get_bool(key)).transpose()
    }

    pub fn get_str(&self, key: &str) -> Result<&str> {
        match self.require(key)? {
            GgufValue::String(s) => Ok(s),
            v => Err(self.wrong_type(key, "string", v)),
        }
    }

    /// [`Self::get_str`], `None` when the key is absent.
    pub fn opt_str(&self, key: &str) -> Result<Option<&str>> {
        self.get(key).map(|_| self.get_str(key)).transpose()
    }

    pub fn get_array(&self, key: &str) -> Result<&GgufArray> {
        match self.require(key)? {
            GgufValue::Array(a) => Ok(a),
            v => Err(self.wrong_type(key, "an array", v)),
        }
    }

    pub fn get_str_array(&self, key: &str) -> Result<&[String]> {
        match self.get_array(key)? {
            GgufArray::String(v) => Ok(v),
            a => Err(ModelError::invalid(&self.file, key, format!("expected array<string>, found {}", a.type_name()))),
        }
    }

    /// An array of any integer type, widened.
    pub fn get_int_array(&self, key: &str) -> Result<Vec<i128>> {
        let a = self.get_array(key)?;
        a.to_i128().ok_or_else(|| ModelError::invalid(&self.file, key, format!("expected an integer array, found {}", a.type_name())))
    }

    /// The raw bytes of a tensor (its range was checked at open).
    pub fn tensor_bytes(&self, t: &GgufTensor) -> Result<&[u8]> {
        let end = t.start.checked_add(t.n_bytes);
        end.and_then(|end| self.bytes.get(t.start..end)).ok_or_else(|| ModelError::Truncated {
            file: self.file.clone(),
            field: format!("tensor `{}` data", t.name),
            offset: t.start as u64,
            need: t.n_bytes as u64,
            have: self.bytes.len().saturating_sub(t.start) as u64,
        })
    }

    /// Dequantizes tensor `name` to f32 (MODEL-3), shape HF-style
    /// (slowest-varying first). Types other than F32, F16, Q8_0, Q4_0 and
    /// Q4_1 are `UnsupportedTensorType`.
    pub fn tensor_f32(&self, name: &str) -> Result<Matrix> {
        let t = self.tensor(name).ok_or_else(|| ModelError::MissingTensor { file: self.file.clone(), tensor: name.to_string() })?;
        if !t.ggml_type.is_supported() {
            return Err(ModelError::UnsupportedTensorType { file: self.file.clone(), tensor: t.name.clone(), dtype: t.ggml_type.name.to_string() });
        }
        let data = dequantize(t.ggml_type, self.tensor_bytes(t)?, t.n_elements());
        Matrix::new(t.shape(), data, name)
    }
}

/// Dequantizes `n` elements of a supported type. `bytes` holds exactly
/// `n / block_size` blocks (checked when the file was opened); a block
/// never straddles a row because the fastest dimension is a multiple of
/// the block size, so the flat order is the row-major order.
fn dequantize(ty: GgmlType, bytes: &[u8], n: usize) -> Vec<f32> {
    let mut out = Vec::with_capacity(n);
    let half = |b: &[u8], i: usize| f16::from_bits(u16::from_le_bytes([b[i], b[i + 1]])).to_f32();
    match ty.id {
        GGML_F32 => out.extend(bytes.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))),
        GGML_F16 => out.extend(bytes.chunks_exact(2).map(|c| half(c, 0))),
        // block_q8_0 { f16 d; i8 qs[32]; }: x = qs·d.
        GGML_Q8_0 => {
            for b in bytes.chunks_exact(34) {
                let d = half(b, 0);
                out.extend(b[2..34].iter().map(|&q| f32::from(q as i8) * d));
            }
        }
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
        // block_q4_1 { f16 d; f16 m; u8 qs[16]; }: x = nibble·d + m, same
        // nibble order as Q4_0. Multiply then add in f32, unfused, as ggml's
        // reference and gguf-py (HF transformers' loader) both compute it.
        GGML_Q4_1 => {
            for b in bytes.chunks_exact(20) {
                let (d, m) = (half(b, 0), half(b, 2));
                let qs = &b[4..20];
                out.extend(qs.iter().map(|&q| f32::from(q & 0x0F) * d + m));
                out.extend(qs.iter().map(|&q| f32::from(q >> 4) * d + m));
            }
        }
        _ => {}
    }
    out
}

struct Header {
    version: u32,
    alignment: u64,
    metadata: Vec<(String, GgufValue)>,
    metadata_index: HashMap<String, usize>,
    tensors: Vec<GgufTensor>,
    tensor_index: HashMap<String, usize>,
}

/// A bounds-checked little-endian cursor over the file.
struct Reader<'a> {
    file: &'a str,
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    fn remaining(&self) -> usize {
        self.buf.len().saturating_sub(self.pos)
    }

    fn take(&mut self, n: usize, field: &str) -> Result<&'a [u8]> {
        let slice = self.pos.checked_add(n).and_then(|end| self.buf.get(self.pos..end));
        let Some(slice) = slice else {
            return Err(ModelError::Truncated { file: self.file.to_string(), field: field.to_string(), offset: self.pos as u64, need: n as u64, have: self.remaining() as u64 });
        };
        self.pos += n;
        Ok(slice)
    }

    fn array<const N: usize>(&mut self, field: &str) -> Result<[u8; N]> {
        let s = self.take(N, field)?;
        let mut a = [0u8; N];
        a.copy_from_slice(s);
        Ok(a)
    }

    fn u8(&mut self, field: &str) -> Result<u8> {
        Ok(self.array::<1>(field)?[0])
    }

    fn u32(&mut self, field: &str) -> Result<u32> {
        Ok(u32::from_le_bytes(self.array(field)?))
    }

    fn u64(&mut self, field: &str) -> Result<u64> {
        Ok(u64::from_le_bytes(self.array(field)?))
    }

    /// A count of entries that take at least `min_entry` bytes each, bounded
    /// by the bytes that remain so that allocating `count` entries is safe.
    fn count(&mut self, field: &str, min_entry: usize, what: &str) -> Result<usize> {
        let n = self.u64(field)?;
        self.bound(n, field, min_entry, what)
    }

    /// `n` entries of at least `min_entry` bytes each, checked to fit in the
    /// bytes that remain.
    fn bound(&self, n: u64, field: &str, min_entry: usize, what: &str) -> Result<usize> {
        let limit = self.remaining() / min_entry.max(1);
        match usize::try_from(n) {
            Ok(n) if n <= limit => Ok(n),
            _ => Err(ModelError::HeaderTooLarge {
                file: self.file.to_string(),
                field: field.to_string(),
                value: n,
                limit: format!("{} bytes remain and each {what} takes at least {min_entry}, so at most {limit}", self.remaining()),
            }),
        }
    }

    fn string(&mut self, field: &str) -> Result<String> {
        let len = self.count(field, 1, "string byte")?;
        let bytes = self.take(len, field)?;
        String::from_utf8(bytes.to_vec()).map_err(|e| ModelError::invalid(self.file, field, format!("string is not UTF-8: {e}")))
    }

    fn bool(&mut self, field: &str) -> Result<bool> {
        match self.u8(field)? {
            0 => Ok(false),
            1 => Ok(true),
            b => Err(ModelError::invalid(self.file, field, format!("bool byte is {b}, not 0 or 1"))),
        }
    }

    fn value(&mut self, ty: u32, key: &str, depth: usize) -> Result<GgufValue> {
        Ok(match ty {
            0 => GgufValue::U8(self.u8(key)?),
            1 => GgufValue::I8(i8::from_le_bytes(self.array(key)?)),
            2 => GgufValue::U16(u16::from_le_bytes(self.array(key)?)),
            3 => GgufValue::I16(i16::from_le_bytes(self.array(key)?)),
            4 => GgufValue::U32(self.u32(key)?),
            5 => GgufValue::I32(i32::from_le_bytes(self.array(key)?)),
            6 => GgufValue::F32(f32::from_le_bytes(self.array(key)?)),
            7 => GgufValue::Bool(self.bool(key)?),
            8 => GgufValue::String(self.string(key)?),
            9 => GgufValue::Array(self.gguf_array(key, depth + 1)?),
            10 => GgufValue::U64(self.u64(key)?),
            11 => GgufValue::I64(i64::from_le_bytes(self.array(key)?)),
            12 => GgufValue::F64(f64::from_le_bytes(self.array(key)?)),
            t => return Err(ModelError::invalid(self.file, key, format!("unknown metadata value type {t}"))),
        })
    }

    /// `n` fixed-size elements, `n` already bounded by the caller.
    fn fixed<T, const N: usize>(&mut self, n: usize, key: &str, conv: fn([u8; N]) -> T) -> Result<Vec<T>> {
        let bytes = self.take(n * N, key)?;
        Ok(bytes
            .chunks_exact(N)
            .map(|c| {
                let mut a = [0u8; N];
                a.copy_from_slice(c);
                conv(a)
            })
            .collect())
    }

    fn gguf_array(&mut self, key: &str, depth: usize) -> Result<GgufArray> {
        if depth > MAX_ARRAY_DEPTH {
            return Err(ModelError::invalid(self.file, key, format!("arrays nested deeper than {MAX_ARRAY_DEPTH}")));
        }
        let ty = self.u32(key)?;
        // Smallest encoding of one element: strings carry an 8-byte length,
        // nested arrays a 4-byte type and an 8-byte count.
        let min = match ty {
            0 | 1 | 7 => 1,
            2 | 3 => 2,
            4..=6 => 4,
            8 | 10..=12 => 8,
            9 => 12,
            t => return Err(ModelError::invalid(self.file, key, format!("unknown array element type {t}"))),
        };
        let n = self.count(key, min, "element")?;
        Ok(match ty {
            0 => GgufArray::U8(self.take(n, key)?.to_vec()),
            1 => GgufArray::I8(self.fixed(n, key, i8::from_le_bytes)?),
            2 => GgufArray::U16(self.fixed(n, key, u16::from_le_bytes)?),
            3 => GgufArray::I16(self.fixed(n, key, i16::from_le_bytes)?),
            4 => GgufArray::U32(self.fixed(n, key, u32::from_le_bytes)?),
            5 => GgufArray::I32(self.fixed(n, key, i32::from_le_bytes)?),
            6 => GgufArray::F32(self.fixed(n, key, f32::from_le_bytes)?),
            7 => GgufArray::Bool((0..n).map(|_| self.bool(key)).collect::<Result<_>>()?),
            8 => GgufArray::String((0..n).map(|_| self.string(key)).collect::<Result<_>>()?),
            9 => GgufArray::Array((0..n).map(|_| self.gguf_array(key, depth + 1)).collect::<Result<_>>()?),
            10 => GgufArray::U64(self.fixed(n, key, u64::from_le_bytes)?),
            11 => GgufArray::I64(self.fixed(n, key, i64::from_le_bytes)?),
            _ => GgufArray::F64(self.fixed(n, key, f64::from_le_bytes)?),
        })
    }
}

fn parse_header(r: &mut Reader<'_>) -> Result<Header> {
    let file = r.file;
    let magic = r.take(4, "magic")?;
    if magic != GGUF_MAGIC {
        return Err(ModelError::BadMagic { file: file.to_string(), found: magic.escape_ascii().to_string(), expected: "GGUF".to_string() });
    }
    let version = r.u32("version")?;
    // v1 used 32-bit lengths and counts; a byte-swapped (big-endian) file
    // shows up here as a huge version number.
    if !matches!(version, 2 | 3) {
        return Err(ModelError::UnsupportedVersion { file: file.to_string(), field: "version".to_string(), version: version.into() });
    }
    // Both counts are read before either is bounded, so that a file cut
    // inside the fixed header reads as truncated.
    let n_tensors = r.u64("tensor_count")?;
    let n_kv = r.u64("metadata_kv_count")?;
    let n_tensors = r.bound(n_tensors, "tensor_count", MIN_TENSOR_INFO_BYTES, "tensor info")?;
    let n_kv = r.bound(n_kv, "metadata_kv_count", MIN_KV_BYTES, "metadata entry")?;

    let mut metadata = Vec::with_capacity(n_kv);
    let mut metadata_index = HashMap::with_capacity(n_kv);
    for i in 0..n_kv {
        let key = r.string(&format!("metadata key #{i}"))?;
        let ty = r.u32(&key)?;
        let value = r.value(ty, &key, 0)?;
        if metadata_index.insert(key.clone(), metadata.len()).is_some() {
            return Err(ModelError::invalid(file, &key, "duplicate metadata key"));
        }
        metadata.push((key, value));
    }

    let alignment = match metadata_index.get("general.alignment").and_then(|&i| metadata.get(i)) {
        None => DEFAULT_ALIGNMENT,
        Some((_, GgufValue::U32(a))) if a.is_power_of_two() => u64::from(*a),
        Some((_, v)) => return Err(ModelError::invalid(file, "general.alignment", format!("{v:?} is not a power of two u32"))),
    };

    let mut tensors = Vec::with_capacity(n_tensors);
    let mut tensor_index = HashMap::with_capacity(n_tensors);
    for i in 0..n_tensors {
        let name = r.string(&format!("tensor name #{i}"))?;
        let t = tensor_info(r, name, alignment)?;
        if tensor_index.insert(t.name.clone(), tensors.len()).is_some() {
            return Err(ModelError::invalid(file, &t.name, "duplicate tensor name"));
        }
        tensors.push(t);
    }

    // The data section starts at the next multiple of the alignment.
    let data_start = (r.pos as u64).div_ceil(alignment).checked_mul(alignment);
    let len = r.buf.len() as u64;
    for t in &mut tensors {
        let start = data_start.and_then(|d| d.checked_add(t.offset));
        let end = start.and_then(|s| s.checked_add(t.n_bytes as u64));
        match (start, end) {
            (Some(s), Some(e)) if e <= len => t.start = s as usize,
            _ => {
                return Err(ModelError::Truncated {
                    file: file.to_string(),
                    field: format!("tensor `{}` data", t.name),
                    offset: start.unwrap_or(u64::MAX),
                    need: t.n_bytes as u64,
                    have: start.map_or(0, |s| len.saturating_sub(s)),
                });
            }
        }
    }
    Ok(Header { version, alignment, metadata, metadata_index, tensors, tensor_index })
}

fn tensor_info(r: &mut Reader<'_>, name: String, alignment: u64) -> Result<GgufTensor> {
    let file = r.file;
    let field = |what: &str| format!("tensor `{name}` {what}");
    let n_dims = r.u32(&field("n_dims"))? as usize;
    if n_dims == 0 || n_dims > MAX_DIMS {
        return Err(ModelError::invalid(file, &field("n_dims"), format!("{n_dims} is outside [1, {MAX_DIMS}]")));
    }
    let mut dims = Vec::with_capacity(n_dims);
    for _ in 0..n_dims {
        let d = r.u64(&field("dims"))?;
        match usize::try_from(d) {
            Ok(d) if d > 0 => dims.push(d),
            _ => return Err(ModelError::invalid(file, &field("dims"), format!("dimension {d} is zero or too large"))),
        }
    }
    let type_id = r.u32(&field("type"))?;
    let offset = r.u64(&field("offset"))?;
    let Some(ggml_type) = GgmlType::from_id(type_id) else {
        return Err(ModelError::UnsupportedTensorType { file: file.to_string(), tensor: name, dtype: format!("unknown ggml type {type_id}") });
    };
    let n_elements = dims.iter().try_fold(1usize, |n, &d| n.checked_mul(d));
    let Some(n_elements) = n_elements else {
        return Err(ModelError::invalid(file, &field("dims"), format!("{dims:?} overflows the element count")));
    };
    // Blocks run along the fastest dimension and may not straddle rows.
    if dims[0] % ggml_type.block_size != 0 {
        return Err(ModelError::invalid(file, &field("dims"), format!("first dimension {} is not a multiple of the {} block size {}", dims[0], ggml_type.name, ggml_type.block_size)));
    }
    let n_bytes = (n_elements / ggml_type.block_size).checked_mul(ggml_type.type_size);
    let Some(n_bytes) = n_bytes else {
        return Err(ModelError::invalid(file, &field("dims"), format!("{dims:?} overflows the byte size")));
    };
    if offset % alignment != 0 {
        return Err(ModelError::invalid(file, &field("offset"), format!("{offset} is not a multiple of the alignment {alignment}")));
    }
    Ok(GgufTensor { name, dims, ggml_type, offset, start: 0, n_bytes })
}

// ---------------------------------------------------------------------------
// The q/k row permutation (MODEL-4).

fn check_permutable(w: &Matrix, n_head: usize) -> Result<(usize, usize)> {
    let (rows, cols) = match w.shape.as_slice() {
        [r, c] => (*r, *c),
        s => return Err(ModelError::InvalidInput { arg: "w", reason: format!("shape {s:?} is not 2-D") }),
    };
    if n_head == 0 || rows % (2 * n_head) != 0 {
        return Err(ModelError::InvalidInput { arg: "n_head", reason: format!("{rows} rows do not split into {n_head} heads of an even width") });
    }
    if rows.checked_mul(cols) != Some(w.data.len()) {
        return Err(ModelError::InvalidInput { arg: "w", reason: format!("{} values cannot fill {rows}x{cols}", w.data.len()) });
    }
    Ok((rows, cols))
}

/// Moves whole rows: output row `dst(r)` takes input row `r`.
fn move_rows(w: &Matrix, rows: usize, cols: usize, dst: impl Fn(usize) -> usize) -> Matrix {
    let mut data = vec![0.0f32; w.data.len()];
    for r in 0..rows {
        let d = dst(r);
        data[d * cols..(d + 1) * cols].copy_from_slice(&w.data[r * cols..(r + 1) * cols]);
    }
    Matrix { shape: w.shape.clone(), data }
}

/// What llama.cpp's HF-to-GGUF converter does to `q_proj`/`k_proj` rows so
/// that interleaved RoPE (pairs `(2i, 2i+1)`) computes what HF's rotate-half
/// RoPE (pairs `(i, i + d/2)`) computes (MODEL-4):
/// `w.reshape(n_head, 2, d/2, in).swapaxes(1, 2).reshape(out, in)`.
/// Within each head, HF row `t·d/2 + j` becomes GGUF row `2j + t`.
pub fn permute_qk(w: &Matrix, n_head: usize) -> Result<Matrix> {
    let (rows, cols) = check_permutable(w, n_head)?;
    let hd = rows / n_head;
    let half = hd / 2;
    Ok(move_rows(w, rows, cols, |r| {
        let (h, i) = (r / hd, r % hd);
        let (t, j) = (i / half, i % half);
        h * hd + 2 * j + t
    }))
}

/// The inverse of [`permute_qk`], applied on GGUF load so that `wq`/`wk`
/// are in HF row order (MODEL-4):
/// `w.reshape(n_head, d/2, 2, in).swapaxes(1, 2).reshape(out, in)`.
/// Within each head, GGUF row `2j + t` goes back to HF row `t·d/2 + j`.
pub fn unpermute_qk(w: &Matrix, n_head: usize) -> Result<Matrix> {
    let (rows, cols) = check_permutable(w, n_head)?;
    let hd = rows / n_head;
    let half = hd / 2;
    Ok(move_rows(w, rows, cols, |r| {
        let (h, i) = (r / hd, r % hd);
        let (j, t) = (i / 2, i % 2);
        h * hd + t * half + j
    }))
}

// ---------------------------------------------------------------------------
// The `llama` architecture.

/// The GGUF name of an HF tensor name (`model.layers.3.self_attn.q_proj.weight`
/// -> `blk.3.attn_q.weight`), as llama.cpp's converter maps them.
pub fn gguf_tensor_name(hf: &str) -> Option<String> {
    let fixed = match hf {
        "model.embed_tokens.weight" => Some("token_embd.weight"),
        "model.norm.weight" => Some("output_norm.weight"),
        "lm_head.weight" => Some("output.weight"),
        _ => None,
    };
    if let Some(name) = fixed {
        return Some(name.to_string());
    }
    let rest = hf.strip_prefix("model.layers.")?;
    let (layer, rest) = rest.split_once('.')?;
    layer.parse::<usize>().ok()?;
    let part = match rest {
        "input_layernorm.weight" => "attn_norm",
        "self_attn.q_proj.weight" => "attn_q",
        "self_attn.k_proj.weight" => "attn_k",
        "self_attn.v_proj.weight" => "attn_v",
        "self_attn.o_proj.weight" => "attn_output",
        "post_attention_layernorm.weight" => "ffn_norm",
        "mlp.gate_proj.weight" => "ffn_gate",
        "mlp.up_proj.weight" => "ffn_up",
        "mlp.down_proj.weight" => "ffn_down",
        _ => return None,
    };
    Some(format!("blk.{layer}.{part}.weight"))
}

/// The [`LlamaConfig`] a `llama` GGUF file describes (MODEL-3). Reads only
/// metadata and the tensor table, never tensor data.
pub fn llama_config(g: &GgufFile) -> Result<LlamaConfig> {
    let file = g.file();
    let arch = g.get_str("general.architecture")?;
    if arch != "llama" {
        return Err(ModelError::invalid(file, "general.architecture", format!("`{arch}` is not `llama`")));
    }
    let key = |k: &str| format!("llama.{k}");
    let usize_of = |k: &str| g.get_u32(&key(k)).map(|v| v as usize);

    // Mixture-of-experts files reuse the `llama` architecture name; their
    // experts are not a plain Llama MLP.
    if let Some(experts) = g.opt_u32(&key("expert_count"))?
        && experts > 0
    {
        return Err(ModelError::invalid(file, &key("expert_count"), format!("{experts} experts: mixture-of-experts is not supported")));
    }
    if let Some(kind) = g.opt_str(&key("rope.scaling.type"))?
        && kind != "none"
    {
        return Err(ModelError::invalid(file, &key("rope.scaling.type"), format!("rope scaling `{kind}` is not supported")));
    }
    if g.tensor("rope_freqs.weight").is_some() {
        return Err(ModelError::invalid(file, "rope_freqs.weight", "per-frequency rope scaling is not supported"));
    }

    let hidden = usize_of("embedding_length")?;
    let heads = usize_of("attention.head_count")?;
    // llama.cpp defaults the KV head count to the head count (no GQA).
    let kv_heads = match g.opt_u32(&key("attention.head_count_kv"))? {
        Some(n) => n as usize,
        None => heads,
    };
    let derived = hidden.checked_div(heads).unwrap_or(0);
    let head_dim = match g.opt_u32(&key("attention.key_length"))? {
        Some(k) => {
            if let Some(v) = g.opt_u32(&key("attention.value_length"))?
                && v != k
            {
                return Err(ModelError::invalid(file, &key("attention.value_length"), format!("{v} differs from key_length {k}")));
            }
            k as usize
        }
        None => derived,
    };
    let vocab = match g.opt_u32(&key("vocab_size"))? {
        Some(v) => v as usize,
        None => match g.tensor("token_embd.weight") {
            Some(t) => t.shape().first().copied().unwrap_or(0),
            None => g.get_str_array("tokenizer.ggml.tokens")?.len(),
        },
    };
    let config = LlamaConfig {
        architectures: vec!["LlamaForCausalLM".to_string()],
        model_type: "llama".to_string(),
        vocab_size: vocab,
        hidden_size: hidden,
        intermediate_size: usize_of("feed_forward_length")?,
        num_hidden_layers: usize_of("block_count")?,
        num_attention_heads: heads,
        num_key_value_heads: kv_heads,
        head_dim: (head_dim != derived).then_some(head_dim),
        // The file stores f32; widen exactly (HF's GGUF loader does the same).
        rms_norm_eps: g.get_f64(&key("attention.layer_norm_rms_epsilon"))?,
        rope_theta: g.opt_f64(&key("rope.freq_base"))?.unwrap_or(10_000.0),
        max_position_embeddings: usize_of("context_length")?,
        tie_word_embeddings: g.tensor("output.weight").is_none(),
        bos_token_id: g.opt_u32("tokenizer.ggml.bos_token_id")?,
        eos_token_id: g.opt_u32("tokenizer.ggml.eos_token_id")?.map(crate::config::EosIds::One),
        pad_token_id: g.opt_u32("tokenizer.ggml.padding_token_id")?,
        torch_dtype: None,
        hidden_act: Some("silu".to_string()),
        rope_scaling: None,
        attention_bias: None,
        mlp_bias: None,
        ignored: serde_json::Map::new(),
    };
    config.validate(file)?;
    // Checked after `validate`, which reports zero or inconsistent head
    // counts under their own names first.
    if let Some(rot) = g.opt_u32(&key("rope.dimension_count"))?
        && rot as usize != config.head_dim()
    {
        return Err(ModelError::invalid(file, &key("rope.dimension_count"), format!("{rot} differs from head_dim {}: partial rotary is not supported", config.head_dim())));
    }
    Ok(config)
}

/// Dequantizes every tensor of a `llama` GGUF file into [`LlamaWeights`]
/// (MODEL-3), undoing the converter's q/k permutation (MODEL-4). A tensor
/// the architecture does not use is an error, not silently dropped: a bias
/// or an extra norm would change the forward.
pub fn llama_weights(g: &GgufFile) -> Result<LlamaWeights> {
    let config = llama_config(g)?;
    let expected: HashMap<String, Vec<usize>> = config.tensor_shapes().into_iter().collect();
    let (heads, kv_heads) = (config.num_attention_heads, config.num_key_value_heads);
    let mut used = HashSet::new();
    let weights = LlamaWeights::from_named(config, g.file(), |hf| {
        let Some(name) = gguf_tensor_name(hf) else { return Ok(None) };
        if g.tensor(&name).is_none() {
            // Report the file's name for the tensor, which the user can find.
            return Err(ModelError::MissingTensor { file: g.file().to_string(), tensor: name });
        }
        used.insert(name.clone());
        let m = g.tensor_f32(&name)?;
        let n_head = if hf.ends_with("q_proj.weight") {
            heads
        } else if hf.ends_with("k_proj.weight") {
            kv_heads
        } else {
            return Ok(Some(m));
        };
        // A wrongly shaped tensor is passed through unchanged so that
        // `from_named` reports it as a `TensorShape` error.
        if expected.get(hf) != Some(&m.shape) {
            return Ok(Some(m));
        }
        unpermute_qk(&m, n_head).map(Some)
    })?;
    if let Some(extra) = g.tensors().iter().find(|t| !used.contains(&t.name)) {
        return Err(ModelError::invalid(g.file(), &extra.name, "tensor is not part of a plain Llama"));
    }
    Ok(weights)
}

/// Opens `path` and loads its `llama` weights (MODEL-3, MODEL-4).
pub fn load_llama_gguf(path: impl AsRef<Path>) -> Result<LlamaWeights> {
    llama_weights(&GgufFile::open(path)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ramp(rows: usize, cols: usize) -> Matrix {
        Matrix { shape: vec![rows, cols], data: (0..rows * cols).map(|i| i as f32).collect() }
    }

    /// MODEL-4: the inverse permutation undoes the converter's permutation,
    /// for the head counts of q (9) and k (3) of SmolLM2-sized heads and small ones.
    #[test]
    fn unpermute_inverts_permute() {
        for (rows, cols, heads) in [(8, 3, 1), (8, 3, 2), (12, 2, 3), (576, 4, 9), (192, 4, 3)] {
            let w = ramp(rows, cols);
            let p = permute_qk(&w, heads).unwrap();
            assert_ne!(p, w, "{rows}x{cols}/{heads}: permutation is not the identity");
            assert_eq!(unpermute_qk(&p, heads).unwrap(), w);
            assert_eq!(permute_qk(&unpermute_qk(&w, heads).unwrap(), heads).unwrap(), w);
        }
    }

    /// MODEL-4: one head of width 4: HF rows (a0, a1, b0, b1) pair a_i with b_i
    /// (rotate-half); GGUF stores them interleaved (a0, b0, a1, b1).
    #[test]
    fn permute_interleaves_halves() {
        let w = ramp(4, 1);
        assert_eq!(permute_qk(&w, 1).unwrap().data, vec![0.0, 2.0, 1.0, 3.0]);
        assert_eq!(unpermute_qk(&w, 1).unwrap().data, vec![0.0, 2.0, 1.0, 3.0]);
        let w = ramp(6, 1);
        assert_eq!(permute_qk(&w, 1).unwrap().data, vec![0.0, 3.0, 1.0, 4.0, 2.0, 5.0]);
    }

    #[test]
    fn permute_rejects_bad_heads() {
        assert_eq!(permute_qk(&ramp(6, 1), 2).unwrap_err().kind(), "InvalidInput");
        assert_eq!(unpermute_qk(&ramp(6, 1), 0).unwrap_err().kind(), "InvalidInput");
    }

    #[test]
    fn tensor_names_map() {
        assert_eq!(gguf_tensor_name("model.layers.12.mlp.down_proj.weight").as_deref(), Some("blk.12.ffn_down.weight"));
        assert_eq!(gguf_tensor_name("model.embed_tokens.weight").as_deref(), Some("token_embd.weight"));
        assert_eq!(gguf_tensor_name("model.layers.x.mlp.down_proj.weight"), None);
    }
}
