//! MODEL-17: each Llama-family architecture's reference forward against HF
//! transformers' own modeling code, on random-weight checkpoints HF wrote
//! (`fixtures/architectures/<case>`, made by `cargo xtask architectures`
//! with `adapters/peers/hf_architectures.py`; nothing downloaded), read
//! through the HF-layout loader; and negative controls: each architecture's
//! addition left out fails by far more than the tolerance.

use std::path::PathBuf;

use serde::Deserialize;
use specdec_models::forward::{ForwardRequest, LogitRows};
use specdec_models::{LlamaWeights, RefModel};

/// How far the f64 reference may lie from HF's logits, relative to each
/// row's largest magnitude: HF run in float64 still normalises (RMSNorm) and
/// builds its rotary tables in float32 inside.
const HF_LOGIT_REL_TOLERANCE: f64 = 1e-5;

#[derive(Deserialize)]
struct HfLogits {
    tokens: Vec<Vec<u32>>,
    logits: Vec<Vec<Vec<f64>>>,
}

fn case_dir(case: &str) -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../fixtures/architectures")).join(case)
}

fn load(case: &str) -> (LlamaWeights, HfLogits) {
    let dir = case_dir(case);
    let loaded = specdec_models::load(&dir).unwrap_or_else(|e| panic!("{case}: {e}"));
    let hf: HfLogits = serde_json::from_str(&std::fs::read_to_string(dir.join("logits.json")).unwrap()).unwrap();
    (loaded.weights, hf)
}

/// The largest relative distance of the reference's logits from HF's, each
/// sequence prefilled alone with every row's logits.
fn distance(w: &LlamaWeights, hf: &HfLogits) -> f64 {
    let model = RefModel::new(w.clone());
    let mut worst = 0.0f64;
    for (tokens, want) in hf.tokens.iter().zip(&hf.logits) {
        let mut cache = model.new_cache(1, 64).unwrap();
        let out = model.forward(&mut cache, &ForwardRequest { tokens: std::slice::from_ref(tokens), logits: LogitRows::All, hidden_layers: &[] }).unwrap();
        for (got, want) in out.logits.chunks(w.config.vocab_size).zip(want) {
            let scale = want.iter().fold(0.0f64, |m, v| m.max(v.abs()));
            let d = got.iter().zip(want).fold(0.0f64, |m, (a, b)| m.max((a - b).abs()));
            worst = worst.max(d / scale);
        }
    }
    worst
}

/// One case: its architecture as loaded, the distance within the tolerance,
/// and, with `break_it` applied to the weights, a distance far beyond it.
fn check(case: &str, model_type: &str, break_it: impl Fn(&mut LlamaWeights)) {
    let (w, hf) = load(case);
    assert_eq!(w.config.model_type, model_type, "{case}");
    let d = distance(&w, &hf);
    assert!(d <= HF_LOGIT_REL_TOLERANCE, "MODEL-17: {case}: the reference is {d:e} from HF transformers' logits");
    let mut broken = w.clone();
    break_it(&mut broken);
    let off = distance(&broken, &hf);
    eprintln!("MODEL-17: {case}: {d:e} from HF transformers' logits; its negative control {off:e}");
    let d = off;
    assert!(d > 100.0 * HF_LOGIT_REL_TOLERANCE, "MODEL-17 negative control: {case} without its addition is only {d:e} from HF");
}

#[test]
fn qwen2_adds_its_qkv_biases() {
    check("qwen2", "qwen2", |w| w.layers.iter_mut().for_each(|l| l.attn.q_bias.as_mut().unwrap().data.fill(0.0)));
}

#[test]
fn qwen3_norms_each_head_of_q_and_k() {
    check("qwen3", "qwen3", |w| w.layers.iter_mut().for_each(|l| l.attn.k_norm.as_mut().unwrap().data.fill(1.0)));
}

