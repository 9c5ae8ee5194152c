//! DFlash training on a tiny seeded target, as a user runs it: record the
//! target's greedy continuations and hidden states through the decoder,
//! train, export, load the checkpoint back and decode with it.
//!
//! Checked: a run is a pure function of its inputs and seed (bit-identical
//! weights and losses twice; another seed differs); training lowers the
//! held-out loss and raises the accepted length the trainer estimates, and
//! that estimate is what the decoder then measures (the acceptance of
//! greedy verification, DFLASH-4) within sampling noise; decoding with the
//! trained draft is token-identical to plain greedy decoding (DECODE-2).
#![cfg(feature = "libtorch")]

use std::sync::Arc;

use specdec_backend::ReferenceBackend;
use specdec_backend::model::ModelBackend;
use specdec_decoder::{DflashMode, DflashProposer, Engine, EngineConfig, NoProposer, NoSink, Request, RunOutput, record_hidden};
use specdec_models::hf::SaveDtype;
use specdec_models::tiny::TinySpec;
use specdec_models::{DflashDraft, DraftData, DraftSequence, LlamaWeights, Matrix, export_dflash, load_dflash};
use specdec_train::trainer::{Quiet, TrainConfig, evaluate_draft, train};

const LAYERS: [usize; 2] = [0, 1];

fn target() -> LlamaWeights {
    TinySpec::preset("tiny-v32-l2").unwrap().weights().unwrap()
}

/// Prompts `0 .. n` of 3 to 5 tokens (a fixed pseudo-random pattern).
fn prompts(range: std::ops::Range<usize>) -> Vec<Vec<u32>> {
    range.map(|i| (0..3 + i % 3).map(|j| ((7 * i + 13 * j + i * j) % 31) as u32 + 1).collect()).collect()
}

/// Greedy continuations and hidden rows, recorded by the decoder.
fn data(w: &LlamaWeights, prompts: &[Vec<u32>], tokens: usize) -> DraftData {
    let b = ReferenceBackend;
    let model = b.load_model(w).unwrap();
    let engine = Engine::new(&b, &model, &w.config, EngineConfig { k: 0, ..EngineConfig::default() }).unwrap();
    let requests: Vec<Request> = prompts.iter().map(|p| Request::greedy(p.clone(), tokens)).collect();
    let width = LAYERS.len() * w.config.hidden_size;
    let sequences = record_hidden(&engine, &requests, &LAYERS, w.config.hidden_size)
        .unwrap()
        .into_iter()
        .enumerate()
        .map(|(i, r)| DraftSequence {
            prompt_id: i,
            kind: "tiny".into(),
            hidden: Matrix::new(vec![r.tokens.len() - 1, width], r.rows.iter().map(|&v| v as f32).collect(), "hidden").unwrap(),
            tokens: r.tokens,
            prompt_len: r.prompt_len,
        })
        .collect();
    DraftData { target_layer_ids: LAYERS.to_vec(), hidden_size: w.config.hidden_size, vocab_size: w.config.vocab_size, sequences }
}

fn config(steps: usize, seed: u64) -> TrainConfig {
    TrainConfig { block_size: 4, mask_token_id: 0, steps, seqs_per_step: 4, anchors_per_seq: 8, lr: 3e-3, warmup: 10, eval_every: 25, seed, ..TrainConfig::default() }
}

#[test]
fn training_is_a_pure_function_of_its_inputs_and_seed() {
    let w = target();
    let train_data = data(&w, &prompts(0..12), 16);
    let run = |seed| train(&w, &train_data, None, &config(12, seed), &mut Quiet).unwrap();
    let (a, log_a) = run(3);
    let (b, log_b) = run(3);
    let (c, _) = run(4);
    assert_eq!(a.weights(), b.weights(), "the same seed gives bit-identical weights");
    assert_eq!(log_a.loss.iter().map(|l| l.to_bits()).collect::<Vec<_>>(), log_b.loss.iter().map(|l| l.to_bits()).collect::<Vec<_>>(), "and bit-identical losses");
    assert_ne!(a.weights(), c.weights(), "another seed gives other weights (the seed is used)");
}

