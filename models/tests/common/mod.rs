//! Test-only helpers: a tiny GGUF writer, random Llama weights in the host
//! convention, a small byte-level BPE vocabulary, and scratch directories.
//!
//! The writer lays files out exactly as llama.cpp does (header, metadata,
//! tensor infos, padding to the alignment, tensor data each at an aligned
//! offset), and lets a test override any count or offset to build a hostile
//! file.

#![allow(dead_code)]

use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};

use specdec_models::gguf::{gguf_tensor_name, permute_qk};
use specdec_models::{LlamaConfig, LlamaWeights, Matrix, Result};

/// A metadata value to write.
#[derive(Debug, Clone)]
pub enum Val {
    U8(u8),
    U32(u32),
    I32(i32),
    U64(u64),
    F32(f32),
    Bool(bool),
    Str(String),
    StrArr(Vec<String>),
    I32Arr(Vec<i32>),
    /// A value type id and its encoded bytes, written verbatim.
    Raw(u32, Vec<u8>),
}

pub fn s(x: &str) -> Val {
    Val::Str(x.to_string())
}

/// A tensor to write: `dims` fastest-first as GGUF lists them.
#[derive(Debug, Clone)]
pub struct TensorSpec {
    pub name: String,
    pub dims: Vec<u64>,
    pub ty: u32,
    pub data: Vec<u8>,
    /// Written instead of the computed offset.
    pub offset: Option<u64>,
}

#[derive(Debug, Clone)]
pub struct GgufBuilder {
    pub version: u32,
    pub alignment: u64,
    pub kvs: Vec<(String, Val)>,
    pub tensors: Vec<TensorSpec>,
    pub tensor_count: Option<u64>,
    pub kv_count: Option<u64>,
}

impl Default for GgufBuilder {
    fn default() -> Self {
        GgufBuilder { version: 3, alignment: 32, kvs: vec![], tensors: vec![], tensor_count: None, kv_count: None }
    }
}

fn put_str(out: &mut Vec<u8>, s: &str) {
    out.extend((s.len() as u64).to_le_bytes());
    out.extend(s.as_bytes());
}

fn put_val(out: &mut Vec<u8>, v: &Val) {
    let (ty, bytes): (u32, Vec<u8>) = match v {
        Val::U8(x) => (0, vec![*x]),
        Val::U32(x) => (4, x.to_le_bytes().to_vec()),
        Val::I32(x) => (5, x.to_le_bytes().to_vec()),
        Val::F32(x) => (6, x.to_le_bytes().to_vec()),
        Val::Bool(b) => (7, vec![u8::from(*b)]),
        Val::Str(s) => {
            let mut b = vec![];
            put_str(&mut b, s);
            (8, b)
        }
        Val::StrArr(v) => {
            let mut b = 8u32.to_le_bytes().to_vec();
            b.extend((v.len() as u64).to_le_bytes());
            for s in v {
                put_str(&mut b, s);
            }
            (9, b)
        }
        Val::I32Arr(v) => {
            let mut b = 5u32.to_le_bytes().to_vec();
            b.extend((v.len() as u64).to_le_bytes());
            for x in v {
                b.extend(x.to_le_bytes());
            }
            (9, b)
        }
        Val::U64(x) => (10, x.to_le_bytes().to_vec()),
        Val::Raw(ty, bytes) => (*ty, bytes.clone()),
    };
    out.extend(ty.to_le_bytes());
    out.extend(bytes);
}

impl GgufBuilder {
    pub fn kv(mut self, key: &str, v: Val) -> Self {
        self.kvs.retain(|(k, _)| k != key);
        self.kvs.push((key.to_string(), v));
        self
    }

    pub fn without_kv(mut self, key: &str) -> Self {
        self.kvs.retain(|(k, _)| k != key);
        self
    }

    pub fn tensor(mut self, name: &str, dims: &[u64], ty: u32, data: Vec<u8>) -> Self {
        self.tensors.push(TensorSpec { name: name.to_string(), dims: dims.to_vec(), ty, data, offset: None });
        self
    }

    /// An F32 tensor from an HF-shaped matrix (dims written reversed).
    pub fn tensor_f32(self, name: &str, m: &Matrix) -> Self {
        let dims: Vec<u64> = m.shape.iter().rev().map(|&d| d as u64).collect();
        let data = m.data.iter().flat_map(|x| x.to_le_bytes()).collect();
        self.tensor(name, &dims, 0, data)
    }

    pub fn without_tensor(mut self, name: &str) -> Self {
        self.tensors.retain(|t| t.name != name);
        self
    }

    pub fn tensor_mut(&mut self, name: &str) -> &mut TensorSpec {
        self.tensors.iter_mut().find(|t| t.name == name).expect("test names an existing tensor")
    }

    fn align(&self, n: usize) -> usize {
        let a = self.alignment as usize;
        n.div_ceil(a) * a
    }

