//! The Llama-family configuration, as HF's `config.json` writes it (MODEL-1).
//!
//! Accepted: `LlamaForCausalLM`, and the architectures that are a Llama
//! with one addition each ([`Architecture`], MODEL-17): Mistral without a
//! sliding window, Qwen2 (biases on the q/k/v projections) and Qwen3 (an
//! RMSNorm over each head of q and k before RoPE), and Phi-3, whose q/k/v
//! and gate/up projections are stored fused ([`crate::fused`]). Every size is validated before any
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

/// The tensors of a decoder layer that only some architectures have, in
/// [`crate::weights::AttnExtras`] field order: (HF name below
/// `model.layers.{i}.`, GGUF name below `blk.{i}.`).
pub const EXTRA_LAYER_TENSORS: [(&str, &str); 5] = [
    ("self_attn.q_proj.bias", "attn_q.bias"),
    ("self_attn.k_proj.bias", "attn_k.bias"),
    ("self_attn.v_proj.bias", "attn_v.bias"),
    ("self_attn.q_norm.weight", "attn_q_norm.weight"),
    ("self_attn.k_norm.weight", "attn_k_norm.weight"),
];

/// A Llama-family architecture (MODEL-17): each is the Llama forward with
/// what [`Architecture::qkv_bias`] and [`Architecture::qk_norm`] add.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Architecture {
    Llama,
    /// Llama's forward; `sliding_window` must not bind.
    Mistral,
    /// Biases on the q, k and v projections.
    Qwen2,
    /// An RMSNorm over each head of q and of k, before RoPE.
    Qwen3,
    /// Llama's forward, its q/k/v and gate/up projections stored fused
    /// ([`crate::fused`]).
    Phi3,
}

impl Architecture {
    pub const ALL: [Architecture; 5] = [Architecture::Llama, Architecture::Mistral, Architecture::Qwen2, Architecture::Qwen3, Architecture::Phi3];

    /// HF's `model_type`.
    pub fn model_type(self) -> &'static str {
        match self {
            Architecture::Llama => "llama",
            Architecture::Mistral => "mistral",
            Architecture::Qwen2 => "qwen2",
            Architecture::Qwen3 => "qwen3",
            Architecture::Phi3 => "phi3",
        }
    }

    /// HF's model class, in `architectures`.
    pub fn class(self) -> &'static str {
        match self {
            Architecture::Llama => "LlamaForCausalLM",
            Architecture::Mistral => "MistralForCausalLM",
            Architecture::Qwen2 => "Qwen2ForCausalLM",
            Architecture::Qwen3 => "Qwen3ForCausalLM",
            Architecture::Phi3 => "Phi3ForCausalLM",
        }
    }

    pub fn qkv_bias(self) -> bool {
        self == Architecture::Qwen2
    }

    pub fn qk_norm(self) -> bool {
        self == Architecture::Qwen3
    }

    /// Whether its files store q/k/v as one projection and gate/up as
    /// another ([`crate::fused`]); the forward is unchanged.
    pub fn fused_projections(self) -> bool {
        self == Architecture::Phi3
    }
}

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
const IGNORABLE: &[&str] = &[
    "initializer_range",
    "use_cache",
    "transformers_version",
    "pretraining_tp",
    "_name_or_path",
    "attention_dropout",
    "is_llama_config",
    "rope_interleaved",
    "torchscript",
    "dtype",
    // Qwen2's and Mistral's sliding-window fields, checked not to bind in `validate`.
    "use_sliding_window",
    "sliding_window",
    "max_window_layers",
    "layer_types",
    // HF 5's form of `rope_theta` and `rope_scaling`, checked in `validate`.
    "rope_parameters",
    // Phi-3's dropout rates (training only) and the base length its `longrope`
    // scaling reads (refused as a rope type in `rope`).
    "embd_pdrop",
    "resid_pdrop",
    "original_max_position_embeddings",
];

impl LlamaConfig {
    /// Parses and validates `config.json` text; `file` names it in errors.
    pub fn from_json(text: &str, file: &str) -> Result<Self> {
        let raw: serde_json::Value = serde_json::from_str(text).map_err(|e| ModelError::invalid(file, "config.json", e.to_string()))?;
        // The architecture first: another family's config lacks Llama's fields, and naming
        // the first missing one would hide that the model is not of a family read here.
        if let Some(model_type) = raw.get("model_type").and_then(serde_json::Value::as_str)
            && !Architecture::ALL.iter().any(|a| a.model_type() == model_type)
        {
            let known: Vec<&str> = Architecture::ALL.iter().map(|a| a.model_type()).collect();
            let classes = raw.get("architectures").map_or(String::new(), |c| format!(" ({c})"));
            return Err(ModelError::invalid(file, "model_type", format!("`{model_type}`{classes} is not one of {known:?}")));
        }
        let mut cfg: LlamaConfig = serde_json::from_str(text).map_err(|e| ModelError::invalid(file, "config.json", e.to_string()))?;
        // HF 5 writes the rotary base only inside `rope_parameters`.
        if raw.get("rope_theta").is_none()
            && let Some(theta) = cfg.ignored.get("rope_parameters").and_then(|r| r.get("rope_theta"))
        {
            cfg.rope_theta = theta.as_f64().ok_or_else(|| ModelError::invalid(file, "rope_parameters.rope_theta", format!("{theta} is not a number")))?;
        }
        cfg.validate(file)?;
        Ok(cfg)
    }

