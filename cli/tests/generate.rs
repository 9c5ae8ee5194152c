//! `specdec generate`, `specdec model` and `specdec draft-data` as a user
//! runs them (MODEL-5, MODEL-15, MODEL-16). The SmolLM2 tests need `SPECDEC_SMOLLM2_GGUF` and
//! `SPECDEC_SMOLLM2_HF`, which `cargo xtask test` sets; without them they
//! print why and return (plain `cargo test` has no model to run).

use std::path::PathBuf;
use std::process::{Command, Output};

fn specdec(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_specdec")).args(args).output().expect("the specdec binary runs")
}

fn smollm2() -> Option<(String, String)> {
    let gguf = std::env::var("SPECDEC_SMOLLM2_GGUF").ok().filter(|p| PathBuf::from(p).is_file());
    let hf = std::env::var("SPECDEC_SMOLLM2_HF").ok().filter(|p| PathBuf::from(p).is_dir());
    match (gguf, hf) {
        (Some(g), Some(h)) => Some((g, h)),
        _ => {
            eprintln!("SmolLM2 not given (SPECDEC_SMOLLM2_GGUF / SPECDEC_SMOLLM2_HF): `cargo xtask test` runs this");
            None
        }
    }
}

fn json(out: &Output) -> serde_json::Value {
    assert!(out.status.success(), "exit {:?}: {}", out.status, String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).expect("--json prints one JSON object")
}

/// MODEL-15: greedy is deterministic, identical from the GGUF and its HF
/// export, and says something sensible about France.
#[test]
fn greedy_from_gguf_and_export_agree() {
    let Some((gguf, hf)) = smollm2() else { return };
    let run = |model: &str| json(&specdec(&["generate", "--model", model, "--backend", "ndarray", "--prompt", "The capital of France is", "--max-tokens", "8", "--temperature", "0", "--json"]));
    let (a, b) = (run(&gguf), run(&hf));
    assert_eq!(a["token_ids"], b["token_ids"], "MODEL-15: greedy decoding: GGUF and HF export must give the same tokens");
    assert_eq!(a["prompt_ids"], b["prompt_ids"]);
    assert!(a["text"].as_str().unwrap().contains("Paris"), "{}", a["text"]);
    assert_eq!(a["finish_reason"], "length");
    assert_eq!(a["token_ids"].as_array().unwrap().len(), 8, "MODEL-15: `--max-tokens` tokens");
}

/// MODEL-15: sampling is reproducible from the seed, and the seed matters.
#[test]
fn sampling_follows_the_seed() {
    let Some((gguf, _)) = smollm2() else { return };
    let run = |seed: &str| {
        json(&specdec(&[
            "generate",
            "--model",
            &gguf,
            "--backend",
            "ndarray",
            "--prompt",
            "Tell me a story.",
            "--chat",
            "--max-tokens",
            "6",
            "--temperature",
            "1.5",
            "--top-k",
            "50",
            "--top-p",
            "0.95",
            "--seed",
            seed,
            "--json",
        ]))["token_ids"]
            .clone()
    };
    let first = run("7");
    assert_eq!(first, run("7"), "MODEL-15: a sampled run is reproducible from `--seed`");
    let others: Vec<_> = ["8", "9", "10"].iter().map(|s| run(s)).collect();
    assert!(others.iter().any(|o| *o != first), "MODEL-15: four seeds gave one output: the seed is not used");
}

/// DECODE-2, DECODE-8: at temperature 0 the tokens are the same whatever
/// `--proposer`; `--compare` checks them against plain decoding and the JSON
/// carries the metrics.
#[test]
fn every_proposer_gives_the_plain_greedy_tokens() {
    let Some((gguf, _)) = smollm2() else { return };
    let prompt = "Repeat after me exactly: one two three four five. One two three four five. One two three";
    let run = |proposer: &str| {
        json(&specdec(&[
            "generate",
            "--model",
            &gguf,
            "--backend",
            "candle-cpu",
            "--proposer",
            proposer,
            "--k",
            "3",
            "--prompt",
            prompt,
            "--max-tokens",
            "12",
            "--temperature",
            "0",
            "--compare",
            "--json",
        ]))
    };
    let plain = run("none");
    assert_eq!(plain["proposer"], "none");
    assert_eq!(plain["token_ids"].as_array().unwrap().len(), 12);
    for p in ["ngram", "early-exit:6"] {
        let out = run(p);
        assert_eq!(out["token_ids"], plain["token_ids"], "{p}");
        assert_eq!(out["compare"]["identical_tokens"], true, "{p}");
        assert!(out["steps"].as_u64().unwrap() >= 1 && out["tokens_per_step"].as_f64().unwrap() >= 1.0, "DECODE-8: {p}: {out}");
        for key in ["acceptance", "mean_accepted", "acceptance_per_position", "timings"] {
            assert!(!out[key].is_null(), "DECODE-8: {p}: no `{key}` in {out}");
        }
    }
    let n = run("ngram");
    assert!(n["accepted"].as_u64().unwrap() > 0, "n-gram drafts on a repetitive prompt were never accepted: {n}");
    // Greedy runs default to the pay-off controller, which counts its steps by k.
    assert_eq!(n["controller"], "payoff", "CTRL-7: {n}");
    let by_k: u64 = n["steps_by_k"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap()).sum();
    assert_eq!(by_k, n["steps"].as_u64().unwrap(), "every step counted once: {n}");
    // A malformed proposer name is an error, not a plain run.
    let bad = specdec(&["generate", "--model", &gguf, "--proposer", "draft:", "--prompt", "x"]);
    assert!(!bad.status.success());
}

