//! Checks that keep the newcomer's documents true to the tree: ARCHITECTURE's
//! code map names every crate of the workspace under its folder and crate
//! name (and no folder that is gone), and README states the spec's rule count.
//!
//! The code map's crate entries are headings of one form,
//! ``### `<folder>/` (`<crate name>`)``; a folder that is not a crate has
//! ``### `<folder>/` `` alone.

use std::collections::BTreeMap;
use std::path::Path;

/// Every workspace member of `root`'s Cargo.toml: its folder and its crate name.
pub fn workspace_members(root: &Path) -> Result<BTreeMap<String, String>, String> {
    let read = |p: &Path| -> Result<toml::Table, String> {
        let text = std::fs::read_to_string(p).map_err(|e| format!("{}: {e}", p.display()))?;
        text.parse::<toml::Table>().map_err(|e| format!("{}: {e}", p.display()))
    };
    let top = read(&root.join("Cargo.toml"))?;
    let members = top.get("workspace").and_then(|w| w.get("members")).and_then(|m| m.as_array()).ok_or("Cargo.toml has no [workspace] members")?;
    let mut out = BTreeMap::new();
    for m in members {
        let folder = m.as_str().ok_or("a workspace member is not a string")?;
        let manifest = read(&root.join(folder).join("Cargo.toml"))?;
        let name = manifest.get("package").and_then(|p| p.get("name")).and_then(|n| n.as_str()).ok_or_else(|| format!("{folder}/Cargo.toml has no package name"))?;
        out.insert(folder.to_string(), name.to_string());
    }
    Ok(out)
}

/// The code map's headings (under `## Code map`, up to the next `## `):
/// folder (without its trailing `/`) and crate name, if given.
pub fn code_map(architecture: &str) -> Vec<(String, Option<String>)> {
    let mut out = Vec::new();
    let section = architecture.lines().skip_while(|l| l.trim() != "## Code map").skip(1).take_while(|l| !l.starts_with("## "));
    for line in section {
        let Some(rest) = line.strip_prefix("### `") else { continue };
        let Some((folder, after)) = rest.split_once('`') else { continue };
        let name = after.trim().strip_prefix("(`").and_then(|n| n.split_once("`)")).map(|(n, _)| n.to_string());
        out.push((folder.trim_end_matches('/').to_string(), name));
    }
    out
}

/// `Err` names each crate the code map misses or names wrongly, and each
/// folder it names that `root` does not have.
pub fn check_code_map(root: &Path, architecture: &str) -> Result<(), String> {
    let members = workspace_members(root)?;
    let map = code_map(architecture);
    let mut problems = Vec::new();
    for (folder, name) in &members {
        match map.iter().find(|(f, _)| f == folder) {
            None => problems.push(format!("the code map has no heading for crate `{name}` (``### `{folder}/` (`{name}`)``)")),
            Some((_, Some(n))) if n == name => {}
            Some((_, other)) => problems.push(format!("the code map names `{folder}/` as {other:?}, its crate is `{name}`")),
        }
    }
    for (folder, _) in &map {
        if !root.join(folder).is_dir() {
            problems.push(format!("the code map names `{folder}/`, which does not exist"));
        }
    }
    if problems.is_empty() { Ok(()) } else { Err(problems.join("\n")) }
}

/// The rule count README states ("<N> numbered rules"), if it states one.
pub fn stated_rule_count(readme: &str) -> Option<usize> {
    let words: Vec<&str> = readme.split_whitespace().collect();
    words.windows(3).find(|w| w[1] == "numbered" && w[2].trim_end_matches(|c: char| !c.is_alphanumeric()) == "rules").and_then(|w| w[0].trim_start_matches(|c: char| !c.is_ascii_digit()).parse().ok())
}

/// Each member's floor, from the `# Floor N` comments of the root Cargo.toml's
/// members list (a member takes the last floor named above it).
pub fn floors(root: &Path) -> Result<BTreeMap<String, u32>, String> {
    let text = std::fs::read_to_string(root.join("Cargo.toml")).map_err(|e| format!("Cargo.toml: {e}"))?;
    let list = text.split_once("members = [").and_then(|(_, rest)| rest.split_once("\n]")).map(|(list, _)| list).ok_or("Cargo.toml has no members list")?;
    let mut floor = None;
    let mut out = BTreeMap::new();
    for line in list.lines().map(str::trim) {
        if let Some(n) = line.strip_prefix("# Floor ") {
            floor = n.split(|c: char| !c.is_ascii_digit()).next().and_then(|d| d.parse().ok());
        } else if let Some(member) = line.strip_prefix('"').and_then(|l| l.split_once('"')).map(|(m, _)| m) {
            out.insert(member.to_string(), floor.ok_or_else(|| format!("member `{member}` comes before any `# Floor N` line"))?);
        }
    }
    Ok(out)
}

/// `Err` names each `[dependencies]` entry of a member (by crate name) that
/// sits on a higher floor than the member.
pub fn check_floors(members: &BTreeMap<String, String>, floors: &BTreeMap<String, u32>, dependencies: &BTreeMap<String, Vec<String>>) -> Result<(), String> {
    let floor_of_crate: BTreeMap<&str, u32> = members.iter().filter_map(|(folder, name)| floors.get(folder).map(|&f| (name.as_str(), f))).collect();
    let mut problems = Vec::new();
    for (folder, name) in members {
        let Some(&own) = floors.get(folder) else {
            problems.push(format!("`{folder}` has no floor"));
            continue;
        };
        for dep in dependencies.get(folder).into_iter().flatten() {
            if let Some(&f) = floor_of_crate.get(dep.as_str())
                && f > own
            {
                problems.push(format!("`{name}` (floor {own}) depends on `{dep}` (floor {f})"));
            }
        }
    }
    if problems.is_empty() { Ok(()) } else { Err(problems.join("\n")) }
}

/// Each member's `[dependencies]` (not dev- or build-dependencies), by folder.
pub fn dependencies(root: &Path, members: &BTreeMap<String, String>) -> Result<BTreeMap<String, Vec<String>>, String> {
    let mut out = BTreeMap::new();
    for folder in members.keys() {
        let p = root.join(folder).join("Cargo.toml");
        let text = std::fs::read_to_string(&p).map_err(|e| format!("{}: {e}", p.display()))?;
        let manifest = text.parse::<toml::Table>().map_err(|e| format!("{}: {e}", p.display()))?;
        let deps = manifest.get("dependencies").and_then(|d| d.as_table()).map(|t| t.keys().cloned().collect()).unwrap_or_default();
        out.insert(folder.clone(), deps);
    }
    Ok(out)
}
