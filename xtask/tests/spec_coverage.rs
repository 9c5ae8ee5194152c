//! Fails when a spec rule is implemented nowhere, tested nowhere, or when a
//! test names a rule the spec does not define.

#[test]
fn every_spec_rule_is_implemented_and_tested() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("repository root");
    let coverage = xtask::coverage::scan(root).expect("spec/SPEC.md is readable");
    assert!(coverage.defined.len() > 50, "found only {} rules: is the spec format broken?", coverage.defined.len());
    match coverage.check() {
        Ok(summary) => println!("{summary}"),
        Err(problems) => panic!("{problems}"),
    }
}
