//! The candle Llama forward against the f64 reference (MODEL-8 .. MODEL-11).
//!
//! Every scenario runs the candle backend and `RefModel` side by side on the
//! same calls ([`Pair::step`]) and judges each output with one helper,
//! [`check`]: logits within the backend's stated relative tolerance, argmax
//! identical unless the reference's top-2 margin is below the stated epsilon
//! (MODEL-11), hidden states likewise (MODEL-9). Models: every
//! `TinySpec::PRESETS` entry, and a seeded 30-layer model built here (the
//! tiny generator caps depth at 2) for the precision measurement. Run with
//! `--nocapture` to see the measured errors.

use candle_core::Tensor;
use rand::{RngExt, SeedableRng};
use rand_pcg::Pcg64;
use specdec_backend::model::{ForwardOutput, ForwardRequest, LlamaWeights, LogitRows, ModelBackend, ModelPrecision};
use specdec_backend::{Backend, BackendError};
use specdec_candle::{CandleBackend, CandleModel, CandleModelCache};
use specdec_models::tiny::TinySpec;
use specdec_models::{ModelError, RefCache, RefModel, reference::RefOutput};

fn presets() -> Vec<(&'static str, LlamaWeights)> {
    TinySpec::PRESETS.iter().map(|(name, spec)| (*name, spec.weights().expect("presets are valid"))).collect()
}

/// A deeper seeded model with `TinySpec::weights`' scales (the tiny
/// generator only makes 1..=2 layers): 30 layers, hidden 64, 8 heads over 2
/// KV heads, vocabulary 256.
fn deep_weights() -> LlamaWeights {
    let spec = TinySpec { vocab: 256, layers: 30, hidden: 64, heads: 8, kv_heads: 2, intermediate: 128, tied: false, seed: 30 };
    spec.seeded_weights().expect("valid weights")
}

/// Deterministic token ids in `[0, vocab)`.
fn tokens(n: usize, vocab: usize, salt: u64) -> Vec<u32> {
    let mut rng = Pcg64::seed_from_u64(salt);
    (0..n).map(|_| rng.random_range(0..vocab as u32)).collect()
}

fn host(b: &CandleBackend, t: &Tensor) -> Vec<f64> {
    b.download_f64(t).expect("download").data().to_vec()
}

/// Lowest index of the maximum (CONV-8 ties).
fn argmax(row: &[f64]) -> usize {
    row.iter().enumerate().fold(0, |best, (i, &v)| if v > row[best] { i } else { best })
}

fn top2_margin(row: &[f64]) -> f64 {
    let mut s = row.to_vec();
    s.sort_by(|a, b| b.total_cmp(a));
    s[0] - s.get(1).copied().unwrap_or(f64::NEG_INFINITY)
}

/// Worst `|x - ref| / max|ref in row|` over rows of `width`.
fn rel_err(got: &[f64], want: &[f64], width: usize) -> f64 {
    assert_eq!(got.len(), want.len(), "output sizes differ");
    got.chunks(width)
        .zip(want.chunks(width))
        .map(|(g, w)| {
            let scale = w.iter().fold(0.0f64, |m, v| m.max(v.abs())).max(f64::MIN_POSITIVE);
            g.iter().zip(w).map(|(g, w)| (g - w).abs() / scale).fold(0.0, f64::max)
        })
        .fold(0.0, f64::max)
}

/// What one comparison measured.
#[derive(Debug, Default, Clone, Copy)]
struct Measured {
    logits: f64,
    hidden: f64,
}

impl Measured {
    fn max(self, o: Measured) -> Measured {
        Measured { logits: self.logits.max(o.logits), hidden: self.hidden.max(o.hidden) }
    }
}

