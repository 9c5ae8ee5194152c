//! BACKEND-6: a backend cannot buy a pass by stating a generous precision. The
//! statement is checked against its dtype's cap (`precision/within-cap`), and the
//! judge and the exact-law check use the capped values, so a broken verify that
//! states margin epsilon 1 still fails what catches it.

use specdec_backend::{Backend, Precision, ReferenceBackend, precision_cap};
use specdec_conformance::mutants::{Defect, Mutant, OverstatedPrecision};
use specdec_conformance::suite::{self, CheckResult, Status, SuiteConfig};

fn run(backend: &impl Backend, filter: &str) -> Vec<CheckResult> {
    let cfg = SuiteConfig { filter: Some(filter.into()), statistical: false, ..SuiteConfig::default() };
    let results: Vec<CheckResult> = suite::run(backend, &suite::all_items(&cfg), &cfg, &mut |_| {}).into_iter().filter(|r| r.status != Status::Skipped).collect();
    assert!(!results.is_empty(), "`{filter}` selects no check");
    results
}

const GENEROUS: Precision = Precision { float_dtype: "f64", accumulate_dtype: "f64", margin_epsilon: 1.0, value_tolerance: 1.0 };

#[test]
fn an_overstated_precision_fails_its_own_check() {
    let r = run(&OverstatedPrecision(Defect::ResidualIsTarget, GENEROUS), "precision/within-cap");
    assert_eq!(r[0].status, Status::Fail, "{}", r[0].message);
    assert!(r[0].message.contains("margin_epsilon") && r[0].message.contains("cap"), "{}", r[0].message);
    assert_eq!(run(&ReferenceBackend, "precision/within-cap")[0].status, Status::Pass);
}

#[test]
fn an_overstated_epsilon_buys_no_pass() {
    // The residual drawn from p instead of max(0, p - q): with epsilon 1 every
    // decision of positive margin would be excused and the exact-law tolerance
    // would be 10. Capped at 1e-9, both catch it.
    let overstated = OverstatedPrecision(Defect::ResidualIsTarget, GENEROUS);
    for filter in ["exact/", "golden/rejection/seed004-example-residual"] {
        let failed = run(&overstated, filter).into_iter().filter(|r| r.status == Status::Fail).count();
        assert!(failed > 0, "{filter}: the overstated mutant passed every check");
        // And the same checks pass on the honest reference, so they are not vacuous.
        for r in run(&ReferenceBackend, filter) {
            assert_eq!(r.status, Status::Pass, "{}: {}", r.name, r.message);
        }
    }
    // The defect is caught with the reference's own (exact) precision too: the cap, not the mutant, decides.
    assert!(run(&Mutant(Defect::ResidualIsTarget), "exact/").iter().any(|r| r.status == Status::Fail));
}

#[test]
fn judged_values_are_capped_and_unknown_statements_get_no_slack() {
    let f32_cap = precision_cap("f32").expect("f32 has a cap");
    let stated = Precision { float_dtype: "f32", accumulate_dtype: "f64", margin_epsilon: 1e-3, value_tolerance: 1e-6 };
    let judged = stated.judged();
    assert_eq!(judged.margin_epsilon, f32_cap.margin_epsilon, "above the cap: the cap");
    assert_eq!(judged.value_tolerance, 1e-6, "below the cap: as stated");
    for bad in [Precision { float_dtype: "f8", ..stated }, Precision { margin_epsilon: f64::NAN, ..stated }, Precision { margin_epsilon: -1.0, ..stated }] {
        let j = bad.judged();
        assert!(bad.float_dtype == "f8" || j.margin_epsilon == 0.0, "{bad:?} judged as {j:?}");
        assert!(bad.cap_violation().is_some(), "{bad:?} passes the cap check");
    }
    assert_eq!(Precision { float_dtype: "f8", ..stated }.judged().margin_epsilon, 0.0);
    assert!(Precision { accumulate_dtype: "f128", ..GENEROUS }.cap_violation().is_some_and(|m| m.contains("accumulate_dtype")));
    assert!(ReferenceBackend.precision().cap_violation().is_none());
}