    /// The per-head width.
    pub fn head_dim(&self) -> usize {
        self.head_dim.unwrap_or(self.hidden_size / self.num_attention_heads.max(1))
    }

    /// Its architecture (validated configs only name supported ones).
    pub fn architecture(&self) -> Architecture {
        Architecture::ALL.into_iter().find(|a| a.model_type() == self.model_type).unwrap_or(Architecture::Llama)
    }

    /// All end-of-sequence ids.
    pub fn eos_ids(&self) -> Vec<u32> {
        self.eos_token_id.as_ref().map(EosIds::ids).unwrap_or_default()
    }

    /// Checks every size and every flag a plain Llama forward depends on.
    pub fn validate(&self, file: &str) -> Result<()> {
        let bad = |field: &str, reason: String| Err(ModelError::invalid(file, field, reason));
        let Some(arch) = Architecture::ALL.into_iter().find(|a| a.model_type() == self.model_type) else {
            let known: Vec<&str> = Architecture::ALL.iter().map(|a| a.model_type()).collect();
            return bad("model_type", format!("`{}` is not one of {known:?}", self.model_type));
        };
        if !self.architectures.iter().any(|a| a == arch.class()) {
            return bad("architectures", format!("{:?} does not name {}", self.architectures, arch.class()));
        }
        self.validate_windows_and_rope(file)?;
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
        self.rope().map_err(|reason| ModelError::invalid(file, "rope_scaling", reason))?;
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

    /// The fields HF writes beside the forward's own that would change it if
    /// they bound: a sliding window shorter than the positions, a layer of
    /// another attention than full, and HF 5's `rope_parameters` of another
    /// type than `default` or another theta than `rope_theta`.
    fn validate_windows_and_rope(&self, file: &str) -> Result<()> {
        let bad = |field: &str, reason: String| Err(ModelError::invalid(file, field, reason));
        let field = |name: &str| self.ignored.get(name).filter(|v| !v.is_null());
        let sliding = match field("use_sliding_window") {
            None => true,
            Some(serde_json::Value::Bool(b)) => *b,
            Some(v) => return bad("use_sliding_window", format!("{v} is not a boolean")),
        };
        if let Some(w) = field("sliding_window")
            && sliding
        {
            match w.as_u64() {
                Some(w) if w as usize >= self.max_position_embeddings => {}
                _ => return bad("sliding_window", format!("{w}: a sliding window shorter than max_position_embeddings {} is not supported", self.max_position_embeddings)),
            }
        }
        if let Some(types) = field("layer_types") {
            let all_full = types.as_array().is_some_and(|t| t.iter().all(|t| t == "full_attention"));
            if !all_full {
                return bad("layer_types", format!("{types}: only `full_attention` layers are supported"));
            }
        }
        if let Some(theta) = field("rope_parameters").and_then(|rope| rope.get("rope_theta"))
            && theta.as_f64() != Some(self.rope_theta)
        {
            return bad("rope_parameters", format!("rope_theta {theta} differs from the config's rope_theta {}", self.rope_theta));
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
            out.extend(self.extra_layer_tensors().into_iter().map(|(hf, shape)| (format!("model.layers.{l}.{hf}"), shape)));
        }
        out.push(("model.norm.weight".to_string(), vec![h]));
        if !self.tie_word_embeddings {
            out.push(("lm_head.weight".to_string(), vec![v, h]));
        }
        out
    }
}

impl LlamaConfig {
    /// The architecture's extra tensors of each layer (HF name below the
    /// layer, shape), in [`EXTRA_LAYER_TENSORS`] order.
    pub fn extra_layer_tensors(&self) -> Vec<(&'static str, Vec<usize>)> {
        let (arch, hd) = (self.architecture(), self.head_dim());
        let (q, kv) = (self.num_attention_heads * hd, self.num_key_value_heads * hd);
        let shapes = [(arch.qkv_bias(), q), (arch.qkv_bias(), kv), (arch.qkv_bias(), kv), (arch.qk_norm(), hd), (arch.qk_norm(), hd)];
        EXTRA_LAYER_TENSORS.iter().zip(shapes).filter(|(_, (on, _))| *on).map(|((hf, _), (_, n))| (*hf, vec![n])).collect()
    }
}

/// Llama 3's frequency-dependent rotary scaling (`rope_type: llama3`), as
/// HF's `_compute_llama3_parameters` computes it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Llama3Scaling {
    pub factor: f64,
    pub low_freq_factor: f64,
    pub high_freq_factor: f64,
    pub original_max_position_embeddings: f64,
}

