//! Hostile and malformed model files (MODEL-16): every defect is a typed
//! error of the right kind naming the file and the field or tensor, never a
//! panic and never an allocation sized by an unchecked header number. Covers
//! the GGUF reader (MODEL-3), the q/k handling of the llama loader (MODEL-4),
//! the HF layout (MODEL-5) and the GGUF tokenizer (MODEL-6).

mod common;

use std::path::Path;

use common::{GgufBuilder, Val, case, check, llama_gguf, random_weights, s, scratch_dir, tiny_config, with_small_tokenizer};
use specdec_models::gguf::{GgufFile, load_llama_gguf};
use specdec_models::hf::{SaveDtype, load_hf_dir};
use specdec_models::{ModelError, Result, Tokenizer, load};

fn parse(bytes: Vec<u8>) -> Result<()> {
    GgufFile::from_bytes("hostile.gguf", bytes).map(|_| ())
}

/// The bytes after the fixed 24-byte header (magic, version, two counts).
fn header(version: u32, n_tensors: u64, n_kv: u64) -> Vec<u8> {
    let mut b = b"GGUF".to_vec();
    b.extend(version.to_le_bytes());
    b.extend(n_tensors.to_le_bytes());
    b.extend(n_kv.to_le_bytes());
    b
}

fn tiny_llama() -> GgufBuilder {
    llama_gguf(&random_weights(tiny_config(true), 7))
}

fn load_bytes(b: &GgufBuilder) -> Result<()> {
    let g = GgufFile::from_bytes("hostile.gguf", b.build())?;
    specdec_models::gguf::llama_weights(&g).map(|_| ())
}

