//! Training data for a draft model: the target's greedy continuations of a
//! set of prompts and its hidden states at chosen layers (MODEL-9), on disk
//! as a directory of two files.
//!
//! - `data.json`: the format tag, the target layers recorded, the hidden
//!   width, the vocabulary, and per sequence its prompt id, kind, prompt
//!   length and every token (prompt, then the target's continuation).
//! - `hidden.safetensors`: one tensor `seq.{i}` per sequence,
//!   `[tokens - 1, K·hidden]` in f16: the hidden rows of every position but
//!   the last (the last token was never fed to the target).
//!
//! Invariants: reading trusts nothing. The safetensors header is checked
//! against the file size before it is read (`SafetensorsFile`), every tensor's
//! shape against its sequence, every token against the vocabulary, every
//! value for finiteness; a defect is a typed error naming the file and the
//! field.

use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::error::{ModelError, Result};
use crate::hf::{SafetensorsFile, SaveDtype, write_safetensors};
use crate::weights::Matrix;

/// `data.json`'s format tag.
pub const FORMAT: &str = "specdec-draft-data/1";
pub const MANIFEST_FILE: &str = "data.json";
pub const HIDDEN_FILE: &str = "hidden.safetensors";

/// One prompt and the target's continuation of it.
#[derive(Debug, Clone, PartialEq)]
pub struct DraftSequence {
    pub prompt_id: usize,
    /// `chat`, `code` or `prose` (the prompt file's kind).
    pub kind: String,
    /// Prompt, then the continuation: `tokens[prompt_len..]` are the
    /// target's greedy tokens.
    pub tokens: Vec<u32>,
    pub prompt_len: usize,
    /// `[tokens.len() - 1, K·hidden]`: row `j` is the target's hidden state
    /// at position `j`, layers in `target_layer_ids` order.
    pub hidden: Matrix,
}

/// Draft training data.
#[derive(Debug, Clone, PartialEq)]
pub struct DraftData {
    pub target_layer_ids: Vec<usize>,
    pub hidden_size: usize,
    pub vocab_size: usize,
    pub sequences: Vec<DraftSequence>,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Manifest {
    format: String,
    target_layer_ids: Vec<usize>,
    hidden_size: usize,
    vocab_size: usize,
    sequences: Vec<ManifestSeq>,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct ManifestSeq {
    prompt_id: usize,
    kind: String,
    prompt_len: usize,
    tokens: Vec<u32>,
}

impl DraftData {
    /// `K·hidden`.
    pub fn width(&self) -> usize {
        self.target_layer_ids.len() * self.hidden_size
    }

    /// Checks every sequence against the header fields; `file` names the data in errors.
    pub fn validate(&self, file: &str) -> Result<()> {
        let bad = |field: String, reason: String| Err(ModelError::invalid(file, &field, reason));
        if self.target_layer_ids.is_empty() || self.hidden_size == 0 || self.vocab_size == 0 {
            return bad("target_layer_ids".into(), "no layers, no hidden width or no vocabulary".into());
        }
        let width = self.width();
        for (i, s) in self.sequences.iter().enumerate() {
            let field = |f: &str| format!("sequences[{i}].{f}");
            if s.tokens.len() < 2 {
                return bad(field("tokens"), format!("{} tokens: a sequence needs a prompt token and a continuation", s.tokens.len()));
            }
            if !(1..s.tokens.len()).contains(&s.prompt_len) {
                return bad(field("prompt_len"), format!("{} is outside [1, {})", s.prompt_len, s.tokens.len()));
            }
            if let Some(t) = s.tokens.iter().find(|t| **t as usize >= self.vocab_size) {
                return bad(field("tokens"), format!("id {t} is outside the vocabulary of {}", self.vocab_size));
            }
            if s.hidden.shape != [s.tokens.len() - 1, width] {
                return bad(format!("seq.{i}"), format!("shape {:?}, expected [tokens - 1, K·hidden] = [{}, {width}]", s.hidden.shape, s.tokens.len() - 1));
            }
            if let Some(j) = s.hidden.data.iter().position(|v| !v.is_finite()) {
                return bad(format!("seq.{i}"), format!("non-finite value at flat index {j}"));
            }
        }
        Ok(())
    }

    /// Writes `dir/data.json` and `dir/hidden.safetensors` (hidden rows in f16).
    pub fn write(&self, dir: impl AsRef<Path>) -> Result<()> {
        let dir = dir.as_ref();
        self.validate(&dir.display().to_string())?;
        std::fs::create_dir_all(dir).map_err(|e| ModelError::io(dir, e))?;
        let names: Vec<String> = (0..self.sequences.len()).map(|i| format!("seq.{i}")).collect();
        let tensors: Vec<(String, &Matrix)> = names.iter().cloned().zip(self.sequences.iter().map(|s| &s.hidden)).collect();
        write_safetensors(dir.join(HIDDEN_FILE), &tensors, SaveDtype::F16)?;
        let manifest = Manifest {
            format: FORMAT.into(),
            target_layer_ids: self.target_layer_ids.clone(),
            hidden_size: self.hidden_size,
            vocab_size: self.vocab_size,
            sequences: self.sequences.iter().map(|s| ManifestSeq { prompt_id: s.prompt_id, kind: s.kind.clone(), prompt_len: s.prompt_len, tokens: s.tokens.clone() }).collect(),
        };
        let path = dir.join(MANIFEST_FILE);
        let text = serde_json::to_string(&manifest).map_err(|e| ModelError::InvalidInput { arg: "data", reason: e.to_string() })?;
        std::fs::write(&path, text + "\n").map_err(|e| ModelError::io(&path, e))
    }

    /// Reads and validates a directory written by [`DraftData::write`].
    pub fn read(dir: impl AsRef<Path>) -> Result<Self> {
        let dir = dir.as_ref();
        let path = dir.join(MANIFEST_FILE);
        let file = path.display().to_string();
        let text = std::fs::read_to_string(&path).map_err(|e| ModelError::io(&path, e))?;
        let m: Manifest = serde_json::from_str(&text).map_err(|e| ModelError::invalid(&file, "data.json", e.to_string()))?;
        if m.format != FORMAT {
            return Err(ModelError::invalid(&file, "format", format!("`{}` is not `{FORMAT}`", m.format)));
        }
        let st = SafetensorsFile::open(&dir.join(HIDDEN_FILE))?;
        if st.tensors().len() != m.sequences.len() {
            return Err(ModelError::invalid(st.file(), "tensors", format!("{} tensors for {} sequences", st.tensors().len(), m.sequences.len())));
        }
        let mut sequences = Vec::with_capacity(m.sequences.len());
        for (i, s) in m.sequences.into_iter().enumerate() {
            let name = format!("seq.{i}");
            let hidden = st.tensor_f32(&name)?.ok_or_else(|| ModelError::MissingTensor { file: st.file().to_string(), tensor: name })?;
            sequences.push(DraftSequence { prompt_id: s.prompt_id, kind: s.kind, tokens: s.tokens, prompt_len: s.prompt_len, hidden });
        }
        let data = DraftData { target_layer_ids: m.target_layer_ids, hidden_size: m.hidden_size, vocab_size: m.vocab_size, sequences };
        data.validate(&file)?;
        Ok(data)
    }
}
