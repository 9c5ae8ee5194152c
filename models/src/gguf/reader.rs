//! The bounded byte reader of a GGUF file: header, metadata and tensor
//! table, every count checked against the bytes that remain before anything
//! is allocated from it.

use std::collections::HashMap;

use crate::error::{ModelError, Result};

use super::types::GgmlType;
use super::value::{GgufArray, GgufValue};

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
pub(super) const MIN_TENSOR_INFO_BYTES: usize = 24;

/// The fewest bytes one metadata entry can take: key length (8), value type
/// (4), a one-byte value.
pub(super) const MIN_KV_BYTES: usize = 13;

pub(super) struct Header {
    pub(super) version: u32,
    pub(super) alignment: u64,
    pub(super) metadata: Vec<(String, GgufValue)>,
    pub(super) metadata_index: HashMap<String, usize>,
    pub(super) tensors: Vec<GgufTensor>,
    pub(super) tensor_index: HashMap<String, usize>,
}

/// A bounds-checked little-endian cursor over the file.
pub(super) struct Reader<'a> {
    pub(super) file: &'a str,
    pub(super) buf: &'a [u8],
    pub(super) pos: usize,
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

pub(super) fn parse_header(r: &mut Reader<'_>) -> Result<Header> {
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

pub(super) fn tensor_info(r: &mut Reader<'_>, name: String, alignment: u64) -> Result<GgufTensor> {
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
    pub(super) start: usize,
    pub(super) n_bytes: usize,
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
