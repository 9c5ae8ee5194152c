//! The reference forward (MODEL-7 .. MODEL-13) checked against hand
//! computations and against its own stated invariants.

use specdec_models::forward::{ForwardRequest, LogitRows, plan, rope_angles};
use specdec_models::tiny::TinySpec;
use specdec_models::{LlamaConfig, LlamaWeights, RefModel};

fn tiny(name: &str) -> LlamaWeights {
    TinySpec::preset(name).expect("a preset").weights().expect("tiny weights")
}

fn logits(model: &RefModel, tokens: &[Vec<u32>], rows: LogitRows) -> Vec<Vec<f64>> {
    let mut cache = model.new_cache(tokens.len(), 32).unwrap();
    let out = model.forward(&mut cache, &ForwardRequest { tokens, logits: rows, hidden_layers: &[] }).unwrap();
    out.logits.chunks(model.config().vocab_size).map(<[f64]>::to_vec).collect()
}

/// Independent loops: RMSNorm of a vector with gains.
fn rms(x: &[f64], g: &[f32], eps: f64) -> Vec<f64> {
    let ms = x.iter().map(|v| v * v).sum::<f64>() / x.len() as f64;
    x.iter().zip(g).map(|(v, g)| v / (ms + eps).sqrt() * f64::from(*g)).collect()
}

fn matvec(w: &specdec_models::Matrix, x: &[f64]) -> Vec<f64> {
    (0..w.rows()).map(|r| w.row(r).iter().zip(x).map(|(a, b)| f64::from(*a) * b).sum()).collect()
}

fn close(a: &[f64], b: &[f64], tol: f64) {
    assert_eq!(a.len(), b.len());
    for (i, (x, y)) in a.iter().zip(b).enumerate() {
        assert!((x - y).abs() <= tol * (1.0 + y.abs()), "index {i}: {x} vs {y}");
    }
}

/// MODEL-8: with attention and MLP outputs zeroed, a layer is the identity,
/// so logits are `head · rmsnorm(embed[t])` at every position, whatever the context.
#[test]
fn zeroed_layers_leave_the_residual_stream_alone() {
    let mut w = tiny("tiny-v12-l2");
    for l in &mut w.layers {
        l.wo.data.fill(0.0);
        l.w_down.data.fill(0.0);
    }
    let cfg = w.config.clone();
    let model = RefModel::new(w.clone());
    let toks = vec![vec![3u32, 7, 7, 1]];
    let got = logits(&model, &toks, LogitRows::All);
    for (i, &t) in toks[0].iter().enumerate() {
        let x: Vec<f64> = w.embed.row(t as usize).iter().map(|&v| f64::from(v)).collect();
        let want = matvec(w.output_matrix(), &rms(&x, &w.final_norm.data, cfg.rms_norm_eps));
        close(&got[i], &want, 1e-12);
    }
}

/// MODEL-8: a first token attends only to itself, so attention returns its
/// own value vector (RoPE does not touch values): `x + Wo·Wv·rmsnorm(x)`.
#[test]
fn a_single_token_attends_to_its_own_value() {
    let mut w = tiny("tiny-v16-l1");
    w.layers[0].w_down.data.fill(0.0);
    let cfg = w.config.clone();
    let l = &w.layers[0];
    let t = 5usize;
    let x: Vec<f64> = w.embed.row(t).iter().map(|&v| f64::from(v)).collect();
    let v = matvec(&l.wv, &rms(&x, &l.attn_norm.data, cfg.rms_norm_eps));
    // GQA: query head h reads KV head h / (heads / kv_heads).
    let (hd, group) = (cfg.head_dim(), cfg.num_attention_heads / cfg.num_key_value_heads);
    let att: Vec<f64> = (0..cfg.num_attention_heads).flat_map(|h| v[(h / group) * hd..(h / group + 1) * hd].to_vec()).collect();
    let o = matvec(&l.wo, &att);
    let x1: Vec<f64> = x.iter().zip(&o).map(|(a, b)| a + b).collect();
    let want = matvec(w.output_matrix(), &rms(&x1, &w.final_norm.data, cfg.rms_norm_eps));
    let got = logits(&RefModel::new(w), &[vec![t as u32]], LogitRows::Last);
    close(&got[0], &want, 1e-12);
}

/// MODEL-10: the angle table by hand.
#[test]
fn rope_angles_by_hand() {
    let (c, s) = rope_angles(0, 4, 10_000.0);
    assert_eq!((c, s), (vec![1.0, 1.0], vec![0.0, 0.0]));
    let (c, s) = rope_angles(3, 4, 10_000.0);
    close(&c, &[3f64.cos(), (0.03f64).cos()], 1e-15);
    close(&s, &[3f64.sin(), (0.03f64).sin()], 1e-15);
}

