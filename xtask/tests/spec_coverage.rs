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

/// README states the spec's rule count, and a wrong count would fail.
#[test]
fn readme_states_the_spec_rule_count() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("repository root");
    let spec = std::fs::read_to_string(root.join("spec/SPEC.md")).unwrap();
    let readme = std::fs::read_to_string(root.join("README.md")).unwrap();
    let defined = xtask::coverage::defined_rules(&spec).len();
    assert_eq!(xtask::docs::stated_rule_count(&readme), Some(defined), "README.md must say \"{defined} numbered rules\"");
    // The negative control: the count read from a README that states another.
    assert_eq!(xtask::docs::stated_rule_count(&readme.replace(&format!("{defined} numbered rules"), "7 numbered rules")), Some(7));
}
