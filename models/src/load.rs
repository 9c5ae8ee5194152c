//! One entry point for any model path: a `.gguf` file or an HF directory
//! (MODEL-3, MODEL-5, MODEL-6), and a cheap description of it.
//!
//! Role: dispatch on the path, load weights and tokenizer together, and
//! check that they agree (the tokenizer can never produce an id the
//! embedding lacks).
//!
//! Invariants: [`info`] reads headers and metadata only and never
//! dequantizes a tensor, so it is fast on any model and safe on a hostile
//! file (the same validation as a full load applies to what it reads).

use std::collections::BTreeMap;
use std::path::Path;

use serde_json::{Value, json};

use crate::config::LlamaConfig;
use crate::error::{ModelError, Result};
use crate::gguf::{self, GgufFile};
use crate::hf::HfDir;
use crate::tokenizer::{TOKENIZER_FILE, Tokenizer};
use crate::weights::LlamaWeights;

/// A model loaded from a file, with its tokenizer when the file has one.
#[derive(Debug, Clone)]
pub struct LoadedModel {
    pub weights: LlamaWeights,
    pub tokenizer: Option<Tokenizer>,
    /// The path loaded.
    pub source: String,
    /// `"gguf"` or `"hf"`.
    pub format: &'static str,
    /// Each dtype of the file's tensors with how many tensors use it,
    /// sorted by name (e.g. `[("F32", 61), ("Q4_1", 210), ("Q8_0", 1)]`).
    pub file_dtypes: Vec<(String, usize)>,
}

/// Loads a `.gguf` file or an HF model directory. Anything that is not a
/// directory is read as GGUF (a wrong file fails on its magic).
pub fn load(path: impl AsRef<Path>) -> Result<LoadedModel> {
    let path = path.as_ref();
    let source = path.display().to_string();
    let (weights, tokenizer, format, file_dtypes) = if path.is_dir() {
        let hf = HfDir::open(path)?;
        let dtypes = count(hf.tensor_names().filter_map(|n| hf.info(n)).map(|i| format!("{:?}", i.dtype)));
        let weights = hf.weights()?;
        let tokenizer = if path.join(TOKENIZER_FILE).is_file() { Some(Tokenizer::from_dir(path)?) } else { None };
        (weights, tokenizer, "hf", dtypes)
    } else {
        let g = GgufFile::open(path)?;
        let dtypes = count(g.tensors().iter().map(|t| t.type_name().to_string()));
        let weights = gguf::llama_weights(&g)?;
        let tokenizer = if g.get("tokenizer.ggml.model").is_some() { Some(Tokenizer::from_gguf(&g)?) } else { None };
        (weights, tokenizer, "gguf", dtypes)
    };
    if let Some(t) = &tokenizer
        && t.vocab_size() > weights.config.vocab_size
    {
        return Err(ModelError::invalid(&source, "vocab_size", format!("the tokenizer has {} tokens but the embedding only {} rows", t.vocab_size(), weights.config.vocab_size)));
    }
    Ok(LoadedModel { weights, tokenizer, source, format, file_dtypes })
}

fn count(names: impl Iterator<Item = String>) -> Vec<(String, usize)> {
    let mut m = BTreeMap::new();
    for n in names {
        *m.entry(n).or_insert(0usize) += 1;
    }
    m.into_iter().collect()
}

