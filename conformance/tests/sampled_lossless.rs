//! Sampled losslessness of the reference (REJECT-7) under the statistics
//! policy (STAT-1 .. STAT-5), and the negative controls that must fail.

use specdec_conformance::lossless::{controls, lossless_checks, passed, run_controls, run_lossless_family};
use specdec_conformance::stat::{DETECTABLE_DELTA, FAMILY_ALPHA};
use specdec_conformance::suite::seed_from_env;

/// STAT-1, STAT-2, STAT-3, STAT-4: one family, fixed seed, Holm at 1e-4, no
/// retries; every check states a detectable TV distance of at most 0.02
/// before sampling.
#[test]
fn reference_is_lossless_by_sampling() {
    let seed = seed_from_env().expect("SPECDEC_SEED, if set, is a u64");
    let outcomes = run_lossless_family(seed, &mut |_| {}).expect("the family runs");
    assert_eq!(outcomes.len(), lossless_checks().len(), "STAT-4: one outcome per check, none retried or resampled");
    let mut failures = Vec::new();
    for o in &outcomes {
        println!("{}  TV={:.4}", o.report, o.tv_distance);
        let power = o.report.power.expect("every check states its power");
        assert!(power.detectable_delta <= DETECTABLE_DELTA, "{}: detectable TV {} > {}", o.name, power.detectable_delta, DETECTABLE_DELTA);
        assert!(o.report.alpha.is_some_and(|a| a <= FAMILY_ALPHA));
        if !passed(&o.report) {
            failures.push(o.report.to_string());
        }
    }
    assert!(failures.is_empty(), "STAT-1, STAT-4: seed {seed}: lossless checks failed (family-wise false-failure rate {FAMILY_ALPHA:e}):\n{}", failures.join("\n"));
}

/// STAT-5: every known bug class is rejected by the same machinery,
/// including the per-step `q` of iterative unmasking (DRAFT-5).
#[test]
fn negative_controls_are_rejected() {
    let seed = seed_from_env().expect("SPECDEC_SEED, if set, is a u64");
    let results = run_controls(seed, &mut |_| {}).expect("the controls run");
    assert_eq!(results.len(), controls().len());
    let mut missed = Vec::new();
    for (control, o) in &results {
        println!("{}  TV={:.4}  -> {:?}", o.report, o.tv_distance, o.report.decision);
        if passed(&o.report) {
            missed.push(format!("{} was not detected: {}", control.name, o.report));
        }
    }
    assert!(missed.is_empty(), "{}", missed.join("\n"));
}
