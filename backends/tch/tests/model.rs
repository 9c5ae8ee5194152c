//! The tch Llama forward against the f64 reference forward (`specdec_models::RefModel`):
//! MODEL-8 (one code path for ragged prefill, verify windows and decodes; validation
//! before the device; per-sequence strict trim), MODEL-9 (hidden states of the requested
//! layers, in request order), MODEL-10 (RoPE at each token's own position), MODEL-11
//! (the stated precision holds, and was measured: `measured_precision`).
//!
//! Every comparison goes through one helper, [`built::check`]: each value within
//! `logit_rel_tolerance` of the reference relative to the reference row's largest
//! magnitude, and (for logits) the argmax equal to the reference's unless the reference's
//! top-2 margin is below `argmax_margin_epsilon`. Each test runs on the CPU and, where
//! libtorch sees one, on CUDA. Without the `libtorch` feature the tests are reported as
//! ignored, with the reason.

#[cfg(not(feature = "libtorch"))]
#[test]
#[ignore = "tch backend not built: the `libtorch` feature is off (cargo xtask test builds it with a cached libtorch)"]
fn model_tests_need_the_libtorch_feature() {}

#[cfg(feature = "libtorch")]
mod built {
    use specdec_backend::{Backend, BackendError, ModelBackend, ModelPrecision};
    use specdec_models::tiny::TinySpec;
    use specdec_models::{ForwardRequest, LlamaConfig, LlamaWeights, LogitRows, ModelError, RefCache, RefModel};
    use specdec_tch::{TchBackend, TchModel, TchModelCache, TchTensor};

    fn backends() -> Vec<TchBackend> {
        let mut all = vec![TchBackend::cpu()];
        all.extend(TchBackend::cuda_if_available().ok());
        all
    }

    fn presets() -> Vec<(String, LlamaWeights)> {
        TinySpec::PRESETS.iter().map(|(name, spec)| (name.to_string(), spec.weights().expect("preset weights"))).collect()
    }

    /// A deeper seeded model than the tiny ones (which stop at 2 layers and hidden 32):
    /// vocab 256, hidden 64, 6 layers, 8 heads over 2 kv heads, untied head, built with
    /// the tiny models' seeded generator.
    fn deep_weights() -> LlamaWeights {
        let mut cfg: LlamaConfig = TinySpec::PRESETS[0].1.config();
        cfg.vocab_size = 256;
        cfg.hidden_size = 64;
        cfg.intermediate_size = 176;
        cfg.num_hidden_layers = 6;
        cfg.num_attention_heads = 8;
        cfg.num_key_value_heads = 2;
        cfg.max_position_embeddings = 128;
        cfg.tie_word_embeddings = false;
        specdec_models::tiny::seeded(cfg, 0x5eed).expect("deep weights")
    }

    /// `n` deterministic token ids below `vocab`, varied by `salt`.
    fn tokens(n: usize, salt: usize, vocab: usize) -> Vec<u32> {
        (0..n).map(|i| ((salt * 7 + i * 5 + i * i * 3 + 1) % vocab) as u32).collect()
    }

    fn host(be: &TchBackend, t: &TchTensor) -> Vec<f64> {
        be.download_f64(t).expect("download").into_data()
    }

    /// The one comparison of this file. `got` and `want` are row-major rows of `width`;
    /// every `|got - want|` must be within `logit_rel_tolerance · max|want row|`, and with
    /// `argmax`, each row's argmax (ties to the lowest id) must be the reference's unless
    /// the reference's top-2 margin is below `argmax_margin_epsilon` (such rows are
    /// counted and reported, never hidden). Returns the worst relative error.
    pub(crate) fn check(what: &str, got: &[f64], want: &[f64], width: usize, argmax: bool, p: &ModelPrecision) -> f64 {
        assert_eq!(got.len(), want.len(), "{what}: {} values, the reference has {}", got.len(), want.len());
        assert!(width > 0 && want.len().is_multiple_of(width), "{what}: {} values are not rows of {width}", want.len());
        let (mut worst, mut excused) = (0.0f64, 0);
        for (r, (g, w)) in got.chunks(width).zip(want.chunks(width)).enumerate() {
            let scale = w.iter().fold(0.0f64, |m, v| m.max(v.abs()));
            let err = g.iter().zip(w).fold(0.0f64, |m, (a, b)| m.max((a - b).abs()));
            let rel = if scale > 0.0 { err / scale } else { err };
            assert!(rel.is_finite() && rel <= p.logit_rel_tolerance, "{what}: row {r} relative error {rel:e} > {:e}", p.logit_rel_tolerance);
            worst = worst.max(rel);
            if argmax {
                let top = |x: &[f64]| x.iter().enumerate().fold(0, |best, (i, v)| if *v > x[best] { i } else { best });
                let (tg, tw) = (top(g), top(w));
                if tg != tw {
                    let second = w.iter().enumerate().filter(|(i, _)| *i != tw).fold(f64::NEG_INFINITY, |m, (_, v)| m.max(*v));
                    let margin = w[tw] - second;
                    assert!(margin < p.argmax_margin_epsilon, "{what}: row {r} argmax {tg}, reference {tw} with margin {margin:e}");
                    excused += 1;
                }
            }
        }
        if excused > 0 {
            eprintln!("{what}: {excused} argmax rows excused by the reference's margin");
        }
        worst
    }

