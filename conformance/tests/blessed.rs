//! CASE-3: reference-written expectations do not drift. Every
//! `expected_by: reference` case recomputes to what its file says, and
//! `fixtures/cases/blessed/` is exactly what `specdec bless` generates.

use specdec_conformance::bless::rebless;
use specdec_conformance::blessed::blessed_file;
use specdec_conformance::case::{CaseFile, ExpectedBy};
use specdec_conformance::diff;
use specdec_conformance::fixtures::{GOLDEN_FILES, HOST_FILES};

#[test]
fn reference_expectations_do_not_drift() {
    let mut checked = 0;
    for (path, text) in GOLDEN_FILES.iter().chain(HOST_FILES) {
        let file: CaseFile = serde_json::from_str(text).expect("shipped files parse");
        for case in file.cases.iter().filter(|c| c.expected_by == ExpectedBy::Reference) {
            let fresh = rebless(case).expect("shipped cases run");
            assert_eq!(fresh.expect, case.expect, "CASE-3: {path} case {} drifted: run `cargo xtask bless`", case.id);
            checked += 1;
        }
    }
    assert!(checked >= diff::ops().count() * 12, "CASE-3: only {checked} reference cases found");
}

#[test]
fn blessed_files_are_what_bless_writes() {
    for op in diff::ops() {
        let name = format!("blessed/{}.json", op.name());
        let text = GOLDEN_FILES.iter().find(|(p, _)| *p == name).map(|(_, t)| *t).unwrap_or_else(|| panic!("{name} is missing"));
        let on_disk: serde_json::Value = serde_json::from_str(text).expect("parses");
        let wanted = serde_json::to_value(blessed_file(op).expect("generates")).expect("serializes");
        assert_eq!(on_disk, wanted, "CASE-3: {name} differs from `specdec bless` output");
    }
}
