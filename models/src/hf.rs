//! The HF layout: `config.json` plus `model.safetensors` or a sharded
//! `model.safetensors.index.json` (MODEL-5), read and written.
//!
//! Role: load an HF model directory into [`LlamaWeights`] (F32, F16 and BF16
//! tensors widened exactly to f32) and write tensors as safetensors.
//!
//! Invariants (MODEL-16): every safetensors file is memory-mapped and its
//! header length is checked against the file size before the header is read;
//! the safetensors crate then validates every tensor's offsets against the
//! data section, so a tensor view can never point outside the file. A shard
//! name from an index is a bare file name (no path separator, no `..`), so
//! an index cannot make us read outside the model directory. Every defect
//! is a typed error naming the file and the field or tensor.

use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use half::{bf16, f16};
use memmap2::Mmap;
use safetensors::tensor::{Metadata, TensorInfo};
use safetensors::{Dtype, SafeTensors, View};

use crate::config::LlamaConfig;
use crate::error::{ModelError, Result};
use crate::gguf::map_file;
use crate::weights::{LlamaWeights, Matrix};

pub const CONFIG_FILE: &str = "config.json";
pub const SINGLE_FILE: &str = "model.safetensors";
pub const INDEX_FILE: &str = "model.safetensors.index.json";

/// The dtypes we write (and, widened to f32, read).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SaveDtype {
    #[default]
    F32,
    F16,
    BF16,
}

impl SaveDtype {
    /// The safetensors name (`F32`, `F16`, `BF16`).
    pub fn name(self) -> &'static str {
        match self {
            SaveDtype::F32 => "F32",
            SaveDtype::F16 => "F16",
            SaveDtype::BF16 => "BF16",
        }
    }

    /// The `torch_dtype` HF writes into `config.json`.
    pub fn torch_name(self) -> &'static str {
        match self {
            SaveDtype::F32 => "float32",
            SaveDtype::F16 => "float16",
            SaveDtype::BF16 => "bfloat16",
        }
    }

    fn safetensors(self) -> Dtype {
        match self {
            SaveDtype::F32 => Dtype::F32,
            SaveDtype::F16 => Dtype::F16,
            SaveDtype::BF16 => Dtype::BF16,
        }
    }

    fn size(self) -> usize {
        match self {
            SaveDtype::F32 => 4,
            SaveDtype::F16 | SaveDtype::BF16 => 2,
        }
    }
}

impl SaveDtype {
    /// Parses `f32`/`float32`, `f16`/`float16`, `bf16`/`bfloat16` (any case).
    pub fn parse(s: &str) -> Result<Self> {
        match s.to_ascii_lowercase().as_str() {
            "f32" | "float32" => Ok(SaveDtype::F32),
            "f16" | "float16" => Ok(SaveDtype::F16),
            "bf16" | "bfloat16" => Ok(SaveDtype::BF16),
            _ => Err(ModelError::InvalidInput { arg: "dtype", reason: format!("`{s}` is not one of f32, f16, bf16") }),
        }
    }
}

impl std::str::FromStr for SaveDtype {
    type Err = ModelError;
    fn from_str(s: &str) -> Result<Self> {
        SaveDtype::parse(s)
    }
}

/// One memory-mapped safetensors file with its parsed header.
pub struct SafetensorsFile {
    file: String,
    map: Mmap,
    /// Where the data section starts (8 + header length).
    data_start: usize,
    metadata: Metadata,
}

impl std::fmt::Debug for SafetensorsFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SafetensorsFile").field("file", &self.file).finish()
    }
}

impl SafetensorsFile {
    /// Maps `path` and validates its header (MODEL-5, MODEL-16).
    pub fn open(path: &Path) -> Result<Self> {
        let file = path.display().to_string();
        let map = map_file(path)?;
        let Some(len_bytes) = map.get(..8) else {
            return Err(ModelError::Truncated { file, field: "header length".into(), offset: 0, need: 8, have: map.len() as u64 });
        };
        let mut n = [0u8; 8];
        n.copy_from_slice(len_bytes);
        let header_len = u64::from_le_bytes(n);
        let remain = map.len() as u64 - 8;
        if header_len > remain {
            return Err(ModelError::HeaderTooLarge { file, field: "header length".into(), value: header_len, limit: format!("{remain} bytes follow it") });
        }
        // The crate checks the JSON, every tensor's offsets against the data
        // section, and that the tensors cover it exactly.
        let (n, metadata) = SafeTensors::read_metadata(&map).map_err(|e| ModelError::invalid(&file, "header", e.to_string()))?;
        Ok(SafetensorsFile { file, data_start: 8 + n, map, metadata })
    }

