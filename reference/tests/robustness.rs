//! ERR-1 and CONV-7: arbitrary input never panics, and padding never matters.

use proptest::prelude::*;
use specdec_reference::kvcache::{self, BatchKvCache};
use specdec_reference::ngram::{self, NgramConfig};
use specdec_reference::{
    Comparator, DrawNoise, PAD, RejectionInputs, SamplingParams, Tensor, dflash_accept, greedy_verify, process_logits_batch, rejection_verify, residual_distribution, speculative_accept,
};

/// Any small shape (rank 0 to 4, dims 0 to 3).
fn shape() -> impl Strategy<Value = Vec<usize>> {
    prop::collection::vec(0usize..4, 0..5)
}

/// Floats including every troublesome value.
fn float() -> impl Strategy<Value = f64> {
    prop_oneof![
        4 => 0.0f64..1.0,
        1 => Just(f64::NAN),
        1 => Just(f64::INFINITY),
        1 => Just(f64::NEG_INFINITY),
        1 => -2.0f64..2.0,
        1 => Just(1.0),
        1 => Just(0.0),
    ]
}

fn tensor_f() -> impl Strategy<Value = Tensor<f64>> {
    shape().prop_flat_map(|s| {
        let n: usize = s.iter().product();
        prop::collection::vec(float(), n).prop_map(move |d| Tensor::new(s.clone(), d).unwrap())
    })
}

