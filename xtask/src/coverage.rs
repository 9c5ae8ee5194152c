//! Spec-rule coverage: every rule defined in `spec/SPEC.md` must be named in
//! the source that implements it and by at least one check that runs, and no
//! file may name a rule the spec does not define.
//!
//! "Named by a check that runs" is read from code, never from comments (the
//! Rust files are tokenised, which drops comments): a rule is tested when its
//! ID is in a string of the body of a `#[test]` function that is not
//! `#[ignore]`d (or of a `proptest!` block), in the `rules` of a case in a
//! `fixtures/` case file, or is a whole string literal in the conformance
//! suite's own source (its check lists: every backend's conformance test runs
//! the whole suite). A rule ID in a comment, a doc comment or a helper that no
//! test calls by that name does not count.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Where each rule ID was found.
#[derive(Debug, Default)]
pub struct Coverage {
    /// Rules defined in SPEC.md (`**AREA-N**` at the start of a paragraph).
    pub defined: BTreeSet<String>,
    /// Rule -> implementation files (`src/` of any crate).
    pub implemented: BTreeMap<String, BTreeSet<PathBuf>>,
    /// Rule -> files whose running checks name it (see the module doc).
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
            problems.push(format!("rules named by no test that runs, no case and no suite check (a comment is not a test): {test_missing:?}"));
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
        let is_suite = parts.first().is_some_and(|p| p == "conformance") && parts.get(1).is_some_and(|p| p == "src");
        let is_test_dir = parts.iter().any(|p| p == "tests");
        let is_src = !is_fixture && !is_test_dir && parts.iter().any(|p| p == "src");
        if !(is_fixture || is_test_dir || is_src) {
            continue;
        }
        let Ok(text) = std::fs::read_to_string(&f) else { continue };
        let is_rust = rel.extension().is_some_and(|e| e == "rs");
        // Every mention is checked against the spec; only running checks count as tests.
        let mut tested: BTreeSet<String> = BTreeSet::new();
        if is_fixture && !is_rust {
            let value: serde_json::Value = serde_json::from_str(&text).map_err(|e| format!("{}: not JSON: {e}", rel.display()))?;
            case_rules(&value, &mut tested);
        } else if is_rust {
            let file = syn::parse_file(&text).map_err(|e| format!("{}: cannot parse: {e}", rel.display()))?;
            tested.extend(names_in_running_tests(&file));
            if is_suite {
                tested.extend(whole_literals(&quote::ToTokens::to_token_stream(&file)));
            }
        }
        for id in rule_ids(&text) {
            let area = id.split('-').next().unwrap_or_default();
            if !areas.contains(area) {
                continue; // not a spec rule (e.g. an unrelated identifier)
            }
            if !cov.defined.contains(&id) {
                cov.undefined.entry(id).or_default().insert(rel.clone());
            } else if is_src {
                cov.implemented.entry(id).or_default().insert(rel.clone());
            }
        }
        for id in tested.into_iter().filter(|id| cov.defined.contains(id)) {
            cov.tested.entry(id).or_default().insert(rel.clone());
        }
    }
    Ok(cov)
}

/// The rule IDs in the `rules` arrays of every case in a case file.
fn case_rules(v: &serde_json::Value, out: &mut BTreeSet<String>) {
    match v {
        serde_json::Value::Object(map) => {
            if let Some(serde_json::Value::Array(rules)) = map.get("rules") {
                out.extend(rules.iter().filter_map(|r| r.as_str()).flat_map(rule_ids));
            }
            map.values().for_each(|x| case_rules(x, out));
        }
        serde_json::Value::Array(items) => items.iter().for_each(|x| case_rules(x, out)),
        _ => {}
    }
}

/// The string literals among `tokens`, macro arguments included (comments are
/// not tokens; doc comments are `doc` attributes, skipped).
fn string_literals(tokens: &proc_macro2::TokenStream, out: &mut Vec<String>) {
    for tt in tokens.clone() {
        match tt {
            // `#[doc = "..."]` is a doc comment, not code: its bracket group is skipped.
            proc_macro2::TokenTree::Group(g) => {
                let is_doc = g.delimiter() == proc_macro2::Delimiter::Bracket && matches!(g.stream().into_iter().next(), Some(proc_macro2::TokenTree::Ident(i)) if i == "doc");
                if !is_doc {
                    string_literals(&g.stream(), out);
                }
            }
            proc_macro2::TokenTree::Literal(l) => {
                if let Ok(syn::Lit::Str(s)) = syn::parse_str::<syn::Lit>(&l.to_string()) {
                    out.push(s.value());
                }
            }
            _ => {}
        }
    }
}