    pub fn file(&self) -> &str {
        &self.file
    }

    /// Every tensor name with its info, sorted by name.
    pub fn tensors(&self) -> BTreeMap<String, &TensorInfo> {
        self.metadata.tensors().into_iter().collect()
    }

    pub fn info(&self, name: &str) -> Option<&TensorInfo> {
        self.metadata.info(name)
    }

    /// Tensor `name` widened to f32; `None` when the file lacks it.
    pub fn tensor_f32(&self, name: &str) -> Result<Option<Matrix>> {
        let Some(info) = self.metadata.info(name) else { return Ok(None) };
        let (start, end) = info.data_offsets;
        let bytes = self
            .data_start
            .checked_add(start)
            .zip(self.data_start.checked_add(end))
            .and_then(|(s, e)| self.map.get(s..e))
            .ok_or_else(|| ModelError::invalid(&self.file, name, "data offsets lie outside the file"))?;
        let data: Vec<f32> = match info.dtype {
            Dtype::F32 => bytes.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect(),
            Dtype::F16 => bytes.chunks_exact(2).map(|c| f16::from_le_bytes([c[0], c[1]]).to_f32()).collect(),
            Dtype::BF16 => bytes.chunks_exact(2).map(|c| bf16::from_le_bytes([c[0], c[1]]).to_f32()).collect(),
            other => {
                return Err(ModelError::UnsupportedTensorType { file: self.file.clone(), tensor: name.to_string(), dtype: format!("{other:?}") });
            }
        };
        Matrix::new(info.shape.clone(), data, name).map(Some).map_err(|_| ModelError::invalid(&self.file, name, format!("data does not fill shape {:?}", info.shape)))
    }
}

/// An open HF model directory: the config and where each tensor lives.
#[derive(Debug)]
pub struct HfDir {
    dir: PathBuf,
    config: LlamaConfig,
    files: Vec<SafetensorsFile>,
    /// Tensor name -> index into `files`.
    location: BTreeMap<String, usize>,
}

impl HfDir {
    /// Reads `config.json` and maps the weights (MODEL-5); no tensor is
    /// converted yet.
    pub fn open(dir: impl AsRef<Path>) -> Result<Self> {
        let dir = dir.as_ref().to_path_buf();
        let config_path = dir.join(CONFIG_FILE);
        let text = std::fs::read_to_string(&config_path).map_err(|e| ModelError::io(&config_path, e))?;
        let config = LlamaConfig::from_json(&text, &config_path.display().to_string())?;

        let single = dir.join(SINGLE_FILE);
        let index = dir.join(INDEX_FILE);
        let mut files = Vec::new();
        let mut location = BTreeMap::new();
        if single.is_file() {
            let f = SafetensorsFile::open(&single)?;
            location.extend(f.tensors().into_keys().map(|name| (name, 0)));
            files.push(f);
        } else if index.is_file() {
            let shards = read_index(&index)?;
            let mut by_shard: HashMap<String, usize> = HashMap::new();
            for (tensor, shard) in shards {
                let i = match by_shard.get(&shard) {
                    Some(&i) => i,
                    None => {
                        files.push(SafetensorsFile::open(&dir.join(&shard))?);
                        by_shard.insert(shard.clone(), files.len() - 1);
                        files.len() - 1
                    }
                };
                if files[i].info(&tensor).is_none() {
                    return Err(ModelError::MissingTensor { file: files[i].file.clone(), tensor });
                }
                location.insert(tensor, i);
            }
        } else {
            return Err(ModelError::Io { file: dir.display().to_string(), message: format!("neither {SINGLE_FILE} nor {INDEX_FILE} is in this directory") });
        }
        Ok(HfDir { dir, config, files, location })
    }

