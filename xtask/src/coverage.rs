//! Spec-rule coverage: every rule defined in `spec/SPEC.md` must be named in
//! the source that implements it and in at least one test or case file, and
//! no test may name a rule the spec does not define.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Where each rule ID was found.
#[derive(Debug, Default)]
pub struct Coverage {
    /// Rules defined in SPEC.md (`**AREA-N**` at the start of a paragraph).
    pub defined: BTreeSet<String>,
    /// Rule -> implementation files (`src/` of any crate).
    pub implemented: BTreeMap<String, BTreeSet<PathBuf>>,
    /// Rule -> test files (`tests/` of any crate, and `fixtures/`).
    pub tested: BTreeMap<String, BTreeSet<PathBuf>>,
    /// IDs named in code or tests that the spec does not define.
    pub undefined: BTreeMap<String, BTreeSet<PathBuf>>,
}

impl Coverage {
    pub fn missing_implementation(&self) -> Vec<&String> {
        self.defined.iter().filter(|r| !self.implemented.contains_key(*r)).collect()
    }

    pub fn missing_test(&self) -> Vec<&String> {
        self.defined.iter().filter(|r| !self.tested.contains_key(*r)).collect()
    }

    /// A human-readable verdict; `Err` lists every problem.
    pub fn check(&self) -> Result<String, String> {
        let mut problems = Vec::new();
        let impl_missing = self.missing_implementation();
        if !impl_missing.is_empty() {
            problems.push(format!("rules named by no implementation: {impl_missing:?}"));
        }
        let test_missing = self.missing_test();
        if !test_missing.is_empty() {
            problems.push(format!("rules named by no test or case file: {test_missing:?}"));
        }
        for (id, files) in &self.undefined {
            problems.push(format!("{id} is not defined in spec/SPEC.md but is named in {files:?}"));
        }
        if problems.is_empty() { Ok(format!("{} spec rules, each implemented and tested", self.defined.len())) } else { Err(problems.join("\n")) }
    }
}

/// Rule-shaped tokens (`AREA-N`) in `text`, with their areas.
fn rule_ids(text: &str) -> Vec<String> {
    let bytes = text.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        let starts_word = i == 0 || !(bytes[i - 1].is_ascii_alphanumeric() || bytes[i - 1] == b'_');
        if starts_word && bytes[i].is_ascii_uppercase() {
            let mut j = i;
            while j < bytes.len() && (bytes[j].is_ascii_uppercase() || bytes[j].is_ascii_digit()) {
                j += 1;
            }
            if j - i >= 2 && j < bytes.len() && bytes[j] == b'-' {
                let mut k = j + 1;
                while k < bytes.len() && bytes[k].is_ascii_digit() {
                    k += 1;
                }
                let ends_word = k == bytes.len() || !(bytes[k].is_ascii_alphanumeric() || bytes[k] == b'_');
                if k > j + 1 && ends_word {
                    out.push(text[i..k].to_string());
                    i = k;
                    continue;
                }
            }
            i = j.max(i + 1);
        } else {
            i += 1;
        }
    }
    out
}

/// Rules defined in the spec text: `**AREA-N**` opening a paragraph.
pub fn defined_rules(spec: &str) -> BTreeSet<String> {
    spec.lines().filter_map(|l| l.strip_prefix("**")).filter_map(|l| l.split_once("**")).map(|(id, _)| id.to_string()).filter(|id| rule_ids(id).len() == 1).collect()
}

fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for e in entries.flatten() {
        let p = e.path();
        let name = e.file_name();
        let name = name.to_string_lossy();
        if p.is_dir() {
            if !matches!(name.as_ref(), "target" | ".git" | ".cache" | "reports" | "node_modules") {
                walk(&p, out);
            }
        } else if name.ends_with(".rs") || name.ends_with(".json") {
            out.push(p);
        }
    }
}

/// Scans the repository at `root`.
pub fn scan(root: &Path) -> Result<Coverage, String> {
    let spec_path = root.join("spec/SPEC.md");
    let spec = std::fs::read_to_string(&spec_path).map_err(|e| format!("cannot read {}: {e}", spec_path.display()))?;
    let defined = defined_rules(&spec);
    let areas: BTreeSet<String> = defined.iter().filter_map(|r| r.split('-').next()).map(str::to_string).collect();
    let mut cov = Coverage { defined, ..Coverage::default() };
    let mut files = Vec::new();
    walk(root, &mut files);
    for f in files {
        let rel = f.strip_prefix(root).unwrap_or(&f).to_path_buf();
        let parts: Vec<String> = rel.components().map(|c| c.as_os_str().to_string_lossy().into_owned()).collect();
        let is_fixture = parts.first().is_some_and(|p| p == "fixtures");
        let is_test = is_fixture || parts.iter().any(|p| p == "tests");
        let is_src = !is_test && parts.iter().any(|p| p == "src");
        if !(is_test || is_src) {
            continue;
        }
        let Ok(text) = std::fs::read_to_string(&f) else { continue };
        for id in rule_ids(&text) {
            let area = id.split('-').next().unwrap_or_default();
            if !areas.contains(area) {
                continue; // not a spec rule (e.g. an unrelated identifier)
            }
            let map = if !cov.defined.contains(&id) {
                &mut cov.undefined
            } else if is_test {
                &mut cov.tested
            } else {
                &mut cov.implemented
            };
            map.entry(id).or_default().insert(rel.clone());
        }
    }
    Ok(cov)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_rule_ids_as_whole_words() {
        assert_eq!(rule_ids("see ABC-4, and (XYZ-10)."), ["ABC-4", "XYZ-10"]);
        assert!(rule_ids("x-1 A-1 GREEDY- ABC-12x UTF8").is_empty());
    }

    #[test]
    fn definitions_are_bold_paragraph_openers() {
        let spec = "**ABC-1** text XYZ-2\n\n**XYZ-2** more\nnot **QQ-1** here";
        assert_eq!(defined_rules(spec), ["ABC-1".to_string(), "XYZ-2".to_string()].into());
    }
}
