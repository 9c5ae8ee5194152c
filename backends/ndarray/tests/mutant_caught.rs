//! Proof that the suite has teeth against a real port: built with
//! `--features mutant-residual` (a deliberately broken residual, REJECT-3),
//! the ndarray backend must fail the suite, on the residual and rejection
//! checks and on the statistical checks, and nowhere else.
//! Run by `cargo xtask test`; without the feature this file is empty.

#[cfg(feature = "mutant-residual")]
#[test]
fn the_suite_catches_the_broken_residual() {
    use specdec_conformance::suite::{self, Kind, Status, SuiteConfig};
    let cfg = SuiteConfig::default();
    let results = suite::run(&specdec_ndarray::NdarrayBackend::new(), &suite::all_items(&cfg), &cfg, &mut |_| {});
    let failed: Vec<_> = results.iter().filter(|r| r.status == Status::Fail).collect();
    for op in ["residual", "rejection_verify", "rejection_verify_seeded"] {
        assert!(failed.iter().any(|r| r.op == op), "no `{op}` check failed: the mutant went undetected");
    }
    assert!(failed.iter().any(|r| r.kind == Kind::Statistical), "the statistical checks missed the mutant");
    let elsewhere: Vec<_> = failed.iter().filter(|r| !r.op.starts_with("re")).map(|r| &r.name).collect();
    assert!(elsewhere.is_empty(), "unrelated checks failed: {elsewhere:?}");
    println!("{} checks caught the mutant", failed.len());
}