/// The one judge (MODEL-8, MODEL-9, MODEL-11): the candle outputs of a call
/// against the reference's, within the backend's stated precision.
/// `hidden_size` is one layer's block of a hidden row (`K` blocks per row).
fn check(b: &CandleBackend, got: &ForwardOutput<Tensor>, want: &RefOutput, vocab: usize, hidden_size: usize, k: usize, what: &str) -> Measured {
    let p: ModelPrecision = b.model_precision();
    assert_eq!(got.plan, want.plan, "{what}: plans differ");
    let mut m = Measured::default();
    match &got.logits {
        None => assert!(want.logits.is_empty(), "{what}: logits missing"),
        Some(l) => {
            assert_eq!(l.dims(), [want.plan.logit_rows, vocab], "{what}: logits shape");
            let l = host(b, l);
            m.logits = rel_err(&l, &want.logits, vocab);
            assert!(m.logits <= p.logit_rel_tolerance, "{what}: logit error {:e} beyond {:e}", m.logits, p.logit_rel_tolerance);
            for (r, (g, w)) in l.chunks(vocab).zip(want.logits.chunks(vocab)).enumerate() {
                if argmax(g) != argmax(w) {
                    assert!(top2_margin(w) < p.argmax_margin_epsilon, "{what}: row {r} argmax {} != reference {} with margin {:e}", argmax(g), argmax(w), top2_margin(w));
                }
            }
        }
    }
    match &got.hidden {
        None => assert!(want.hidden.is_empty(), "{what}: hidden states missing"),
        Some(h) => {
            assert_eq!(h.dims(), [want.plan.total_tokens, k * hidden_size], "{what}: hidden shape");
            // Judged per layer block of a row, as a logits row is.
            m.hidden = rel_err(&host(b, h), &want.hidden, hidden_size);
            assert!(m.hidden <= p.hidden_rel_tolerance, "{what}: hidden error {:e} beyond {:e}", m.hidden, p.hidden_rel_tolerance);
        }
    }
    m
}

/// The candle backend and the reference, driven by the same calls.
struct Pair {
    b: CandleBackend,
    model: CandleModel,
    cache: CandleModelCache,
    reference: RefModel,
    ref_cache: RefCache,
    worst: Measured,
    name: String,
}

impl Pair {
    fn new(name: &str, w: &LlamaWeights, batch: usize, capacity: usize) -> Pair {
        Pair::on(CandleBackend::cpu(), name, w, batch, capacity)
    }

    fn on(b: CandleBackend, name: &str, w: &LlamaWeights, batch: usize, capacity: usize) -> Pair {
        let model = b.load_model(w).expect("load");
        let cache = b.new_model_cache(&model, batch, capacity).expect("cache");
        let reference = RefModel::new(w.clone());
        let ref_cache = reference.new_cache(batch, capacity).expect("reference cache");
        Pair { b, model, cache, reference, ref_cache, worst: Measured::default(), name: name.to_string() }
    }

    fn vocab(&self) -> usize {
        self.reference.config().vocab_size
    }

    /// One call on both, judged by [`check`]; the caches stay in step.
    fn step(&mut self, toks: &[Vec<u32>], logits: LogitRows, hidden_layers: &[usize]) -> ForwardOutput<Tensor> {
        let req = ForwardRequest { tokens: toks, logits, hidden_layers };
        let got = self.b.forward(&self.model, &mut self.cache, &req).expect("candle forward");
        let want = self.reference.forward(&mut self.ref_cache, &req).expect("reference forward");
        let what = format!("{} {:?}", self.name, toks.iter().map(Vec::len).collect::<Vec<_>>());
        let m = check(&self.b, &got, &want, self.vocab(), self.reference.config().hidden_size, hidden_layers.len(), &what);
        self.worst = self.worst.max(m);
        assert_eq!(self.b.cache_lens(&self.cache), self.ref_cache.lens(), "{what}: cache lengths");
        got
    }

    /// [`Pair::step`], with the logits downloaded.
    fn logits(&mut self, toks: &[Vec<u32>], rows: LogitRows) -> Vec<f64> {
        let out = self.step(toks, rows, &[]);
        host(&self.b, out.logits.as_ref().expect("logits were asked"))
    }

    fn trim(&mut self, amounts: &[usize]) {
        self.b.cache_trim(&mut self.cache, amounts).expect("trim");
        self.ref_cache.trim(amounts).expect("reference trim");
    }
}

