//! The DFlash block drafter (DRAFT-6 .. DRAFT-9) on tiny seeded targets:
//! config and checkpoint validation (every defect a typed error naming the
//! file and the field, through one `check`), the export/load round trip, and
//! invariances of the block forward that a real bug would break, checked
//! against an independent re-implementation written in this file.

mod common;

use std::path::PathBuf;

use common::{case, check, scratch_dir};
use serde_json::{Value, json};
use specdec_models::dflash::{DflashConfig, DflashContext, DflashDraft, DflashSpec, Schedule, export_dflash, load_dflash, load_dflash_with_mask_id, seeded_dflash};
use specdec_models::dflash_f32::DflashF32;
use specdec_models::forward::{ForwardRequest, LogitRows};
use specdec_models::hf::{SafetensorsFile, SaveDtype, write_safetensors};
use specdec_models::tiny::TinySpec;
use specdec_models::{LlamaWeights, Matrix, RefModel, Result};
use specdec_reference::dflash::unmask_order;

const SCHEDULES: [Schedule; 3] = [Schedule::Cosine, Schedule::Linear, Schedule::Sqrt];

/// A tiny target, a seeded drafter for it, and context rows from the
/// target's own forward over a prompt (its hidden states at `target_layer_ids`).
struct Setup {
    target: LlamaWeights,
    draft: DflashDraft,
    /// `[prompt_len, K·hidden]` row-major.
    rows: Vec<f64>,
}

impl Setup {
    fn width(&self) -> usize {
        self.draft.config().feature_width()
    }

    fn context(&self, positions: usize) -> DflashContext {
        let mut ctx = self.draft.new_context();
        self.draft.extend(&mut ctx, &self.rows[..positions * self.width()]).unwrap();
        ctx
    }

    fn vocab(&self) -> usize {
        self.target.config.vocab_size
    }
}

/// `ids`: target layers fed to `fc` (all of the target's, last first, by default).
fn setup_with(preset: &str, layers: usize, block: usize, ids: Option<Vec<usize>>, prompt_len: usize, seed: u64) -> Setup {
    let target = TinySpec::preset(preset).expect("a preset").weights().expect("tiny weights");
    let cfg = &target.config;
    let ids = ids.unwrap_or_else(|| (0..cfg.num_hidden_layers).rev().collect());
    let spec = DflashSpec { layers, heads: 2, kv_heads: 1, intermediate: 2 * cfg.hidden_size, block_size: block, target_layer_ids: ids.clone(), mask_token_id: (cfg.vocab_size - 1) as u32 };
    let draft = seeded_dflash(cfg, spec, seed).expect("a valid seeded drafter");
    let model = RefModel::new(target.clone());
    let mut cache = model.new_cache(1, cfg.max_position_embeddings).unwrap();
    let prompt: Vec<u32> = (0..prompt_len).map(|i| ((5 * i + 3) % cfg.vocab_size) as u32).collect();
    let out = model.forward(&mut cache, &ForwardRequest { tokens: &[prompt], logits: LogitRows::None, hidden_layers: &ids }).unwrap();
    Setup { target, draft, rows: out.hidden }
}

fn setup(preset: &str) -> Setup {
    setup_with(preset, 2, 4, None, 6, 11)
}

fn rows_of(logits: &[f64], v: usize) -> Vec<Vec<f64>> {
    logits.chunks(v).map(<[f64]>::to_vec).collect()
}

fn bits(x: &[f64]) -> Vec<u64> {
    x.iter().map(|v| v.to_bits()).collect()
}

fn max_diff(a: &[f64], b: &[f64]) -> f64 {
    assert_eq!(a.len(), b.len());
    a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0.0, f64::max)
}

const CFG: &str = "draft/config.json";

