//! ARCHITECTURE's code map names every crate of the workspace under its
//! folder and crate name, and no folder that is gone (`xtask::docs`).

use std::path::Path;

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("repository root")
}

#[test]
fn the_code_map_names_every_crate() {
    let architecture = std::fs::read_to_string(root().join("ARCHITECTURE.md")).expect("ARCHITECTURE.md is readable");
    let members = xtask::docs::workspace_members(root()).unwrap();
    assert!(members.len() >= 15, "found only {} workspace members: is the scan broken?", members.len());
    if let Err(problems) = xtask::docs::check_code_map(root(), &architecture) {
        panic!("ARCHITECTURE.md's code map is stale:\n{problems}");
    }
}

/// The negative control: a code map that lost a crate, misnames one, or
/// names a folder that is gone fails the check.
#[test]
fn a_stale_code_map_fails() {
    let architecture = std::fs::read_to_string(root().join("ARCHITECTURE.md")).unwrap();
    let lost = architecture.lines().filter(|l| !l.starts_with("### `stats/`")).collect::<Vec<_>>().join("\n");
    let err = xtask::docs::check_code_map(root(), &lost).unwrap_err();
    assert!(err.contains("specdec-stats"), "{err}");
    let misnamed = architecture.replace("(`specdec-decoder`)", "(`specdec-decode`)");
    assert!(xtask::docs::check_code_map(root(), &misnamed).unwrap_err().contains("specdec-decoder"));
    let gone = architecture.replacen("## Code map\n", "## Code map\n\n### `backends/api/` (`specdec-backend`)\n", 1);
    assert!(xtask::docs::check_code_map(root(), &gone).unwrap_err().contains("backends/api"));
}

/// A crate's `[dependencies]` name only crates of its own floor or below
/// (the floors of the root Cargo.toml's members list, as ARCHITECTURE.md
/// states them); a port's tests may use the suite above it (dev-dependencies).
#[test]
fn no_crate_depends_on_a_floor_above_it() {
    let members = xtask::docs::workspace_members(root()).unwrap();
    let floors = xtask::docs::floors(root()).unwrap();
    assert_eq!(floors.len(), members.len(), "every member has a floor: {floors:?}");
    let deps = xtask::docs::dependencies(root(), &members).unwrap();
    if let Err(problems) = xtask::docs::check_floors(&members, &floors, &deps) {
        panic!("{problems}");
    }
    // The negative control: the reference depending on the decoder breaks the floors.
    let mut upward = deps.clone();
    upward.get_mut("reference").unwrap().push("specdec-decoder".into());
    let err = xtask::docs::check_floors(&members, &floors, &upward).unwrap_err();
    assert!(err.contains("`specdec-reference` (floor 2) depends on `specdec-decoder` (floor 5)"), "{err}");
}