/// MODEL-13: the reference's verify window equals its one-token decodes bit
/// for bit, and a sequence's logits do not depend on its batch.
#[test]
fn window_and_batch_invariance_are_exact() {
    for (name, spec) in TinySpec::PRESETS {
        let model = RefModel::new(spec.weights().unwrap());
        let toks: Vec<u32> = (0..9).map(|i| (i * 5 + 2) as u32 % spec.vocab as u32).collect();
        let window = logits(&model, std::slice::from_ref(&toks), LogitRows::All);
        let mut cache = model.new_cache(1, 32).unwrap();
        for (i, &t) in toks.iter().enumerate() {
            let out = model.forward(&mut cache, &ForwardRequest::last_logits(&[vec![t]])).unwrap();
            assert_eq!(out.logits, window[i], "{name}: position {i}");
        }
        let other: Vec<u32> = vec![1, 2, 3];
        let batched = logits(&model, &[other, toks.clone()], LogitRows::All);
        assert_eq!(&batched[3..], &window[..], "{name}: batch changed a sequence's logits");
    }
}

/// MODEL-9: hidden states come back in request order, `K · hidden` per token.
#[test]
fn hidden_states_follow_request_order() {
    let model = RefModel::new(tiny("tiny-v32-l2"));
    let h = model.config().hidden_size;
    let toks = vec![vec![1u32, 2, 3]];
    let get = |layers: &[usize]| {
        let mut cache = model.new_cache(1, 8).unwrap();
        model.forward(&mut cache, &ForwardRequest { tokens: &toks, logits: LogitRows::None, hidden_layers: layers }).unwrap()
    };
    let both = get(&[1, 0]);
    let (one, zero) = (get(&[1]), get(&[0]));
    assert!(both.logits.is_empty());
    for t in 0..3 {
        assert_eq!(&both.hidden[t * 2 * h..t * 2 * h + h], &one.hidden[t * h..(t + 1) * h]);
        assert_eq!(&both.hidden[t * 2 * h + h..(t + 1) * 2 * h], &zero.hidden[t * h..(t + 1) * h]);
    }
}

/// MODEL-7: the early-exit draft is the first L layers with the final norm
/// and head: its logits are the head applied to layer L-1's hidden state.
#[test]
fn early_exit_is_the_head_on_an_inner_layer() {
    let w = tiny("tiny-v12-l2");
    let cfg = w.config.clone();
    let full = RefModel::new(w.clone());
    let toks = vec![vec![4u32, 9, 2]];
    let mut cache = full.new_cache(1, 8).unwrap();
    let hidden = full.forward(&mut cache, &ForwardRequest { tokens: &toks, logits: LogitRows::None, hidden_layers: &[0] }).unwrap().hidden;
    let draft = RefModel::new(w.truncated(1).unwrap());
    let got = logits(&draft, &toks, LogitRows::All);
    for t in 0..3 {
        let want: Vec<f64> = matvec(w.output_matrix(), &specdec_models::reference::rms_norm(&hidden[t * cfg.hidden_size..(t + 1) * cfg.hidden_size], &w.final_norm, cfg.rms_norm_eps));
        close(&got[t], &want, 1e-12);
    }
    assert_eq!(w.truncated(1).unwrap().layers, &w.layers[..1], "MODEL-7: the early-exit draft is the target's first L layers");
    assert!(w.truncated(0).is_err() && w.truncated(3).is_err(), "MODEL-7: 1 <= L <= layers");
}

/// MODEL-8: every malformed request is a typed error naming the argument.
#[test]
fn bad_requests_are_typed_errors() {
    let cfg = TinySpec::preset("tiny-v12-l2").unwrap().config();
    let check = |tokens: Vec<Vec<u32>>, hidden: &[usize], lens: &[usize], arg: &str| {
        let req = ForwardRequest { tokens: &tokens, logits: LogitRows::All, hidden_layers: hidden };
        match plan(&cfg, lens, 8, &req) {
            Err(specdec_models::ModelError::InvalidInput { arg: a, .. }) => assert_eq!(a, arg, "{tokens:?}"),
            other => panic!("{tokens:?}: expected an error on `{arg}`, got {other:?}"),
        }
    };
    check(vec![vec![12]], &[], &[0], "tokens"); // id == vocab
    check(vec![vec![1; 9]], &[], &[0], "tokens"); // beyond capacity
    check(vec![vec![1; 3]], &[], &[6], "tokens"); // beyond capacity after the cache
    check(vec![vec![1]], &[], &[0, 0], "tokens"); // batch mismatch
    check(vec![vec![], vec![]], &[], &[0, 0], "tokens"); // nothing to run
    check(vec![vec![1]], &[2], &[0], "hidden_layers");
    check(vec![vec![1]], &[0, 0], &[0], "hidden_layers");
    let model = RefModel::new(tiny("tiny-v12-l2"));
    assert!(model.new_cache(0, 8).is_err() && model.new_cache(1, 0).is_err() && model.new_cache(1, 65).is_err());
    let mut cache = model.new_cache(2, 8).unwrap();
    model.forward(&mut cache, &ForwardRequest::last_logits(&[vec![1, 2], vec![3]])).unwrap();
    assert!(cache.trim(&[3, 0]).is_err(), "KV-4: trimming beyond a length is an error");
    assert_eq!(cache.lens(), &[2, 1], "a refused trim changes nothing");
}