/// MODEL-3, MODEL-16: GGUF headers, metadata and tensor tables.
#[test]
fn hostile_gguf_headers() {
    let ok = tiny_llama();
    let q6k = tiny_llama();
    let mut cases = vec![
        case("wrong magic", "BadMagic", &["hostile.gguf", "GGUX"], || {
            let mut b = header(3, 0, 0);
            b[3] = b'X';
            parse(b)
        }),
        case("version 1", "UnsupportedVersion", &["version 1"], || parse(header(1, 0, 0))),
        case("version 99", "UnsupportedVersion", &["version 99"], || parse(header(99, 0, 0))),
        case("tensor count u64::MAX", "HeaderTooLarge", &["tensor_count", &u64::MAX.to_string()], || parse(header(3, u64::MAX, 0))),
        case("tensor count 2^40", "HeaderTooLarge", &["tensor_count", "1099511627776"], || parse(header(3, 1 << 40, 0))),
        case("kv count u64::MAX", "HeaderTooLarge", &["metadata_kv_count"], || parse(header(3, 0, u64::MAX))),
        case("kv count 2^40", "HeaderTooLarge", &["metadata_kv_count", "1099511627776"], || parse(header(3, 0, 1 << 40))),
        case("key length beyond the file", "HeaderTooLarge", &["metadata key #0", "1099511627776"], || {
            let mut b = header(3, 0, 1);
            b.extend((1u64 << 40).to_le_bytes());
            b.extend([0u8; 16]);
            parse(b)
        }),
        case("string value length beyond the file", "HeaderTooLarge", &["general.name"], || {
            let mut b = header(3, 0, 1);
            b.extend(12u64.to_le_bytes());
            b.extend(b"general.name");
            b.extend(8u32.to_le_bytes());
            b.extend(u64::MAX.to_le_bytes());
            parse(b)
        }),
        case("array count beyond the file", "HeaderTooLarge", &["tokenizer.ggml.tokens"], || {
            parse(GgufBuilder::default().kv("tokenizer.ggml.tokens", Val::Raw(9, [8u32.to_le_bytes().as_slice(), &(1u64 << 40).to_le_bytes()].concat())).build())
        }),
        case("unknown value type", "InvalidField", &["general.x", "type 13"], || parse(GgufBuilder::default().kv("general.x", Val::Raw(13, vec![0; 8])).build())),
        case("bool byte 2", "InvalidField", &["general.flag"], || parse(GgufBuilder::default().kv("general.flag", Val::Raw(7, vec![2])).build())),
        case("arrays nested 9 deep", "InvalidField", &["general.deep", "nested"], || {
            let mut v = [0u32.to_le_bytes().as_slice(), &0u64.to_le_bytes()].concat();
            for _ in 0..9 {
                v = [9u32.to_le_bytes().as_slice(), &1u64.to_le_bytes(), &v].concat();
            }
            parse(GgufBuilder::default().kv("general.deep", Val::Raw(9, v)).build())
        }),
        case("duplicate key", "InvalidField", &["general.name", "duplicate"], || {
            let mut b = GgufBuilder::default().kv("general.name", s("a"));
            b.kvs.push(("general.name".into(), s("b")));
            parse(b.build())
        }),
        case("string not UTF-8", "InvalidField", &["general.name", "UTF-8"], || {
            parse(GgufBuilder::default().kv("general.name", Val::Raw(8, [2u64.to_le_bytes().as_slice(), &[0xff, 0xfe]].concat())).build())
        }),
        case("alignment not a power of two", "InvalidField", &["general.alignment"], || parse(GgufBuilder::default().kv("general.alignment", Val::U32(24)).build())),
        case("five dimensions", "InvalidField", &["tensor `t` n_dims", "5"], || parse(GgufBuilder::default().tensor("t", &[1, 1, 1, 1, 1], 0, vec![0; 4]).build())),
        case("zero dimension", "InvalidField", &["tensor `t` dims"], || parse(GgufBuilder::default().tensor("t", &[4, 0], 0, vec![]).build())),
        case("element count overflows", "InvalidField", &["tensor `t` dims", "overflows"], || parse(GgufBuilder::default().tensor("t", &[1 << 32, 1 << 32, 1 << 32], 0, vec![]).build())),
        case("row not a whole number of blocks", "InvalidField", &["tensor `t` dims", "Q8_0"], || parse(GgufBuilder::default().tensor("t", &[16], 8, vec![0; 34]).build())),
        case("unknown ggml type id", "UnsupportedTensorType", &["`t`", "unknown ggml type 99"], || parse(GgufBuilder::default().tensor("t", &[4], 99, vec![0; 16]).build())),
        case("tensor data runs past the end", "Truncated", &["tensor `t` data"], || {
            let mut b = GgufBuilder::default().tensor("t", &[8], 0, vec![0; 32]);
            b.tensors[0].data.truncate(16);
            parse(b.build())
        }),
        case("tensor offset beyond the file", "Truncated", &["tensor `t` data"], || {
            let mut b = GgufBuilder::default().tensor("t", &[8], 0, vec![0; 32]);
            b.tensors[0].offset = Some(1 << 40);
            parse(b.build())
        }),
        case("tensor offset at u64::MAX - 31", "Truncated", &["tensor `t` data"], || {
            let mut b = GgufBuilder::default().tensor("t", &[8], 0, vec![0; 32]);
            b.tensors[0].offset = Some(u64::MAX - 31);
            parse(b.build())
        }),
        case("misaligned tensor offset", "InvalidField", &["tensor `t` offset", "alignment"], || {
            let mut b = GgufBuilder::default().tensor("t", &[8], 0, vec![0; 64]);
            b.tensors[0].offset = Some(4);
            parse(b.build())
        }),
        case("duplicate tensor", "InvalidField", &["`t`", "duplicate"], || parse(GgufBuilder::default().tensor("t", &[8], 0, vec![0; 32]).tensor("t", &[8], 0, vec![0; 32]).build())),
        // The llama loader (MODEL-3, MODEL-4).
        case("Q6_K tensor", "UnsupportedTensorType", &["blk.0.ffn_up.weight", "Q6_K"], move || {
            let mut b = q6k.clone();
            *b.tensor_mut("blk.0.ffn_up.weight") = q6k_tensor("blk.0.ffn_up.weight");
            GgufFile::from_bytes("q6k.gguf", b.build())?.tensor_f32("blk.0.ffn_up.weight").map(|_| ())
        }),
        case("missing tensor", "MissingTensor", &["blk.1.ffn_up.weight"], {
            let b = ok.clone().without_tensor("blk.1.ffn_up.weight");
            move || load_bytes(&b)
        }),
        case("shape contradicting the config", "TensorShape", &["model.layers.0.mlp.gate_proj.weight", "[24, 16]", "[20, 16]"], {
            let b = ok.clone().kv("llama.feed_forward_length", Val::U32(20));
            move || load_bytes(&b)
        }),
        case("q rows contradicting the heads", "TensorShape", &["q_proj"], {
            let mut b = ok.clone();
            let t = b.tensor_mut("blk.0.attn_q.weight");
            t.dims = vec![16, 8];
            t.data.truncate(16 * 8 * 4);
            move || load_bytes(&b)
        }),
        case("rope_freqs with a zero factor", "InvalidField", &["rope_freqs.weight", "factor 1 is 0"], {
            let factors: Vec<u8> = [1.0f32, 0.0, 1.0, 1.0].iter().flat_map(|f| f.to_le_bytes()).collect();
            let b = ok.clone().tensor("rope_freqs.weight", &[4], 0, factors);
            move || load_bytes(&b)
        }),
        case("rope_freqs not one per rotary pair", "InvalidField", &["rope_scaling", "1 factors for"], {
            let b = ok.clone().tensor("rope_freqs.weight", &[1], 0, 2.0f32.to_le_bytes().to_vec());
            move || load_bytes(&b)
        }),
        case("architecture not llama", "InvalidField", &["general.architecture", "gpt2"], {
            let b = ok.clone().kv("general.architecture", s("gpt2"));
            move || load_bytes(&b)
        }),
        case("missing block_count", "MissingField", &["llama.block_count"], {
            let b = ok.clone().without_kv("llama.block_count");
            move || load_bytes(&b)
        }),
        case("block_count as a string", "InvalidField", &["llama.block_count", "string"], {
            let b = ok.clone().kv("llama.block_count", s("2"));
            move || load_bytes(&b)
        }),
        case("zero heads", "InvalidField", &["num_attention_heads"], {
            let b = ok.clone().kv("llama.attention.head_count", Val::U32(0));
            move || load_bytes(&b)
        }),
        case("partial rotary", "InvalidField", &["llama.rope.dimension_count"], {
            let b = ok.clone().kv("llama.rope.dimension_count", Val::U32(2));
            move || load_bytes(&b)
        }),
        case("mixture of experts", "InvalidField", &["llama.expert_count"], {
            let b = ok.clone().kv("llama.expert_count", Val::U32(8));
            move || load_bytes(&b)
        }),
        case("unexpected bias tensor", "InvalidField", &["blk.0.attn_q.bias"], {
            let b = ok.clone().tensor("blk.0.attn_q.bias", &[16], 0, vec![0; 64]);
            move || load_bytes(&b)
        }),
        case("NaN weight", "InvalidField", &["model.norm.weight", "NaN"], {
            let mut b = ok.clone();
            b.tensor_mut("output_norm.weight").data[..4].copy_from_slice(&f32::NAN.to_le_bytes());
            move || load_bytes(&b)
        }),
        case("not a file", "Io", &["no-such.gguf"], || load_llama_gguf("no-such.gguf").map(|_| ())),
    ];
    // The same defects through the file-based entry points name the path.
    let dir = scratch_dir("hostile-open");
    let path = dir.join("bad-magic.gguf");
    std::fs::write(&path, b"GGML\x03\0\0\0").unwrap();
    cases.push(case("bad magic through load()", "BadMagic", &["bad-magic.gguf"], move || load(&path).map(|_| ())));
    let empty = dir.join("empty.gguf");
    std::fs::write(&empty, b"").unwrap();
    cases.push(case("empty file", "Truncated", &["empty.gguf", "magic"], move || GgufFile::open(&empty).map(|_| ())));
    let empty_st = dir.join("empty.safetensors");
    std::fs::write(&empty_st, b"").unwrap();
    cases.push(case("empty safetensors", "Truncated", &["empty.safetensors"], move || specdec_models::hf::SafetensorsFile::open(&empty_st).map(|_| ())));
    check("MODEL-3, MODEL-16: a hostile GGUF file is a typed error naming the file and the field or tensor", cases);
}

