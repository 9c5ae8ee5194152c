//! An opened GGUF file: its metadata, its tensor table (every byte range
//! checked at open), and tensors read out as f32.

use std::collections::HashMap;
use std::ops::Deref;
use std::path::Path;

use memmap2::Mmap;

use crate::error::{ModelError, Result};
use crate::weights::Matrix;

use super::dequant::{dequantize, stored_format};
use super::reader::{GgufTensor, Reader, parse_header};
use super::value::{GgufArray, GgufValue};

/// The bytes of an open file: memory-mapped, or owned (tests, in-memory files).
pub(super) enum Bytes {
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
        let bytes = self.tensor_bytes(t)?;
        if let (Some(format), [rows, cols]) = (stored_format(t.ggml_type), t.shape().as_slice()) {
            // The blocks fill the shape (checked when the file was opened).
            if let Some(m) = Matrix::from_blocks(*rows, *cols, format, bytes.to_vec()) {
                return Ok(m);
            }
        }
        Matrix::new(t.shape(), dequantize(t.ggml_type, bytes, t.n_elements()), name)
    }
}