#[test]
fn llama3_scales_its_rotary_frequencies() {
    check("llama3", "llama", |w| {
        w.config.ignored.remove("rope_parameters");
    });
}

#[test]
fn mistral_without_a_sliding_window_is_llama() {
    // The negative control: the q/k rows in GGUF's interleaved order, as a
    // loader that forgot MODEL-4's permutation would hold them.
    check("mistral", "mistral", |w| {
        for l in &mut w.layers {
            l.wq = specdec_models::gguf::permute_qk(&l.wq, w.config.num_attention_heads).unwrap();
        }
    });
}

#[test]
fn phi3_splits_its_fused_projections_in_order() {
    // The negative control: gate and up cut from `gate_up_proj` the wrong
    // way round, as a loader that guessed the order would hold them.
    check("phi3", "phi3", |w| {
        for l in &mut w.layers {
            std::mem::swap(&mut l.w_gate, &mut l.w_up);
        }
    });
}

/// MODEL-17: Phi-3's fused tensors are split on load and fused on export:
/// HF's names come back (`qkv_proj`, `gate_up_proj`, so HF loads the export)
/// and the weights round-trip bit for bit; a fused tensor whose rows are not
/// its parts' is refused naming it, before any row is cut.
#[test]
fn phi3_fused_tensors_round_trip_and_are_checked() {
    let (w, _) = load("phi3");
    let dir = std::env::temp_dir().join(format!("specdec-arch-phi3-{}", std::process::id()));
    specdec_models::export::export_hf(&w, None, &dir, specdec_models::hf::SaveDtype::F32).unwrap();
    let names: Vec<String> = specdec_models::hf::HfDir::open(&dir).unwrap().tensor_names().map(str::to_string).collect();
    assert!(names.contains(&"model.layers.1.self_attn.qkv_proj.weight".to_string()) && names.contains(&"model.layers.0.mlp.gate_up_proj.weight".to_string()), "{names:?}");
    assert!(!names.iter().any(|n| n.contains("q_proj") || n.contains("up_proj.") && !n.contains("gate_up")), "{names:?}");
    assert_eq!(specdec_models::load(&dir).unwrap().weights.named(), w.named(), "split, fused, split again");

    let stored = specdec_models::fused::stored_named(&w).unwrap();
    let mut cut: Vec<(String, specdec_models::weights::Matrix)> = stored.iter().map(|(n, m)| (n.clone(), m.as_ref().clone())).collect();
    let qkv = cut.iter_mut().find(|(n, _)| n == "model.layers.0.self_attn.qkv_proj.weight").unwrap();
    let cols = qkv.1.shape[1];
    qkv.1 = specdec_models::weights::Matrix::new(vec![qkv.1.shape[0] - 1, cols], qkv.1.data[cols..].to_vec(), "cut").unwrap();
    let named: Vec<(String, &specdec_models::weights::Matrix)> = cut.iter().map(|(n, m)| (n.clone(), m)).collect();
    specdec_models::hf::write_safetensors(dir.join("model.safetensors"), &named, specdec_models::hf::SaveDtype::F32).unwrap();
    let err = specdec_models::load(&dir).unwrap_err();
    assert!(matches!(err, specdec_models::ModelError::TensorShape { ref tensor, .. } if tensor == "model.layers.0.self_attn.qkv_proj.weight"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// MODEL-3 and MODEL-17 for GGUF: Qwen2's and Qwen3's checkpoints written as
/// llama.cpp names them (`qwen2` / `qwen3`, biases and head norms under
/// `attn_*`, q and k not permuted, Qwen3's head width as `key_length`) load
/// back to the same weights and architecture; Phi-3's (`phi3`) with q/k/v
/// fused as `attn_qkv` and gate/up as `ffn_up`; a `llama` file still has its
/// q/k permutation undone; Llama 3's scaling, which llama.cpp stores as a
/// `rope_freqs` tensor, is refused rather than written without it.
#[test]
fn gguf_files_of_each_architecture_load_back() {
    let dir = std::env::temp_dir().join(format!("specdec-arch-gguf-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for case in ["qwen2", "qwen3", "mistral", "phi3"] {
        let (w, _) = load(case);
        let pieces: Vec<String> = (0..w.config.vocab_size).map(|i| format!("t{i}")).collect();
        let path = dir.join(format!("{case}.gguf"));
        // A neutral `general.name`: llama.cpp keys special-token handling off names like `phi3`.
        specdec_models::gguf::write_llama_gguf(&path, &w, "random weights", &specdec_models::gguf::GgufVocab { pieces: &pieces, bos: 1, eos: 2 }).unwrap();
        let back = specdec_models::gguf::load_llama_gguf(&path).unwrap_or_else(|e| panic!("{case}: {e}"));
        assert_eq!(back.named(), w.named(), "{case}: every tensor back as written");
        let g = specdec_models::gguf::GgufFile::open(&path).unwrap();
        assert_eq!(g.tensor("blk.0.attn_qkv.weight").is_some(), case == "phi3", "{case}: llama.cpp's fused name exactly where HF fuses");
        let want = if case == "mistral" { "llama" } else { case };
        assert_eq!((back.config.model_type.as_str(), back.config.head_dim()), (want, w.config.head_dim()), "{case}");
    }
    let (w, _) = load("llama3");
    let err = specdec_models::gguf::write_llama_gguf(dir.join("llama3.gguf"), &w, "llama3", &specdec_models::gguf::GgufVocab { pieces: &vec![String::new(); 48], bos: 1, eos: 2 }).unwrap_err();
    assert!(err.to_string().contains("rope_freqs"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// MODEL-17's refusals: each config below differs from a shipped case's by
/// one field that would change the forward; each is a typed error naming it.
#[test]
fn configs_that_would_change_the_forward_are_refused() {
    let edit = |case: &str, f: &dyn Fn(&mut serde_json::Value)| {
        let mut v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(case_dir(case).join("config.json")).unwrap()).unwrap();
        f(&mut v);
        specdec_models::LlamaConfig::from_json(&v.to_string(), "config.json").map(|_| ()).map_err(|e| e.to_string())
    };
    type Edit = fn(&mut serde_json::Value);
    let cases: [(&str, Edit, &str); 9] = [
        ("mistral", |v| v["sliding_window"] = 16.into(), "sliding_window"),
        (
            "qwen2",
            |v| {
                v["use_sliding_window"] = true.into();
                v["sliding_window"] = 8.into();
            },
            "sliding_window",
        ),
        ("qwen3", |v| v["layer_types"][1] = "sliding_attention".into(), "layer_types"),
        ("llama3", |v| v["rope_parameters"]["rope_type"] = "yarn".into(), "yarn"),
        ("llama3", |v| v["rope_parameters"]["high_freq_factor"] = 0.5.into(), "high_freq_factor"),
        ("qwen2", |v| v["architectures"] = serde_json::json!(["LlamaForCausalLM"]), "Qwen2ForCausalLM"),
        ("qwen2", |v| v["model_type"] = "gemma".into(), "gemma"),
        // Phi-4-mini's rotary over three quarters of each head, and Phi-3's long-context scaling.
        ("phi3", |v| v["rope_parameters"]["partial_rotary_factor"] = 0.75.into(), "partial_rotary_factor"),
        ("phi3", |v| v["rope_parameters"]["rope_type"] = "longrope".into(), "longrope"),
    ];
    for (case, f, want) in cases {
        let err = edit(case, &f).expect_err(want);
        assert!(err.contains(want), "MODEL-17: {case}: {err}");
    }
    // HF 5 writes the rotary base only in `rope_parameters`: it is read from there.
    edit("qwen2", &|v| v["rope_parameters"]["rope_theta"] = 5e5.into()).unwrap();
}

/// A model of another family (`fixtures/architectures/gpt2`, GPT-2 as HF and
/// llama.cpp's converter wrote it, the model ENGINE-10 checks a server of
/// with nothing from the reference) is refused by the loader in either
/// layout, naming its architecture; its GGUF's tokenizer alone still loads
/// and encodes as the HF checkpoint's tokenizer does, which is all ENGINE-10
/// needs of the model (`--tokenizer`).
#[test]
fn a_model_of_another_family_is_refused_but_its_tokenizer_serves() {
    let dir = case_dir("gpt2");
    let gguf = dir.join("gpt2.llama.cpp-f32.gguf");
    let err = specdec_models::load(&dir).map(|_| ()).unwrap_err().to_string();
    assert!(err.contains("model_type") && err.contains("`gpt2`") && err.contains("GPT2LMHeadModel"), "{err}");
    let err = specdec_models::load(&gguf).map(|_| ()).unwrap_err().to_string();
    assert!(err.contains("general.architecture") && err.contains("`gpt2`"), "{err}");
    let (from_gguf, from_hf) = (specdec_models::Tokenizer::open(&gguf).unwrap(), specdec_models::Tokenizer::open(&dir).unwrap());
    let prompts = std::fs::read_to_string(case_dir("prompts.jsonl")).unwrap();
    for line in prompts.lines() {
        let text = serde_json::from_str::<serde_json::Value>(line).unwrap()["text"].as_str().unwrap().to_string();
        let ids = from_gguf.encode(&text, false).unwrap();
        assert!(!ids.is_empty() && !ids.contains(&0), "{text:?}: the prompts keep to the alphabet");
        assert_eq!(ids, from_hf.encode(&text, false).unwrap(), "{text:?}");
        assert_eq!(from_gguf.decode(&ids, false).unwrap(), text);
    }
    assert_eq!((from_gguf.eos_id(), from_gguf.vocab_size()), (Some(2), 48));
}

/// HF's ids of a text on a checkpoint's tokenizer (`logits.json`).
#[derive(Deserialize)]
struct HfText {
    text: String,
    text_ids: Vec<u32>,
}

/// MODEL-6 on the checkpoints' own tokenizer (a byte-level BPE of their 48
/// ids, one merge): each loads with its model, encodes the stored text to
/// HF's ids (its merge among them, characters outside its alphabet as
/// `<|unk|>`, never dropped), names its special ids, and gives each text id
/// its bytes (what constraints walk): one byte, and the merge's two.
#[test]
fn each_checkpoint_tokenizes_as_hf_does() {
    for case in ["llama3", "mistral", "qwen2", "qwen3", "phi3"] {
        let dir = case_dir(case);
        let loaded = specdec_models::load(&dir).unwrap();
        let tok = loaded.tokenizer.unwrap_or_else(|| panic!("{case}: no tokenizer"));
        let hf: HfText = serde_json::from_str(&std::fs::read_to_string(dir.join("logits.json")).unwrap()).unwrap();
        let ids = tok.encode(&hf.text, false).unwrap();
        assert_eq!(ids, hf.text_ids, "{case}: {:?}", hf.text);
        assert!(ids.contains(&0) && ids.contains(&47), "{case}: the text has characters outside the alphabet, and the merge");
        assert_eq!((tok.unk_id(), tok.bos_id(), tok.eos_id(), tok.vocab_size()), (Some(0), Some(1), Some(2), loaded.weights.config.vocab_size), "{case}");
        let bytes = tok.token_bytes().unwrap();
        assert!(bytes[..3].iter().all(Option::is_none) && bytes[3..47].iter().all(|b| b.as_ref().is_some_and(|b| b.len() == 1)), "{case}: {bytes:?}");
        assert_eq!(bytes[47].as_deref(), Some(&b" t"[..]), "{case}");
        let known: Vec<u32> = ids.iter().copied().take_while(|&i| i != 0).collect();
        let decoded = tok.decode(&known, false).unwrap();
        assert!(decoded.len() > known.len() && hf.text.starts_with(&decoded), "{case}: {decoded:?}");
    }
}

/// MODEL-17 from the GGUFs llama.cpp's own converter wrote of the checkpoints
/// (`<case>/llama.cpp-f32.gguf`, `cargo xtask architectures`; Phi-3's is not
/// among them, the command says why): each reads as the HF checkpoint it
/// came from, its weights bit for bit (llama.cpp permutes a `llama` file's
/// q/k rows and the loader undoes it), its tokenizer giving HF's ids of the
/// text, and so HF's logits; Llama 3's scaling, written as `rope_freqs`
/// factors, within the same tolerance.
#[test]
fn llama_cpp_written_ggufs_read_as_their_checkpoints() {
    // llama.cpp writes Mistral as `llama` (MODEL-17): the same forward.
    for (case, model_type) in [("llama3", "llama"), ("mistral", "llama"), ("qwen2", "qwen2"), ("qwen3", "qwen3")] {
        let dir = case_dir(case);
        let hf = specdec_models::load(&dir).unwrap();
        let gguf = specdec_models::load(dir.join("llama.cpp-f32.gguf")).unwrap_or_else(|e| panic!("{case}: {e}"));
        let (g, h) = (&gguf.weights, &hf.weights);
        assert_eq!(g.config.model_type, model_type, "{case}");
        assert_eq!((g.config.head_dim(), g.config.num_key_value_heads, g.config.rope_theta), (h.config.head_dim(), h.config.num_key_value_heads, h.config.rope_theta), "{case}");
        assert!((g.config.rms_norm_eps - h.config.rms_norm_eps).abs() <= 1e-6 * f64::from(f32::EPSILON), "{case}: GGUF keeps eps as f32");
        assert!(g.embed == h.embed && g.layers == h.layers && g.final_norm == h.final_norm && g.lm_head == h.lm_head, "{case}: weights differ");
        let (hf_logits, text): (HfLogits, HfText) = {
            let json = std::fs::read_to_string(dir.join("logits.json")).unwrap();
            (serde_json::from_str(&json).unwrap(), serde_json::from_str(&json).unwrap())
        };
        let tok = gguf.tokenizer.unwrap_or_else(|| panic!("{case}: no tokenizer in the GGUF"));
        assert_eq!(tok.encode(&text.text, false).unwrap(), text.text_ids, "{case}");
        assert_eq!((tok.bos_id(), tok.eos_id()), (Some(1), Some(2)), "{case}");
        let d = distance(g, &hf_logits);
        eprintln!("MODEL-17: {case}: llama.cpp's GGUF is {d:e} from HF transformers' logits");
        assert!(d <= HF_LOGIT_REL_TOLERANCE, "{case}: {d:e} from HF's logits");
        // Llama 3's scaling arrives as factors, which give HF's frequencies up to f32.
        let (g_rope, h_rope, hd) = (g.config.rope().unwrap(), h.config.rope().unwrap(), h.config.head_dim());
        assert_eq!(g_rope.freq_factors.is_some(), h_rope.llama3.is_some(), "{case}");
        if g_rope.freq_factors.is_some() {
            let dir = std::env::temp_dir().join(format!("specdec-export-freqs-{}", std::process::id()));
            let err = specdec_models::export::export_hf(g, None, &dir, specdec_models::hf::SaveDtype::F32).unwrap_err();
            assert!(err.to_string().contains("rope_freqs") && !dir.exists(), "{case}: factors exported to HF layout: {err}");
        }
        for i in 0..hd / 2 {
            let (a, b) = (g_rope.inv_freq(i, hd), h_rope.inv_freq(i, hd));
            assert!((a - b).abs() <= 1e-6 * b, "{case}: pair {i}: {a} against HF's {b}");
        }
    }
}