/// DRAFT-6, DRAFT-7: every config defect, checked against the TARGET's config.
#[test]
fn draft_6_config_validation_errors_are_typed() {
    let s = setup("tiny-v12-l2"); // hidden 8, vocab 12, 2 target layers
    let base: Value = serde_json::from_str(&s.draft.config().to_json().unwrap()).unwrap();
    let target = s.target.config.clone();
    let cfg_case = |name: &str, kind: &'static str, needles: &[&str], edit: fn(&mut Value)| {
        let mut v = base.clone();
        edit(&mut v);
        let (text, target) = (v.to_string(), target.clone());
        let mut needles = needles.to_vec();
        needles.push(CFG);
        case(name, kind, &needles, move || DflashConfig::from_json(&text, CFG)?.validate(&target, CFG))
    };
    let mut cases = vec![
        cfg_case("block_size 1", "InvalidField", &["dflash_config.block_size"], |v| v["dflash_config"]["block_size"] = json!(1)),
        cfg_case("block_size 65", "InvalidField", &["dflash_config.block_size", "65"], |v| v["dflash_config"]["block_size"] = json!(65)),
        cfg_case("block_size negative", "InvalidField", &["dflash_config.block_size"], |v| v["dflash_config"]["block_size"] = json!(-4)),
        cfg_case("block_size 2^40", "InvalidField", &["dflash_config.block_size"], |v| v["dflash_config"]["block_size"] = json!(1u64 << 40)),
        cfg_case("block_size missing", "MissingField", &["dflash_config.block_size"], |v| {
            v["dflash_config"].as_object_mut().unwrap().remove("block_size");
        }),
        cfg_case("dflash_config missing", "MissingField", &["dflash_config"], |v| {
            v.as_object_mut().unwrap().remove("dflash_config");
        }),
        cfg_case("dflash_config not an object", "InvalidField", &["dflash_config"], |v| v["dflash_config"] = json!([1])),
        cfg_case("unknown dflash_config field", "InvalidField", &["dflash_config.block_sise"], |v| v["dflash_config"]["block_sise"] = json!(4)),
        cfg_case("target_layer_ids empty", "InvalidField", &["dflash_config.target_layer_ids", "empty"], |v| v["dflash_config"]["target_layer_ids"] = json!([])),
        cfg_case("target_layer_ids repeated", "InvalidField", &["dflash_config.target_layer_ids", "twice"], |v| v["dflash_config"]["target_layer_ids"] = json!([1, 1])),
        cfg_case("target layer beyond the target", "InvalidField", &["dflash_config.target_layer_ids", "layer 2", "2 layers"], |v| v["dflash_config"]["target_layer_ids"] = json!([0, 2])),
        cfg_case("target_layer_ids not an array", "InvalidField", &["dflash_config.target_layer_ids"], |v| v["dflash_config"]["target_layer_ids"] = json!(1)),
        cfg_case("target_layer_ids missing", "MissingField", &["dflash_config.target_layer_ids"], |v| {
            v["dflash_config"].as_object_mut().unwrap().remove("target_layer_ids");
        }),
        cfg_case("hidden differs from the target", "InvalidField", &["hidden_size", "16", "8"], |v| v["hidden_size"] = json!(16)),
        cfg_case("vocab differs from the target", "InvalidField", &["vocab_size", "13", "12"], |v| v["vocab_size"] = json!(13)),
        cfg_case("mask id = vocab", "InvalidField", &["dflash_config.mask_token_id", "12"], |v| v["dflash_config"]["mask_token_id"] = json!(12)),
        cfg_case("mask id beyond u32", "InvalidField", &["dflash_config.mask_token_id"], |v| v["dflash_config"]["mask_token_id"] = json!(1u64 << 40)),
        cfg_case("mask token as a string", "InvalidField", &["dflash_config.mask_token", "<|MASK|>", "resolve"], |v| {
            let d = v["dflash_config"].as_object_mut().unwrap();
            d.remove("mask_token_id");
            d.insert("mask_token".into(), json!("<|MASK|>"));
        }),
        cfg_case("mask_token and mask_token_id disagree", "InvalidField", &["dflash_config.mask_token", "disagree"], |v| v["dflash_config"]["mask_token"] = json!(3)),
        cfg_case("no mask at all", "MissingField", &["dflash_config.mask_token_id"], |v| {
            v["dflash_config"].as_object_mut().unwrap().remove("mask_token_id");
        }),
        cfg_case("architectures not DFlash", "InvalidField", &["architectures", "DFlashDraftModel"], |v| v["architectures"] = json!(["LlamaForCausalLM"])),
        cfg_case("a Llama field typo (MODEL-1)", "InvalidField", &["rms_norm_epsilon", "unknown"], |v| v["rms_norm_epsilon"] = json!(1e-5)),
        cfg_case("kv heads not dividing heads (MODEL-1)", "InvalidField", &["num_key_value_heads"], |v| v["num_key_value_heads"] = json!(3)),
        cfg_case("not JSON", "InvalidField", &["config.json"], |v| *v = json!("{")),
    ];
    // The fc contract (DRAFT-7) checked on weights built in memory.
    let (cfg, w, tcfg) = (s.draft.config().clone(), s.draft.weights().clone(), target.clone());
    cases.push(case("fc in_features = hidden with K = 2", "InvalidField", &["fc.weight", "fc contract", "[8, 16]", "[8, 8]"], move || {
        let mut w = w.clone();
        w.fc = Matrix::new(vec![8, 8], vec![0.1; 64], "fc").unwrap();
        DflashDraft::new(cfg.clone(), w, &tcfg).map(|_| ())
    }));
    let (cfg, w, tcfg) = (s.draft.config().clone(), s.draft.weights().clone(), target.clone());
    cases.push(case("fc out_features != hidden", "InvalidField", &["fc.weight", "fc contract"], move || {
        let mut w = w.clone();
        w.fc = Matrix::new(vec![9, 16], vec![0.1; 144], "fc").unwrap();
        DflashDraft::new(cfg.clone(), w, &tcfg).map(|_| ())
    }));
    check("DRAFT-6, DRAFT-7: a config or fc defect, checked against the target's config, is a typed error naming the field", cases);
}

/// Exports `s.draft`, then rewrites its tensors with `edit` (F32).
fn checkpoint(name: &str, s: &Setup, edit: impl FnOnce(&mut Vec<(String, Matrix)>)) -> PathBuf {
    let dir = scratch_dir(name);
    export_dflash(&s.draft, &dir, SaveDtype::F32).unwrap();
    let mut tensors: Vec<(String, Matrix)> = s.draft.weights().named().into_iter().map(|(n, m)| (n, m.clone())).collect();
    edit(&mut tensors);
    let refs: Vec<(String, &Matrix)> = tensors.iter().map(|(n, m)| (n.clone(), m)).collect();
    write_safetensors(dir.join("model.safetensors"), &refs, SaveDtype::F32).unwrap();
    dir
}

