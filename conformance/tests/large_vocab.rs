//! BACKEND-4 at real vocabulary sizes: the large-vocabulary cases of `draw`
//! and of `rejection_verify` (V = 32768 and 151936; head-heavy, flat, Zipf and
//! zero-tail rows) pass on the reference, catch an inverse-CDF scan that
//! accumulates in f32 while stating f64, and place that decision far enough
//! from its boundary (SAMPLE-3) that a backend stating f64 cannot have it
//! excused (BACKEND-6), nor, on the head-heavy rows at V = 151936, one stating
//! f32 at its cap. For the verify, the decisive draws are a correction from the
//! residual (REJECT-3) and a bonus from row `len` (REJECT-4).

use serde_json::Value;
use specdec_backend::{Op, ReferenceBackend, precision_cap};
use specdec_conformance::diff::{LARGE_VOCAB_CASES, large_vocab_case, large_vocab_verify_rows};
use specdec_conformance::mutants::F32AccumulatingDraw;
use specdec_conformance::suite::{self, CheckResult, Status, SuiteConfig};
use specdec_reference::sampling::draw_rows;
use specdec_reference::{DrawNoise, Tensor};

const SEEDS: [u64; 2] = [20261122, 5];

fn run(backend: &impl specdec_backend::Backend, op: Op, seed: u64) -> Vec<CheckResult> {
    let filter = format!("{}-large-vocab", op.name());
    let cfg = SuiteConfig { seed, filter: Some(filter), statistical: false, ..SuiteConfig::default() };
    let results: Vec<CheckResult> = suite::run(backend, &suite::all_items(&cfg), &cfg, &mut |_| {}).into_iter().filter(|r| r.status != Status::Skipped).collect();
    assert_eq!(results.len(), LARGE_VOCAB_CASES, "{op:?}");
    results
}

fn floats(v: &Value) -> Tensor<f64> {
    specdec_conformance::case::decode_f64(v).expect("a float tensor")
}

/// SAMPLE-3's inverse-CDF margin of drawing from `weights` with uniform `u`.
fn margin(weights: &[f64], u: f64) -> f64 {
    let w = Tensor::new(vec![1, weights.len()], weights.to_vec()).expect("one row");
    draw_rows(&w, &DrawNoise::InverseCdf(Tensor::new(vec![1], vec![u]).expect("one uniform"))).expect("valid")[0].margin
}

/// Checks every large-vocabulary case of `op` at both seeds: the reference
/// passes, the f32-accumulating mutant fails each inverse-CDF case and passes
/// each race, and `decisive` (case index, seed, case) gives the margins of the
/// aimed draws, each above the f64 cap. Returns how many were above the f32 cap.
fn check(op: Op, decisive: impl Fn(usize, u64, &specdec_conformance::case::Case) -> Vec<f64>) -> usize {
    let (f64_cap, f32_cap) = (precision_cap("f64").expect("cap").margin_epsilon, precision_cap("f32").expect("cap").margin_epsilon);
    let mut beyond_f32_cap = 0;
    for seed in SEEDS {
        for r in run(&ReferenceBackend, op, seed) {
            assert_eq!(r.status, Status::Pass, "{}: {}", r.name, r.message);
        }
        for (index, result) in run(&F32AccumulatingDraw, op, seed).iter().enumerate() {
            let case = large_vocab_case(op, index, seed).expect("generated");
            if !case.inputs.contains_key("draw_uniforms") {
                assert_eq!(result.status, Status::Pass, "{}: an exponential race has no accumulation", result.name);
                continue;
            }
            assert_eq!(result.status, Status::Fail, "seed {seed}: {} ({}) let f32 accumulation through", result.name, case.description);
            for m in decisive(index, seed, &case) {
                assert!(m > f64_cap, "seed {seed}, {}: margin {m:e} is within the f64 cap", case.id);
                if case.description.starts_with("head-heavy row, V = 151936") {
                    // Systematic f32 drift over 151936 equal tail weights: beyond even the f32 cap.
                    assert!(m > f32_cap, "seed {seed}, {}: margin {m:e} is within the f32 cap", case.id);
                    beyond_f32_cap += 1;
                }
            }
        }
    }
    beyond_f32_cap
}

#[test]
fn f32_accumulation_in_draw_is_caught_far_from_any_boundary() {
    // SAMPLE-1, BACKEND-4: row 0's uniform is the aimed one.
    let beyond = check(Op::Draw, |_, _, case| {
        let u = floats(&case.inputs["draw_uniforms"]).data()[0];
        let drawn = draw_rows(&floats(&case.inputs["weights"]), &DrawNoise::InverseCdf(floats(&case.inputs["draw_uniforms"]))).expect("valid");
        assert!((0.0..1.0).contains(&u));
        vec![drawn[0].margin]
    });
    assert_eq!(beyond, 2, "one head-heavy inverse-CDF case at V = 151936 per seed");
}

#[test]
fn f32_accumulation_in_the_correction_and_the_bonus_is_caught_far_from_any_boundary() {
    // REJECT-3 (sequence 0: the residual of row 0) and REJECT-4 (sequence 1:
    // the bonus from row 2), each uniform aimed between the f64 and f32 sums.
    let beyond = check(Op::RejectionVerify, |index, seed, case| {
        let rows = large_vocab_verify_rows(index, seed);
        let u = floats(&case.inputs["draw_uniforms"]);
        let vocab = rows.target0.len();
        assert_eq!(&floats(&case.inputs["target_probs"]).data()[..vocab], rows.target0.as_slice(), "{}: the rows are the case's", case.id);
        assert_eq!(&floats(&case.inputs["draft_probs"]).data()[..vocab], rows.draft0.as_slice(), "{}: the rows are the case's", case.id);
        let (p, q) = (rows.target0[rows.drafts0[0]], rows.draft0[rows.drafts0[0]]);
        assert!(p / q < 0.9, "{}: the first draft must be rejected under either comparator (p/q = {})", case.id, p / q);
        vec![margin(&rows.residual0(), u.data()[0]), margin(&rows.target1, u.data()[5])]
    });
    assert_eq!(beyond, 4, "both decisive draws of one head-heavy inverse-CDF case at V = 151936 per seed");
}

#[test]
fn the_reference_rejects_and_accepts_where_the_cases_say() {
    // The verify cases only test REJECT-3 and REJECT-4 if sequence 0 rejects
    // its first draft and sequence 1 accepts both: read from the blessed expectation.
    for index in 0..LARGE_VOCAB_CASES {
        let case = large_vocab_case(Op::RejectionVerify, index, SEEDS[0]).expect("generated");
        let accepted = specdec_conformance::case::decode_i64(&case.expect["num_accepted"]).expect("blessed");
        assert_eq!(accepted.data(), [0, 2], "{}", case.id);
    }
}
