//! The peer table (`adapters/peers/peer_table.py`, run by `cargo xtask peers`) puts every
//! failing check in exactly one class and drops none: a listed divergence, an input the
//! peer did not reject, or unexplained. Checked on hand-written reports, so that a table
//! that silently loses a failure cannot reach RESULTS.md.

use std::path::{Path, PathBuf};
use std::process::Command;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("repository root").to_path_buf()
}

fn result(name: &str, status: &str, message: &str) -> String {
    format!(r#"{{"name": "{name}", "kind": "golden", "op": "rejection_verify", "rules": ["ACCEPT-1"], "status": "{status}", "message": "{message}"}}"#)
}

#[test]
fn every_failure_is_classified_once_and_none_is_dropped() {
    let dir = std::env::temp_dir().join(format!("specdec-peer-table-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let divergences = dir.join("divergences.toml");
    std::fs::write(
        &divergences,
        r#"
[peers.somepeer]
what = "A peer."

[[divergence]]
id = "le"
peers = ["somepeer"]
rules = ["ACCEPT-1"]
errata = "E1"
by_design = true
what = "Accepts with <=."
[divergence.cases]
somepeer = ["golden/a", "golden/listed-but-passing"]
"#,
    )
    .unwrap();
    let results = [
        result("golden/a", "Fail", "`tokens`[0, 0]: expected 0, got 2"),
        result("golden/listed-but-passing", "Pass", ""),
        result("golden/err", "Fail", r#"expected error \"TokenOutOfRange\", but the operation succeeded"#),
        result("golden/surprise", "Fail", "`tokens`[1, 0]: expected 3, got 4"),
        result("golden/ns", "NotSupported", "not listed"),
    ];
    let report = dir.join("somepeer.json");
    std::fs::write(&report, format!(r#"{{"backend": "exec-somepeer-1.0", "results": [{}]}}"#, results.join(","))).unwrap();
    let python = std::env::var("SPECDEC_PYTHON").unwrap_or_else(|_| "python3".into());
    let out = Command::new(python).arg(root().join("adapters/peers/peer_table.py")).arg(&divergences).arg(&report).output().expect("python3 runs");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "peer_table.py failed: {}", String::from_utf8_lossy(&out.stderr));
    // run = pass + fail; one known divergence, one input not rejected, one unexplained.
    assert!(text.contains("| `exec-somepeer-1.0` | 4 | 1 | 1 | 1 | 1 | 1 |"), "{text}");
    assert!(text.contains("by design (E1)") && text.contains("`golden/a`"), "{text}");
    assert!(text.contains("`TokenOutOfRange`: `golden/err`"), "{text}");
    assert!(text.contains("**unexplained** `golden/surprise`") && text.contains("expected 3, got 4"), "{text}");
    assert!(text.contains("`golden/listed-but-passing`, which did not fail"), "{text}");
    std::fs::remove_dir_all(&dir).ok();
}