fn edit_config(dir: &std::path::Path, edit: impl FnOnce(&mut Value)) {
    let path = dir.join("config.json");
    let mut v: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    edit(&mut v);
    std::fs::write(path, v.to_string()).unwrap();
}

/// DRAFT-6, DRAFT-7, MODEL-16: hostile and inconsistent checkpoint files.
#[test]
fn draft_6_hostile_checkpoints_give_typed_errors() {
    let s = setup("tiny-v12-l2");
    let t = s.target.config.clone();
    let load = move |dir: PathBuf| {
        let t = t.clone();
        move || load_dflash(&dir, &t).map(|_| ())
    };
    let st = |dir: &PathBuf| dir.join("model.safetensors");

    let short = checkpoint("short", &s, |_| {});
    std::fs::write(st(&short), [1u8, 2, 3]).unwrap();
    let cut = checkpoint("cut", &s, |_| {});
    let bytes = std::fs::read(st(&cut)).unwrap();
    std::fs::write(st(&cut), &bytes[..bytes.len() / 2]).unwrap();
    let huge = checkpoint("huge", &s, |_| {});
    let mut bytes = std::fs::read(st(&huge)).unwrap();
    bytes[..8].copy_from_slice(&(1u64 << 40).to_le_bytes());
    std::fs::write(st(&huge), bytes).unwrap();
    let missing = checkpoint("missing", &s, |t| t.retain(|(n, _)| n != "layers.1.mlp.up_proj.weight"));
    let shape = checkpoint("shape", &s, |t| {
        let m = &mut t.iter_mut().find(|(n, _)| n == "layers.0.self_attn.k_proj.weight").unwrap().1;
        *m = Matrix::new(vec![8, 8], vec![0.0; 64], "k").unwrap();
    });
    let extra = checkpoint("extra", &s, |t| t.push(("embed_tokens.weight".into(), Matrix::new(vec![12, 8], vec![0.0; 96], "e").unwrap())));
    let nan = checkpoint("nan", &s, |t| t[3].1.data[2] = f32::NAN);
    let fc_k = checkpoint("fc-k", &s, |_| {});
    edit_config(&fc_k, |v| v["dflash_config"]["target_layer_ids"] = json!([1]));
    let no_weights = checkpoint("no-weights", &s, |_| {});
    std::fs::remove_file(st(&no_weights)).unwrap();
    let no_config = checkpoint("no-config", &s, |_| {});
    std::fs::remove_file(no_config.join("config.json")).unwrap();
    let string_mask = checkpoint("string-mask", &s, |_| {});
    edit_config(&string_mask, |v| v["dflash_config"] = json!({"block_size": 4, "target_layer_ids": [1, 0], "mask_token": "<|MASK|>"}));
    let (t2, sm) = (s.target.config.clone(), string_mask.clone());

    let cases = vec![
        case("safetensors shorter than its length field", "Truncated", &["model.safetensors"], load(short)),
        case("safetensors cut in half", "InvalidField", &["model.safetensors", "header"], load(cut)),
        case("header length beyond the file", "HeaderTooLarge", &["model.safetensors", "header length"], load(huge)),
        case("missing tensor", "MissingTensor", &["model.safetensors", "layers.1.mlp.up_proj.weight"], load(missing)),
        case("wrong shape", "TensorShape", &["model.safetensors", "layers.0.self_attn.k_proj.weight", "[4, 8]", "[8, 8]"], load(shape)),
        case("an embedding of its own", "InvalidField", &["model.safetensors", "embed_tokens.weight", "no embedding"], load(extra)),
        case("NaN weight", "InvalidField", &["model.safetensors", "non-finite"], load(nan)),
        case("fc contract: config K = 1, fc built for K = 2", "InvalidField", &["model.safetensors", "fc.weight", "fc contract", "K = 1"], load(fc_k)),
        case("no model.safetensors", "Io", &["model.safetensors"], load(no_weights)),
        case("no config.json", "Io", &["config.json"], load(no_config)),
        case("string mask without a resolved id", "InvalidField", &["config.json", "dflash_config.mask_token", "<|MASK|>"], load(string_mask)),
        case("resolved mask id outside the vocabulary", "InvalidField", &["config.json", "dflash_config.mask_token_id"], move || load_dflash_with_mask_id(&sm, &t2, 12).map(|_| ())),
    ];
    check("DRAFT-6, DRAFT-7, MODEL-16: a hostile or inconsistent checkpoint is a typed error naming the file and the field or tensor", cases);
}

