//! Tiny seeded Llama models for exact tests (MODEL-12).
//!
//! A tiny model is small enough that the law of a whole generated sequence
//! can be enumerated (vocabulary 8..=32, 1 or 2 layers, hidden 8..=32), yet
//! it exercises every piece of the real forward: GQA, RoPE, RMSNorm, SwiGLU,
//! tied or untied heads. Weights are a pure function of the spec and the
//! seed (PCG64), so a test regenerates the same model anywhere; the few
//! committed under `fixtures/models/tiny/` are checked against the generator.

use rand::{RngExt, SeedableRng};
use rand_pcg::Pcg64;

use crate::config::{EosIds, LlamaConfig};
use crate::error::{ModelError, Result};
use crate::weights::{LlamaWeights, Matrix};

/// The shape of a tiny model.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TinySpec {
    pub vocab: usize,
    pub layers: usize,
    pub hidden: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub intermediate: usize,
    pub tied: bool,
    pub seed: u64,
}

impl TinySpec {
    /// The named tiny models the suite uses (and `fixtures/models/tiny/` holds).
    pub const PRESETS: [(&'static str, TinySpec); 3] = [
        ("tiny-v16-l1", TinySpec { vocab: 16, layers: 1, hidden: 16, heads: 4, kv_heads: 2, intermediate: 32, tied: true, seed: 1 }),
        ("tiny-v12-l2", TinySpec { vocab: 12, layers: 2, hidden: 8, heads: 2, kv_heads: 1, intermediate: 16, tied: false, seed: 2 }),
        ("tiny-v32-l2", TinySpec { vocab: 32, layers: 2, hidden: 32, heads: 4, kv_heads: 4, intermediate: 64, tied: false, seed: 3 }),
    ];

    pub fn preset(name: &str) -> Option<TinySpec> {
        Self::PRESETS.iter().find(|(n, _)| *n == name).map(|(_, s)| *s)
    }

    /// Checks the tiny ranges: vocabulary 8..=32, 1..=2 layers, hidden 8..=32.
    pub fn validate(&self) -> Result<()> {
        let bad = |reason: String| Err(ModelError::InvalidInput { arg: "tiny spec", reason });
        if !(8..=32).contains(&self.vocab) || !(1..=2).contains(&self.layers) || !(8..=32).contains(&self.hidden) {
            return bad(format!("{self:?} is outside vocab 8..=32, layers 1..=2, hidden 8..=32"));
        }
        if self.heads == 0 || self.kv_heads == 0 || !self.hidden.is_multiple_of(self.heads) || !self.heads.is_multiple_of(self.kv_heads) || !(self.hidden / self.heads).is_multiple_of(2) {
            return bad(format!("{self:?}: heads must divide hidden into even head widths, kv_heads must divide heads"));
        }
        Ok(())
    }

    pub fn config(&self) -> LlamaConfig {
        LlamaConfig {
            architectures: vec!["LlamaForCausalLM".into()],
            model_type: "llama".into(),
            vocab_size: self.vocab,
            hidden_size: self.hidden,
            intermediate_size: self.intermediate,
            num_hidden_layers: self.layers,
            num_attention_heads: self.heads,
            num_key_value_heads: self.kv_heads,
            head_dim: None,
            rms_norm_eps: 1e-5,
            rope_theta: 10_000.0,
            max_position_embeddings: 64,
            tie_word_embeddings: self.tied,
            bos_token_id: Some(0),
            eos_token_id: Some(EosIds::One(1)),
            pad_token_id: None,
            torch_dtype: Some("float32".into()),
            hidden_act: Some("silu".into()),
            rope_scaling: None,
            attention_bias: Some(false),
            mlp_bias: Some(false),
            ignored: serde_json::Map::new(),
        }
    }

    /// The seeded weights. Linear weights are uniform in `±1/sqrt(in)` (so
    /// activations stay O(1)); norm gains are `1 ± 0.25`; the embedding is
    /// uniform in `±1` and the output projection is scaled so that logits
    /// spread over a few units: next-token laws are neither flat nor one-hot.
    pub fn weights(&self) -> Result<LlamaWeights> {
        self.validate()?;
        self.seeded_weights()
    }

    /// [`TinySpec::weights`] without the tiny ranges: the same seeded
    /// generator for a deeper or wider model (precision measurements).
    pub fn seeded_weights(&self) -> Result<LlamaWeights> {
        seeded(self.config(), self.seed)
    }
}

/// Seeded weights for any valid config, with the tiny models' scales.
pub fn seeded(cfg: LlamaConfig, seed: u64) -> Result<LlamaWeights> {
    let mut rng = Pcg64::seed_from_u64(seed);
    let mut tensors = std::collections::HashMap::new();
    for (name, shape) in cfg.tensor_shapes() {
        let n: usize = shape.iter().product();
        let data: Vec<f32> = if name.ends_with("norm.weight") || name.ends_with("layernorm.weight") {
            (0..n).map(|_| 1.0 + 0.25 * (2.0 * rng.random::<f32>() - 1.0)).collect()
        } else {
            let scale = match name.as_str() {
                "model.embed_tokens.weight" => 1.0,
                "lm_head.weight" => 3.0 / (shape[1] as f32).sqrt(),
                _ => 1.0 / (shape[1] as f32).sqrt(),
            };
            (0..n).map(|_| scale * (2.0 * rng.random::<f32>() - 1.0)).collect()
        };
        tensors.insert(name.clone(), Matrix::new(shape, data, &name)?);
    }
    LlamaWeights::from_named(cfg, "tiny", |name| Ok(tensors.remove(name)))
}

/// The tiny models' text: id `i` reads as two letters, `A + i` then `a + i`
/// (`0` is `Aa`, `1` is `Bb`), so a stop string can straddle two tokens.
/// Ids are at most 32 ([`TinySpec::validate`]).
pub fn tiny_text(ids: &[u32]) -> String {
    ids.iter().flat_map(|&i| [char::from(b'A' + i as u8), char::from(b'a' + i as u8)]).collect()
}

/// The ids of a tiny model's text, the inverse of [`tiny_text`] for ids
/// below `vocab`; a text that is not pairs of such letters is an error naming
/// the first bad pair.
pub fn tiny_ids(text: &str, vocab: usize) -> Result<Vec<u32>> {
    let bytes = text.as_bytes();
    let bad = |at: usize| Err(ModelError::InvalidInput { arg: "text", reason: format!("byte {at} does not start a tiny token (`Aa`, `Bb`, .. for ids below {vocab})") });
    let mut ids = Vec::with_capacity(bytes.len() / 2);
    for (n, pair) in bytes.chunks(2).enumerate() {
        match pair {
            [hi, lo] if hi.is_ascii_uppercase() && lo.wrapping_sub(b'a') == hi - b'A' && usize::from(hi - b'A') < vocab => ids.push(u32::from(hi - b'A')),
            _ => return bad(2 * n),
        }
    }
    Ok(ids)
}

#[cfg(test)]
mod text_tests {
    use super::*;

    #[test]
    fn tiny_text_reads_back() {
        let ids = vec![0, 11, 3, 3];
        assert_eq!(tiny_text(&ids), "AaLlDdDd");
        assert_eq!(tiny_ids(&tiny_text(&ids), 12).unwrap(), ids);
        for bad in ["A", "Ab", "aA", "Mm", "Aa "] {
            assert!(tiny_ids(bad, 12).is_err(), "{bad}");
        }
    }
}
