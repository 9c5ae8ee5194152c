//! Replays the committed fuzz corpus (`fuzz/corpus/<target>/`) through every
//! target: the seeds, and each crash the fuzzer found once it was fixed. A
//! panic here is a regression; a target without seeds is a failure too.

use std::path::Path;

#[test]
fn every_target_replays_its_corpus() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("corpus");
    for (name, target) in specdec_fuzz::TARGETS {
        let dir = root.join(name);
        let mut files: Vec<_> = std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())).map(|e| e.expect("readable entry").path()).collect();
        files.sort();
        assert!(files.len() >= 2, "target {name}: only {} corpus files in {}", files.len(), dir.display());
        for file in files {
            let data = std::fs::read(&file).expect("readable corpus file");
            if let Err(panic) = std::panic::catch_unwind(|| target(&data)) {
                let msg = panic.downcast_ref::<String>().cloned().or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string())).unwrap_or_default();
                panic!("target {name} panicked on {}: {msg}", file.display());
            }
        }
    }
}

fn seed(target: &str, name: &str) -> Vec<u8> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("corpus").join(target).join(name);
    std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

#[test]
fn the_seeds_reach_past_the_front_door() {
    // A corpus of rejected inputs would fuzz only the first check: one valid
    // seed per reader, so mutations start from inputs that load whole.
    let g = specdec_models::gguf::GgufFile::from_bytes("seed", seed("gguf", "seed-tiny-llama.gguf")).expect("the tiny GGUF parses");
    specdec_models::gguf::llama_weights(&g).expect("and its weights load");
    let g = specdec_models::gguf::GgufFile::from_bytes("seed", seed("gguf", "seed-tokenizer-only.gguf")).expect("the tokenizer GGUF parses");
    specdec_models::Tokenizer::from_gguf(&g).expect("and its tokenizer loads");

    let text = String::from_utf8(seed("config", "seed-tiny.json")).expect("UTF-8");
    specdec_models::LlamaConfig::from_json(&text, "seed").expect("parses").validate("seed").expect("validates");

    let dir = std::env::temp_dir().join(format!("specdec-fuzz-seeds-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("scratch dir");
    std::fs::write(dir.join("model.safetensors"), seed("safetensors", "seed-mixed.safetensors")).expect("write");
    let st = specdec_models::hf::SafetensorsFile::open(&dir.join("model.safetensors")).expect("the safetensors seed opens");
    for name in ["model.embed_tokens.weight", "lm_head.weight", "model.norm.weight"] {
        st.tensor_f32(name).expect("readable").expect("present");
    }
    std::fs::write(dir.join("tokenizer.json"), seed("tokenizer", "seed-smollm2-300.json")).expect("write");
    let t = specdec_models::Tokenizer::from_dir(&dir).expect("the trimmed tokenizer loads");
    assert!(!t.encode("Hello, world!", false).expect("encodes").is_empty());
    let _ = std::fs::remove_dir_all(&dir);

    let line = String::from_utf8(seed("exec_reply", "seed-handshake.json")).expect("UTF-8");
    let fields = specdec_exec::parse_reply("handshake", 0, &line).expect("well formed").expect("not an error reply");
    specdec_exec::protocol::parse_handshake(&fields).expect("a valid handshake");

    let text = String::from_utf8(seed("case_file", "seed-minimal.json")).expect("UTF-8");
    let loaded = specdec_conformance::case::parse(&text, Path::new("seed-minimal.json")).expect("a case file");
    assert!(loaded.errors.is_empty() && loaded.cases.len() == 1, "{:?}", loaded.errors);
    let verdict = specdec_conformance::suite::check_case(&specdec_backend::ReferenceBackend, &loaded.cases[0]);
    assert!(matches!(verdict, specdec_conformance::compare::Verdict::Pass { .. }), "{verdict:?}");
}