/// MODEL-8: a ragged prefill (prompts of 1, 4 and 7 tokens), then decodes
/// and verify windows of different lengths per sequence, all against the
/// reference; also the last-row-only logits.
fn ragged_batch(name: &str, w: &LlamaWeights, capacity: usize) -> Measured {
    ragged_batch_on(CandleBackend::cpu(), name, w, capacity)
}

fn ragged_batch_on(b: CandleBackend, name: &str, w: &LlamaWeights, capacity: usize) -> Measured {
    let v = w.config.vocab_size;
    let mut pair = Pair::on(b, name, w, 3, capacity);
    let prompts: Vec<Vec<u32>> = [1, 4, 7].iter().enumerate().map(|(i, &n)| tokens(n, v, i as u64)).collect();
    pair.step(&prompts, LogitRows::All, &[]);
    pair.step(&[tokens(1, v, 10), vec![], tokens(3, v, 11)], LogitRows::Last, &[]);
    let mut salt = 100;
    while pair.b.cache_lens(&pair.cache).iter().max().is_some_and(|&l| l + 6 <= capacity) {
        let toks: Vec<Vec<u32>> = (0..3).map(|s| tokens(1 + (salt as usize + s) % 6, v, salt + s as u64)).collect();
        pair.step(&toks, LogitRows::All, &[]);
        salt += 3;
    }
    pair.worst
}

#[test]
fn ragged_batch_logits_match_the_reference_on_every_preset() {
    for (name, w) in presets() {
        let m = ragged_batch(name, &w, w.config.max_position_embeddings);
        println!("MODEL-11 {name}: worst logit rel error {:.2e}", m.logits);
    }
}

/// MODEL-11 measured on depth: 30 layers, windows up to 48 positions.
#[test]
fn thirty_layer_model_is_within_the_stated_precision() {
    let w = deep_weights();
    let m = ragged_batch("deep-l30", &w, 48);
    let mut pair = Pair::new("deep-l30 hidden", &w, 2, 16);
    let h = pair.step(&[tokens(5, 256, 1), tokens(9, 256, 2)], LogitRows::Last, &[29, 0, 14]);
    println!("MODEL-11 deep-l30: worst logit rel error {:.2e}, hidden {:.2e}", m.logits, pair.worst.hidden);
    assert!(h.hidden.is_some());
}

/// MODEL-11 with reduced-precision weights, on the seeded 30-layer model,
/// whose every input width is a multiple of Q8_0's 32-value block, so every
/// linear weight is converted (the bytes a step reads prove it): within the
/// precision each format states, and measurably coarser than f32 (so the
/// reduced-precision product really ran).
#[test]
fn reduced_precision_weights_are_within_their_stated_precision() {
    let w = deep_weights();
    let exact = ragged_batch("deep-l30", &w, 48);
    let f32_bytes = CandleBackend::cpu().load_model(&w).expect("load").weight_bytes_per_step();
    for (b, bytes_at_most) in [(CandleBackend::cpu_f16(), f32_bytes / 2 + f32_bytes / 50), (CandleBackend::cpu_q8_0(), f32_bytes / 3)] {
        let format = b.model_precision().weight_dtype;
        let bytes = b.load_model(&w).expect("load").weight_bytes_per_step();
        assert!(bytes <= bytes_at_most, "{format} reads {bytes} bytes a step, f32 {f32_bytes}");
        let m = ragged_batch_on(b, &format!("deep-l30 {format}"), &w, 48);
        println!("MODEL-11 deep-l30 {format}: worst logit rel error {:.2e} (f32: {:.2e})", m.logits, exact.logits);
        assert!(m.logits > 10.0 * exact.logits, "{format} error {:e} is not coarser than f32's {:e}", m.logits, exact.logits);
    }
}