    /// The file's bytes.
    pub fn build(&self) -> Vec<u8> {
        let mut out = b"GGUF".to_vec();
        out.extend(self.version.to_le_bytes());
        out.extend(self.tensor_count.unwrap_or(self.tensors.len() as u64).to_le_bytes());
        out.extend(self.kv_count.unwrap_or(self.kvs.len() as u64).to_le_bytes());
        for (k, v) in &self.kvs {
            put_str(&mut out, k);
            put_val(&mut out, v);
        }
        let mut offsets = vec![];
        let mut next = 0usize;
        for t in &self.tensors {
            offsets.push(next);
            next = self.align(next + t.data.len());
        }
        for (t, &off) in self.tensors.iter().zip(&offsets) {
            put_str(&mut out, &t.name);
            out.extend((t.dims.len() as u32).to_le_bytes());
            for d in &t.dims {
                out.extend(d.to_le_bytes());
            }
            out.extend(t.ty.to_le_bytes());
            out.extend(t.offset.unwrap_or(off as u64).to_le_bytes());
        }
        let data_start = self.align(out.len());
        out.resize(data_start, 0);
        for (t, &off) in self.tensors.iter().zip(&offsets) {
            out.resize(data_start + off, 0);
            out.extend(&t.data);
        }
        out
    }

    /// Writes the file under a fresh scratch directory and returns its path.
    pub fn write(&self, name: &str) -> PathBuf {
        let path = scratch_dir(name).join(format!("{name}.gguf"));
        std::fs::write(&path, self.build()).expect("scratch file is writable");
        path
    }
}

static COUNTER: AtomicUsize = AtomicUsize::new(0);