    pub fn config(&self) -> &LlamaConfig {
        &self.config
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Every tensor name, sorted.
    pub fn tensor_names(&self) -> impl Iterator<Item = &str> {
        self.location.keys().map(String::as_str)
    }

    /// The info (dtype, shape) of a tensor.
    pub fn info(&self, name: &str) -> Option<&TensorInfo> {
        self.location.get(name).and_then(|&i| self.files.get(i)).and_then(|f| f.info(name))
    }

    /// Tensor `name` widened to f32; `None` when absent.
    pub fn tensor_f32(&self, name: &str) -> Result<Option<Matrix>> {
        match self.location.get(name).and_then(|&i| self.files.get(i)) {
            Some(f) => f.tensor_f32(name),
            None => Ok(None),
        }
    }

    /// Converts every tensor into [`LlamaWeights`] (MODEL-5). A tensor a
    /// plain Llama does not use is an error, except the two HF saves
    /// carry harmlessly: the RoPE buffer `rotary_emb.inv_freq` (recomputed
    /// from the config) and a copy of the embedding as `lm_head.weight`
    /// when the embeddings are tied.
    pub fn weights(&self) -> Result<LlamaWeights> {
        let file = self.dir.display().to_string();
        let weights = LlamaWeights::from_named(self.config.clone(), &file, crate::fused::split_reader(&self.config, |name| self.tensor_f32(name), &file))?;
        let expected: std::collections::HashSet<String> = crate::fused::stored_shapes(&weights.config).into_iter().map(|(n, _)| n).collect();
        let tied = weights.config.tie_word_embeddings;
        let harmless = |n: &str| expected.contains(n) || n.ends_with("rotary_emb.inv_freq") || (tied && n == "lm_head.weight");
        if let Some(extra) = self.tensor_names().find(|n| !harmless(n)) {
            return Err(ModelError::invalid(&file, extra, "tensor is not part of the architecture's forward"));
        }
        Ok(weights)
    }
}

/// The `weight_map` of a sharded index, every shard name checked to be a
/// plain file name inside the directory (MODEL-5, MODEL-16).
fn read_index(path: &Path) -> Result<Vec<(String, String)>> {
    let file = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|e| ModelError::io(path, e))?;
    let json: serde_json::Value = serde_json::from_str(&text).map_err(|e| ModelError::invalid(&file, "index", e.to_string()))?;
    let map = json
        .get("weight_map")
        .ok_or_else(|| ModelError::MissingField { file: file.clone(), field: "weight_map".into() })?
        .as_object()
        .ok_or_else(|| ModelError::invalid(&file, "weight_map", "is not an object"))?;
    let mut out = Vec::with_capacity(map.len());
    for (tensor, shard) in map {
        let field = format!("weight_map.{tensor}");
        let shard = shard.as_str().ok_or_else(|| ModelError::invalid(&file, &field, "shard name is not a string"))?;
        if shard.is_empty() || shard.contains(['/', '\\', '\0']) || shard.contains("..") {
            return Err(ModelError::invalid(&file, &field, format!("shard `{shard}` is not a plain file name in the model directory")));
        }
        out.push((tensor.clone(), shard.to_string()));
    }
    Ok(out)
}

/// Loads an HF model directory (MODEL-5).
pub fn load_hf_dir(dir: impl AsRef<Path>) -> Result<LlamaWeights> {
    HfDir::open(dir)?.weights()
}

/// A matrix encoded on demand, so writing a model holds at most one
/// tensor's bytes besides the weights themselves.
struct Encoded<'a> {
    m: &'a Matrix,
    dtype: SaveDtype,
}

impl View for Encoded<'_> {
    fn dtype(&self) -> Dtype {
        self.dtype.safetensors()
    }

    fn shape(&self) -> &[usize] {
        &self.m.shape
    }

    fn data(&self) -> Cow<'_, [u8]> {
        let d = &self.m.data;
        Cow::Owned(match self.dtype {
            SaveDtype::F32 => d.iter().flat_map(|x| x.to_le_bytes()).collect(),
            // Round to nearest even, as torch's `.to(float16/bfloat16)`.
            SaveDtype::F16 => d.iter().flat_map(|&x| f16::from_f32(x).to_le_bytes()).collect(),
            SaveDtype::BF16 => d.iter().flat_map(|&x| bf16::from_f32(x).to_le_bytes()).collect(),
        })
    }

    fn data_len(&self) -> usize {
        self.m.data.len() * self.dtype.size()
    }
}

/// Writes `tensors` to `path` as safetensors in `dtype` (with HF's
/// `{"format": "pt"}` metadata).
pub fn write_safetensors(path: impl AsRef<Path>, tensors: &[(String, &Matrix)], dtype: SaveDtype) -> Result<()> {
    let path = path.as_ref();
    for (name, m) in tensors {
        if m.shape.iter().try_fold(1usize, |n, &d| n.checked_mul(d)) != Some(m.data.len()) {
            return Err(ModelError::InvalidInput { arg: "tensors", reason: format!("`{name}`: {} values cannot fill shape {:?}", m.data.len(), m.shape) });
        }
    }
    let views = tensors.iter().map(|(name, m)| (name.clone(), Encoded { m, dtype }));
    let meta = HashMap::from([("format".to_string(), "pt".to_string())]);
    safetensors::serialize_to_file(views, Some(meta), path).map_err(|e| ModelError::io(path, e))
}