/// A Q6_K tensor of one 256-element block (210 bytes), named `name`.
fn q6k_tensor(name: &str) -> common::TensorSpec {
    common::TensorSpec { name: name.to_string(), dims: vec![256], ty: 14, data: vec![0; 210], offset: None }
}

/// MODEL-3, MODEL-16: every prefix of a valid file is rejected as
/// truncated (or, when the cut falls where a count is read, as a count the
/// remaining bytes cannot hold); none panics.
#[test]
fn truncated_at_every_cut() {
    let bytes = tiny_llama().build();
    assert!(GgufFile::from_bytes("whole.gguf", bytes.clone()).is_ok());
    for cut in 0..bytes.len() {
        let err = GgufFile::from_bytes("cut.gguf", bytes[..cut].to_vec()).expect_err("MODEL-16: a prefix must fail");
        assert!(matches!(err.kind(), "Truncated" | "HeaderTooLarge"), "MODEL-16: cut at {cut}: {} {err}", err.kind());
        assert!(err.to_string().contains("cut.gguf"), "MODEL-16: the error names the file: cut at {cut}: {err}");
    }
    // Named cut points land on the field being read.
    let expect = |cut: usize, field: &str| {
        let err = GgufFile::from_bytes("cut.gguf", bytes[..cut].to_vec()).unwrap_err();
        assert_eq!(err.kind(), "Truncated", "MODEL-16: cut at {cut}: {err}");
        assert!(err.to_string().contains(field), "MODEL-16: cut at {cut}: {err} lacks {field}");
    };
    expect(2, "magic");
    expect(6, "version");
    expect(12, "tensor_count");
    expect(20, "metadata_kv_count");
    expect(bytes.len() - 1, "tensor `output_norm.weight` data");
    // With the tokenizer metadata: cuts inside the long string arrays.
    let with_tok = with_small_tokenizer(tiny_llama()).build();
    for cut in (0..with_tok.len()).step_by(97) {
        let err = GgufFile::from_bytes("cut.gguf", with_tok[..cut].to_vec()).unwrap_err();
        assert!(matches!(err.kind(), "Truncated" | "HeaderTooLarge"), "MODEL-16: cut at {cut}: {err}");
    }
}

