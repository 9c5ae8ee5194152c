//! `specdec engine-check` as a vendor runs it (ENGINE-2, PROTO-9): specdec's
//! own decoder in process and as a child process speaking the exec
//! protocol, through every engine check; a failing engine fails the exit
//! status and each failure prints the command that reruns it.

use std::process::{Command, Output};

fn specdec(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_specdec")).args(args).output().expect("the specdec binary runs")
}

fn text(out: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
}

#[test]
fn the_decoder_passes_in_process_and_over_the_exec_protocol() {
    let adapter = format!("exec:{} engine-adapter --backend reference --proposer draft:self --k 3", env!("CARGO_BIN_EXE_specdec"));
    let dir = std::env::temp_dir().join(format!("specdec-engine-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for engine in ["decoder:reference:ngram", adapter.as_str()] {
        let report = dir.join("engine.json");
        let out = specdec(&["engine-check", "--engine", engine, "--report", report.to_str().unwrap()]);
        let t = text(&out);
        assert!(out.status.success(), "ENGINE-2: {engine}: {t}");
        assert!(t.contains("engine checks: PASS") && t.contains("40 pass, 0 fail"), "ENGINE-2: every check ran: {t}");
        let json: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&report).unwrap()).unwrap();
        assert_eq!(json["device"], "engine");
        assert_eq!(json["engine_version"], env!("CARGO_PKG_VERSION"), "ENGINE-1: the report names the engine's version");
    }
}

/// An engine in another language that answers every request with id 0.
const CONSTANT_ENGINE: &str = r#"import json, sys
for line in sys.stdin:
    r = json.loads(line)
    if r["op"] == "handshake":
        info = {"name": "constant", "version": "0", "speculation": "none", "vocab": 12, "greedy_epsilon": 0.0, "batch_invariant": True, "stop_strings": False}
        print(json.dumps({"id": 0, "protocol": "specdec-exec/1", "name": "constant", "device": "cpu", "ops": ["generate"], "engine": info}), flush=True)
    else:
        out = [{"tokens": [0], "finish": "length"} for _ in r["params"]["requests"]]
        print(json.dumps({"id": r["id"], "outputs": {"generations": out}}), flush=True)
"#;

#[test]
fn a_failing_or_missing_engine_fails_with_a_repro_line() {
    let dir = std::env::temp_dir().join(format!("specdec-engine-bad-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let script = dir.join("constant.py");
    std::fs::write(&script, CONSTANT_ENGINE).unwrap();
    let engine = format!("exec:python3 {}", script.display());
    let out = specdec(&["engine-check", "--engine", &engine, "--filter", "greedy-identity"]);
    let t = text(&out);
    assert_eq!(out.status.code(), Some(1), "ENGINE-3: a wrong engine fails the run: {t}");
    assert!(t.contains("engine/exec/greedy-identity") && t.contains(&format!("repro: specdec engine-check --engine '{engine}'")), "{t}");

    let out = specdec(&["engine-check", "--engine", "decoder:reference:no-such-proposer"]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    let out = specdec(&["engine-check", "--engine", "exec:exit 3"]);
    assert_eq!(out.status.code(), Some(2), "ENGINE-1: an engine that does not start is an error: {}", text(&out));
    let out = specdec(&["engine-check", "--engine", "vllm:x"]);
    assert!(text(&out).contains("expected decoder:BACKEND:PROPOSER, exec:COMMAND, http://HOST:PORT or llama-cpp+http://HOST:PORT"), "{}", text(&out));
}

/// MODEL-17 with `--model`: the model checks (greedy identity against the
/// reference, on against off) on each architecture's checkpoint HF wrote,
/// through the checkpoint's own tokenizer and the vendor's `--prompts`
/// (the checkpoints' alphabet); the negative control, an engine that always
/// answers id 0, fails greedy identity on the same model.
#[test]
fn the_model_checks_take_an_architecture_checkpoint_and_its_prompts() {
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/../fixtures/architectures");
    let prompts = format!("{root}/prompts.jsonl");
    for case in ["llama3", "mistral", "qwen2", "qwen3", "phi3"] {
        let model = format!("{root}/{case}");
        let out = specdec(&["engine-check", "--engine", "decoder:ndarray:ngram", "--model", &model, "--prompts", &prompts]);
        let t = text(&out);
        assert!(out.status.success() && t.contains("2 pass, 0 fail") && t.contains("engine checks: PASS"), "{case}: {t}");
    }
    let dir = std::env::temp_dir().join(format!("specdec-engine-model-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let script = dir.join("constant.py");
    std::fs::write(&script, CONSTANT_ENGINE.replace("\"vocab\": 12", "\"vocab\": 48")).unwrap();
    let engine = format!("exec:python3 {}", script.display());
    let out = specdec(&["engine-check", "--engine", &engine, "--model", &format!("{root}/qwen2"), "--prompts", &prompts, "--filter", "greedy-identity"]);
    let t = text(&out);
    assert!(out.status.code() == Some(1) && t.contains("Fail engine/exec/qwen2/greedy-identity"), "{t}");
    let out = specdec(&["engine-check", "--engine", "decoder:reference:ngram", "--prompts", &prompts]);
    assert!(out.status.code() == Some(2) && text(&out).contains("--prompts goes with --tokenizer or --model"), "{}", text(&out));
    let _ = std::fs::remove_dir_all(&dir);
}
