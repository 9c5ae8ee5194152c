//! Draft training data on disk (`draft_data.rs`) and the training prompt
//! file: a round trip, and every malformed file a typed error naming the
//! file and the field, through one `check`.

mod common;

use common::scratch_dir;
use serde_json::{Value, json};
use specdec_models::draft_data::{HIDDEN_FILE, MANIFEST_FILE};
use specdec_models::hf::{SaveDtype, write_safetensors};
use specdec_models::prompts::{DraftPrompt, read_prompts};
use specdec_models::{DraftData, DraftSequence, Matrix};

fn data() -> DraftData {
    let seq = |id: usize, tokens: Vec<u32>, prompt_len: usize| {
        let n = tokens.len() - 1;
        DraftSequence { prompt_id: id, kind: "chat".into(), hidden: Matrix::new(vec![n, 4], (0..n * 4).map(|i| i as f32 * 0.25 - 1.0).collect(), "hidden").unwrap(), tokens, prompt_len }
    };
    DraftData { target_layer_ids: vec![3, 1], hidden_size: 2, vocab_size: 10, sequences: vec![seq(0, vec![1, 2, 3, 4], 2), seq(5, vec![9, 0], 1)] }
}

#[test]
fn draft_data_round_trips_with_f16_rows() {
    let dir = scratch_dir("draft-data-roundtrip");
    let d = data();
    d.write(&dir).unwrap();
    // The rows are multiples of 1/4 in [-1, 5]: exact in f16.
    assert_eq!(DraftData::read(&dir).unwrap(), d);
}

/// Writes `data()` with one edit to the manifest or the tensors, reads it back.
fn read_edited(name: &str, edit_manifest: impl FnOnce(&mut Value), tensors: Option<Vec<(String, Matrix)>>) -> specdec_models::Result<DraftData> {
    let dir = scratch_dir(name);
    data().write(&dir).unwrap();
    let path = dir.join(MANIFEST_FILE);
    let mut m: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    edit_manifest(&mut m);
    std::fs::write(&path, m.to_string()).unwrap();
    if let Some(t) = tensors {
        let named: Vec<(String, &Matrix)> = t.iter().map(|(n, m)| (n.clone(), m)).collect();
        write_safetensors(dir.join(HIDDEN_FILE), &named, SaveDtype::F16).unwrap();
    }
    DraftData::read(&dir)
}

/// Each malformed directory gives an error whose message names these fragments.
fn check(cases: Vec<(&str, specdec_models::Result<DraftData>, &[&str])>) {
    let mut failures = Vec::new();
    for (name, got, needles) in cases {
        match got {
            Ok(_) => failures.push(format!("{name}: accepted")),
            Err(e) => {
                let msg = e.to_string();
                if let Some(n) = needles.iter().find(|n| !msg.contains(*n)) {
                    failures.push(format!("{name}: `{msg}` does not name `{n}`"));
                }
            }
        }
    }
    assert!(failures.is_empty(), "MODEL-16: malformed draft data must give typed errors naming the field:\n{}", failures.join("\n"));
}

#[test]
fn malformed_draft_data_gives_typed_errors() {
    let m = |rows: usize, cols: usize| Matrix::new(vec![rows, cols], vec![0.5; rows * cols], "t").unwrap();
    check(vec![
        ("format tag", read_edited("dd-format", |v| v["format"] = json!("other/1"), None), &["format", "other/1"]),
        ("unknown field", read_edited("dd-unknown", |v| v["extra"] = json!(1), None), &["data.json", "extra"]),
        ("token outside the vocabulary", read_edited("dd-token", |v| v["sequences"][0]["tokens"][1] = json!(10), None), &["sequences[0].tokens", "10"]),
        ("prompt length 0", read_edited("dd-plen0", |v| v["sequences"][0]["prompt_len"] = json!(0), None), &["sequences[0].prompt_len"]),
        ("prompt length = tokens", read_edited("dd-plen", |v| v["sequences"][1]["prompt_len"] = json!(2), None), &["sequences[1].prompt_len"]),
        ("one token", read_edited("dd-one", |v| v["sequences"][1]["tokens"] = json!([9]), None), &["sequences[1].tokens"]),
        ("rows of the wrong width", read_edited("dd-width", |_| {}, Some(vec![("seq.0".into(), m(3, 5)), ("seq.1".into(), m(1, 4))])), &["seq.0", "[3, 5]"]),
        ("too few rows", read_edited("dd-rows", |_| {}, Some(vec![("seq.0".into(), m(2, 4)), ("seq.1".into(), m(1, 4))])), &["seq.0", "[2, 4]"]),
        ("a tensor missing", read_edited("dd-missing", |_| {}, Some(vec![("seq.0".into(), m(3, 4)), ("other".into(), m(1, 4))])), &["seq.1"]),
        ("a tensor too many", read_edited("dd-extra", |_| {}, Some(vec![("seq.0".into(), m(3, 4)), ("seq.1".into(), m(1, 4)), ("seq.2".into(), m(1, 4))])), &["3 tensors for 2 sequences"]),
        (
            "non-finite row",
            read_edited("dd-nan", |_| {}, Some(vec![("seq.0".into(), Matrix::new(vec![3, 4], [vec![f32::INFINITY], vec![0.0; 11]].concat(), "t").unwrap()), ("seq.1".into(), m(1, 4))])),
            &["seq.0", "non-finite"],
        ),
        ("no layers", read_edited("dd-layers", |v| v["target_layer_ids"] = json!([]), None), &["target_layer_ids"]),
        (
            "truncated hidden file",
            {
                let dir = scratch_dir("dd-truncated");
                data().write(&dir).unwrap();
                let bytes = std::fs::read(dir.join(HIDDEN_FILE)).unwrap();
                std::fs::write(dir.join(HIDDEN_FILE), &bytes[..bytes.len() - 3]).unwrap();
                DraftData::read(&dir)
            },
            &[HIDDEN_FILE],
        ),
    ]);
}

#[test]
fn malformed_prompt_files_give_typed_errors() {
    let shipped = read_prompts::<DraftPrompt>(concat!(env!("CARGO_MANIFEST_DIR"), "/../fixtures/dflash/prompts.json")).unwrap();
    assert!(shipped.iter().any(|p| p.split == "train") && shipped.iter().any(|p| p.split == "heldout"), "the shipped prompts have both splits");
    let write = |name: &str, prompts: Value| {
        let dir = scratch_dir(name);
        let path = dir.join("prompts.json");
        std::fs::write(&path, json!({"about": "test", "prompts": prompts}).to_string()).unwrap();
        read_prompts::<DraftPrompt>(&path).map(|_| DraftData { target_layer_ids: vec![], hidden_size: 0, vocab_size: 0, sequences: vec![] })
    };
    let p = |id: usize, split: &str, text: &str| json!({"id": id, "split": split, "kind": "chat", "chat": true, "text": text});
    check(vec![
        ("duplicate id", write("pr-dup", json!([p(1, "train", "a"), p(1, "heldout", "b")])), &["id 1", "twice"]),
        ("unknown split", write("pr-split", json!([p(1, "test", "a")])), &["split", "test"]),
        ("empty text", write("pr-text", json!([p(1, "train", "")])), &["text", "empty"]),
        ("unknown field", write("pr-field", json!([{"id": 1, "split": "train", "kind": "chat", "chat": true, "text": "a", "extra": 2}])), &["prompts", "extra"]),
    ]);
}