/// [`LlamaConfig::rope_scaling`]'s type for per-frequency factors, each rotary
/// pair's frequency divided by its own (llama.cpp's `rope_freqs` tensor, in which
/// its converter writes Llama 3's scaling): `{"rope_type": "freq_factors",
/// "factors": [..]}`, one positive factor per pair. specdec's name: HF has no
/// config form for it, so a model carrying it is not exported to HF layout.
pub const FREQ_FACTORS: &str = "freq_factors";

/// The rotary embedding a config asks for (MODEL-10, MODEL-17).
#[derive(Debug, Clone, PartialEq)]
pub struct Rope {
    pub theta: f64,
    pub llama3: Option<Llama3Scaling>,
    /// Per-pair divisors of the frequencies ([`FREQ_FACTORS`]).
    pub freq_factors: Option<Vec<f64>>,
}

impl Rope {
    /// Unscaled rotation at `theta`.
    pub fn plain(theta: f64) -> Rope {
        Rope { theta, llama3: None, freq_factors: None }
    }

    /// The inverse frequency of rotary pair `i` of `head_dim`.
    pub fn inv_freq(&self, i: usize, head_dim: usize) -> f64 {
        let base = self.theta.powf(-(2.0 * i as f64) / head_dim as f64);
        if let Some(f) = &self.freq_factors {
            return base / f[i];
        }
        let Some(s) = self.llama3 else { return base };
        let wavelen = 2.0 * std::f64::consts::PI / base;
        let (low_wavelen, high_wavelen) = (s.original_max_position_embeddings / s.low_freq_factor, s.original_max_position_embeddings / s.high_freq_factor);
        if wavelen < high_wavelen {
            base
        } else if wavelen > low_wavelen {
            base / s.factor
        } else {
            let smooth = (s.original_max_position_embeddings / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
            (1.0 - smooth) * base / s.factor + smooth * base
        }
    }
}

impl LlamaConfig {
    /// The rotary embedding: `rope_theta`, with Llama 3's scaling where
    /// `rope_scaling` (HF 4) or `rope_parameters` (HF 5) asks for it; any
    /// other type is refused, naming it.
    pub fn rope(&self) -> std::result::Result<Rope, String> {
        let specs = [self.rope_scaling.as_ref(), self.ignored.get("rope_parameters")];
        // Phi-3's and Phi-4's: a rotary embedding over the first part of each head only.
        if let Some(f) = specs.into_iter().flatten().find_map(|s| s.get("partial_rotary_factor"))
            && f.as_f64() != Some(1.0)
        {
            return Err(format!("partial_rotary_factor {f}: a rotary embedding over part of each head is not supported"));
        }
        let Some(spec) = specs.into_iter().flatten().find(|v| !v.is_null()) else { return Ok(Rope::plain(self.rope_theta)) };
        let kind = spec.get("rope_type").or_else(|| spec.get("type")).and_then(serde_json::Value::as_str).unwrap_or("default");
        match kind {
            "default" => Ok(Rope::plain(self.rope_theta)),
            FREQ_FACTORS => {
                let pairs = self.head_dim() / 2;
                let factors: Vec<f64> = spec
                    .get("factors")
                    .and_then(serde_json::Value::as_array)
                    .and_then(|a| a.iter().map(serde_json::Value::as_f64).collect::<Option<Vec<f64>>>())
                    .ok_or_else(|| format!("{FREQ_FACTORS} needs `factors`, a list of numbers"))?;
                if factors.len() != pairs {
                    return Err(format!("{FREQ_FACTORS}: {} factors for {pairs} rotary pairs", factors.len()));
                }
                if let Some((i, f)) = factors.iter().enumerate().find(|(_, f)| !(f.is_finite() && **f > 0.0)) {
                    return Err(format!("{FREQ_FACTORS}: factor {i} is {f}, not a positive number"));
                }
                Ok(Rope { freq_factors: Some(factors), ..Rope::plain(self.rope_theta) })
            }
            "llama3" => {
                let num = |k: &str| spec.get(k).and_then(serde_json::Value::as_f64).filter(|v| v.is_finite() && *v > 0.0).ok_or_else(|| format!("llama3 rope scaling needs a positive `{k}`"));
                let s = Llama3Scaling {
                    factor: num("factor")?,
                    low_freq_factor: num("low_freq_factor")?,
                    high_freq_factor: num("high_freq_factor")?,
                    original_max_position_embeddings: num("original_max_position_embeddings")?,
                };
                if s.high_freq_factor <= s.low_freq_factor {
                    return Err(format!("high_freq_factor {} is not above low_freq_factor {}", s.high_freq_factor, s.low_freq_factor));
                }
                Ok(Rope { llama3: Some(s), ..Rope::plain(self.rope_theta) })
            }
            other => Err(format!("rope type `{other}` is not supported (`default`, `llama3`, `{FREQ_FACTORS}`)")),
        }
    }
}
