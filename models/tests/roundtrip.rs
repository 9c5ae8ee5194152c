//! Round trips between the layouts: a random llama GGUF (F32, q/k permuted as
//! llama.cpp stores them) loads into HF row order (MODEL-3, MODEL-4),
//! exports to the HF layout and loads back bit-identical (MODEL-5), sharded
//! or not, and `info` describes both without dequantizing (MODEL-6 for the
//! tokenizer part).

mod common;

use common::{assert_same_tensors, llama_gguf, random_weights, scratch_dir, tiny_config, with_small_tokenizer};
use specdec_models::export::export_hf;
use specdec_models::gguf::{GgufFile, load_llama_gguf, unpermute_qk};
use specdec_models::hf::{SaveDtype, load_hf_dir, write_safetensors};
use specdec_models::{LlamaConfig, Matrix, load};

/// The config fields a forward depends on (the GGUF-loaded config adds
/// `hidden_act`, the export adds `torch_dtype`).
fn forward_fields(c: &LlamaConfig) -> (usize, usize, usize, usize, usize, usize, usize, u64, u64, usize, bool) {
    (
        c.vocab_size,
        c.hidden_size,
        c.intermediate_size,
        c.num_hidden_layers,
        c.num_attention_heads,
        c.num_key_value_heads,
        c.head_dim(),
        c.rms_norm_eps.to_bits(),
        c.rope_theta.to_bits(),
        c.max_position_embeddings,
        c.tie_word_embeddings,
    )
}

/// MODEL-3, MODEL-4, MODEL-5: GGUF -> host (HF order) -> HF export -> host.
#[test]
fn gguf_to_hf_and_back_is_exact() {
    for tied in [true, false] {
        let original = random_weights(tiny_config(tied), 42 + u64::from(tied));
        let path = with_small_tokenizer(llama_gguf(&original)).write("rt");

        let loaded = load(&path).unwrap();
        assert_eq!(loaded.format, "gguf");
        assert_eq!(loaded.file_dtypes, vec![("F32".to_string(), original.named().len())]);
        assert_same_tensors(&loaded.weights, &original, "gguf load");
        assert_eq!(forward_fields(&loaded.weights.config), forward_fields(&original.config));
        assert_eq!(loaded.weights.config.tie_word_embeddings, tied);
        assert_eq!((loaded.weights.config.bos_token_id, loaded.weights.config.eos_ids()), (Some(1), vec![2]));

        let dir = scratch_dir("rt-hf");
        export_hf(&loaded.weights, loaded.tokenizer.as_ref(), &dir, SaveDtype::F32).unwrap();
        let back = load(&dir).unwrap();
        assert_eq!(back.format, "hf");
        assert_same_tensors(&back.weights, &original, "hf load");
        assert_eq!(forward_fields(&back.weights.config), forward_fields(&original.config));
        assert_eq!(back.weights.config.torch_dtype.as_deref(), Some("float32"));
        let (t0, t1) = (loaded.tokenizer.unwrap(), back.tokenizer.unwrap());
        for text in ["the the in", "<|im_start|>user\nhi 2024<|im_end|>"] {
            assert_eq!(t0.encode(text, true).unwrap(), t1.encode(text, true).unwrap(), "{text:?}");
        }
        assert_eq!(load_llama_gguf(&path).unwrap(), loaded.weights);
    }
}

/// MODEL-4: the file really holds permuted rows; loading them without the
/// inverse permutation would give different q/k weights.
#[test]
fn gguf_q_k_rows_are_unpermuted() {
    let original = random_weights(tiny_config(true), 5);
    let g = GgufFile::from_bytes("perm.gguf", llama_gguf(&original).build()).unwrap();
    let raw_q = g.tensor_f32("blk.0.attn_q.weight").unwrap();
    let raw_k = g.tensor_f32("blk.0.attn_k.weight").unwrap();
    assert_ne!(raw_q, original.layers[0].wq, "the stored q rows are permuted");
    assert_ne!(raw_k, original.layers[0].wk, "the stored k rows are permuted");
    assert_eq!(unpermute_qk(&raw_q, 4).unwrap(), original.layers[0].wq);
    assert_eq!(unpermute_qk(&raw_k, 2).unwrap(), original.layers[0].wk);
    // v is never permuted.
    assert_eq!(g.tensor_f32("blk.0.attn_v.weight").unwrap(), original.layers[0].wv);
}