fn tensor_i() -> impl Strategy<Value = Tensor<i64>> {
    shape().prop_flat_map(|s| {
        let n: usize = s.iter().product();
        prop::collection::vec(-2i64..5, n).prop_map(move |d| Tensor::new(s.clone(), d).unwrap())
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// ERR-1: no public operation panics, whatever it is given.
    #[test]
    fn no_operation_panics(
        a in tensor_f(), b in tensor_f(), c in tensor_f(), d in tensor_f(),
        t in tensor_i(), l in tensor_i(), v in 0usize..6,
        temp in float(), top_k in 0usize..4, top_p in float(), r in prop::collection::vec(float(), 0..4),
        toks in prop::collection::vec(-2i64..5, 0..4),
    ) {
        let _ = greedy_verify(&a, &t, &l);
        let _ = dflash_accept(&t, &l, v);
        let _ = speculative_accept(&toks, &a, &b, &r, Comparator::Strict);
        let _ = speculative_accept(&toks, &a, &b, &r, Comparator::Seed004LessEq);
        for draw in [DrawNoise::InverseCdf(c.clone()), DrawNoise::ExponentialRace(c.clone())] {
            for q in [Some(&b), None] {
                let inputs = RejectionInputs {
                    target_probs: &a, draft_probs: q, draft_tokens: &t, proposal_lens: &l,
                    accept_uniforms: &d, draw: &draw,
                };
                let _ = rejection_verify(&inputs, Comparator::Strict);
            }
        }
        let rows = a.shape().first().copied().unwrap_or(0);
        let params = vec![SamplingParams::new(temp, top_k, top_p); rows];
        let _ = process_logits_batch(&a, &params);
        let _ = residual_distribution(&a, Some(&b), &t);
        let _ = residual_distribution(&a, None, &t);
        let cfg = NgramConfig { ngram_min: top_k, ngram_max: v, k: top_k + 1, ..NgramConfig::default() };
        let _ = ngram::propose_batch(&t, &l, v, &cfg);
        let _ = ngram::propose(&toks, v, &cfg);
        let _ = kvcache::gather_paged(&a, &t, &l);
        if let Ok(mut cache) = BatchKvCache::new(v.max(1), 1, 2, 4) {
            let _ = cache.append(&a, &b, &l);
            let _ = cache.trim_variable(&l);
            let _ = cache.trim_clamped(&t);
        }
    }
}

/// CONV-7: rows past a sequence's proposal are not read. Filling them with
/// NaN (target rows past `len`, draft rows at and past `len`) changes nothing.
#[test]
fn padding_rows_are_never_read() {
    let (b, k, v) = (2, 3, 4);
    let row = [0.1, 0.2, 0.3, 0.4];
    let qrow = [0.4, 0.3, 0.2, 0.1];
    let lens = Tensor::from_vec(vec![1, 3]);
    let drafts = Tensor::new(vec![b, k], vec![3, PAD, PAD, 0, 1, 2]).unwrap();
    let build = |fill: f64| {
        let mut p = Vec::new();
        let mut q = Vec::new();
        for s in 0..b {
            let len = [1, 3][s];
            for j in 0..=k {
                p.extend(if j <= len { row } else { [fill; 4] });
                if j < k {
                    q.extend(if j < len { qrow } else { [fill; 4] });
                }
            }
        }
        (Tensor::new(vec![b, k + 1, v], p).unwrap(), Tensor::new(vec![b, k, v], q).unwrap())
    };
    let u = Tensor::new(vec![b, k], vec![0.3, 0.9, 0.1, 0.2, 0.5, 0.7]).unwrap();
    let draw = DrawNoise::InverseCdf(Tensor::new(vec![b, k + 1], vec![0.5; b * (k + 1)]).unwrap());
    let run = |fill: f64| {
        let (p, q) = build(fill);
        let inputs = RejectionInputs { target_probs: &p, draft_probs: Some(&q), draft_tokens: &drafts, proposal_lens: &lens, accept_uniforms: &u, draw: &draw };
        (rejection_verify(&inputs, Comparator::Strict).unwrap(), greedy_verify(&p, &drafts, &lens).unwrap())
    };
    assert_eq!(run(f64::NAN), run(0.25));
}

/// KV-2: an append of zero positions (T = 0) is a valid no-op, not a panic.
#[test]
fn empty_append_is_a_no_op() {
    let mut cache = BatchKvCache::new(2, 1, 2, 4).unwrap();
    let empty = Tensor::new(vec![2, 1, 0, 2], vec![]).unwrap();
    cache.append(&empty, &empty, &Tensor::from_vec(vec![0, 0])).unwrap();
    assert_eq!(cache.lens(), [0, 0]);
}

/// ERR-1: sizes that would overflow are errors, not panics or hangs.
#[test]
fn overflowing_sizes_are_errors() {
    use specdec_reference::ErrorKind;
    use specdec_reference::theory;
    assert_eq!(Tensor::<f64>::new(vec![usize::MAX, 2], vec![]).unwrap_err().kind(), ErrorKind::DataLength);
    let huge = NgramConfig { ngram_max: usize::MAX, ..NgramConfig::default() };
    assert_eq!(ngram::propose(&[1, 2, 3], 5, &huge).unwrap_err().kind(), ErrorKind::InvalidParameter);
    let huge_k = NgramConfig { k: usize::MAX, ..NgramConfig::default() };
    assert_eq!(ngram::propose(&[1, 2, 3], 5, &huge_k).unwrap_err().kind(), ErrorKind::InvalidParameter);
    assert_eq!(BatchKvCache::new(usize::MAX, 2, 2, 2).unwrap_err().kind(), ErrorKind::InvalidParameter);
    assert_eq!(BatchKvCache::new(1 << 20, 1 << 20, 1 << 20, 1).unwrap_err().kind(), ErrorKind::InvalidParameter);
    assert!(theory::expected_tokens_geometric(0.5, usize::MAX).unwrap().is_finite());
}

/// SAMPLE-2: huge weights over tiny exponentials make w / e overflow; the
/// race must still pick the largest ratio (0.75 / e over 0.25 / e).
#[test]
fn exponential_race_survives_overflowing_ratios() {
    use specdec_reference::sampling::sample_exponential_race;
    let d = sample_exponential_race(&[0.25e308, 0.75e308], &[1e-30, 1e-30]).unwrap();
    assert_eq!(d.token, 1);
    assert!((d.margin - 2.0 / 3.0).abs() < 1e-12, "{}", d.margin);
    let d = sample_exponential_race(&[1e308, 1.0], &[0.5, 1.0]).unwrap();
    assert_eq!(d.token, 0);
}

/// SAMPLE-2's domain: noise outside the binary32 normal range is rejected
/// (an f32 port would flush it and turn a strict order into a tie), its
/// bounds are admitted.
#[test]
fn exponential_noise_outside_the_binary32_normals_is_rejected() {
    use specdec_reference::sampling::sample_exponential_race;
    use specdec_reference::{ErrorKind, MAX_EXPONENTIAL, MIN_EXPONENTIAL};
    for bad in [1e-40, 1e-310, 1e-320, 1e39, f64::MAX] {
        let err = sample_exponential_race(&[0.5, 0.5], &[bad, 1.0]).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidNoise, "{bad:e}");
        // The message names the domain, not "finite and > 0" (which 1e-320 is).
        assert!(err.to_string().contains("outside [2^-126, 2^126]"), "{err}");
    }
    assert_eq!(sample_exponential_race(&[0.5, 0.5], &[MAX_EXPONENTIAL, MIN_EXPONENTIAL]).unwrap().token, 1);
}

/// LOGITS-1: a bias or penalty that overflows a logit to `+inf` leaves no
/// score row; the error names the processed logits (no f32 port can hold
/// these inputs, so this lives here rather than in the shared cases).
#[test]
fn processed_logits_that_overflow_are_named() {
    use specdec_reference::{ErrorKind, RowInputs, SamplingParams, process_logits_with};
    let e = process_logits_with(&[1e308, 0.0], SamplingParams::default(), RowInputs { bias: Some(&[1e308, 0.0]), counts: None }).unwrap_err();
    assert_eq!((e.kind(), e.arg()), (ErrorKind::NonFinite, Some("processed_logits")), "{e}");
    let params = SamplingParams { presence_penalty: -1e308, ..SamplingParams::default() };
    let e = process_logits_with(&[1e308, 0.0], params, RowInputs { counts: Some(&[1.0, 0.0]), bias: None }).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::NonFinite, "{e}");
}