#[test]
fn training_learns_and_the_trained_draft_decodes_losslessly() {
    let w = target();
    let train_data = data(&w, &prompts(0..48), 24);
    let heldout = data(&w, &prompts(48..60), 24);
    // Data recorded by the decoder matches a direct forward's hidden rows (MODEL-9).
    let seq = &train_data.sequences[0];
    let direct = specdec_models::RefModel::new(w.clone());
    let mut cache = direct.new_cache(1, 64).unwrap();
    let out = direct
        .forward(&mut cache, &specdec_models::ForwardRequest { tokens: &[seq.tokens[..seq.tokens.len() - 1].to_vec()], logits: specdec_models::LogitRows::None, hidden_layers: &LAYERS })
        .unwrap();
    for (i, (x, y)) in seq.hidden.data.iter().zip(&out.hidden).enumerate() {
        assert!((f64::from(*x) - y).abs() <= 1e-6 * (1.0 + y.abs()), "MODEL-9: recorded hidden value {i}: {x} vs a direct forward's {y}");
    }

    let (draft, log) = train(&w, &train_data, Some(&heldout), &config(200, 0), &mut Quiet).unwrap();
    let (first, last) = (log.evals.first().unwrap(), log.evals.last().unwrap());
    // `specdec-train --evaluate`: an existing draft on held-out data is measured
    // exactly as training measured it (the same forward on the same weights).
    let again = evaluate_draft(&w, &draft, &heldout, "cpu").unwrap();
    assert_eq!((again.loss.to_bits(), again.tau.to_bits(), again.blocks), (last.loss.to_bits(), last.tau.to_bits(), last.blocks), "evaluate_draft repeats the last held-out estimate");
    let mut other_layers = heldout.clone();
    other_layers.target_layer_ids = vec![0];
    assert!(evaluate_draft(&w, &draft, &other_layers, "cpu").unwrap_err().contains("does not fit"), "held-out data of other layers is refused");
    assert!(last.loss < 0.8 * first.loss, "held-out loss falls: {} at step {} to {} at step {}", first.loss, first.step, last.loss, last.step);
    assert!(last.accepted_per_block > first.accepted_per_block + 0.2, "held-out accepted drafts per block rise: {} to {}", first.accepted_per_block, last.accepted_per_block);

    let spec = decode_with_export(&w, &draft, "trained", 48..60, 24);
    // The trainer's estimate is the decoder's acceptance: both count leading
    // drafts equal to the target's greedy tokens (blocks near the end of a
    // sequence, which the trainer skips, draft fewer).
    let measured = spec.acceptance.mean_accepted();
    assert!((measured - last.accepted_per_block).abs() < 0.5, "the decoder accepts {measured} drafts per block, the trainer estimated {}", last.accepted_per_block);
}

/// A draft of two layers trains (an in-place residual add once broke
/// autograd from the second layer on: `specdec-train --draft-layers 2`
/// panicked on its first step), its held-out estimate is repeated by
/// `evaluate_draft`, and it decodes losslessly.
#[test]
fn a_draft_of_two_layers_trains_and_decodes_losslessly() {
    let w = target();
    let train_data = data(&w, &prompts(0..12), 16);
    let heldout = data(&w, &prompts(48..52), 16);
    let (draft, log) = train(&w, &train_data, Some(&heldout), &TrainConfig { draft_layers: 2, ..config(6, 0) }, &mut Quiet).unwrap();
    let last = log.evals.last().unwrap();
    let again = evaluate_draft(&w, &draft, &heldout, "cpu").unwrap();
    assert_eq!((again.loss.to_bits(), again.tau.to_bits()), (last.loss.to_bits(), last.tau.to_bits()), "evaluate_draft repeats the two-layer estimate");
    decode_with_export(&w, &draft, "two-layers", 48..52, 12);
}

/// Exports `draft` in f32, loads it back like any checkpoint (bit-identical),
/// and decodes `prompts(range)` with it, `tokens` each at k = 3: the output
/// must be plain greedy decoding's (DECODE-2). Returns the speculative run.
fn decode_with_export(w: &LlamaWeights, draft: &DflashDraft, name: &str, range: std::ops::Range<usize>, tokens: usize) -> RunOutput {
    let dir = std::env::temp_dir().join(format!("specdec-train-{name}-{}", std::process::id()));
    export_dflash(draft, &dir, SaveDtype::F32).unwrap();
    let loaded = load_dflash(&dir, &w.config).unwrap();
    std::fs::remove_dir_all(&dir).ok();
    assert_eq!(loaded.weights(), draft.weights(), "an f32 export loads back bit-identical");
    let b = ReferenceBackend;
    let model = b.load_model(w).unwrap();
    let requests: Vec<Request> = prompts(range).into_iter().map(|p| Request::greedy(p, tokens)).collect();
    let plain = Engine::new(&b, &model, &w.config, EngineConfig { k: 0, ..EngineConfig::default() }).unwrap().generate(&requests, &mut NoProposer, None, &mut NoSink).unwrap();
    let mut proposer = DflashProposer::new(format!("dflash:{name}"), loaded, Arc::new(w.clone()), DflashMode::Parallel).unwrap();
    let spec = Engine::new(&b, &model, &w.config, EngineConfig { k: 3, ..EngineConfig::default() }).unwrap().generate(&requests, &mut proposer, None, &mut NoSink).unwrap();
    for (i, (p, s)) in plain.outputs.iter().zip(&spec.outputs).enumerate() {
        assert_eq!(p.tokens, s.tokens, "DECODE-2: {name} request {i}: the draft's output equals plain greedy decoding");
    }
    spec
}

/// The device is named, checked against what libtorch sees, and never guessed.
#[test]
fn a_device_libtorch_does_not_have_is_refused() {
    let w = target();
    let train_data = data(&w, &prompts(0..4), 8);
    let run = |device: &str| train(&w, &train_data, None, &TrainConfig { device: device.into(), ..config(2, 0) }, &mut Quiet).map(|_| ());
    assert!(run("gpu").unwrap_err().contains("is not `cpu`, `cuda` or `cuda:N`"));
    assert!(run("cuda:x").unwrap_err().contains("is not `cpu`, `cuda` or `cuda:N`"));
    let beyond = format!("cuda:{}", tch::Cuda::device_count());
    assert!(run(&beyond).unwrap_err().contains("CUDA device(s)"), "{beyond} is past the last device");
    run("cpu").unwrap();
}