/// A description of the model at `path` as JSON: format, architecture,
/// sizes, dtypes with tensor counts, tied or not, tokenizer kind, size,
/// special tokens and whether a chat template is present. Reads headers
/// and metadata only; no tensor is dequantized.
pub fn info(path: impl AsRef<Path>) -> Result<Value> {
    let path = path.as_ref();
    let (format, config, dtypes, n_tensors, params, tokenizer) = if path.is_dir() {
        let hf = HfDir::open(path)?;
        let infos: Vec<_> = hf.tensor_names().filter_map(|n| hf.info(n)).collect();
        let dtypes = count(infos.iter().map(|i| format!("{:?}", i.dtype)));
        let params: usize = infos.iter().map(|i| i.shape.iter().product::<usize>()).sum();
        let tokenizer = if path.join(TOKENIZER_FILE).is_file() { tokenizer_info(&Tokenizer::from_dir(path)?) } else { Value::Null };
        ("hf", hf.config().clone(), dtypes, infos.len(), params, tokenizer)
    } else {
        let g = GgufFile::open(path)?;
        let config = gguf::llama_config(&g)?;
        let dtypes = count(g.tensors().iter().map(|t| t.type_name().to_string()));
        let params: usize = g.tensors().iter().map(|t| t.n_elements()).sum();
        ("gguf", config, dtypes, g.tensors().len(), params, gguf_tokenizer_info(&g)?)
    };
    Ok(json!({
        "path": path.display().to_string(),
        "format": format,
        "architecture": config.architectures.first().cloned().unwrap_or_default(),
        "hidden_size": config.hidden_size,
        "intermediate_size": config.intermediate_size,
        "num_layers": config.num_hidden_layers,
        "num_heads": config.num_attention_heads,
        "num_kv_heads": config.num_key_value_heads,
        "head_dim": config.head_dim(),
        "vocab_size": config.vocab_size,
        "context_length": config.max_position_embeddings,
        "rope_theta": config.rope_theta,
        "rms_norm_eps": config.rms_norm_eps,
        "tied_embeddings": config.tie_word_embeddings,
        "tensors": n_tensors,
        "parameters": params,
        "dtypes": dtypes.into_iter().map(|(k, n)| (k, Value::from(n))).collect::<serde_json::Map<String, Value>>(),
        "tokenizer": tokenizer,
    }))
}

fn special(id: Option<u32>, token: Option<String>) -> Value {
    match id {
        Some(id) => json!({"id": id, "token": token}),
        None => Value::Null,
    }
}

fn tokenizer_info(t: &Tokenizer) -> Value {
    let s = |id: Option<u32>| special(id, id.and_then(|i| t.id_to_token(i)));
    json!({
        "kind": t.kind(),
        "size": t.vocab_size(),
        "bos": s(t.bos_id()),
        "eos": s(t.eos_id()),
        "pad": s(t.pad_id()),
        "unk": s(t.unk_id()),
        "add_bos": t.add_bos(),
        "chat_template": t.chat_template().is_some(),
    })
}

/// The tokenizer as the GGUF metadata describes it, without building it.
fn gguf_tokenizer_info(g: &GgufFile) -> Result<Value> {
    let Some(model) = g.opt_str("tokenizer.ggml.model")? else { return Ok(Value::Null) };
    let tokens = g.get_str_array("tokenizer.ggml.tokens")?;
    let s = |key: &str| -> Result<Value> {
        let id = g.opt_u32(key)?;
        Ok(special(id, id.and_then(|i| tokens.get(i as usize).cloned())))
    };
    Ok(json!({
        "kind": format!("gguf {model}"),
        "pre": g.opt_str("tokenizer.ggml.pre")?,
        "size": tokens.len(),
        "merges": g.get("tokenizer.ggml.merges").map(|_| g.get_str_array("tokenizer.ggml.merges").map(<[String]>::len)).transpose()?,
        "bos": s("tokenizer.ggml.bos_token_id")?,
        "eos": s("tokenizer.ggml.eos_token_id")?,
        "pad": s("tokenizer.ggml.padding_token_id")?,
        "unk": s("tokenizer.ggml.unknown_token_id")?,
        "add_bos": g.opt_bool("tokenizer.ggml.add_bos_token")?.unwrap_or(false),
        "chat_template": g.get("tokenizer.chat_template").is_some(),
    }))
}

/// The config of the model at `path`, from headers only.
pub fn config(path: impl AsRef<Path>) -> Result<LlamaConfig> {
    let path = path.as_ref();
    if path.is_dir() { Ok(HfDir::open(path)?.config().clone()) } else { gguf::llama_config(&GgufFile::open(path)?) }
}