/// DRAFT-6: export then load gives the same drafter bit for bit, under the
/// HF tensor names; an integer `mask_token` and a caller-resolved string
/// mask load too.
#[test]
fn draft_6_export_load_round_trip_is_bit_identical() {
    for (preset, _) in TinySpec::PRESETS {
        let s = setup(preset);
        let dir = scratch_dir(&format!("roundtrip-{preset}"));
        export_dflash(&s.draft, &dir, SaveDtype::F32).unwrap();
        let back = load_dflash(&dir, &s.target.config).unwrap();
        assert_eq!(back, s.draft, "DRAFT-6: an F32 export loads back: {preset}");
        for ((n1, a), (n2, b)) in back.weights().named().iter().zip(s.draft.weights().named()) {
            assert_eq!(n1, &n2);
            assert_eq!(a.data.iter().map(|v| v.to_bits()).collect::<Vec<_>>(), b.data.iter().map(|v| v.to_bits()).collect::<Vec<_>>(), "DRAFT-6: bit for bit: {preset} {n1}");
        }
        let names: Vec<String> = SafetensorsFile::open(&dir.join("model.safetensors")).unwrap().tensors().into_keys().collect();
        let mut want = vec!["fc.weight".to_string(), "hidden_norm.weight".into(), "norm.weight".into()];
        for l in 0..2 {
            for t in ["input_layernorm", "self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj", "post_attention_layernorm", "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"] {
                want.push(format!("layers.{l}.{t}.weight"));
            }
        }
        want.sort();
        assert_eq!(names, want, "DRAFT-6: the drafter's tensors, no embedding and no head: {preset}");
        let k = s.draft.config().num_target_layers();
        let h = s.target.config.hidden_size;
        assert_eq!(back.weights().fc.shape, vec![h, k * h], "DRAFT-7: {preset}: the fc contract");
        let text = std::fs::read_to_string(dir.join("config.json")).unwrap();
        let v: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(v["architectures"], json!(["DFlashDraftModel"]));
        assert_eq!(v["dflash_config"]["block_size"], json!(4));

        edit_config(&dir, |v| v["dflash_config"] = json!({"block_size": 4, "target_layer_ids": s.draft.config().target_layer_ids, "mask_token": 2}));
        assert_eq!(load_dflash(&dir, &s.target.config).unwrap().config().mask_token_id, 2, "DRAFT-6: {preset}: integer mask_token");
        edit_config(&dir, |v| v["dflash_config"]["mask_token"] = json!("<|MASK|>"));
        assert_eq!(load_dflash_with_mask_id(&dir, &s.target.config, 5).unwrap().config().mask_token_id, 5, "DRAFT-6: {preset}: resolved string mask");
    }
}

/// One input check, run on the shared setup.
type InputRun = Box<dyn Fn(&Setup) -> Result<()>>;

/// DRAFT-7, DRAFT-8, DRAFT-9: argument checks of the context and the forward.
#[test]
fn draft_8_invalid_inputs_are_typed_errors() {
    let s = std::rc::Rc::new(setup("tiny-v16-l1")); // block 4, vocab 16, max positions 64
    let w = s.width();
    let mut cases = vec![];
    let mut add = |name: &str, needles: &[&str], run: InputRun| {
        let s = s.clone();
        cases.push(case(name, "InvalidInput", needles, move || run(&s)));
    };
    add("block of 3", &["block_tokens", "3 tokens"], Box::new(|s| s.draft.block_logits(&s.target, &s.context(2), &[1, 2, 3]).map(|_| ())));
    add("block of 5", &["block_tokens"], Box::new(|s| s.draft.block_logits(&s.target, &s.context(2), &[1, 2, 3, 4, 5]).map(|_| ())));
    add("token = vocab", &["block_tokens", "16"], Box::new(|s| s.draft.block_logits(&s.target, &s.context(2), &[1, 16, 15, 15]).map(|_| ())));
    add("empty context", &["ctx", "empty"], Box::new(|s| s.draft.block_logits(&s.target, &s.draft.new_context(), &[1, 15, 15, 15]).map(|_| ())));
    add(
        "block beyond max positions",
        &["ctx", "64"],
        Box::new(move |s| {
            let mut ctx = s.draft.new_context();
            s.draft.extend(&mut ctx, &vec![0.5; 61 * w])?;
            s.draft.block_logits(&s.target, &ctx, &[1, 15, 15, 15]).map(|_| ())
        }),
    );
    add("context beyond max positions", &["rows", "max_position_embeddings"], Box::new(move |s| s.draft.extend(&mut s.draft.new_context(), &vec![0.5; 65 * w])));
    add("rows not a multiple of K·hidden", &["rows", "K·hidden"], Box::new(move |s| s.draft.extend(&mut s.draft.new_context(), &vec![0.5; w + 1])));
    add("no rows", &["rows"], Box::new(|s| s.draft.extend(&mut s.draft.new_context(), &[])));
    add(
        "NaN row value",
        &["rows", "row 1, column 3"],
        Box::new(move |s| {
            let mut rows = vec![0.5; 2 * w];
            rows[w + 3] = f64::NAN;
            s.draft.extend(&mut s.draft.new_context(), &rows)
        }),
    );
    add("truncate beyond the length", &["n", "3"], Box::new(|s| s.context(2).truncate(3)));
    add("verified id = vocab", &["verified"], Box::new(|s| s.draft.draft_parallel(&s.target, &s.context(2), 16).map(|_| ())));
    add("zero steps", &["steps"], Box::new(|s| s.draft.draft_iterative(&s.target, &s.context(2), 1, 0, Schedule::Cosine).map(|_| ())));
    add("more steps than positions", &["steps", "3"], Box::new(|s| s.draft.draft_iterative(&s.target, &s.context(2), 1, 4, Schedule::Cosine).map(|_| ())));
    add(
        "another target",
        &["target", "hidden_size"],
        Box::new(|s| {
            let other = TinySpec::preset("tiny-v32-l2").unwrap().weights().unwrap();
            s.draft.block_logits(&other, &s.context(2), &[1, 15, 15, 15]).map(|_| ())
        }),
    );
    add(
        "a context of another drafter",
        &["ctx"],
        Box::new(|s| {
            let other = setup_with("tiny-v16-l1", 1, 4, None, 2, 5);
            s.draft.block_logits(&s.target, &other.context(2), &[1, 15, 15, 15]).map(|_| ())
        }),
    );
    check("DRAFT-7, DRAFT-8, DRAFT-9: a bad context row, block, position or step count is a typed error naming the argument", cases);
}

