//! Fuzz targets: every reader of untrusted bytes, driven by arbitrary input.
//!
//! Role: case files come from vendors, model files and tokenizers from
//! anywhere, protocol replies from an adapter process in any language. Each
//! target takes raw bytes and must return: an `Err` is a fine outcome, a
//! panic, an abort, a hang or an allocation sized by an unchecked field is a
//! bug. `ngram_index` is differential: it panics when the incremental index
//! and the linear search (NGRAM-2..4) disagree.
//!
//! Invariants: a target touches no shared state (files go to a directory of
//! the process's own), so the AFL++ driver (`src/bin/specdec-fuzz.rs`, built
//! only with the `afl` feature) can call it in a persistent loop; the test
//! `tests/corpus.rs` replays the committed corpus (`corpus/<target>/`)
//! through the same functions in every test run.
//!
//! Targets: case files (parsed, then run on the reference), GGUF (header,
//! config, weights, tokenizer), safetensors, `config.json`,
//! `tokenizer.json`, external-backend reply lines, and the n-gram index
//! after every append. Each reader has one committed seed that loads whole,
//! so the fuzzer starts past the front door. `cargo xtask fuzz` builds the
//! driver and runs each target from its corpus. A crate of its own so that
//! the fuzzer's dependency never enters the libraries.

use std::path::{Path, PathBuf};

use specdec_backend::ReferenceBackend;
use specdec_exec::protocol::{Want, decode_tensor, parse_handshake};
use specdec_models::gguf::{GgufFile, llama_config, llama_weights};
use specdec_models::hf::SafetensorsFile;
use specdec_models::{LlamaConfig, Tokenizer};
use specdec_reference::ngram::{NgramConfig, NgramIndex, NgramPolicy, propose};

/// A fuzz target: arbitrary bytes in, no panic out.
pub type Target = fn(&[u8]);

/// Every target, by the name the driver and the corpus directory use.
pub const TARGETS: [(&str, Target); 7] =
    [("case_file", case_file), ("gguf", gguf), ("safetensors", safetensors), ("config", config), ("tokenizer", tokenizer), ("exec_reply", exec_reply), ("ngram_index", ngram_index)];

/// The target called `name`.
pub fn target(name: &str) -> Option<Target> {
    TARGETS.iter().find(|(n, _)| *n == name).map(|(_, t)| *t)
}

/// A case file (CASE-8): parsed strictly, then every case it holds is run
/// on the reference backend and judged, as `specdec check FILE` does.
pub fn case_file(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let Ok(loaded) = specdec_conformance::case::parse(text, Path::new("fuzz.json")) else { return };
    for case in &loaded.cases {
        let _ = specdec_conformance::suite::check_case(&ReferenceBackend, case);
    }
}

/// A GGUF file (MODEL-16): the header, the Llama config and weights read
/// from it (dequantised), and the tokenizer in its metadata.
pub fn gguf(data: &[u8]) {
    let Ok(g) = GgufFile::from_bytes("fuzz.gguf", data.to_vec()) else { return };
    let _ = llama_config(&g);
    let _ = llama_weights(&g);
    if let Ok(t) = Tokenizer::from_gguf(&g) {
        exercise_tokenizer(&t, data);
    }
}

/// A safetensors file (MODEL-5, MODEL-16): the header, then every tensor
/// read as f32.
pub fn safetensors(data: &[u8]) {
    let path = scratch().join("model.safetensors");
    if std::fs::write(&path, data).is_err() {
        return;
    }
    let Ok(file) = SafetensorsFile::open(&path) else { return };
    let names: Vec<String> = file.tensors().keys().cloned().collect();
    for name in names {
        let _ = file.tensor_f32(&name);
    }
}

/// An HF `config.json` (MODEL-2): parsed, validated, and its tensor shapes
/// derived (the sizes every loader then trusts).
pub fn config(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let Ok(cfg) = LlamaConfig::from_json(text, "config.json") else { return };
    if cfg.validate("config.json").is_ok() {
        let _ = cfg.tensor_shapes();
        let _ = cfg.head_dim();
    }
}