/// MODEL-5: F16 and BF16 exports round to nearest even, as torch does.
#[test]
fn half_precision_exports_round() {
    let original = random_weights(tiny_config(false), 9);
    for (dtype, round) in [(SaveDtype::F16, (|x: f32| half::f16::from_f32(x).to_f32()) as fn(f32) -> f32), (SaveDtype::BF16, |x: f32| half::bf16::from_f32(x).to_f32())] {
        let dir = scratch_dir("rt-half");
        export_hf(&original, None, &dir, dtype).unwrap();
        let back = load(&dir).unwrap();
        assert_eq!(back.file_dtypes, vec![(dtype.name().to_string(), original.named().len())]);
        assert_eq!(back.weights.config.torch_dtype.as_deref(), Some(dtype.torch_name()));
        for ((name, a), (_, b)) in original.named().iter().zip(back.weights.named()) {
            let want: Vec<f32> = a.data.iter().map(|&x| round(x)).collect();
            assert_eq!(b.data, want, "{dtype:?} {name}");
        }
    }
}

/// MODEL-5: a sharded directory (index + two shards) loads like one file.
#[test]
fn sharded_directory_loads() {
    let original = random_weights(tiny_config(false), 13);
    let dir = scratch_dir("rt-sharded");
    export_hf(&original, None, &dir, SaveDtype::F32).unwrap();
    std::fs::remove_file(dir.join("model.safetensors")).unwrap();
    let named = original.named();
    let (a, b) = named.split_at(named.len() / 2);
    write_safetensors(dir.join("model-00001-of-00002.safetensors"), a, SaveDtype::F32).unwrap();
    write_safetensors(dir.join("model-00002-of-00002.safetensors"), b, SaveDtype::BF16).unwrap();
    let mut map = serde_json::Map::new();
    for (name, _) in a {
        map.insert(name.clone(), "model-00001-of-00002.safetensors".into());
    }
    for (name, _) in b {
        map.insert(name.clone(), "model-00002-of-00002.safetensors".into());
    }
    std::fs::write(dir.join("model.safetensors.index.json"), serde_json::json!({"metadata": {"total_size": 0}, "weight_map": map}).to_string()).unwrap();
    let back = load_hf_dir(&dir).unwrap();
    for ((name, x), (_, y)) in named.iter().zip(back.named()) {
        let bf16 = b.iter().any(|(n, _)| n == name);
        let want: Vec<f32> = x.data.iter().map(|&v| if bf16 { half::bf16::from_f32(v).to_f32() } else { v }).collect();
        assert_eq!(y.data, want, "{name}");
    }
    let loaded = load(&dir).unwrap();
    assert_eq!(loaded.file_dtypes.len(), 2);
}

/// `info` describes a GGUF file and an HF directory from headers alone.
#[test]
fn info_describes_both_layouts() {
    let original = random_weights(tiny_config(true), 17);
    let path = with_small_tokenizer(llama_gguf(&original)).write("info");
    let i = specdec_models::load::info(&path).unwrap();
    assert_eq!(i["format"], "gguf");
    assert_eq!(i["architecture"], "LlamaForCausalLM");
    assert_eq!((i["num_layers"].as_u64(), i["num_heads"].as_u64(), i["num_kv_heads"].as_u64(), i["head_dim"].as_u64()), (Some(2), Some(4), Some(2), Some(4)));
    assert_eq!(i["tied_embeddings"], true);
    assert_eq!(i["dtypes"]["F32"], original.named().len());
    assert_eq!(i["tokenizer"]["size"], 265);
    assert_eq!(i["tokenizer"]["bos"]["token"], "<|im_start|>");
    assert_eq!(i["tokenizer"]["chat_template"], true);

    let dir = scratch_dir("info-hf");
    let loaded = load(&path).unwrap();
    export_hf(&loaded.weights, loaded.tokenizer.as_ref(), &dir, SaveDtype::F16).unwrap();
    let j = specdec_models::load::info(&dir).unwrap();
    assert_eq!(j["format"], "hf");
    assert_eq!(j["dtypes"]["F16"], original.named().len());
    assert_eq!(j["parameters"], i["parameters"]);
    assert_eq!(j["tokenizer"]["eos"]["id"], 2);
    assert_eq!(j["tokenizer"]["chat_template"], true);
}

/// `write_safetensors` refuses a matrix whose data does not fill its shape;
/// dtype names parse case-insensitively.
#[test]
fn write_checks_shapes() {
    assert_eq!(SaveDtype::parse("BF16").unwrap(), SaveDtype::BF16);
    assert_eq!("float16".parse::<SaveDtype>().unwrap(), SaveDtype::F16);
    assert_eq!(SaveDtype::parse("f8").unwrap_err().kind(), "InvalidInput");
    let mut bad = Matrix::new(vec![2, 3], vec![0.0; 6], "x").unwrap();
    bad.data.pop();
    let e = write_safetensors(scratch_dir("bad-write").join("x.safetensors"), &[("x".into(), &bad)], SaveDtype::F32).unwrap_err();
    assert_eq!(e.kind(), "InvalidInput");
}