// ---------------------------------------------------------------------------
// The block forward.

/// DRAFT-8: attention inside the block is not causal: the token at the LAST
/// block position changes the draft for position 1 (a causal mask would
/// hide it), and the same for row 0.
#[test]
fn draft_8_block_attention_is_not_causal() {
    for (preset, _) in TinySpec::PRESETS {
        let s = setup(preset);
        let v = s.vocab();
        let ctx = s.context(3);
        let mut block = s.draft.block_input(2).unwrap();
        let a = rows_of(&s.draft.block_logits(&s.target, &ctx, &block).unwrap(), v);
        *block.last_mut().unwrap() = 0;
        let b = rows_of(&s.draft.block_logits(&s.target, &ctx, &block).unwrap(), v);
        assert!(max_diff(&a[1], &b[1]) > 1e-6, "DRAFT-8: no causal mask inside the block: {preset}: row 1 ignores the last block position");
        assert!(max_diff(&a[0], &b[0]) > 1e-6, "DRAFT-8: no causal mask inside the block: {preset}: row 0 ignores the last block position");
    }
}

/// DRAFT-7, DRAFT-8: the context matters, all of it: changing the OLDEST
/// context row changes every logits row, and so does a different target
/// layer order in `fc`'s input.
#[test]
fn draft_8_context_changes_the_logits() {
    for (preset, _) in TinySpec::PRESETS {
        let s = setup(preset);
        let (v, w) = (s.vocab(), s.width());
        let block = s.draft.block_input(2).unwrap();
        let a = rows_of(&s.draft.block_logits(&s.target, &s.context(4), &block).unwrap(), v);
        let mut rows = s.rows[..4 * w].to_vec();
        rows[1] += 0.5;
        let mut ctx = s.draft.new_context();
        s.draft.extend(&mut ctx, &rows).unwrap();
        let b = rows_of(&s.draft.block_logits(&s.target, &ctx, &block).unwrap(), v);
        for i in 0..4 {
            assert!(max_diff(&a[i], &b[i]) > 1e-9, "DRAFT-7, DRAFT-8: every block query attends to the whole context: {preset}: row {i} ignores context position 0");
        }
    }
}

/// DRAFT-7: extending a context in pieces (or truncating and re-extending)
/// equals one extension, bit for bit, and so do the logits.
#[test]
fn draft_7_incremental_context_is_bit_exact() {
    for (preset, _) in TinySpec::PRESETS {
        let s = setup(preset);
        let w = s.width();
        let whole = s.context(6);
        for splits in [vec![2, 4], vec![1, 1, 1, 1, 1, 1], vec![5, 1]] {
            let mut ctx = s.draft.new_context();
            let mut at = 0;
            for n in &splits {
                s.draft.extend(&mut ctx, &s.rows[at * w..(at + n) * w]).unwrap();
                at += n;
            }
            assert_eq!(ctx, whole, "DRAFT-7: extending in several calls equals one call: {preset} {splits:?}");
        }
        let mut ctx = s.context(6);
        ctx.truncate(2).unwrap();
        assert_eq!(ctx, s.context(2), "DRAFT-7: {preset}: truncate");
        s.draft.extend(&mut ctx, &s.rows[2 * w..6 * w]).unwrap();
        assert_eq!(ctx, whole, "DRAFT-7: {preset}: truncate then extend");
        let block = s.draft.block_input(3).unwrap();
        let a = s.draft.block_logits(&s.target, &whole, &block).unwrap();
        let b = s.draft.block_logits(&s.target, &ctx, &block).unwrap();
        assert_eq!(bits(&a), bits(&b), "DRAFT-7: the same logits, bit for bit: {preset}");
    }
}