/// MODEL-12: tiny models are a pure function of shape and seed, within range.
#[test]
fn tiny_models_are_seeded_and_bounded() {
    for (name, spec) in TinySpec::PRESETS {
        assert_eq!(spec.weights().unwrap(), spec.weights().unwrap(), "MODEL-12: {name} is a pure function of its shape and seed");
        let other = TinySpec { seed: spec.seed + 100, ..spec };
        assert_ne!(spec.weights().unwrap(), other.weights().unwrap(), "MODEL-12: {name}: the seed must matter");
    }
    let base = TinySpec::PRESETS[0].1;
    for bad in [TinySpec { vocab: 7, ..base }, TinySpec { vocab: 33, ..base }, TinySpec { layers: 3, ..base }, TinySpec { hidden: 6, ..base }, TinySpec { kv_heads: 3, ..base }] {
        assert!(bad.weights().is_err(), "MODEL-12: a shape out of range: {bad:?}");
    }
}

/// MODEL-1: typos and unsupported features in config.json are errors naming the field.
#[test]
fn config_is_validated() {
    let good = serde_json::to_value(TinySpec::PRESETS[0].1.config()).unwrap();
    assert!(LlamaConfig::from_json(&good.to_string(), "config.json").is_ok());
    let cases: [(&str, serde_json::Value); 6] = [
        ("rms_norm_epsilon", serde_json::json!(1e-5)),
        ("num_attention_heads", serde_json::json!(0)),
        ("num_key_value_heads", serde_json::json!(3)),
        ("rope_scaling", serde_json::json!({"type": "linear", "factor": 2.0})),
        ("hidden_act", serde_json::json!("gelu")),
        ("eos_token_id", serde_json::json!(99)),
    ];
    for (field, value) in cases {
        let mut v = good.clone();
        v[field] = value;
        match LlamaConfig::from_json(&v.to_string(), "config.json") {
            Err(specdec_models::ModelError::InvalidField { field: f, .. }) => assert_eq!(f, field),
            other => panic!("{field}: expected an InvalidField error, got {other:?}"),
        }
    }
}

/// MODEL-2: shapes are checked against the config when weights are assembled.
#[test]
fn weights_must_match_the_config() {
    let w = tiny("tiny-v16-l1");
    let named: std::collections::HashMap<String, specdec_models::Matrix> = w.named().into_iter().map(|(n, m)| (n, m.clone())).collect();
    let rebuilt = LlamaWeights::from_named(w.config.clone(), "t", |n| Ok(named.get(n).cloned())).unwrap();
    assert_eq!(rebuilt, w, "MODEL-2: weights assembled from their HF names");
    let err = LlamaWeights::from_named(w.config.clone(), "t", |n| Ok(if n.ends_with("q_proj.weight") { None } else { named.get(n).cloned() })).unwrap_err();
    assert_eq!(err.kind(), "MissingTensor", "MODEL-2: every tensor the config implies is present");
    let err = LlamaWeights::from_named(w.config.clone(), "t", |n| {
        Ok(named.get(n).cloned().map(|m| if n == "model.norm.weight" { specdec_models::Matrix::new(vec![m.data.len() - 1], m.data[1..].to_vec(), n).unwrap() } else { m }))
    })
    .unwrap_err();
    assert_eq!(err.kind(), "TensorShape", "MODEL-2: every shape is checked against the config");
    let err = LlamaWeights::from_named(w.config.clone(), "t", |n| {
        Ok(named.get(n).cloned().map(|mut m| {
            if n == "model.norm.weight" {
                m.data[0] = f32::NAN;
            }
            m
        }))
    })
    .unwrap_err();
    assert_eq!(err.kind(), "InvalidField", "MODEL-2: every value is finite");
}