/// Writes `weights` as an HF directory and returns it.
fn hf_dir(name: &str) -> std::path::PathBuf {
    let dir = scratch_dir(name);
    let w = random_weights(tiny_config(false), 11);
    specdec_models::export::export_hf(&w, None, &dir, SaveDtype::F32).unwrap();
    dir
}

/// A safetensors file from a raw header and data.
fn raw_safetensors(path: &Path, header: &str, data: &[u8]) {
    let mut b = (header.len() as u64).to_le_bytes().to_vec();
    b.extend(header.as_bytes());
    b.extend(data);
    std::fs::write(path, b).unwrap();
}

fn edit_config(dir: &Path, edit: impl FnOnce(&mut serde_json::Map<String, serde_json::Value>)) {
    let path = dir.join("config.json");
    let mut v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    edit(v.as_object_mut().unwrap());
    std::fs::write(&path, v.to_string()).unwrap();
}

/// A directory whose index maps every tensor to shard `shard`.
fn sharded(name: &str, shard: &str) -> std::path::PathBuf {
    let dir = hf_dir(name);
    let st = specdec_models::hf::SafetensorsFile::open(&dir.join("model.safetensors")).unwrap();
    let map: serde_json::Map<String, serde_json::Value> = st.tensors().into_keys().map(|k| (k, serde_json::Value::from(shard))).collect();
    drop(st);
    std::fs::rename(dir.join("model.safetensors"), dir.join("shard-1.safetensors")).unwrap();
    std::fs::write(dir.join("model.safetensors.index.json"), serde_json::json!({"metadata": {}, "weight_map": map}).to_string()).unwrap();
    dir
}

