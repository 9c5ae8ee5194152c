//! Writes a `llama` GGUF v3 file of f32 tensors, in llama.cpp's layout:
//! its tensor names, dims fastest first, `q`/`k` rows permuted for
//! interleaved RoPE (MODEL-4, the inverse of what loading undoes), and a
//! vocabulary of plain pieces (`tokenizer.ggml.model = llama`, every token
//! normal). It exists so that an engine that reads only GGUF (llama.cpp)
//! can run the tiny models the engine checks enumerate, with the very
//! weights the f64 reference runs.

use std::io::Write;
use std::path::Path;

use crate::config::Architecture;
use crate::error::{ModelError, Result};
use crate::weights::{LlamaWeights, Matrix};

use super::DEFAULT_ALIGNMENT;
use super::llama::{gguf_tensor_name, permute_qk};

/// The vocabulary written with the weights: one piece per id, and the ids
/// llama.cpp takes for bos and eos.
pub struct GgufVocab<'a> {
    pub pieces: &'a [String],
    pub bos: u32,
    pub eos: u32,
}

enum Value<'a> {
    U32(u32),
    F32(f32),
    Bool(bool),
    Str(&'a str),
    Strs(&'a [String]),
    F32s(Vec<f32>),
    I32s(Vec<i32>),
}

fn string(out: &mut Vec<u8>, s: &str) {
    out.extend((s.len() as u64).to_le_bytes());
    out.extend(s.as_bytes());
}

fn value(out: &mut Vec<u8>, v: &Value<'_>) {
    match v {
        Value::U32(x) => {
            out.extend(4u32.to_le_bytes());
            out.extend(x.to_le_bytes());
        }
        Value::F32(x) => {
            out.extend(6u32.to_le_bytes());
            out.extend(x.to_le_bytes());
        }
        Value::Bool(b) => {
            out.extend(7u32.to_le_bytes());
            out.push(u8::from(*b));
        }
        Value::Str(s) => {
            out.extend(8u32.to_le_bytes());
            string(out, s);
        }
        Value::Strs(v) => {
            out.extend(9u32.to_le_bytes());
            out.extend(8u32.to_le_bytes());
            out.extend((v.len() as u64).to_le_bytes());
            v.iter().for_each(|s| string(out, s));
        }
        Value::F32s(v) => {
            out.extend(9u32.to_le_bytes());
            out.extend(6u32.to_le_bytes());
            out.extend((v.len() as u64).to_le_bytes());
            v.iter().for_each(|x| out.extend(x.to_le_bytes()));
        }
        Value::I32s(v) => {
            out.extend(9u32.to_le_bytes());
            out.extend(5u32.to_le_bytes());
            out.extend((v.len() as u64).to_le_bytes());
            v.iter().for_each(|x| out.extend(x.to_le_bytes()));
        }
    }
}

/// `weights` with one id more at the end, whose embedding and output rows
/// are zero: an end token of its own for an engine that bans its model's eos
/// ids when told to ignore them (llama.cpp's server sets their logit to
/// -inf under `ignore_eos`). Banned, it leaves the law of every other id as
/// the original model's (the softmax over the original ids is unchanged when
/// the new id's probability is zero), so the engine still runs the weights
/// the reference enumerates.
pub fn with_end_token(weights: &LlamaWeights) -> LlamaWeights {
    let pad = |m: &Matrix| {
        let mut data = m.data.clone();
        data.extend(std::iter::repeat_n(0.0, m.shape[1]));
        Matrix::new(vec![m.shape[0] + 1, m.shape[1]], data, "padded").expect("one more row of the same width")
    };
    let mut padded = weights.clone();
    padded.config.vocab_size += 1;
    padded.embed = pad(&weights.embed);
    padded.lm_head = weights.lm_head.as_ref().map(pad);
    padded
}

/// Writes `weights` (and `vocab`) to `path` as a GGUF file named `name`.
pub fn write_llama_gguf(path: impl AsRef<Path>, weights: &LlamaWeights, name: &str, vocab: &GgufVocab<'_>) -> Result<()> {
    let path = path.as_ref();
    let c = &weights.config;
    let bad = |reason: String| Err(ModelError::InvalidInput { arg: "vocab", reason });
    if vocab.pieces.len() != c.vocab_size {
        return bad(format!("{} pieces for a vocabulary of {}", vocab.pieces.len(), c.vocab_size));
    }
    if vocab.bos as usize >= c.vocab_size || vocab.eos as usize >= c.vocab_size {
        return bad(format!("bos {} or eos {} outside the vocabulary of {}", vocab.bos, vocab.eos, c.vocab_size));
    }
    let u32_of = |x: usize, what: &str| u32::try_from(x).map_err(|_| ModelError::InvalidInput { arg: "config", reason: format!("{what} {x} does not fit GGUF's u32") });
    // llama.cpp's names: Mistral is written as `llama`; Qwen2, Qwen3 and Phi-3 under their own.
    let arch = match c.architecture() {
        Architecture::Llama | Architecture::Mistral => "llama",
        Architecture::Qwen2 => "qwen2",
        Architecture::Qwen3 => "qwen3",
        Architecture::Phi3 => "phi3",
    };
    let rope = c.rope().map_err(|reason| ModelError::InvalidInput { arg: "config", reason })?;
    if rope.llama3.is_some() || rope.freq_factors.is_some() {
        return Err(ModelError::InvalidInput { arg: "config", reason: "per-frequency rotary scaling has no GGUF form here (llama.cpp writes it as a `rope_freqs` tensor)".into() });
    }
    let key = |k: &str| format!("{arch}.{k}");
    let mut metadata: Vec<(String, Value<'_>)> = vec![
        ("general.architecture".into(), Value::Str(arch)),
        ("general.name".into(), Value::Str(name)),
        ("general.alignment".into(), Value::U32(DEFAULT_ALIGNMENT as u32)),
        (key("context_length"), Value::U32(u32_of(c.max_position_embeddings, "max_position_embeddings")?)),
        (key("embedding_length"), Value::U32(u32_of(c.hidden_size, "hidden_size")?)),
        (key("block_count"), Value::U32(u32_of(c.num_hidden_layers, "num_hidden_layers")?)),
        (key("feed_forward_length"), Value::U32(u32_of(c.intermediate_size, "intermediate_size")?)),
        (key("attention.head_count"), Value::U32(u32_of(c.num_attention_heads, "num_attention_heads")?)),
        (key("attention.head_count_kv"), Value::U32(u32_of(c.num_key_value_heads, "num_key_value_heads")?)),
        (key("attention.layer_norm_rms_epsilon"), Value::F32(c.rms_norm_eps as f32)),
        (key("rope.freq_base"), Value::F32(c.rope_theta as f32)),
        (key("rope.dimension_count"), Value::U32(u32_of(c.head_dim(), "head_dim")?)),
        (key("vocab_size"), Value::U32(u32_of(c.vocab_size, "vocab_size")?)),
        ("tokenizer.ggml.model".into(), Value::Str("llama")),
        ("tokenizer.ggml.tokens".into(), Value::Strs(vocab.pieces)),
        ("tokenizer.ggml.scores".into(), Value::F32s(vec![0.0; vocab.pieces.len()])),
        ("tokenizer.ggml.token_type".into(), Value::I32s(vec![1; vocab.pieces.len()])),
        ("tokenizer.ggml.bos_token_id".into(), Value::U32(vocab.bos)),
        ("tokenizer.ggml.eos_token_id".into(), Value::U32(vocab.eos)),
        ("tokenizer.ggml.add_bos_token".into(), Value::Bool(false)),
        // The pieces carry no `▁`: without this, llama.cpp tokenizes text (a stop
        // string) as `▁` + text, falls back to byte tokens the vocabulary lacks,
        // and its server answers 500.
        ("tokenizer.ggml.add_space_prefix".into(), Value::Bool(false)),
    ];
    if c.head_dim.is_some_and(|hd| hd * c.num_attention_heads != c.hidden_size) {
        // A head width other than hidden / heads (Qwen3's), as llama.cpp writes it.
        let hd = u32_of(c.head_dim(), "head_dim")?;
        metadata.extend([(key("attention.key_length"), Value::U32(hd)), (key("attention.value_length"), Value::U32(hd))]);
    }
    // Tensors in HF order with llama.cpp's names, fused as the architecture
    // stores them; q and k permuted back in `llama` files.
    let permuted = arch == "llama";
    let mut tensors = Vec::new();
    for (hf, m) in crate::fused::stored_named(weights)? {
        let m = m.as_ref();
        let gguf = gguf_tensor_name(&hf).ok_or_else(|| ModelError::InvalidInput { arg: "weights", reason: format!("no GGUF name for `{hf}`") })?;
        let m = if permuted && hf.ends_with("q_proj.weight") {
            permute_qk(m, c.num_attention_heads)?
        } else if permuted && hf.ends_with("k_proj.weight") {
            permute_qk(m, c.num_key_value_heads)?
        } else {
            m.clone()
        };
        tensors.push((gguf, m));
    }
    let mut out = Vec::new();
    out.extend(b"GGUF");
    out.extend(3u32.to_le_bytes());
    out.extend((tensors.len() as u64).to_le_bytes());
    out.extend((metadata.len() as u64).to_le_bytes());
    for (k, v) in &metadata {
        string(&mut out, k);
        value(&mut out, v);
    }
    let align = DEFAULT_ALIGNMENT as usize;
    let mut offset = 0usize;
    for (name, m) in &tensors {
        string(&mut out, name);
        out.extend((m.shape.len() as u32).to_le_bytes());
        m.shape.iter().rev().for_each(|d| out.extend((*d as u64).to_le_bytes()));
        out.extend(0u32.to_le_bytes()); // F32
        out.extend((offset as u64).to_le_bytes());
        offset += (m.data.len() * 4).div_ceil(align) * align;
    }
    out.resize(out.len().div_ceil(align) * align, 0);
    for (_, m) in &tensors {
        let start = out.len();
        m.data.iter().for_each(|x| out.extend(x.to_le_bytes()));
        out.resize(start + (out.len() - start).div_ceil(align) * align, 0);
    }
    let mut file = std::fs::File::create(path).map_err(|e| ModelError::io(path, e))?;
    file.write_all(&out).map_err(|e| ModelError::io(path, e))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gguf::{GgufFile, llama_weights};
    use crate::tiny::{TinySpec, tiny_text};

    #[test]
    fn a_written_tiny_model_reads_back_as_the_same_weights() {
        for (name, spec) in TinySpec::PRESETS {
            let w = spec.weights().unwrap();
            let pieces: Vec<String> = (0..spec.vocab as u32).map(|i| tiny_text(&[i])).collect();
            let dir = std::env::temp_dir().join(format!("specdec-gguf-write-{}-{name}", std::process::id()));
            std::fs::create_dir_all(&dir).unwrap();
            let path = dir.join("m.gguf");
            write_llama_gguf(&path, &w, name, &GgufVocab { pieces: &pieces, bos: 0, eos: 1 }).unwrap();
            let g = GgufFile::open(&path).unwrap();
            let back = llama_weights(&g).unwrap();
            assert_eq!(back.embed, w.embed, "{name}");
            assert_eq!(back.layers, w.layers, "{name}: q/k permuted on write and back on read");
            assert_eq!(back.lm_head, w.lm_head, "{name}");
            assert_eq!(g.get_str_array("tokenizer.ggml.tokens").unwrap(), pieces.as_slice());
            std::fs::remove_dir_all(&dir).unwrap();
        }
        let w = TinySpec::preset("tiny-v12-l2").unwrap().weights().unwrap();
        assert!(write_llama_gguf(std::env::temp_dir().join("never.gguf"), &w, "x", &GgufVocab { pieces: &[], bos: 0, eos: 0 }).is_err());
    }

    #[test]
    fn an_end_token_of_its_own_leaves_every_other_logit_as_it_was() {
        use crate::forward::ForwardRequest;
        use crate::reference::RefModel;
        for (name, spec) in TinySpec::PRESETS {
            let w = spec.weights().unwrap();
            let padded = with_end_token(&w);
            let v = w.config.vocab_size;
            assert_eq!(padded.config.vocab_size, v + 1, "{name}");
            let prompt: Vec<u32> = (0..6).map(|i| i % v as u32).collect();
            let run = |m: &RefModel| {
                let mut cache = m.new_cache(1, 16).unwrap();
                m.forward(&mut cache, &ForwardRequest::all_logits(std::slice::from_ref(&prompt))).unwrap()
            };
            let (a, b) = (run(&RefModel::new(w.clone())), run(&RefModel::new(padded)));
            for r in 0..prompt.len() {
                let row = b.logits_row(r, v + 1);
                assert_eq!(&row[..v], a.logits_row(r, v), "{name} row {r}: the original ids' logits, bit for bit");
                assert_eq!(row[v], 0.0, "{name} row {r}: the end token's logit");
            }
        }
    }
}
