//! Snapshots of the human-readable artefacts (insta): the case table and
//! the Markdown reports a vendor files. Review changes with `cargo insta review`.

use std::fmt::Write as _;

use specdec_backend::ReferenceBackend;
use specdec_conformance::case::parse;
use specdec_conformance::fixtures::{GOLDEN_FILES, HOST_FILES};
use specdec_conformance::mutants::{Defect, Mutant};
use specdec_conformance::report::Report;
use specdec_conformance::suite::{self, SuiteConfig};

/// Every shipped case: file, id, op and the rules it checks.
#[test]
fn case_table() {
    let mut table = String::from("| file | case | op | rules |\n|---|---|---|---|\n");
    for (dir, files) in [("cases", GOLDEN_FILES), ("host", HOST_FILES)] {
        for (path, text) in files {
            for c in parse(text, std::path::Path::new(path)).expect("shipped files parse").cases {
                let _ = writeln!(table, "| {dir}/{path} | {} | {} | {} |", c.id, c.op, c.rules.join(" "));
            }
        }
    }
    insta::assert_snapshot!(table);
}

fn golden_report<B: specdec_backend::Backend>(backend: &B, filter: &str) -> String {
    let cfg = SuiteConfig { filter: Some(filter.into()), statistical: false, diff_cases_per_op: 0, ..SuiteConfig::default() };
    let items: Vec<_> = suite::all_items(&cfg).into_iter().filter(|i| i.name.starts_with(filter)).collect();
    Report::new(backend, cfg.seed, suite::run(backend, &items, &cfg, &mut |_| {})).to_markdown()
}

#[test]
fn passing_report() {
    insta::assert_snapshot!(golden_report(&ReferenceBackend, "golden/greedy/"));
}

/// A failing run: every failure with its message and repro command.
#[test]
fn failing_report() {
    insta::assert_snapshot!(golden_report(&Mutant(Defect::ResidualIsTarget), "golden/rejection/"));
}