/// Rule IDs that are a whole string literal (a check's rule list).
fn whole_literals(tokens: &proc_macro2::TokenStream) -> BTreeSet<String> {
    let mut lits = Vec::new();
    string_literals(tokens, &mut lits);
    lits.into_iter().filter(|s| rule_ids(s) == [s.as_str()]).collect()
}

/// Rule IDs in the strings of running tests: bodies of `#[test]` functions
/// without `#[ignore]`, and `proptest!` blocks, at any depth of modules.
fn names_in_running_tests(file: &syn::File) -> BTreeSet<String> {
    struct Visitor(Vec<String>);
    impl<'ast> syn::visit::Visit<'ast> for Visitor {
        fn visit_item_fn(&mut self, f: &'ast syn::ItemFn) {
            let has = |name: &str| f.attrs.iter().any(|a| a.path().segments.last().is_some_and(|s| s.ident == name));
            if has("test") && !has("ignore") {
                string_literals(&quote::ToTokens::to_token_stream(&f.block), &mut self.0);
            }
            syn::visit::visit_item_fn(self, f);
        }
        fn visit_macro(&mut self, m: &'ast syn::Macro) {
            if m.path.segments.last().is_some_and(|s| s.ident == "proptest") {
                string_literals(&m.tokens, &mut self.0);
            }
        }
    }
    let mut v = Visitor(Vec::new());
    syn::visit::Visit::visit_file(&mut v, file);
    v.0.iter().flat_map(|s| rule_ids(s)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_rule_ids_as_whole_words() {
        assert_eq!(rule_ids("see ABC-4, and (XYZ-10)."), ["ABC-4", "XYZ-10"]);
        assert!(rule_ids("x-1 A-1 GREEDY- ABC-12x UTF8").is_empty());
    }

    /// A repository under the temp dir with a spec of rules `ABC-1..5`, an
    /// implementation naming them all, and `files` (path, text).
    fn scan_repo(name: &str, files: &[(&str, &str)]) -> Coverage {
        let root = std::env::temp_dir().join(format!("specdec-coverage-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        let spec = (1..=5).map(|i| format!("**ABC-{i}** rule {i}\n\n")).collect::<String>();
        let implementation = "// ABC-1 ABC-2 ABC-3 ABC-4 ABC-5\n";
        for (path, text) in [("spec/SPEC.md", spec.as_str()), ("lib/src/lib.rs", implementation)].into_iter().chain(files.iter().copied()) {
            let p = root.join(path);
            std::fs::create_dir_all(p.parent().expect("a parent")).expect("scratch dir");
            std::fs::write(p, text).expect("scratch file");
        }
        let cov = scan(&root).expect("scannable");
        let _ = std::fs::remove_dir_all(&root);
        cov
    }

    #[test]
    fn only_checks_that_run_count_as_tests() {
        let test_file = r#"
            // ABC-1 is named in a comment only.
            /// ABC-2 in a doc comment.
            #[test]
            fn checks() {
                assert_eq!(1 + 1, 2, "ABC-3: addition");
            }
            #[test]
            #[ignore]
            fn skipped() {
                assert!(true, "ABC-4");
            }
            fn helper_nobody_marks() {
                let _ = "ABC-4";
            }
            proptest::proptest! {
                #[test]
                fn prop(x in 0..3u8) { prop_assert!(x < 3, "ABC-5"); }
            }
        "#;
        let cov = scan_repo("running", &[("lib/tests/t.rs", test_file)]);
        let tested: Vec<&String> = cov.tested.keys().collect();
        assert_eq!(tested, ["ABC-3", "ABC-5"], "a comment, a doc comment, an ignored test and a helper do not count");
        assert_eq!(cov.missing_test(), ["ABC-1", "ABC-2", "ABC-4"]);
        assert!(cov.check().is_err());
    }

    #[test]
    fn cases_and_suite_rule_lists_count() {
        let cases = r#"{"format": "x", "cases": [{"id": "a", "rules": ["ABC-1"], "description": "see ABC-2"}]}"#;
        let suite = r#"
            // ABC-4 in a comment of the suite.
            fn items() -> Vec<Item> { vec![Item { rules: vec!["ABC-3"], note: "not ABC-5 in prose" }] }
        "#;
        let cov = scan_repo("cases", &[("fixtures/cases/c.json", cases), ("conformance/src/suite.rs", suite)]);
        let tested: Vec<&String> = cov.tested.keys().collect();
        assert_eq!(tested, ["ABC-1", "ABC-3"], "a case's rules and a suite rule list count; prose and comments do not");
    }

    #[test]
    fn definitions_are_bold_paragraph_openers() {
        let spec = "**ABC-1** text XYZ-2\n\n**XYZ-2** more\nnot **QQ-1** here";
        assert_eq!(defined_rules(spec), ["ABC-1".to_string(), "XYZ-2".to_string()].into());
    }
}
