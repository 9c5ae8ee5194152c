//! BACKEND-4 at real vocabulary sizes: the large-vocabulary draw cases (V =
//! 32768 and 151936; head-heavy, flat, Zipf and zero-tail rows) pass on the
//! reference, catch an inverse-CDF scan that accumulates in f32 while stating
//! f64, and place that decision far enough from its boundary (SAMPLE-3) that a
//! backend stating f64 cannot have it excused (BACKEND-6), nor, on the
//! head-heavy rows at V = 151936, one stating f32 at its cap.

use serde_json::Value;
use specdec_backend::{ReferenceBackend, precision_cap};
use specdec_conformance::diff::{LARGE_VOCAB_CASES, large_vocab_case};
use specdec_conformance::mutants::F32AccumulatingDraw;
use specdec_conformance::suite::{self, CheckResult, Status, SuiteConfig};
use specdec_reference::sampling::draw_rows;
use specdec_reference::{DrawNoise, Tensor};

fn run(backend: &impl specdec_backend::Backend, seed: u64) -> Vec<CheckResult> {
    let cfg = SuiteConfig { seed, filter: Some("draw-large-vocab".into()), statistical: false, ..SuiteConfig::default() };
    let results: Vec<CheckResult> = suite::run(backend, &suite::all_items(&cfg), &cfg, &mut |_| {}).into_iter().filter(|r| r.status != Status::Skipped).collect();
    assert_eq!(results.len(), LARGE_VOCAB_CASES);
    results
}

fn floats(v: &Value) -> Tensor<f64> {
    specdec_conformance::case::decode_f64(v).expect("a float tensor")
}

#[test]
fn f32_accumulation_is_caught_far_from_any_boundary() {
    let (f64_cap, f32_cap) = (precision_cap("f64").expect("cap").margin_epsilon, precision_cap("f32").expect("cap").margin_epsilon);
    let mut beyond_f32_cap = 0;
    for seed in [20261122, 5] {
        for r in run(&ReferenceBackend, seed) {
            assert_eq!(r.status, Status::Pass, "{}: {}", r.name, r.message);
        }
        let mutant = run(&F32AccumulatingDraw, seed);
        for (index, result) in mutant.iter().enumerate() {
            let case = large_vocab_case(index, seed).expect("generated");
            let Some(u) = case.inputs.get("draw_uniforms") else {
                assert_eq!(result.status, Status::Pass, "{}: an exponential race has no accumulation", result.name);
                continue;
            };
            assert_eq!(result.status, Status::Fail, "seed {seed}: {} ({}) let f32 accumulation through", result.name, case.description);
            // Row 0's decision is the one aimed at: no backend stating f64 can have it excused
            // (BACKEND-6), and on the head-heavy 151936 row not even one stating f32.
            let drawn = draw_rows(&floats(&case.inputs["weights"]), &DrawNoise::InverseCdf(floats(u))).expect("valid");
            let margin = drawn[0].margin;
            assert!(margin > f64_cap, "seed {seed}, {}: margin {margin:e} is within the f64 cap", case.id);
            if case.description.starts_with("head-heavy row, V = 151936") {
                // Systematic f32 drift over 151936 equal tail weights: beyond even the f32 cap.
                assert!(margin > f32_cap, "seed {seed}, {}: margin {margin:e} is within the f32 cap", case.id);
                beyond_f32_cap += 1;
            }
        }
    }
    assert_eq!(beyond_f32_cap, 2, "one head-heavy inverse-CDF case at V = 151936 per seed");
}