/// MODEL-8: a 5-token verify window gives the logits of 5 one-token decodes
/// (same code path; f32 GEMMs over different row counts may round apart).
#[test]
fn a_verify_window_equals_one_token_decodes() {
    for (name, w) in presets() {
        let v = w.config.vocab_size;
        let prompt = [tokens(3, v, 1), tokens(6, v, 2)];
        let window = [tokens(5, v, 3), tokens(5, v, 4)];
        let mut win = Pair::new(name, &w, 2, 32);
        let mut dec = Pair::new(name, &w, 2, 32);
        win.step(&prompt, LogitRows::Last, &[]);
        dec.step(&prompt, LogitRows::Last, &[]);
        let all = win.logits(&window, LogitRows::All);
        let mut worst: f64 = 0.0;
        for i in 0..5 {
            let one: Vec<Vec<u32>> = window.iter().map(|t| vec![t[i]]).collect();
            let got = dec.logits(&one, LogitRows::All);
            for (s, row) in got.chunks(v).enumerate() {
                let wrow = &all[(s * 5 + i) * v..(s * 5 + i + 1) * v];
                worst = worst.max(rel_err(row, wrow, v));
                assert_eq!(argmax(row), argmax(wrow), "{name}: sequence {s} token {i}: argmax differs");
            }
        }
        println!("MODEL-8 {name}: verify window vs decodes, max rel difference {worst:.2e}");
        assert!(worst <= win.b.model_precision().logit_rel_tolerance);
        for l in 0..w.config.num_hidden_layers {
            for s in 0..2 {
                let (a, b) = (win.b.cache_contents(&win.cache, l, s).expect("contents"), dec.b.cache_contents(&dec.cache, l, s).expect("contents"));
                assert!(rel_err(&a.0, &b.0, a.0.len().max(1)) <= 1e-5 && rel_err(&a.1, &b.1, a.1.len().max(1)) <= 1e-5, "{name}: caches differ");
            }
        }
    }
}

/// KV-3/KV-4 through the model: append, trim, re-append gives the next
/// logits and the cache of a cache that never held the trimmed tokens.
#[test]
fn trim_then_reappend_matches_a_cache_that_never_held_the_tokens() {
    for (name, w) in presets() {
        let v = w.config.vocab_size;
        let prompt = [tokens(4, v, 1), tokens(2, v, 2)];
        let rejected = [tokens(3, v, 3), tokens(4, v, 4)];
        let accepted = [tokens(2, v, 5), tokens(1, v, 6)];
        let mut trimmed = Pair::new(name, &w, 2, 32);
        let mut fresh = Pair::new(name, &w, 2, 32);
        trimmed.step(&prompt, LogitRows::Last, &[]);
        trimmed.step(&rejected, LogitRows::All, &[]);
        trimmed.trim(&[3, 4]);
        assert_eq!(trimmed.b.cache_lens(&trimmed.cache), [4, 2]);
        let a = trimmed.logits(&accepted, LogitRows::All);
        fresh.step(&prompt, LogitRows::Last, &[]);
        let b = fresh.logits(&accepted, LogitRows::All);
        let diff = rel_err(&a, &b, v);
        println!("KV-4 {name}: trimmed vs fresh logits, max rel difference {diff:.2e}");
        assert!(diff <= trimmed.b.model_precision().logit_rel_tolerance);
        for l in 0..w.config.num_hidden_layers {
            for s in 0..2 {
                let got = trimmed.b.cache_contents(&trimmed.cache, l, s).expect("contents");
                assert_eq!(got, fresh.b.cache_contents(&fresh.cache, l, s).expect("contents"), "{name}: layer {l} sequence {s}");
                let kv = w.config.num_key_value_heads * w.config.head_dim();
                assert_eq!(got.0.len(), trimmed.b.cache_lens(&trimmed.cache)[s] * kv);
                let width = got.0.len().max(1);
                assert!(rel_err(&got.0, trimmed.ref_cache.keys(l, s), width) <= 1e-5, "{name}: keys vs reference");
                assert!(rel_err(&got.1, trimmed.ref_cache.values(l, s), width) <= 1e-5, "{name}: values vs reference");
            }
        }
    }
}

