//! Embeds the case and model files of `fixtures/` (`src/fixtures.rs`) so that the suite is
//! self-contained: a vendor's test binary needs no path to this repository.

use std::fmt::Write as _;
use std::path::Path;

fn main() {
    let mut out = String::new();
    embed("cases", "GOLDEN_FILES", "The golden case files", &mut out);
    embed("host", "HOST_FILES", "The host case files (reference-only algorithms)", &mut out);
    embed("models", "MODEL_FILES", "The table-driven target and draft models", &mut out);
    let dest = Path::new(&std::env::var("OUT_DIR").expect("set by cargo")).join("fixtures.rs");
    std::fs::write(dest, out).expect("OUT_DIR is writable");
}

fn embed(sub: &str, name: &str, doc: &str, out: &mut String) {
    let manifest = std::env::var("CARGO_MANIFEST_DIR").expect("set by cargo");
    let root = Path::new(&manifest).join("../fixtures").join(sub);
    println!("cargo:rerun-if-changed={}", root.display());
    let mut files = Vec::new();
    let mut stack = vec![root.clone()];
    while let Some(dir) = stack.pop() {
        println!("cargo:rerun-if-changed={}", dir.display());
        for entry in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
            let path = entry.path();
            if path.is_dir() {
                stack.push(path);
            } else if path.extension().is_some_and(|e| e == "json") {
                files.push(path.strip_prefix(&root).expect("below root").to_string_lossy().replace('\\', "/"));
            }
        }
    }
    files.sort();
    let _ = writeln!(out, "/// {doc}, by path below `fixtures/{sub}/`.\npub static {name}: &[(&str, &str)] = &[");
    for f in files {
        let _ = writeln!(out, "    (\"{f}\", include_str!(concat!(env!(\"CARGO_MANIFEST_DIR\"), \"/../fixtures/{sub}/{f}\"))),");
    }
    out.push_str("];\n");
}
