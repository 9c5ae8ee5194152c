//! No crate of the workspace has an import circle between its modules
//! (`xtask::modgraph`): a layered crate reads top to bottom.

#[test]
fn no_crate_has_an_import_circle() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("repository root");
    let crates = xtask::modgraph::workspace_crates(root);
    assert!(crates.len() >= 15, "found only {} crates: is the scan broken?", crates.len());
    let mut problems = Vec::new();
    for src in &crates {
        let graph = xtask::modgraph::read(src).unwrap_or_else(|e| panic!("{e}"));
        for circle in graph.circles() {
            let rel = src.strip_prefix(root).unwrap_or(src).display().to_string();
            problems.push(format!("{rel}: {}\n{}", circle.join(", "), graph.describe(&circle)));
        }
    }
    assert!(problems.is_empty(), "import circles:\n{}", problems.join("\n"));
}