/// CONSTRAIN-3 on SmolLM2 from the command line: `--regex` and
/// `--json-schema` outputs keep their constraint, with n-gram speculation
/// giving plain decoding's tokens (`--compare` fails otherwise); bad
/// patterns and schemas are refused before the model loads.
#[test]
fn constrained_generation_keeps_its_constraint() {
    let Some((gguf, _)) = smollm2() else { return };
    let dir = std::env::temp_dir().join(format!("specdec-generate-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let schema = dir.join("schema.json");
    std::fs::write(&schema, r#"{"type": "object", "properties": {"city": {"type": "string", "maxLength": 20}, "days": {"type": "integer"}}, "required": ["city", "days"]}"#).unwrap();
    let base = ["generate", "--model", gguf.as_str(), "--backend", "ndarray", "--chat", "--proposer", "ngram", "--k", "3", "--temperature", "0", "--compare", "--json", "--max-tokens", "40"];
    let schema_flag = schema.to_str().unwrap();
    for (flag, value, prompt) in
        [("--regex", "(yes|no), because [a-z ]{1,30}\\.", "Is the sky blue? Answer yes or no and say why."), ("--json-schema", schema_flag, "Weather in Paris for 3 days, as JSON with city and days.")]
    {
        let out = json(&specdec(&[&base[..], &[flag, value, "--prompt", prompt]].concat()));
        assert_eq!(out["compare"]["identical_tokens"], true, "CONSTRAIN-3: {flag}: {out}");
        assert_eq!(out["constraint"]["every_token_allowed"], true, "CONSTRAIN-4: {flag}: {out}");
        if out["finish_reason"] == "eos" {
            assert_eq!(out["constraint"]["matches"], true, "CONSTRAIN-2: {flag}: {out}");
        }
        if flag == "--json-schema" {
            let v: serde_json::Value = serde_json::from_str(out["text"].as_str().unwrap()).unwrap_or_else(|e| panic!("CONSTRAIN-5: not JSON ({e}): {out}"));
            assert!(v["city"].is_string() && v["days"].is_i64(), "CONSTRAIN-5: {v}");
        }
    }
    std::fs::write(&schema, r#"{"type": "string", "format": "date"}"#).unwrap();
    for (args, needle) in [(vec!["--regex", "(a"], "--regex"), (vec!["--json-schema", schema_flag], "format"), (vec!["--regex", "a", "--json-schema", schema_flag], "only one of")] {
        let out = specdec(&[&["generate", "--model", gguf.as_str(), "--prompt", "x"][..], &args].concat());
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.code() == Some(2) && err.contains(needle) && !err.contains("panicked"), "{args:?}: {err}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// MODEL-17: `generate` takes the checkpoints HF wrote of each architecture
/// (their own tokenizer: a byte-level alphabet of 48 ids) on candle and
/// ndarray: n-gram speculation gives plain decoding's tokens, and a regex
/// and a GBNF grammar keep their constraint, a recursive one too.
#[test]
fn every_architecture_checkpoint_generates_from_its_own_tokenizer() {
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/../fixtures/architectures");
    let dir = std::env::temp_dir().join(format!("specdec-generate-arch-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let grammar = dir.join("words.gbnf");
    let mut ended = 0;
    std::fs::write(&grammar, "# a short sentence\nroot ::= word (\" \" word){0,3} \".\"\nword ::= [a-z]{1,8}\n").unwrap();
    for case in ["llama3", "mistral", "qwen2", "qwen3", "phi3"] {
        for backend in ["ndarray", "candle-cpu"] {
            let model = format!("{root}/{case}");
            let base = ["generate", "--model", model.as_str(), "--backend", backend, "--proposer", "ngram", "--k", "3", "--temperature", "0", "--compare", "--json", "--max-tokens", "20"];
            let out = json(&specdec(&[&base[..], &["--prompt", "one two. one two. one two."]].concat()));
            assert_eq!(out["compare"]["identical_tokens"], true, "{case} on {backend}: {out}");
            assert!(!out["token_ids"].as_array().unwrap().is_empty(), "{case} on {backend}: {out}");
            for flag in [["--regex", "[a-z ]{2,12}\\."], ["--grammar", grammar.to_str().unwrap()]] {
                let out = json(&specdec(&[&base[..], &flag, &["--prompt", "the cat sat."]].concat()));
                assert_eq!(out["constraint"]["every_token_allowed"], true, "CONSTRAIN-4: {case} on {backend} {flag:?}: {out}");
                assert_eq!(out["compare"]["identical_tokens"], true, "CONSTRAIN-3: {case} on {backend} {flag:?}: {out}");
                if out["finish_reason"] == "eos" {
                    assert_eq!(out["constraint"]["matches"], true, "CONSTRAIN-2: {case} on {backend} {flag:?}: {out}");
                    ended += 1;
                }
            }
        }
    }
    assert!(ended > 0, "CONSTRAIN-2: no constrained output ended at eos, so none was checked to match");
    // A recursive grammar (brackets around brackets): its constraint kept,
    // speculation on equal to off.
    std::fs::write(&grammar, "root ::= \"(\" root \")\" | [a-z]{1,4}").unwrap();
    let base = ["generate", "--model", &format!("{root}/qwen3"), "--backend", "ndarray", "--proposer", "ngram", "--k", "3", "--temperature", "0", "--compare", "--json", "--max-tokens", "12"];
    let out = json(&specdec(&[&base[..], &["--prompt", "((x)) ((y))", "--grammar", grammar.to_str().unwrap()]].concat()));
    assert_eq!(out["constraint"]["every_token_allowed"], true, "CONSTRAIN-4, a recursive grammar: {out}");
    assert_eq!(out["compare"]["identical_tokens"], true, "CONSTRAIN-3, a recursive grammar: {out}");
    std::fs::write(&grammar, "root ::= \"(\" root \")\"").unwrap();
    let out = specdec(&["generate", "--model", &format!("{root}/qwen3"), "--prompt", "x", "--grammar", grammar.to_str().unwrap()]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.code() == Some(2) && err.contains("--grammar") && err.contains("no text matches"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Bad arguments and bad files are errors with a message, never a panic.
#[test]
fn bad_input_is_refused() {
    for (args, needle) in [(vec!["generate", "--model", "no/such/file.gguf", "--prompt", "x"], "no/such/file.gguf"), (vec!["model", "info", "no/such/dir"], "no/such/dir")] {
        let out = specdec(&args);
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(needle) && !err.contains("panicked"), "{args:?}: {err}");
    }
    let Some((gguf, _)) = smollm2() else { return };
    for (flag, value) in [("--temperature", "-1"), ("--temperature", "nan"), ("--top-p", "0"), ("--top-p", "1.5"), ("--max-tokens", "0"), ("--controller", "sometimes")] {
        let out = specdec(&["generate", "--model", &gguf, "--prompt", "x", &format!("{flag}={value}")]);
        assert_eq!(out.status.code(), Some(2), "{flag} {value}");
        assert!(String::from_utf8_lossy(&out.stderr).contains(flag), "{flag} {value}: the error names the flag");
    }
    let out = specdec(&["generate", "--model", &gguf, "--prompt", "x", "--max-tokens", "9000"]);
    assert_eq!(out.status.code(), Some(2), "beyond the model's positions");
}

/// MODEL-5: `model info` names the architecture and sizes; `model export`
/// writes a directory that loads.
#[test]
fn info_and_export() {
    let Some((gguf, _)) = smollm2() else { return };
    let info = json(&specdec(&["model", "info", &gguf, "--json"]));
    assert_eq!(info["num_layers"], 30);
    assert_eq!(info["vocab_size"], 49152);
    let dir = std::env::temp_dir().join(format!("specdec-export-test-{}", std::process::id()));
    let out = specdec(&["model", "export", &gguf, dir.to_str().unwrap(), "--dtype", "bf16"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let info = json(&specdec(&["model", "info", dir.to_str().unwrap(), "--json"]));
    assert_eq!(info["hidden_size"], 576);
    let _ = std::fs::remove_dir_all(&dir);
}

/// MODEL-12: a tiny preset written in HF layout loads back to the generator's weights,
/// and its seeded DFlash drafter (DRAFT-6) to the section's.
#[test]
fn tiny_models_are_written_in_hf_layout() {
    let dir = std::env::temp_dir().join(format!("specdec-tiny-test-{}", std::process::id()));
    let out = specdec(&["model", "tiny", "--preset", "tiny-v12-l2", dir.to_str().unwrap(), "--dflash"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let loaded = specdec_models::load(&dir).expect("the written directory loads");
    let want = specdec_models::tiny::TinySpec::preset("tiny-v12-l2").unwrap().weights().unwrap();
    assert_eq!(loaded.weights.named(), want.named(), "bit-identical f32 weights");
    // DRAFT-6: `--dflash` writes the end-to-end section's seeded drafter, which loads back bit for bit.
    let draft = specdec_models::load_dflash(dir.join("dflash-seeded"), &want.config).expect("the drafter loads against its target");
    let seeded = specdec_conformance::e2e_section::seeded_dflash(&want).unwrap();
    assert_eq!(draft.config(), seeded.config());
    assert_eq!(draft.weights().named(), seeded.weights().named(), "bit-identical f32 drafter");
    let out = specdec(&["model", "tiny", "--preset", "tiny-v99", dir.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("tiny-v16-l1"), "the error lists the presets");
    let _ = std::fs::remove_dir_all(&dir);
}

/// `specdec draft-data --synthesize`: training prompts written by the target
/// itself, as chat prompts of the training split numbered after the file's
/// ids, next to the file's own; the held-out split is never synthesised.
#[test]
fn draft_data_adds_prompts_the_target_writes() {
    let Some((gguf, _)) = smollm2() else { return };
    let dir = std::env::temp_dir().join(format!("specdec-draft-data-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let prompts = dir.join("prompts.json");
    let file = serde_json::json!({"about": "test", "prompts": [
        {"id": 5, "split": "train", "kind": "chat", "chat": true, "text": "Name a colour."},
        {"id": 9, "split": "heldout", "kind": "chat", "chat": true, "text": "Name a fruit."}]});
    std::fs::write(&prompts, file.to_string()).unwrap();
    let out = dir.join("data");
    let (prompts, out_s, gguf) = (prompts.to_str().unwrap(), out.to_str().unwrap(), gguf.as_str());
    let run = |split: &str| {
        specdec(&[
            "draft-data",
            "--model",
            gguf,
            "--backend",
            "ndarray",
            "--prompts",
            prompts,
            "--split",
            split,
            "--synthesize",
            "4",
            "--seed",
            "11",
            "--layers",
            "1",
            "--max-tokens",
            "2",
            "--batch",
            "4",
            "--out",
            out_s,
        ])
    };
    let refused = run("heldout");
    assert!(!refused.status.success() && String::from_utf8_lossy(&refused.stderr).contains("held-out split is the file's own"), "{}", String::from_utf8_lossy(&refused.stderr));
    let made = run("train");
    assert!(made.status.success(), "{}", String::from_utf8_lossy(&made.stderr));
    let data: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(out.join("data.json")).unwrap()).unwrap();
    std::fs::remove_dir_all(&dir).ok();
    let seqs = data["sequences"].as_array().unwrap();
    assert_eq!((seqs[0]["prompt_id"].as_u64(), seqs[0]["kind"].as_str()), (Some(5), Some("chat")), "the file's training prompt comes first");
    let synthetic = &seqs[1..];
    assert!(!synthetic.is_empty(), "at least one of 4 sampled user messages is kept: {}", String::from_utf8_lossy(&made.stdout));
    let tokens = |s: &serde_json::Value| s["tokens"].as_array().unwrap().iter().map(|t| t.as_u64().unwrap()).collect::<Vec<_>>();
    let file_prompt = &tokens(&seqs[0])[..seqs[0]["prompt_len"].as_u64().unwrap() as usize];
    for (i, s) in synthetic.iter().enumerate() {
        assert_eq!((s["kind"].as_str(), s["prompt_id"].as_u64()), (Some("synthetic"), Some(10 + i as u64)), "numbered after the file's largest id");
        let prompt = &tokens(s)[..s["prompt_len"].as_u64().unwrap() as usize];
        let shared = prompt.iter().zip(file_prompt).take_while(|(a, b)| a == b).count();
        assert!(shared >= 10 && prompt.len() > shared, "a chat prompt: the system turn and user header ({shared} shared tokens) then a message of its own");
        assert_eq!(prompt[prompt.len() - 3..], file_prompt[file_prompt.len() - 3..], "ending with the assistant header");
    }
}