/// MODEL-9: hidden states of `[1, 0]` (request order, not layer order) on
/// the 2-layer presets, beside all logits and with none.
#[test]
fn hidden_states_follow_the_requested_layers() {
    for (name, w) in presets().into_iter().filter(|(_, w)| w.config.num_hidden_layers == 2) {
        let v = w.config.vocab_size;
        let mut pair = Pair::new(name, &w, 3, 32);
        let out = pair.step(&[tokens(2, v, 1), tokens(5, v, 2), vec![]], LogitRows::All, &[1, 0]);
        assert_eq!(out.hidden.as_ref().map(|h| h.dims().to_vec()), Some(vec![7, 2 * w.config.hidden_size]));
        let out = pair.step(&[tokens(1, v, 3), tokens(3, v, 4), tokens(4, v, 5)], LogitRows::None, &[1, 0]);
        assert!(out.logits.is_none());
        println!("MODEL-9 {name}: worst hidden rel error {:.2e}", pair.worst.hidden);
    }
}

/// The typed error of a call, with the cache left as it was.
fn invalid<T: std::fmt::Debug>(r: Result<T, BackendError>, arg: &str) {
    match r {
        Err(BackendError::Model(ModelError::InvalidInput { arg: a, .. })) if a == arg => {}
        other => panic!("expected an invalid `{arg}`, got {other:?}"),
    }
}

/// MODEL-8: every bad input is a typed error before the device is touched,
/// and leaves the cache unchanged.
#[test]
fn bad_input_is_a_typed_error() {
    let (_, w) = &presets()[1];
    let v = w.config.vocab_size;
    let b = CandleBackend::cpu();
    let model = b.load_model(w).expect("load");
    let mut cache = b.new_model_cache(&model, 2, 8).expect("cache");
    b.forward(&model, &mut cache, &ForwardRequest::all_logits(&[tokens(7, v, 1), tokens(2, v, 2)])).expect("prefill");
    let before = (b.cache_lens(&cache), b.cache_contents(&cache, 1, 0).expect("contents"));
    invalid(b.forward(&model, &mut cache, &ForwardRequest::all_logits(&[vec![v as u32], vec![]])), "tokens");
    invalid(b.forward(&model, &mut cache, &ForwardRequest::all_logits(&[vec![0, 1], vec![]])), "tokens");
    invalid(b.forward(&model, &mut cache, &ForwardRequest::all_logits(&[vec![0]])), "tokens");
    invalid(b.forward(&model, &mut cache, &ForwardRequest::all_logits(&[vec![], vec![]])), "tokens");
    let twice = ForwardRequest { tokens: &[vec![0], vec![0]], logits: LogitRows::All, hidden_layers: &[0, 0] };
    invalid(b.forward(&model, &mut cache, &twice), "hidden_layers");
    let outside = ForwardRequest { hidden_layers: &[2], ..twice };
    invalid(b.forward(&model, &mut cache, &outside), "hidden_layers");
    invalid(b.cache_trim(&mut cache, &[8, 0]), "amounts");
    invalid(b.cache_trim(&mut cache, &[1]), "amounts");
    assert_eq!((b.cache_lens(&cache), b.cache_contents(&cache, 1, 0).expect("contents")), before);
    invalid(b.cache_contents(&cache, 2, 0), "cache index");
    invalid(b.cache_contents(&cache, 0, 2), "cache index");
    invalid(b.new_model_cache(&model, 0, 8), "batch");
    invalid(b.new_model_cache(&model, 1, w.config.max_position_embeddings + 1), "capacity");
    // A cache of another model's geometry.
    let other = b.load_model(&presets()[2].1).expect("load");
    let mut foreign = b.new_model_cache(&other, 2, 8).expect("cache");
    invalid(b.forward(&model, &mut foreign, &ForwardRequest::all_logits(&[vec![0], vec![0]])), "cache");
    // Weights whose shapes disagree with their config.
    let mut bad = w.clone();
    bad.layers[0].wq.shape = vec![1, bad.layers[0].wq.data.len()];
    assert!(matches!(b.load_model(&bad), Err(BackendError::Model(ModelError::TensorShape { .. }))));
}