/// An independent, straightforward DFlash block forward: naive sums, RoPE
/// as a per-pair rotation by `pos / theta^(2i/d)`, context keys recomputed
/// from the rows, attention with explicit per-head loops. `block_start` is
/// the position of the first block token (DRAFT-8 says `n`).
fn independent_block_logits(draft: &DflashDraft, target: &LlamaWeights, rows: &[f64], block: &[u32], block_start: usize) -> Vec<Vec<f64>> {
    let c = &draft.config().layers;
    let wt = draft.weights();
    let (h, nh, nkv, eps, theta) = (c.hidden_size, c.num_attention_heads, c.num_key_value_heads, c.rms_norm_eps, c.rope_theta);
    let hd = h / nh;
    let mv = |m: &Matrix, x: &[f64]| -> Vec<f64> { (0..m.shape[0]).map(|r| (0..m.shape[1]).map(|j| f64::from(m.data[r * m.shape[1] + j]) * x[j]).sum()).collect() };
    let norm = |x: &[f64], g: &Matrix| -> Vec<f64> {
        let rms = (x.iter().map(|v| v * v).sum::<f64>() / x.len() as f64 + eps).sqrt();
        x.iter().zip(&g.data).map(|(v, g)| v / rms * f64::from(*g)).collect()
    };
    let rotate = |x: &mut Vec<f64>, pos: usize| {
        for head in 0..x.len() / hd {
            for i in 0..hd / 2 {
                let angle = pos as f64 / theta.powf((2 * i) as f64 / hd as f64);
                let (lo, hi) = (head * hd + i, head * hd + i + hd / 2);
                let (a, b) = (x[lo], x[hi]);
                x[lo] = a * angle.cos() - b * angle.sin();
                x[hi] = a * angle.sin() + b * angle.cos();
            }
        }
    };
    let width = draft.config().feature_width();
    let feats: Vec<Vec<f64>> = rows.chunks(width).map(|r| norm(&mv(&wt.fc, r), &wt.hidden_norm)).collect();
    let n = feats.len();
    let mut x: Vec<Vec<f64>> = block.iter().map(|&t| target.embed.row(t as usize).iter().map(|&v| f64::from(v)).collect()).collect();
    for layer in &wt.layers {
        let mut keys: Vec<Vec<f64>> = vec![];
        let mut vals: Vec<Vec<f64>> = vec![];
        for (t, f) in feats.iter().enumerate() {
            let mut k = mv(&layer.wk, f);
            rotate(&mut k, t);
            keys.push(k);
            vals.push(mv(&layer.wv, f));
        }
        let hs: Vec<Vec<f64>> = x.iter().map(|r| norm(r, &layer.attn_norm)).collect();
        let mut qs = vec![];
        for (i, hn) in hs.iter().enumerate() {
            let mut q = mv(&layer.wq, hn);
            rotate(&mut q, block_start + i);
            qs.push(q);
            let mut k = mv(&layer.wk, hn);
            rotate(&mut k, block_start + i);
            keys.push(k);
            vals.push(mv(&layer.wv, hn));
        }
        assert_eq!(keys.len(), n + block.len());
        for (i, q) in qs.iter().enumerate() {
            let mut attn = vec![0.0; nh * hd];
            for head in 0..nh {
                let g = head / (nh / nkv);
                let scores: Vec<f64> = keys.iter().map(|k| (0..hd).map(|d| q[head * hd + d] * k[g * hd + d]).sum::<f64>() / (hd as f64).sqrt()).collect();
                let top = scores.iter().cloned().fold(f64::MIN, f64::max);
                let z: f64 = scores.iter().map(|s| (s - top).exp()).sum();
                for (j, s) in scores.iter().enumerate() {
                    for d in 0..hd {
                        attn[head * hd + d] += (s - top).exp() / z * vals[j][g * hd + d];
                    }
                }
            }
            let o = mv(&layer.wo, &attn);
            x[i].iter_mut().zip(o).for_each(|(a, b)| *a += b);
            let m = norm(&x[i], &layer.mlp_norm);
            let (gate, up) = (mv(&layer.w_gate, &m), mv(&layer.w_up, &m));
            let act: Vec<f64> = gate.iter().zip(&up).map(|(g, u)| g / (1.0 + (-g).exp()) * u).collect();
            let down = mv(&layer.w_down, &act);
            x[i].iter_mut().zip(down).for_each(|(a, b)| *a += b);
        }
    }
    let head = target.lm_head.as_ref().unwrap_or(&target.embed);
    x.iter().map(|r| mv(head, &norm(r, &wt.norm))).collect()
}

/// DRAFT-7, DRAFT-8: the forward equals the independent implementation
/// (1e-9 relative), including the smallest hand-sized case (1 layer, block
/// 2, one context position) and a partly unmasked block; the same
/// implementation with the block at positions `0..B` instead of `n..n+B`
/// (relative RoPE offsets to the context broken) is far off, so the check
/// pins absolute positions.
#[test]
fn draft_8_matches_an_independent_implementation() {
    let configs = [("tiny-v16-l1", 1, 2, 1), ("tiny-v16-l1", 2, 4, 5), ("tiny-v12-l2", 1, 3, 2), ("tiny-v12-l2", 2, 8, 6), ("tiny-v32-l2", 2, 4, 4)];
    for (preset, layers, block, n) in configs {
        let s = setup_with(preset, layers, block, None, 6, 17);
        let v = s.vocab();
        let ctx = s.context(n);
        let rows = &s.rows[..n * s.width()];
        let mut tokens = s.draft.block_input(4).unwrap();
        let mut blocks = vec![tokens.clone()];
        tokens[block - 1] = 7;
        blocks.push(tokens);
        for b in blocks {
            let got = rows_of(&s.draft.block_logits(&s.target, &ctx, &b).unwrap(), v);
            let want = independent_block_logits(&s.draft, &s.target, rows, &b, n);
            let wrong = independent_block_logits(&s.draft, &s.target, rows, &b, 0);
            let mut far = 0.0f64;
            for i in 0..block {
                for (x, y) in got[i].iter().zip(&want[i]) {
                    assert!((x - y).abs() <= 1e-9 * (1.0 + y.abs()), "DRAFT-7, DRAFT-8: {preset} L{layers} B{block} n{n} row {i}: {x} vs {y}");
                }
                far = far.max(max_diff(&got[i], &wrong[i]));
            }
            assert!(far > 1e-4, "DRAFT-8: the block sits at positions n..n+B-1: {preset} L{layers} B{block} n{n}: block positions 0.. are not distinguishable ({far})");
        }
    }
}