    /// The backend and the reference, run side by side on the same requests.
    struct Pair<'a> {
        be: &'a TchBackend,
        model: TchModel,
        cache: TchModelCache,
        reference: RefModel,
        ref_cache: RefCache,
        prec: ModelPrecision,
        worst: f64,
    }

    impl<'a> Pair<'a> {
        fn new(be: &'a TchBackend, weights: &LlamaWeights, batch: usize, capacity: usize) -> Self {
            let model = be.load_model(weights).expect("load");
            let cache = be.new_model_cache(&model, batch, capacity).expect("cache");
            let reference = RefModel::new(weights.clone());
            let ref_cache = reference.new_cache(batch, capacity).expect("reference cache");
            Pair { be, model, cache, reference, ref_cache, prec: be.model_precision(), worst: 0.0 }
        }

        /// One call on both; checks logits and hidden states; returns the backend's logits.
        fn step(&mut self, what: &str, req: &ForwardRequest<'_>) -> Vec<f64> {
            let out = self.be.forward(&self.model, &mut self.cache, req).expect("forward");
            let want = self.reference.forward(&mut self.ref_cache, req).expect("reference forward");
            assert_eq!(out.plan, want.plan, "{what}: plan");
            let cfg = self.reference.config();
            let logits = out.logits.as_ref().map(|t| host(self.be, t)).unwrap_or_default();
            assert_eq!(out.logits.is_some(), req.logits != LogitRows::None, "{what}: logits presence");
            if out.logits.is_some() {
                let w = check(&format!("{what} logits"), &logits, &want.logits, cfg.vocab_size, true, &self.prec);
                self.worst = self.worst.max(w);
            }
            assert_eq!(out.hidden.is_some(), !req.hidden_layers.is_empty(), "{what}: hidden presence");
            if let Some(h) = &out.hidden {
                check(&format!("{what} hidden"), &host(self.be, h), &want.hidden, cfg.hidden_size, false, &self.prec);
            }
            assert_eq!(self.be.cache_lens(&self.cache), self.ref_cache.lens(), "{what}: cache lengths");
            // Absolute positions (MODEL-10): attention sees only relative ones, so a RoPE
            // table shifted by a constant would pass the logits; the cached keys would not.
            let width = cfg.num_key_value_heads * cfg.head_dim();
            for layer in 0..cfg.num_hidden_layers {
                for seq in 0..self.ref_cache.lens().len() {
                    let (k, v) = self.be.cache_contents(&self.cache, layer, seq).expect("contents");
                    check(&format!("{what} keys {layer}/{seq}"), &k, self.ref_cache.keys(layer, seq), width, false, &self.prec);
                    check(&format!("{what} values {layer}/{seq}"), &v, self.ref_cache.values(layer, seq), width, false, &self.prec);
                }
            }
            logits
        }
    }

    /// MODEL-8, MODEL-10, MODEL-11: a ragged batch (prompts of 1, 4 and 7 tokens), then a
    /// call where one sequence sits out, then one-token decodes, all against the reference.
    #[test]
    fn ragged_batch_matches_the_reference() {
        for be in backends() {
            for (name, w) in presets() {
                let v = w.config.vocab_size;
                let mut pair = Pair::new(&be, &w, 3, 32);
                let prompts: Vec<Vec<u32>> = [1, 4, 7].iter().enumerate().map(|(s, &n)| tokens(n, s, v)).collect();
                pair.step(&format!("{name} {} prefill", be.name()), &ForwardRequest::all_logits(&prompts));
                let partial = vec![tokens(2, 5, v), Vec::new(), tokens(3, 6, v)];
                pair.step(&format!("{name} {} partial", be.name()), &ForwardRequest::last_logits(&partial));
                for step in 0..3 {
                    let next: Vec<Vec<u32>> = (0..3).map(|s| tokens(1, 10 + step * 3 + s, v)).collect();
                    pair.step(&format!("{name} {} decode {step}", be.name()), &ForwardRequest::last_logits(&next));
                }
                assert_eq!(be.cache_lens(&pair.cache), [6, 7, 13]);
            }
        }
    }

    /// MODEL-8: a 5-token verify window gives the logits of 5 one-token decodes (both
    /// within the stated precision of each other and of the reference) and the same cache.
    #[test]
    fn verify_window_matches_one_token_decodes() {
        for be in backends() {
            for (name, w) in presets() {
                let (v, prec) = (w.config.vocab_size, be.model_precision());
                let prompt = vec![tokens(3, 1, v)];
                let window = tokens(5, 2, v);
                let mut windowed = Pair::new(&be, &w, 1, 16);
                windowed.step("prompt", &ForwardRequest::last_logits(&prompt));
                let all = windowed.step(&format!("{name} {} window", be.name()), &ForwardRequest::all_logits(std::slice::from_ref(&window)));
                let mut decoded = Pair::new(&be, &w, 1, 16);
                decoded.step("prompt", &ForwardRequest::last_logits(&prompt));
                let mut rows = Vec::new();
                for (i, &t) in window.iter().enumerate() {
                    rows.extend(decoded.step(&format!("{name} {} decode {i}", be.name()), &ForwardRequest::last_logits(&[vec![t]])));
                }
                check(&format!("{name} {} window vs decodes", be.name()), &all, &rows, v, true, &prec);
                for layer in 0..w.config.num_hidden_layers {
                    let (k1, v1) = be.cache_contents(&windowed.cache, layer, 0).expect("contents");
                    let (k2, v2) = be.cache_contents(&decoded.cache, layer, 0).expect("contents");
                    let width = w.config.num_key_value_heads * w.config.head_dim();
                    check(&format!("{name} keys {layer}"), &k1, &k2, width, false, &prec);
                    check(&format!("{name} values {layer}"), &v1, &v2, width, false, &prec);
                }
            }
        }
    }

    /// MODEL-8 with KV-3/KV-4: append, trim, re-append gives exactly what a cache that
    /// never held the trimmed tokens gives (the same calls on the same live prefix, so
    /// bit-identical: a trimmed slot that is still read would show here), and matches the
    /// reference; trimming is per sequence.
    #[test]
    fn trim_then_reappend_equals_a_cache_that_never_held_the_tokens() {
        for be in backends() {
            for (name, w) in presets() {
                let v = w.config.vocab_size;
                let prompts = vec![tokens(4, 1, v), tokens(2, 2, v)];
                let dropped = vec![tokens(3, 3, v), tokens(2, 4, v)];
                let kept = vec![tokens(2, 5, v), tokens(1, 6, v)];
                let next = vec![tokens(1, 7, v), tokens(1, 8, v)];

                let mut trimmed = Pair::new(&be, &w, 2, 16);
                trimmed.step("prompt", &ForwardRequest::all_logits(&prompts));
                trimmed.step("dropped", &ForwardRequest::all_logits(&dropped));
                be.cache_trim(&mut trimmed.cache, &[3, 2]).expect("trim");
                trimmed.ref_cache.trim(&[3, 2]).expect("reference trim");
                assert_eq!(be.cache_lens(&trimmed.cache), [4, 2]);
                let a1 = trimmed.step(&format!("{name} re-append"), &ForwardRequest::all_logits(&kept));
                let a2 = trimmed.step(&format!("{name} next"), &ForwardRequest::last_logits(&next));

                let mut clean = Pair::new(&be, &w, 2, 16);
                clean.step("prompt", &ForwardRequest::all_logits(&prompts));
                let b1 = clean.step("append", &ForwardRequest::all_logits(&kept));
                let b2 = clean.step("next", &ForwardRequest::last_logits(&next));
                assert_eq!(a1, b1, "{name} {}: logits after re-append", be.name());
                assert_eq!(a2, b2, "{name} {}: next logits", be.name());
                for layer in 0..w.config.num_hidden_layers {
                    for seq in 0..2 {
                        let a = be.cache_contents(&trimmed.cache, layer, seq).expect("contents");
                        let b = be.cache_contents(&clean.cache, layer, seq).expect("contents");
                        assert_eq!(a, b, "{name} {}: layer {layer} sequence {seq} contents", be.name());
                    }
                }

                // Per sequence: trim only sequence 1, then both grow again.
                be.cache_trim(&mut trimmed.cache, &[0, 2]).expect("trim one");
                trimmed.ref_cache.trim(&[0, 2]).expect("reference trim one");
                assert_eq!(be.cache_lens(&trimmed.cache), [7, 2]);
                trimmed.step(&format!("{name} after per-sequence trim"), &ForwardRequest::all_logits(&kept));
            }
        }
    }

    fn invalid_input(r: Result<impl std::fmt::Debug, BackendError>, arg: &str, what: &str) {
        match r {
            Err(BackendError::Model(ModelError::InvalidInput { arg: got, .. })) if got == arg => {}
            other => panic!("{what}: expected an InvalidInput error on `{arg}`, got {other:?}"),
        }
    }

    /// MODEL-8: every bad input is a typed error named on the host, and leaves the cache
    /// as it was.
    #[test]
    fn bad_inputs_are_typed_errors() {
        for be in backends() {
            for (name, w) in presets() {
                let (v, layers) = (w.config.vocab_size, w.config.num_hidden_layers);
                let model = be.load_model(&w).expect("load");
                let mut cache = be.new_model_cache(&model, 2, 8).expect("cache");
                let ok = vec![tokens(3, 1, v), tokens(1, 2, v)];
                be.forward(&model, &mut cache, &ForwardRequest::all_logits(&ok)).expect("valid");

                let out_of_range = vec![vec![0, v as u32], vec![1]];
                invalid_input(be.forward(&model, &mut cache, &ForwardRequest::all_logits(&out_of_range)), "tokens", &format!("{name}: token id = vocab"));
                let too_long = vec![tokens(6, 3, v), vec![1]];
                invalid_input(be.forward(&model, &mut cache, &ForwardRequest::all_logits(&too_long)), "tokens", &format!("{name}: capacity exceeded"));
                let wrong_batch = vec![vec![1]];
                invalid_input(be.forward(&model, &mut cache, &ForwardRequest::all_logits(&wrong_batch)), "tokens", &format!("{name}: batch of 1 for 2"));
                let nothing = vec![Vec::new(), Vec::new()];
                invalid_input(be.forward(&model, &mut cache, &ForwardRequest::all_logits(&nothing)), "tokens", &format!("{name}: no token"));
                let twice = [0, 0];
                let req = ForwardRequest { tokens: &ok, logits: LogitRows::None, hidden_layers: &twice };
                invalid_input(be.forward(&model, &mut cache, &req), "hidden_layers", &format!("{name}: duplicate hidden layer"));
                let beyond = [layers];
                let req = ForwardRequest { tokens: &ok, logits: LogitRows::None, hidden_layers: &beyond };
                invalid_input(be.forward(&model, &mut cache, &req), "hidden_layers", &format!("{name}: hidden layer beyond the model"));
                invalid_input(be.cache_trim(&mut cache, &[4, 0]), "amounts", &format!("{name}: trim beyond length"));
                invalid_input(be.cache_trim(&mut cache, &[1]), "amounts", &format!("{name}: trim amounts of another batch"));
                invalid_input(be.cache_contents(&cache, layers, 0), "cache index", &format!("{name}: layer beyond the model"));
                invalid_input(be.cache_contents(&cache, 0, 2), "cache index", &format!("{name}: sequence beyond the batch"));
                invalid_input(be.new_model_cache(&model, 0, 8), "batch", &format!("{name}: empty batch"));
                invalid_input(be.new_model_cache(&model, 1, 0), "capacity", &format!("{name}: zero capacity"));
                invalid_input(be.new_model_cache(&model, 1, w.config.max_position_embeddings + 1), "capacity", &format!("{name}: capacity beyond the model"));
                assert_eq!(be.cache_lens(&cache), [3, 1], "{name}: a rejected call changed the cache");

                // A cache built for another geometry is refused, not indexed out of range.
                let other = presets().into_iter().find(|(_, o)| o.config.num_key_value_heads != w.config.num_key_value_heads || o.config.num_hidden_layers != layers);
                if let Some((_, o)) = other {
                    let other_model = be.load_model(&o).expect("load other");
                    let mut other_cache = be.new_model_cache(&other_model, 2, 8).expect("cache");
                    let small = vec![vec![1], vec![2]];
                    invalid_input(be.forward(&model, &mut other_cache, &ForwardRequest::all_logits(&small)), "cache", &format!("{name}: a foreign cache"));
                }
            }
        }
    }

    /// MODEL-9: hidden states of layers `[1, 0]` (request order, not layer order) on the
    /// 2-layer tiny models equal the reference's, alone and together with logits.
    #[test]
    fn hidden_states_follow_the_requested_layers() {
        for be in backends() {
            for (name, w) in presets().into_iter().filter(|(_, w)| w.config.num_hidden_layers == 2) {
                let v = w.config.vocab_size;
                let mut pair = Pair::new(&be, &w, 3, 16);
                let prompts: Vec<Vec<u32>> = [1, 4, 7].iter().enumerate().map(|(s, &n)| tokens(n, s, v)).collect();
                let req = ForwardRequest { tokens: &prompts, logits: LogitRows::None, hidden_layers: &[1, 0] };
                pair.step(&format!("{name} {} hidden [1, 0]", be.name()), &req);
                let next = vec![tokens(2, 4, v), vec![], tokens(1, 5, v)];
                let req = ForwardRequest { tokens: &next, logits: LogitRows::Last, hidden_layers: &[1, 0] };
                pair.step(&format!("{name} {} hidden with logits", be.name()), &req);
                // The layer-1 half of [1, 0] is the [1] call's output, layer 0 the [0] call's.
                let mut one = Pair::new(&be, &w, 3, 16);
                let only_one = one.be.forward(&one.model, &mut one.cache, &ForwardRequest { tokens: &prompts, logits: LogitRows::None, hidden_layers: &[1] }).expect("forward");
                let mut both = Pair::new(&be, &w, 3, 16);
                let both_out = both.be.forward(&both.model, &mut both.cache, &ForwardRequest { tokens: &prompts, logits: LogitRows::None, hidden_layers: &[1, 0] }).expect("forward");
                let (h, total) = (w.config.hidden_size, both_out.plan.total_tokens);
                let (a, b) = (host(&be, only_one.hidden.as_ref().expect("hidden")), host(&be, both_out.hidden.as_ref().expect("hidden")));
                for t in 0..total {
                    assert_eq!(a[t * h..(t + 1) * h], b[t * 2 * h..t * 2 * h + h], "{name}: token {t} layer-1 slot");
                }
            }
        }
    }

    /// A long mixed scenario on `weights`: ragged prefill, verify windows, trims and
    /// decodes; returns the worst relative logit error against the reference.
    fn scenario(be: &TchBackend, weights: &LlamaWeights, prompt_lens: [usize; 3], decodes: usize) -> f64 {
        let v = weights.config.vocab_size;
        let cap = weights.config.max_position_embeddings.min(prompt_lens.iter().max().copied().unwrap_or(0) + 8 + decodes);
        let mut pair = Pair::new(be, weights, 3, cap);
        let prompts: Vec<Vec<u32>> = prompt_lens.iter().enumerate().map(|(s, &n)| tokens(n, 20 + s, v)).collect();
        pair.step("prefill", &ForwardRequest::all_logits(&prompts));
        let windows: Vec<Vec<u32>> = (0..3).map(|s| tokens(6, 30 + s, v)).collect();
        pair.step("window", &ForwardRequest::all_logits(&windows));
        be.cache_trim(&mut pair.cache, &[4, 0, 6]).expect("trim");
        pair.ref_cache.trim(&[4, 0, 6]).expect("reference trim");
        for step in 0..decodes {
            let next: Vec<Vec<u32>> = (0..3).map(|s| tokens(1, 40 + step * 3 + s, v)).collect();
            pair.step("decode", &ForwardRequest::last_logits(&next));
        }
        pair.worst
    }

    /// MODEL-11: the measurement behind `model_precision` (run with `--nocapture` to see
    /// it): the worst relative logit error on every tiny model and on a deeper seeded
    /// model over up to 126 positions, each within the stated bound.
    #[test]
    fn measured_precision() {
        for be in backends() {
            let tol = be.model_precision().logit_rel_tolerance;
            for (name, w) in presets() {
                let worst = scenario(&be, &w, [1, 4, 7], 10);
                eprintln!("{} {name}: worst relative logit error {worst:.2e} (bound {tol:e})", be.name());
            }
            let worst = scenario(&be, &deep_weights(), [13, 100, 1], 20);
            eprintln!("{} deep (v256 h64 l6 8/2 heads): worst relative logit error {worst:.2e} (bound {tol:e})", be.name());
        }
    }
}
