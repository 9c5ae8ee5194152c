//! The `llama` architecture on top of a GGUF file: its config, its weights
//! in the host convention, and the q/k row permutation of llama.cpp's
//! converter, undone on load (MODEL-4).

use std::collections::{HashMap, HashSet};
use std::path::Path;

use crate::config::{Architecture, LlamaConfig};
use crate::error::{ModelError, Result};
use crate::weights::{LlamaWeights, Matrix};

use super::file::GgufFile;

/// The rows of a 2-D matrix whose rows split into `n_head` heads of an even width.
pub(super) fn check_permutable(w: &Matrix, n_head: usize) -> Result<usize> {
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
    Ok(rows)
}

/// What llama.cpp's HF-to-GGUF converter does to `q_proj`/`k_proj` rows so
/// that interleaved RoPE (pairs `(2i, 2i+1)`) computes what HF's rotate-half
/// RoPE (pairs `(i, i + d/2)`) computes (MODEL-4):
/// `w.reshape(n_head, 2, d/2, in).swapaxes(1, 2).reshape(out, in)`.
/// Within each head, HF row `t·d/2 + j` becomes GGUF row `2j + t`.
pub fn permute_qk(w: &Matrix, n_head: usize) -> Result<Matrix> {
    let rows = check_permutable(w, n_head)?;
    let hd = rows / n_head;
    let half = hd / 2;
    Ok(w.move_rows(|r| {
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
    let rows = check_permutable(w, n_head)?;
    let hd = rows / n_head;
    let half = hd / 2;
    Ok(w.move_rows(|r| {
        let (h, i) = (r / hd, r % hd);
        let (j, t) = (i / 2, i % 2);
        h * hd + t * half + j
    }))
}

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
    let fused = crate::fused::FUSED_LAYER_TENSORS.iter().map(|f| (f.hf, f.gguf));
    let (_, gguf) = crate::config::LAYER_TENSORS.iter().chain(&crate::config::EXTRA_LAYER_TENSORS).copied().chain(fused).find(|(hf, _)| *hf == rest)?;
    Some(format!("blk.{layer}.{gguf}"))
}

/// The [`LlamaConfig`] a `llama` GGUF file describes (MODEL-3). Reads only
/// metadata and the tensor table, never tensor data.
pub fn llama_config(g: &GgufFile) -> Result<LlamaConfig> {
    let file = g.file();
    let arch = g.get_str("general.architecture")?;
    // llama.cpp writes Mistral's files as `llama`; Qwen2's, Qwen3's and Phi-3's under their own names.
    let architecture = match arch {
        "llama" => Architecture::Llama,
        "qwen2" => Architecture::Qwen2,
        "qwen3" => Architecture::Qwen3,
        "phi3" => Architecture::Phi3,
        _ => return Err(ModelError::invalid(file, "general.architecture", format!("`{arch}` is not one of `llama`, `qwen2`, `qwen3`, `phi3`"))),
    };
    let key = |k: &str| format!("{arch}.{k}");
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
    // Phi-3's `longrope` factors (two sets, chosen by the context length).
    for factors in ["rope_factors_long.weight", "rope_factors_short.weight"] {
        if g.tensor(factors).is_some() {
            return Err(ModelError::invalid(file, factors, "longrope scaling is not supported"));
        }
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
        architectures: vec![architecture.class().to_string()],
        model_type: architecture.model_type().to_string(),
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
        rope_scaling: rope_freqs(g)?,
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

/// The tensor in which llama.cpp's converter writes Llama 3's rotary scaling:
/// one divisor per rotary pair's frequency.
const ROPE_FREQS: &str = "rope_freqs.weight";

/// A file's [`ROPE_FREQS`] as the config's [`crate::config::FREQ_FACTORS`]
/// rope scaling (its length and values are checked by the config's
/// validation, against `head_dim`).
fn rope_freqs(g: &GgufFile) -> Result<Option<serde_json::Value>> {
    if g.tensor(ROPE_FREQS).is_none() {
        return Ok(None);
    }
    let m = g.tensor_f32(ROPE_FREQS)?;
    if m.shape.len() != 1 {
        return Err(ModelError::invalid(g.file(), ROPE_FREQS, format!("shape {:?}, expected one axis", m.shape)));
    }
    if let Some((i, f)) = m.data.iter().enumerate().find(|(_, f)| !(f.is_finite() && **f > 0.0)) {
        return Err(ModelError::invalid(g.file(), ROPE_FREQS, format!("factor {i} is {f}, not a positive number")));
    }
    let factors: Vec<f64> = m.data.iter().map(|&f| f64::from(f)).collect();
    Ok(Some(serde_json::json!({ "rope_type": crate::config::FREQ_FACTORS, "factors": factors })))
}

/// Dequantizes every tensor of a `llama` GGUF file into [`LlamaWeights`]
/// (MODEL-3), undoing the converter's q/k permutation (MODEL-4). A tensor
/// the architecture does not use is an error, not silently dropped: a bias
/// or an extra norm would change the forward.
pub fn llama_weights(g: &GgufFile) -> Result<LlamaWeights> {
    let config = llama_config(g)?;
    let permuted = config.architecture() == Architecture::Llama;
    let expected: HashMap<String, Vec<usize>> = config.tensor_shapes().into_iter().collect();
    let (heads, kv_heads) = (config.num_attention_heads, config.num_key_value_heads);
    // Read into the config's rotary embedding.
    let mut used = HashSet::from([ROPE_FREQS.to_string()]);
    let stored = crate::fused::split_reader(
        &config,
        |hf: &str| {
            let Some(name) = gguf_tensor_name(hf) else { return Ok(None) };
            if g.tensor(&name).is_none() {
                // Report the file's name for the tensor, which the user can find.
                return Err(ModelError::MissingTensor { file: g.file().to_string(), tensor: name });
            }
            used.insert(name.clone());
            let m = g.tensor_f32(&name)?;
            // Only `llama` files are permuted: llama.cpp runs Qwen's rotary in HF's
            // rotate-half form (its NEOX type) on the weights as HF stores them.
            let n_head = if permuted && hf.ends_with("q_proj.weight") {
                heads
            } else if permuted && hf.ends_with("k_proj.weight") {
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
        },
        g.file(),
    );
    let weights = LlamaWeights::from_named(config, g.file(), stored)?;
    if let Some(extra) = g.tensors().iter().find(|t| !used.contains(&t.name)) {
        return Err(ModelError::invalid(g.file(), &extra.name, "tensor is not part of the architecture's forward"));
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
        Matrix::new(vec![rows, cols], (0..rows * cols).map(|i| i as f32).collect(), "ramp").unwrap()
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
