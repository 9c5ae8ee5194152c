//! The Llama-family configuration, as HF's `config.json` writes it (MODEL-1).
//!
//! Only `LlamaForCausalLM` is accepted. Every size is validated before any
//! tensor is read, so later shape checks can trust it and allocation sizes
//! derived from it cannot overflow.

use serde::{Deserialize, Serialize};

use crate::error::{ModelError, Result};

/// The one table of a decoder layer's tensors, in [`LayerWeights`] field
/// order: the HF name below `model.layers.{i}.` and the GGUF name below
/// `blk.{i}.` (as llama.cpp's converter maps them). Loading, export, the
/// config's shapes, DFlash checkpoints and the GGUF mapping all read it.
pub const LAYER_TENSORS: [(&str, &str); 9] = [
    ("input_layernorm.weight", "attn_norm.weight"),
    ("self_attn.q_proj.weight", "attn_q.weight"),
    ("self_attn.k_proj.weight", "attn_k.weight"),
    ("self_attn.v_proj.weight", "attn_v.weight"),
    ("self_attn.o_proj.weight", "attn_output.weight"),
    ("post_attention_layernorm.weight", "ffn_norm.weight"),
    ("mlp.gate_proj.weight", "ffn_gate.weight"),
    ("mlp.up_proj.weight", "ffn_up.weight"),
    ("mlp.down_proj.weight", "ffn_down.weight"),
];

/// Largest size any one dimension may take; keeps every product of a few
/// dimensions far from `usize` overflow and rejects absurd headers early.
pub const MAX_DIM: usize = 1 << 24;

/// `LlamaForCausalLM` hyper-parameters (field names as in HF `config.json`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LlamaConfig {
    #[serde(default = "default_architectures")]
    pub architectures: Vec<String>,
    #[serde(default = "default_model_type")]
    pub model_type: String,
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    pub num_key_value_heads: usize,
    /// Per-head width; HF derives it as `hidden / heads` when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub head_dim: Option<usize>,
    pub rms_norm_eps: f64,
    #[serde(default = "default_rope_theta")]
    pub rope_theta: f64,
    pub max_position_embeddings: usize,
    #[serde(default)]
    pub tie_word_embeddings: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bos_token_id: Option<u32>,
    /// One id or several; generation stops at any of them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub eos_token_id: Option<EosIds>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pad_token_id: Option<u32>,
    /// The dtype the weights were saved in (informational).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub torch_dtype: Option<String>,
    /// Fields HF writes that do not change the forward pass of a plain Llama
    /// (`hidden_act` must be `silu`, `rope_scaling` must be absent/null,
    /// `attention_bias`/`mlp_bias` must be false): checked in [`LlamaConfig::validate`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hidden_act: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rope_scaling: Option<serde_json::Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attention_bias: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mlp_bias: Option<bool>,
    /// Anything else HF writes that a plain forward ignores by design
    /// (`initializer_range`, `use_cache`, `transformers_version`, ...).
    #[serde(flatten, default, skip_serializing_if = "serde_json::Map::is_empty")]
    pub ignored: serde_json::Map<String, serde_json::Value>,
}

/// `eos_token_id` as one id or a list.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum EosIds {
    One(u32),
    Many(Vec<u32>),
}

impl EosIds {
    pub fn ids(&self) -> Vec<u32> {
        match self {
            EosIds::One(id) => vec![*id],
            EosIds::Many(ids) => ids.clone(),
        }
    }
}

fn default_architectures() -> Vec<String> {
    vec!["LlamaForCausalLM".to_string()]
}
fn default_model_type() -> String {
    "llama".to_string()
}
fn default_rope_theta() -> f64 {
    10_000.0
}

/// HF fields a plain forward may ignore: anything not in this list and not a
/// field above is an error, so a typo (`rms_norm_epsilon`) cannot pass.
const IGNORABLE: &[&str] =
    &["initializer_range", "use_cache", "transformers_version", "pretraining_tp", "_name_or_path", "attention_dropout", "is_llama_config", "rope_interleaved", "torchscript", "dtype"];

impl LlamaConfig {
    /// Parses and validates `config.json` text; `file` names it in errors.
    pub fn from_json(text: &str, file: &str) -> Result<Self> {
        let cfg: LlamaConfig = serde_json::from_str(text).map_err(|e| ModelError::invalid(file, "config.json", e.to_string()))?;
        cfg.validate(file)?;
        Ok(cfg)
    }

    /// The per-head width.
    pub fn head_dim(&self) -> usize {
        self.head_dim.unwrap_or(self.hidden_size / self.num_attention_heads.max(1))
    }

    /// All end-of-sequence ids.
    pub fn eos_ids(&self) -> Vec<u32> {
        self.eos_token_id.as_ref().map(EosIds::ids).unwrap_or_default()
    }