/// DRAFT-8: parallel drafts are the lowest-id argmax of rows 1..B of one
/// forward on `[v, m, .., m]`, from a context the target's own forward made.
#[test]
fn draft_8_parallel_drafts_are_row_argmaxes() {
    for (preset, _) in TinySpec::PRESETS {
        let s = setup_with(preset, 2, 6, None, 6, 23);
        let v = s.vocab();
        let ctx = s.context(6);
        let drafts = s.draft.draft_parallel(&s.target, &ctx, 9).unwrap();
        let block = s.draft.block_input(9).unwrap();
        assert_eq!(block, [9, v as u32 - 1, v as u32 - 1, v as u32 - 1, v as u32 - 1, v as u32 - 1], "DRAFT-8: the block is [v, m, .., m]");
        let logits = rows_of(&s.draft.block_logits(&s.target, &ctx, &block).unwrap(), v);
        let want: Vec<u32> = logits[1..]
            .iter()
            .map(|r| {
                let top = r.iter().cloned().fold(f64::MIN, f64::max);
                r.iter().position(|&x| x == top).unwrap() as u32
            })
            .collect();
        assert_eq!(drafts, want, "DRAFT-8: parallel drafts are the lowest-id argmax of rows 1..B: {preset}");
    }
}

// ---------------------------------------------------------------------------
// Iterative drafting.

/// DRAFT-9: one step is exactly the parallel draft; drafting is
/// deterministic.
#[test]
fn draft_9_iterative_with_one_step_equals_parallel() {
    for (preset, _) in TinySpec::PRESETS {
        for block in [2, 5, 8] {
            let s = setup_with(preset, 2, block, None, 5, 29);
            let ctx = s.context(5);
            for verified in [0, 3] {
                let parallel = s.draft.draft_parallel(&s.target, &ctx, verified).unwrap();
                for schedule in SCHEDULES {
                    let it = s.draft.draft_iterative(&s.target, &ctx, verified, 1, schedule).unwrap();
                    assert_eq!(it.tokens, parallel, "DRAFT-9: T = 1 gives the parallel drafts: {preset} B{block} {schedule:?}");
                    assert_eq!(it.unmasked.len(), 1, "DRAFT-9: one step");
                    assert_eq!(it, s.draft.draft_iterative(&s.target, &ctx, verified, 1, schedule).unwrap(), "DRAFT-9: equal inputs give equal drafts");
                }
            }
        }
    }
}

/// DRAFT-9: with `T` steps, step `s` fixes `unmask_order(B-1, T, schedule)[s]`
/// positions; replaying the steps with `block_logits` shows they are the
/// most confident still-masked positions (ties to the lower one), fixed to
/// their argmax, and every position is fixed exactly once.
#[test]
fn draft_9_unmask_counts_follow_the_schedule() {
    for (preset, _) in TinySpec::PRESETS {
        let s = setup_with(preset, 1, 8, None, 4, 31);
        let (v, ctx, mask) = (s.vocab(), s.context(4), s.draft.config().mask_token_id);
        for schedule in SCHEDULES {
            for steps in 1..=7 {
                let it = s.draft.draft_iterative(&s.target, &ctx, 5, steps, schedule).unwrap();
                let counts: Vec<usize> = it.unmasked.iter().map(Vec::len).collect();
                assert_eq!(counts, unmask_order(7, steps, schedule).unwrap(), "DRAFT-9: step s fixes unmask_order(B - 1, T, schedule)[s] positions: {preset} {schedule:?} T{steps}");
                let mut block = vec![5u32];
                block.extend(std::iter::repeat_n(mask, 7));
                let mut masked = [true; 8];
                masked[0] = false;
                for chosen in &it.unmasked {
                    if chosen.is_empty() {
                        continue;
                    }
                    let logits = rows_of(&s.draft.block_logits(&s.target, &ctx, &block).unwrap(), v);
                    let conf = |p: usize| {
                        let top = logits[p].iter().cloned().fold(f64::MIN, f64::max);
                        1.0 / logits[p].iter().map(|l| (l - top).exp()).sum::<f64>()
                    };
                    let mut order: Vec<usize> = (1..8).filter(|&p| masked[p]).collect();
                    order.sort_by(|&a, &b| conf(b).partial_cmp(&conf(a)).unwrap().then(a.cmp(&b)));
                    assert_eq!(chosen, &order[..chosen.len()], "DRAFT-9: the most confident still-masked positions: {preset} {schedule:?} T{steps}");
                    for &p in chosen {
                        let top = logits[p].iter().cloned().fold(f64::MIN, f64::max);
                        block[p] = logits[p].iter().position(|&x| x == top).unwrap() as u32;
                        masked[p] = false;
                    }
                }
                assert!(masked.iter().all(|m| !m), "DRAFT-9: {preset} {schedule:?} T{steps}: a position was never fixed");
                assert_eq!(it.tokens, block[1..], "DRAFT-9: fixed to their argmax: {preset} {schedule:?} T{steps}");
            }
        }
    }
}

