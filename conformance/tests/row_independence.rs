//! STAT-8 (BACKEND-5): the row-pair checks pass on the reference with their
//! stated power, and catch seeded verifies whose rows share or overlap
//! noise, defects that leave every row's own law exact.

use specdec_backend::Backend;
use specdec_conformance::mutants::{NoiseDefect, SeededMutant};
use specdec_conformance::stat::DETECTABLE_DELTA;
use specdec_conformance::suite::{self, CheckResult, Status, SuiteConfig};

fn row_pair_checks(backend: &impl Backend) -> Vec<CheckResult> {
    let cfg = SuiteConfig { filter: Some("row-pairs".into()), ..SuiteConfig::default() };
    let results: Vec<CheckResult> = suite::run(backend, &suite::all_items(&cfg), &cfg, &mut |_| {}).into_iter().filter(|r| r.status != Status::Skipped).collect();
    assert_eq!(results.len(), 2, "one row-pair check per draw method");
    results
}

#[test]
fn row_pairs_pass_on_the_reference_with_stated_power() {
    for r in row_pair_checks(&specdec_backend::ReferenceBackend) {
        assert_eq!(r.status, Status::Pass, "{}: {}", r.name, r.message);
        let stats = r.statistics.as_ref().expect("a sampled check reports its test");
        let power = stats.power.expect("and its power");
        assert!(power.detectable_delta <= DETECTABLE_DELTA, "{}: detectable TV {}", r.name, power.detectable_delta);
    }
}

#[test]
fn shared_and_overlapping_noise_is_caught() {
    for defect in NoiseDefect::ALL {
        for r in row_pair_checks(&SeededMutant(defect)) {
            assert_eq!(r.status, Status::Fail, "{} missed {}: {}", r.name, defect.name(), r.message);
        }
    }
}