/// A fresh, empty directory under cargo's per-target scratch space.
pub fn scratch_dir(name: &str) -> PathBuf {
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("specdec-models-{name}-{}-{n}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("scratch dir is creatable");
    dir
}

/// SplitMix64: a tiny deterministic generator for test weights.
pub struct Rng(pub u64);

impl Rng {
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [-1, 1).
    pub fn f32(&mut self) -> f32 {
        ((self.next_u64() >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }
}

/// A small GQA config (4 heads of width 4, 2 KV heads) whose `rms_norm_eps`
/// is exact in f32, so it survives a GGUF round trip unchanged.
pub fn tiny_config(tied: bool) -> LlamaConfig {
    let text = format!(
        r#"{{"vocab_size": 300, "hidden_size": 16, "intermediate_size": 24, "num_hidden_layers": 2,
            "num_attention_heads": 4, "num_key_value_heads": 2, "rms_norm_eps": 1.52587890625e-05,
            "rope_theta": 10000.0, "max_position_embeddings": 64, "tie_word_embeddings": {tied},
            "bos_token_id": 1, "eos_token_id": 2, "hidden_act": "silu"}}"#
    );
    LlamaConfig::from_json(&text, "tiny config.json").expect("the tiny config is valid")
}

/// Random weights (HF row order) for `config`.
pub fn random_weights(config: LlamaConfig, seed: u64) -> LlamaWeights {
    let mut rng = Rng(seed);
    let mut tensors: std::collections::HashMap<String, Matrix> = config
        .tensor_shapes()
        .into_iter()
        .map(|(name, shape)| {
            let n = shape.iter().product();
            let norm = name.ends_with("norm.weight");
            let data = (0..n).map(|_| if norm { 1.0 + 0.1 * rng.f32() } else { 0.2 * rng.f32() }).collect();
            (name.clone(), Matrix::new(shape, data, &name).expect("values fill the shape"))
        })
        .collect();
    LlamaWeights::from_named(config, "random", |n| Ok(tensors.remove(n))).expect("random weights fit their config")
}

/// A `llama` GGUF holding `w` as F32, with q/k rows permuted as llama.cpp's
/// converter stores them (MODEL-4).
pub fn llama_gguf(w: &LlamaWeights) -> GgufBuilder {
    let c = &w.config;
    let mut b = GgufBuilder::default()
        .kv("general.architecture", s("llama"))
        .kv("llama.block_count", Val::U32(c.num_hidden_layers as u32))
        .kv("llama.context_length", Val::U32(c.max_position_embeddings as u32))
        .kv("llama.embedding_length", Val::U32(c.hidden_size as u32))
        .kv("llama.feed_forward_length", Val::U32(c.intermediate_size as u32))
        .kv("llama.attention.head_count", Val::U32(c.num_attention_heads as u32))
        .kv("llama.attention.head_count_kv", Val::U32(c.num_key_value_heads as u32))
        .kv("llama.attention.layer_norm_rms_epsilon", Val::F32(c.rms_norm_eps as f32))
        .kv("llama.rope.freq_base", Val::F32(c.rope_theta as f32))
        .kv("llama.rope.dimension_count", Val::U32(c.head_dim() as u32));
    if let Some(bos) = c.bos_token_id {
        b = b.kv("tokenizer.ggml.bos_token_id", Val::U32(bos));
    }
    if let Some(eos) = c.eos_ids().first() {
        b = b.kv("tokenizer.ggml.eos_token_id", Val::U32(*eos));
    }
    for (name, m) in w.named() {
        let gguf = gguf_tensor_name(&name).expect("every HF name maps");
        let stored = if name.ends_with("q_proj.weight") {
            permute_qk(m, c.num_attention_heads).expect("q permutes")
        } else if name.ends_with("k_proj.weight") {
            permute_qk(m, c.num_key_value_heads).expect("k permutes")
        } else {
            m.clone()
        };
        b = b.tensor_f32(&gguf, &stored);
    }
    b
}

/// GPT-2's byte-to-character map: byte `b` is written as `BYTE_CHARS[b]`.
pub fn byte_chars() -> Vec<char> {
    let mut bs: Vec<u32> = (u32::from(b'!')..=u32::from(b'~')).chain(0xA1..=0xAC).chain(0xAE..=0xFF).collect();
    let mut cs = bs.clone();
    let mut n = 0;
    for b in 0..256 {
        if !bs.contains(&b) {
            bs.push(b);
            cs.push(256 + n);
            n += 1;
        }
    }
    let mut out = vec![' '; 256];
    for (b, c) in bs.into_iter().zip(cs) {
        out[b as usize] = char::from_u32(c).expect("valid char");
    }
    out
}

/// The small byte-level BPE vocabulary: three control tokens (ids 0..=2),
/// the 256 byte characters (ids 3..=258), five merged tokens, and one
/// user-defined token `<tool>` (id 264).
pub fn small_vocab() -> (Vec<String>, Vec<i32>, Vec<String>) {
    let mut tokens: Vec<String> = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"].map(String::from).to_vec();
    tokens.extend(byte_chars().into_iter().map(String::from));
    let merged = ["he", "the", "Ġthe", "in", "Ġin"];
    tokens.extend(merged.map(String::from));
    tokens.push("<tool>".to_string());
    let mut types = vec![1; tokens.len()];
    types[..3].fill(3);
    types[tokens.len() - 1] = 4;
    let merges = ["h e", "t he", "Ġ the", "i n", "Ġ in"].map(String::from).to_vec();
    (tokens, types, merges)
}

pub const SMALL_CHATML: &str = "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\nBe brief.<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

/// Tokenizer metadata for [`small_vocab`] in the SmolLM2 style.
pub fn with_small_tokenizer(b: GgufBuilder) -> GgufBuilder {
    let (tokens, types, merges) = small_vocab();
    b.kv("tokenizer.ggml.model", s("gpt2"))
        .kv("tokenizer.ggml.pre", s("smollm"))
        .kv("tokenizer.ggml.tokens", Val::StrArr(tokens))
        .kv("tokenizer.ggml.token_type", Val::I32Arr(types))
        .kv("tokenizer.ggml.merges", Val::StrArr(merges))
        .kv("tokenizer.ggml.bos_token_id", Val::U32(1))
        .kv("tokenizer.ggml.eos_token_id", Val::U32(2))
        .kv("tokenizer.ggml.unknown_token_id", Val::U32(0))
        .kv("tokenizer.ggml.padding_token_id", Val::U32(2))
        .kv("tokenizer.ggml.add_bos_token", Val::Bool(false))
        .kv("tokenizer.chat_template", s(SMALL_CHATML))
}

/// Asserts two weight sets hold bit-identical tensors under the same names.
pub fn assert_same_tensors(a: &LlamaWeights, b: &LlamaWeights, what: &str) {
    let (na, nb) = (a.named(), b.named());
    assert_eq!(na.len(), nb.len(), "{what}: tensor count");
    for ((x, mx), (y, my)) in na.iter().zip(&nb) {
        assert_eq!(x, y, "{what}: names");
        assert_eq!(mx.shape, my.shape, "{what}: {x} shape");
        let bits = |m: &Matrix| m.data.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
        assert!(bits(mx) == bits(my), "{what}: {x} differs");
    }
}

// ---------------------------------------------------------------------------
// One runner for rejected inputs (hostile files, bad configs and arguments).

/// One rejected input: what runs, the error kind it must give, and
/// fragments the message must contain (file, field, tensor or argument names).
pub struct Case {
    name: String,
    kind: &'static str,
    needles: Vec<String>,
    run: Box<dyn Fn() -> Result<()>>,
}

pub fn case(name: impl Into<String>, kind: &'static str, needles: &[&str], run: impl Fn() -> Result<()> + 'static) -> Case {
    Case { name: name.into(), kind, needles: needles.iter().map(|s| s.to_string()).collect(), run: Box::new(run) }
}

/// Runs every case and reports all mismatches at once, under `rules`.
pub fn check(rules: &str, cases: Vec<Case>) {
    let mut failures = vec![];
    for c in &cases {
        match (c.run)() {
            Ok(()) => failures.push(format!("{}: accepted, expected {}", c.name, c.kind)),
            Err(e) => {
                let msg = e.to_string();
                if e.kind() != c.kind {
                    failures.push(format!("{}: got {} ({msg}), expected {}", c.name, e.kind(), c.kind));
                }
                for n in &c.needles {
                    if !msg.contains(n.as_str()) {
                        failures.push(format!("{}: message {msg:?} lacks {n:?}", c.name));
                    }
                }
            }
        }
    }
    assert!(failures.is_empty(), "{rules}: {} of {} cases failed:\n{}", failures.len(), cases.len(), failures.join("\n"));
}