/// A `tokenizer.json` (MODEL-15), loaded as the HF directory loader does,
/// then used to encode and decode.
pub fn tokenizer(data: &[u8]) {
    let dir = scratch();
    if std::fs::write(dir.join("tokenizer.json"), data).is_err() {
        return;
    }
    if let Ok(t) = Tokenizer::from_dir(dir) {
        exercise_tokenizer(&t, data);
    }
}

fn exercise_tokenizer(t: &Tokenizer, data: &[u8]) {
    let text = String::from_utf8_lossy(&data[..data.len().min(64)]).into_owned();
    if let Ok(ids) = t.encode(&format!("Hello, world! {text}"), true) {
        let _ = t.decode(&ids, false);
    }
    // Ids from the input, in range or not: decode must refuse, not panic.
    let ids: Vec<u32> = data.chunks(4).take(16).map(|c| c.iter().fold(0u32, |a, &b| a << 8 | b as u32)).collect();
    let _ = t.decode(&ids, true);
}

/// One reply line of an external backend (PROTO-5, PROTO-6): its envelope,
/// then the handshake fields, and every output decoded as either dtype.
pub fn exec_reply(data: &[u8]) {
    let Ok(line) = std::str::from_utf8(data) else { return };
    for op in ["handshake", "rejection_verify"] {
        let Ok(Ok(fields)) = specdec_exec::parse_reply(op, 0, line) else { continue };
        if op == "handshake" {
            let _ = parse_handshake(&fields);
        } else {
            for (name, value) in &fields {
                let _ = decode_tensor(value, name, Want::Float);
                let _ = decode_tensor(value, name, Want::Int);
            }
        }
    }
}

/// NGRAM-1..5: the incremental index against the linear search after every
/// append. Bytes 0..6 choose the settings (n in 1..=4, k in 1..=8, the
/// policy, an optional `max_model_len`, a vocabulary of 1..=8 so n-grams
/// repeat); each further byte is a token, or, when its top bit is set, an
/// append of the next few bytes in one call.
pub fn ngram_index(data: &[u8]) {
    let Some((head, rest)) = data.split_first_chunk::<6>() else { return };
    let ngram_min = 1 + head[0] as usize % 4;
    let cfg = NgramConfig {
        ngram_min,
        ngram_max: ngram_min + head[1] as usize % 4,
        k: 1 + head[2] as usize % 8,
        policy: if head[3] % 2 == 0 { NgramPolicy::LargestNMostRecent } else { NgramPolicy::LargestNEarliest },
        max_model_len: (head[4] >= 128).then_some(1 + head[4] as usize % 64),
    };
    let vocab = 1 + head[5] as usize % 8;
    let Ok(mut index) = NgramIndex::new(cfg, vocab) else { return };
    let mut bytes = rest.iter();
    while let Some(&b) = bytes.next() {
        let tokens: Vec<i64> = if b & 0x80 != 0 { bytes.by_ref().take(1 + (b & 7) as usize).map(|&t| (t as usize % vocab) as i64).collect() } else { vec![(b as usize % vocab) as i64] };
        if index.extend(&tokens).is_err() {
            return;
        }
        let (got, want) = (index.propose(), propose(index.context(), vocab, &cfg));
        assert_eq!(got, want, "NGRAM-2..4: the index and the linear search disagree on {:?} with {cfg:?}", index.context());
    }
}

/// A directory of this process's own for targets that must read from disk,
/// created once (the persistent loop calls a target millions of times).
fn scratch() -> &'static Path {
    static DIR: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    DIR.get_or_init(|| {
        let dir = std::env::temp_dir().join(format!("specdec-fuzz-{}", std::process::id()));
        let _ = std::fs::create_dir_all(&dir);
        dir
    })
}