// ---------------------------------------------------------------------------
// The f32 host forward the decoder runs.

/// DRAFT-7, DRAFT-8: the f32 forward (`dflash_f32`, what the decoder's
/// parallel drafter runs) gives the f64 reference's logits to f32 accuracy,
/// with its context built in two pieces; its parallel drafts are its own
/// rows' argmaxes and equal the reference's wherever the reference's top
/// two differ by more than the tolerance; its argument checks are the
/// reference's.
#[test]
fn draft_8_f32_forward_matches_the_reference() {
    // n = 11: the second piece has 10 rows, past the few-row path (sgemm).
    let configs = [("tiny-v16-l1", 1, 2, 1), ("tiny-v16-l1", 2, 4, 5), ("tiny-v12-l2", 1, 3, 2), ("tiny-v12-l2", 2, 8, 11), ("tiny-v32-l2", 2, 4, 4)];
    let mut compared_drafts = 0;
    for (preset, layers, block, n) in configs {
        let s = setup_with(preset, layers, block, None, 12, 17);
        let (v, w) = (s.vocab(), s.width());
        let fast = DflashF32::new(s.draft.clone());
        let mut fctx = fast.new_context();
        fast.extend(&mut fctx, &s.rows[..w]).unwrap();
        if n > 1 {
            fast.extend(&mut fctx, &s.rows[w..n * w]).unwrap();
        }
        assert_eq!(fctx.len(), n);
        let ctx = s.context(n);
        let mut tokens = s.draft.block_input(4).unwrap();
        let mut blocks = vec![tokens.clone()];
        tokens[block - 1] = 7;
        blocks.push(tokens);
        for b in &blocks {
            let want = s.draft.block_logits(&s.target, &ctx, b).unwrap();
            let got = fast.block_logits(&s.target, &fctx, b).unwrap();
            assert_eq!(got.len(), want.len(), "DRAFT-8: [B, V] logits");
            let scale = 1.0 + want.iter().fold(0.0f64, |m, x| m.max(x.abs()));
            for (i, (x, y)) in got.iter().zip(&want).enumerate() {
                assert!((f64::from(*x) - y).abs() <= 1e-5 * scale, "DRAFT-8: {preset} L{layers} B{block} n{n}: f32 logit {i} is {x}, the reference's {y}");
            }
        }
        let drafts = fast.draft_parallel(&s.target, &fctx, 4, block - 1).unwrap();
        assert_eq!(fast.draft_parallel(&s.target, &fctx, 4, 1).unwrap(), drafts[..1], "DRAFT-8: asking for fewer drafts gives a prefix of the block's drafts");
        let reference = s.draft.draft_parallel(&s.target, &ctx, 4).unwrap();
        let logits = rows_of(&s.draft.block_logits(&s.target, &ctx, &blocks[0]).unwrap(), v);
        for (i, row) in logits.iter().enumerate().skip(1) {
            let mut sorted = row.clone();
            sorted.sort_by(|a, b| b.total_cmp(a));
            if sorted[0] - sorted[1] > 1e-3 {
                assert_eq!(drafts[i - 1], reference[i - 1], "DRAFT-8: {preset} B{block}: the f32 draft at position {i} differs from the reference's with a clear top token");
                compared_drafts += 1;
            }
        }
    }
    assert!(compared_drafts >= 5, "the drafts comparison must not be vacuous: {compared_drafts} clear positions");
    let s = setup("tiny-v16-l1");
    let fast = DflashF32::new(s.draft.clone());
    let err = fast.block_logits(&s.target, &fast.new_context(), &[1, 15, 15, 15]).unwrap_err().to_string();
    assert!(err.contains("ctx") && err.contains("empty"), "DRAFT-8: an empty context is refused: {err}");
    let ctx2 = {
        let mut c = fast.new_context();
        fast.extend(&mut c, &s.rows[..2 * s.width()]).unwrap();
        c
    };
    for count in [0, 4] {
        let err = fast.draft_parallel(&s.target, &ctx2, 1, count).unwrap_err().to_string();
        assert!(err.contains("count"), "DRAFT-8: {count} drafts of a block of 4 are refused: {err}");
    }
    let err = fast.extend(&mut fast.new_context(), &[f64::NAN; 16]).unwrap_err().to_string();
    assert!(err.contains("rows") && err.contains("non-finite"), "DRAFT-7: a NaN row is refused: {err}");
    let err = fast.block_logits(&s.target, &ctx2, &[1, 16, 15, 15]).unwrap_err().to_string();
    assert!(err.contains("block_tokens"), "DRAFT-8: an id outside the vocabulary is refused: {err}");
}