/// MODEL-11 on a real model file (GGUF or HF directory) named by the
/// `SPECDEC_MODEL` environment variable: a prompt of up to 100 tokens, an
/// 8-token verify window and 4 decodes against the reference. Ignored by
/// default (the reference takes seconds per call on a 100M-parameter model);
/// run with `SPECDEC_MODEL=... cargo test -p specdec-candle --test model --
/// --ignored --nocapture`.
#[test]
#[ignore = "needs a model file in SPECDEC_MODEL"]
fn a_model_file_is_within_the_stated_precision() {
    let Some(path) = std::env::var_os("SPECDEC_MODEL") else {
        println!("SPECDEC_MODEL is not set: nothing to measure");
        return;
    };
    let w = specdec_models::load(&path).expect("a loadable model").weights;
    let (v, capacity) = (w.config.vocab_size, w.config.max_position_embeddings.min(112));
    assert!(capacity >= 13, "the model's context is too short for this scenario");
    for b in [CandleBackend::cpu(), CandleBackend::cpu_f16(), CandleBackend::cpu_q8_0()] {
        let weights = b.model_precision().weight_dtype;
        let mut pair = Pair::on(b, "model file", &w, 1, capacity);
        pair.step(&[tokens(capacity - 12, v, 1)], LogitRows::Last, &[]);
        pair.step(&[tokens(8, v, 2)], LogitRows::All, &[]);
        for i in 0..4 {
            pair.step(&[tokens(1, v, 3 + i)], LogitRows::All, &[]);
        }
        println!("MODEL-11 {}-layer model file, {weights} weights: worst logit rel error {:.2e}", w.config.num_hidden_layers, pair.worst.logits);
    }
}

/// MODEL-17: Qwen2's biases and Qwen3's head norms, on the checkpoints HF
/// transformers wrote, against the reference (a ragged batch, verify
/// windows, decodes). The control: the same forward on weights whose extras
/// are doubled lies outside the tolerance, so a dropped or misplaced extra
/// cannot pass.
#[test]
fn qwen_attention_extras_match_the_reference() {
    for case in ["qwen2", "qwen3"] {
        let dir = std::path::PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../../fixtures/architectures")).join(case);
        let w = specdec_models::load(&dir).unwrap().weights;
        let m = ragged_batch(case, &w, 24);
        println!("MODEL-17 {case}: worst logit rel error {:.2e}", m.logits);

        let mut doubled = w.clone();
        for extras in doubled.layers.iter_mut().map(|l| &mut l.attn) {
            for t in [&mut extras.q_bias, &mut extras.k_bias, &mut extras.v_bias, &mut extras.q_norm, &mut extras.k_norm].into_iter().flatten() {
                t.data.iter_mut().for_each(|v| *v *= 2.0);
            }
        }
        let b = CandleBackend::cpu();
        let model = b.load_model(&doubled).unwrap();
        let mut cache = b.new_model_cache(&model, 1, 24).unwrap();
        let prompt = [tokens(7, w.config.vocab_size, 1)];
        let req = ForwardRequest { tokens: &prompt, logits: LogitRows::All, hidden_layers: &[] };
        let got = host(&b, b.forward(&model, &mut cache, &req).unwrap().logits.as_ref().unwrap());
        let reference = RefModel::new(w.clone());
        let want = reference.forward(&mut reference.new_cache(1, 24).unwrap(), &req).unwrap().logits;
        let err = rel_err(&got, &want, w.config.vocab_size);
        assert!(err > 10.0 * b.model_precision().logit_rel_tolerance, "{case}: doubled extras within the tolerance ({err:e})");

        // A layer missing one of its extras is refused, never run as Llama's.
        let mut partial = w.clone();
        let extras = &mut partial.layers[1].attn;
        if extras.v_bias.is_some() {
            extras.v_bias = None
        } else {
            extras.k_norm = None
        }
        let Err(e) = b.load_model(&partial) else { panic!("{case}: a layer without all its extras loaded") };
        assert!(e.to_string().contains("layers.1"), "{case}: {e}");
    }
}