/// MODEL-5, MODEL-16: HF directories: config, safetensors and index defects.
#[test]
fn hostile_hf_dirs() {
    let cases = vec![
        case("header length beyond the file", "HeaderTooLarge", &["model.safetensors", "header length"], || {
            let dir = hf_dir("st-len");
            let path = dir.join("model.safetensors");
            let mut b = std::fs::read(&path).unwrap();
            b[..8].copy_from_slice(&(1u64 << 40).to_le_bytes());
            std::fs::write(&path, b).unwrap();
            load_hf_dir(&dir).map(|_| ())
        }),
        case("file shorter than the length field", "Truncated", &["model.safetensors"], || {
            let dir = hf_dir("st-short");
            std::fs::write(dir.join("model.safetensors"), [1u8, 2, 3]).unwrap();
            load_hf_dir(&dir).map(|_| ())
        }),
        case("header not JSON", "InvalidField", &["model.safetensors", "header"], || {
            let dir = hf_dir("st-json");
            raw_safetensors(&dir.join("model.safetensors"), "{not json", &[]);
            load_hf_dir(&dir).map(|_| ())
        }),
        case("offsets beyond the data", "InvalidField", &["model.safetensors", "header"], || {
            let dir = hf_dir("st-offsets");
            raw_safetensors(&dir.join("model.safetensors"), r#"{"x":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}}"#, &[0; 8]);
            load_hf_dir(&dir).map(|_| ())
        }),
        case("I32 tensor", "UnsupportedTensorType", &["model.embed_tokens.weight", "I32"], || {
            let dir = scratch_dir("st-i32");
            raw_safetensors(&dir.join("x.safetensors"), r#"{"model.embed_tokens.weight":{"dtype":"I32","shape":[2],"data_offsets":[0,8]}}"#, &[0; 8]);
            let st = specdec_models::hf::SafetensorsFile::open(&dir.join("x.safetensors"))?;
            st.tensor_f32("model.embed_tokens.weight").map(|_| ())
        }),
        case("F64 tensor in a model", "UnsupportedTensorType", &["F64"], || {
            let dir = hf_dir("st-f64");
            let cfg = tiny_config(false);
            let n = cfg.vocab_size * cfg.hidden_size;
            let header = format!(r#"{{"model.embed_tokens.weight":{{"dtype":"F64","shape":[{},{}],"data_offsets":[0,{}]}}}}"#, cfg.vocab_size, cfg.hidden_size, n * 8);
            raw_safetensors(&dir.join("model.safetensors"), &header, &vec![0; n * 8]);
            load_hf_dir(&dir).map(|_| ())
        }),
        case("config typo", "InvalidField", &["config.json", "rms_norm_epsilon"], || {
            let dir = hf_dir("cfg-typo");
            edit_config(&dir, |c| {
                c.insert("rms_norm_epsilon".into(), 1e-5.into());
            });
            load_hf_dir(&dir).map(|_| ())
        }),
        case("config zero heads", "InvalidField", &["config.json", "num_attention_heads"], || {
            let dir = hf_dir("cfg-heads");
            edit_config(&dir, |c| {
                c.insert("num_attention_heads".into(), 0.into());
            });
            load_hf_dir(&dir).map(|_| ())
        }),
        case("config missing field", "InvalidField", &["config.json", "hidden_size"], || {
            let dir = hf_dir("cfg-missing");
            edit_config(&dir, |c| {
                c.remove("hidden_size");
            });
            load_hf_dir(&dir).map(|_| ())
        }),
        case("shape contradicting the config", "TensorShape", &["model.layers.0.mlp.gate_proj.weight"], || {
            let dir = hf_dir("cfg-shape");
            edit_config(&dir, |c| {
                c.insert("intermediate_size".into(), 20.into());
            });
            load_hf_dir(&dir).map(|_| ())
        }),
        case("missing lm_head when untied", "MissingTensor", &["lm_head.weight"], || {
            let dir = hf_dir("untied");
            let w = load_hf_dir(&dir)?;
            let named: Vec<_> = w.named().into_iter().filter(|(n, _)| n != "lm_head.weight").collect();
            specdec_models::hf::write_safetensors(dir.join("model.safetensors"), &named, SaveDtype::F32)?;
            load_hf_dir(&dir).map(|_| ())
        }),
        case("unexpected tensor", "InvalidField", &["model.layers.0.self_attn.q_proj.bias"], || {
            let dir = hf_dir("extra");
            let w = load_hf_dir(&dir)?;
            let bias = specdec_models::Matrix::new(vec![16], vec![0.0; 16], "bias").unwrap();
            let mut named = w.named();
            named.push(("model.layers.0.self_attn.q_proj.bias".into(), &bias));
            specdec_models::hf::write_safetensors(dir.join("model.safetensors"), &named, SaveDtype::F32)?;
            load_hf_dir(&dir).map(|_| ())
        }),
        case("index naming ../x", "InvalidField", &["model.safetensors.index.json", "../x"], || load_hf_dir(sharded("dotdot", "../x")).map(|_| ())),
        case("index naming a subfolder", "InvalidField", &["sub/x.safetensors"], || load_hf_dir(sharded("subdir", "sub/x.safetensors")).map(|_| ())),
        case("index naming a missing shard", "Io", &["shard-2.safetensors"], || load_hf_dir(sharded("noshard", "shard-2.safetensors")).map(|_| ())),
        case("index without weight_map", "MissingField", &["weight_map"], || {
            let dir = sharded("nomap", "shard-1.safetensors");
            std::fs::write(dir.join("model.safetensors.index.json"), "{}").unwrap();
            load_hf_dir(&dir).map(|_| ())
        }),
        case("shard lacking a mapped tensor", "MissingTensor", &["shard-1.safetensors", "model.ghost.weight"], || {
            let dir = sharded("ghost", "shard-1.safetensors");
            let path = dir.join("model.safetensors.index.json");
            let mut v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
            v["weight_map"]["model.ghost.weight"] = "shard-1.safetensors".into();
            std::fs::write(&path, v.to_string()).unwrap();
            load_hf_dir(&dir).map(|_| ())
        }),
        case("no weights at all", "Io", &["model.safetensors"], || {
            let dir = hf_dir("noweights");
            std::fs::remove_file(dir.join("model.safetensors")).unwrap();
            load_hf_dir(&dir).map(|_| ())
        }),
    ];
    check("MODEL-5, MODEL-16: a hostile HF directory is a typed error naming the file and the field or tensor", cases);
}

/// MODEL-6, MODEL-16: tokenizer metadata defects.
#[test]
fn hostile_tokenizers() {
    let tok = |b: GgufBuilder| -> Result<()> { Tokenizer::from_gguf(&GgufFile::from_bytes("tok.gguf", b.build())?).map(|_| ()) };
    let base = || with_small_tokenizer(GgufBuilder::default());
    let cases = vec![
        case("sentencepiece model", "Tokenizer", &["tok.gguf", "llama"], move || tok(base().kv("tokenizer.ggml.model", s("llama")))),
        case("unknown pre-tokenizer", "Tokenizer", &["qwen2"], move || tok(base().kv("tokenizer.ggml.pre", s("qwen2")))),
        case("missing tokens", "MissingField", &["tokenizer.ggml.tokens"], move || tok(base().without_kv("tokenizer.ggml.tokens"))),
        case("tokens not strings", "InvalidField", &["tokenizer.ggml.tokens", "array<i32>"], move || tok(base().kv("tokenizer.ggml.tokens", Val::I32Arr(vec![1, 2])))),
        case("bos outside the vocabulary", "InvalidField", &["bos_token_id", "9999"], move || tok(base().kv("tokenizer.ggml.bos_token_id", Val::U32(9999)))),
        case("merge without a space", "InvalidField", &["tokenizer.ggml.merges", "#0"], move || tok(base().kv("tokenizer.ggml.merges", Val::StrArr(vec!["he".into()])))),
        case("merge of unknown tokens", "Tokenizer", &["BPE"], move || tok(base().kv("tokenizer.ggml.merges", Val::StrArr(vec!["x yz".into()])))),
        case("token types of the wrong length", "InvalidField", &["tokenizer.ggml.token_type"], move || tok(base().kv("tokenizer.ggml.token_type", Val::I32Arr(vec![1])))),
        case("duplicate token", "InvalidField", &["tokenizer.ggml.tokens", "twice"], move || {
            let (mut tokens, _, _) = common::small_vocab();
            tokens[5] = tokens[6].clone();
            tok(base().kv("tokenizer.ggml.tokens", Val::StrArr(tokens)))
        }),
        case("add_bos without a bos id", "Tokenizer", &["add_bos_token"], move || tok(base().without_kv("tokenizer.ggml.bos_token_id").kv("tokenizer.ggml.add_bos_token", Val::Bool(true)))),
        case("tokenizer larger than the embedding", "InvalidField", &["vocab_size", "265 tokens"], || {
            let mut small = tiny_config(true);
            small.vocab_size = 200;
            let path = with_small_tokenizer(llama_gguf(&random_weights(small, 3))).write("bigtok");
            load(path).map(|_| ())
        }),
    ];
    check("MODEL-6, MODEL-16: hostile tokenizer metadata is a typed error naming the file and the field", cases);
}

#[test]
fn errors_are_typed_values() {
    // The kind names are the stable contract reports rely on.
    let e = ModelError::MissingTensor { file: "f".into(), tensor: "t".into() };
    assert_eq!(e.kind(), "MissingTensor");
}

/// MODEL-15, MODEL-16: a `tokenizer.json` on which the `tokenizers` crate
/// itself panics (a syntax error where the decoder starts: its deserializer
/// `expect`s; found by the `tokenizer` fuzz target) is a typed error naming the file, never a panic.
#[test]
fn a_tokenizer_json_that_panics_the_tokenizers_crate() {
    let dir = scratch_dir("panicking-tokenizer");
    let json = r#"{"version": "1.0", "added_tokens": [], "normalizer": null, "pre_tokenizer": null,
        "post_processor": null, "decoder": riom,
        "model": {"type": "WordLevel", "vocab": {"[UNK]": 0, "a": 1}, "unk_token": "[UNK]"}}"#;
    std::fs::write(dir.join("tokenizer.json"), json).unwrap();
    let dir2 = dir.clone();
    check("MODEL-15, MODEL-16", vec![case("syntax error in the decoder", "Tokenizer", &["tokenizer.json", "panicked"], move || specdec_models::Tokenizer::from_dir(&dir2).map(|_| ()))]);
}