    /// Checks every size and every flag a plain Llama forward depends on.
    pub fn validate(&self, file: &str) -> Result<()> {
        let bad = |field: &str, reason: String| Err(ModelError::invalid(file, field, reason));
        if self.model_type != "llama" {
            return bad("model_type", format!("`{}` is not `llama`", self.model_type));
        }
        if !self.architectures.iter().any(|a| a == "LlamaForCausalLM") {
            return bad("architectures", format!("{:?} does not name LlamaForCausalLM", self.architectures));
        }
        for (field, v) in [
            ("vocab_size", self.vocab_size),
            ("hidden_size", self.hidden_size),
            ("intermediate_size", self.intermediate_size),
            ("num_hidden_layers", self.num_hidden_layers),
            ("num_attention_heads", self.num_attention_heads),
            ("num_key_value_heads", self.num_key_value_heads),
            ("max_position_embeddings", self.max_position_embeddings),
            ("head_dim", self.head_dim()),
        ] {
            if v == 0 || v > MAX_DIM {
                return bad(field, format!("{v} is outside [1, {MAX_DIM}]"));
            }
        }
        if self.num_hidden_layers > 4096 {
            return bad("num_hidden_layers", format!("{} is beyond 4096", self.num_hidden_layers));
        }
        if !self.num_attention_heads.is_multiple_of(self.num_key_value_heads) {
            return bad("num_key_value_heads", format!("{} does not divide num_attention_heads {}", self.num_key_value_heads, self.num_attention_heads));
        }
        if !self.head_dim().is_multiple_of(2) {
            return bad("head_dim", format!("{} is odd; rotary embedding pairs dimensions", self.head_dim()));
        }
        if self.head_dim.is_none() && !self.hidden_size.is_multiple_of(self.num_attention_heads) {
            return bad("num_attention_heads", format!("{} does not divide hidden_size {}", self.num_attention_heads, self.hidden_size));
        }
        if !(self.rms_norm_eps.is_finite() && self.rms_norm_eps > 0.0) {
            return bad("rms_norm_eps", format!("{} is not a positive finite number", self.rms_norm_eps));
        }
        if !(self.rope_theta.is_finite() && self.rope_theta > 1.0) {
            return bad("rope_theta", format!("{} is not a finite number above 1", self.rope_theta));
        }
        if let Some(act) = &self.hidden_act
            && act != "silu"
        {
            return bad("hidden_act", format!("`{act}` is not `silu`"));
        }
        if self.rope_scaling.as_ref().is_some_and(|v| !v.is_null()) {
            return bad("rope_scaling", "rope scaling is not supported".to_string());
        }
        if self.attention_bias == Some(true) {
            return bad("attention_bias", "attention biases are not supported".to_string());
        }
        if self.mlp_bias == Some(true) {
            return bad("mlp_bias", "MLP biases are not supported".to_string());
        }
        for (name, _) in &self.ignored {
            if !IGNORABLE.contains(&name.as_str()) {
                return bad(name, "unknown field (a typo, or a feature this forward does not implement)".to_string());
            }
        }
        for (field, id) in [("bos_token_id", self.bos_token_id), ("pad_token_id", self.pad_token_id)] {
            if let Some(id) = id
                && id as usize >= self.vocab_size
            {
                return bad(field, format!("{id} is outside the vocabulary of {}", self.vocab_size));
            }
        }
        for id in self.eos_ids() {
            if id as usize >= self.vocab_size {
                return bad("eos_token_id", format!("{id} is outside the vocabulary of {}", self.vocab_size));
            }
        }
        Ok(())
    }

    /// The shape of every tensor the config implies, HF names, `[out, in]`.
    pub fn tensor_shapes(&self) -> Vec<(String, Vec<usize>)> {
        let (h, i, v, hd) = (self.hidden_size, self.intermediate_size, self.vocab_size, self.head_dim());
        let (nh, nkv) = (self.num_attention_heads, self.num_key_value_heads);
        let mut out = vec![("model.embed_tokens.weight".to_string(), vec![v, h])];
        for l in 0..self.num_hidden_layers {
            // In `LAYER_TENSORS` order.
            let shapes = [vec![h], vec![nh * hd, h], vec![nkv * hd, h], vec![nkv * hd, h], vec![h, nh * hd], vec![h], vec![i, h], vec![i, h], vec![h, i]];
            out.extend(LAYER_TENSORS.iter().zip(shapes).map(|((hf, _), shape)| (format!("model.layers.{l}.{hf}"), shape)));
        }
        out.push(("model.norm.weight".to_string(), vec![h]));
        if !self.tie_word_embeddings {
            out.push(("lm_head.weight".to_string(), vec![v, h]));
        }
        out
    }
}
