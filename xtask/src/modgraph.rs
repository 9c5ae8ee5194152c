//! The module graph of each crate in the workspace, and its import circles.
//!
//! A crate's modules are its files under `src/` (`a.rs` and `a/mod.rs` are `a`,
//! `a/b.rs` is `a::b`). Module `m` depends on module `n` when a file of `m` names
//! a path into `n`: `crate::n::..` or `super::..` (in `use` trees and in
//! expressions and types alike; Rust is read as tokens by `syn`, so a name in a
//! comment or string is not an edge). A module and its own submodules may name
//! each other (a parent declares its children, a child reads its parent's items):
//! those edges are not counted. A circle is a strongly connected set of two or
//! more modules; the invariant the test holds is that no crate has one.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use syn::visit::Visit;

/// One crate's modules and the edges between them.
#[derive(Debug, Default)]
pub struct ModGraph {
    pub crate_dir: PathBuf,
    /// Module path (`a::b`; the crate root is ``) to the modules it names.
    pub edges: BTreeMap<String, BTreeSet<String>>,
}

/// Every `src/` of the workspace with a crate root in it.
pub fn workspace_crates(root: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else { continue };
        for e in entries.flatten() {
            let p = e.path();
            let name = e.file_name().to_string_lossy().into_owned();
            if !p.is_dir() || name.starts_with('.') || name == "target" || name == "fixtures" {
                continue;
            }
            if name == "src" && dir.join("Cargo.toml").is_file() {
                out.push(p);
            } else {
                stack.push(p);
            }
        }
    }
    out.sort();
    out
}

/// `a/b.rs` -> `a::b`, `a/mod.rs` -> `a`, `lib.rs` / `main.rs` -> ``.
fn module_of(src: &Path, file: &Path) -> String {
    let rel = file.strip_prefix(src).unwrap_or(file).with_extension("");
    let mut parts: Vec<String> = rel.components().map(|c| c.as_os_str().to_string_lossy().into_owned()).collect();
    if parts.last().is_some_and(|l| l == "mod") || (parts.len() == 1 && (parts[0] == "lib" || parts[0] == "main")) {
        parts.pop();
    }
    parts.join("::")
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for e in entries.flatten() {
        let p = e.path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// Paths a file names, as segment lists, from `crate::` or `super::` (resolved).
struct Names<'m> {
    module: &'m [String],
    found: Vec<Vec<String>>,
}

impl Names<'_> {
    fn add(&mut self, segments: Vec<String>) {
        let Some(first) = segments.first() else { return };
        let resolved = match first.as_str() {
            "crate" => segments[1..].to_vec(),
            "super" => {
                let mut base = self.module.to_vec();
                let mut rest = &segments[..];
                while rest.first().is_some_and(|s| s == "super") {
                    base.pop();
                    rest = &rest[1..];
                }
                base.extend(rest.iter().cloned());
                base
            }
            _ => return,
        };
        self.found.push(resolved);
    }

    fn use_tree(&mut self, prefix: &mut Vec<String>, tree: &syn::UseTree) {
        match tree {
            syn::UseTree::Path(p) => {
                prefix.push(p.ident.to_string());
                self.use_tree(prefix, &p.tree);
                prefix.pop();
            }
            syn::UseTree::Name(n) => {
                let mut full = prefix.clone();
                full.push(n.ident.to_string());
                self.add(full);
            }
            syn::UseTree::Rename(r) => {
                let mut full = prefix.clone();
                full.push(r.ident.to_string());
                self.add(full);
            }
            syn::UseTree::Glob(_) => self.add(prefix.clone()),
            syn::UseTree::Group(g) => g.items.iter().for_each(|t| self.use_tree(prefix, t)),
        }
    }
}

impl<'ast> Visit<'ast> for Names<'_> {
    fn visit_item_use(&mut self, u: &'ast syn::ItemUse) {
        self.use_tree(&mut Vec::new(), &u.tree);
    }

    fn visit_path(&mut self, p: &'ast syn::Path) {
        self.add(p.segments.iter().map(|s| s.ident.to_string()).collect());
        syn::visit::visit_path(self, p);
    }

    fn visit_macro(&mut self, m: &'ast syn::Macro) {
        // Paths inside macro calls (`format!`, `matches!`, ...) are tokens: read
        // `crate :: a :: b` and `super :: a` runs out of them.
        let tokens: Vec<String> = m.tokens.clone().into_iter().map(|t| t.to_string()).collect();
        scan_tokens(&tokens, self);
    }
}

fn scan_tokens(tokens: &[String], names: &mut Names<'_>) {
    let mut i = 0;
    while i < tokens.len() {
        if tokens[i] == "crate" || tokens[i] == "super" {
            let mut segs = vec![tokens[i].clone()];
            let mut j = i + 1;
            while j + 2 <= tokens.len() && tokens[j] == ":" && tokens.get(j + 1).is_some_and(|t| t == ":") && j + 2 < tokens.len() {
                segs.push(tokens[j + 2].clone());
                j += 3;
            }
            if segs.len() > 1 {
                names.add(segs);
            }
            i = j;
        } else {
            i += 1;
        }
    }
}

/// Reads one crate's `src/`.
pub fn read(src: &Path) -> Result<ModGraph, String> {
    let mut files = Vec::new();
    rust_files(src, &mut files);
    files.sort();
    let modules: BTreeSet<String> = files.iter().map(|f| module_of(src, f)).collect();
    let mut graph = ModGraph { crate_dir: src.to_path_buf(), edges: BTreeMap::new() };
    for file in &files {
        let text = std::fs::read_to_string(file).map_err(|e| format!("{}: {e}", file.display()))?;
        let ast = syn::parse_file(&text).map_err(|e| format!("{}: {e}", file.display()))?;
        let module = module_of(src, file);
        let parts: Vec<String> = if module.is_empty() { Vec::new() } else { module.split("::").map(str::to_string).collect() };
        let mut names = Names { module: &parts, found: Vec::new() };
        names.visit_file(&ast);
        let targets = graph.edges.entry(module.clone()).or_default();
        for path in names.found {
            // The longest prefix of the path that is a module of this crate.
            let target = (0..=path.len()).rev().map(|n| path[..n].join("::")).find(|m| modules.contains(m)).unwrap_or_default();
            let related = |a: &str, b: &str| a.is_empty() || b.is_empty() || a == b || b.starts_with(&format!("{a}::")) || a.starts_with(&format!("{b}::"));
            if !related(&module, &target) {
                targets.insert(target);
            }
        }
    }
    Ok(graph)
}

impl ModGraph {
    /// The strongly connected sets of two or more modules (Tarjan), each sorted.
    pub fn circles(&self) -> Vec<Vec<String>> {
        let nodes: Vec<&String> = self.edges.keys().collect();
        let index_of: BTreeMap<&String, usize> = nodes.iter().enumerate().map(|(i, n)| (*n, i)).collect();
        let adj: Vec<Vec<usize>> = nodes.iter().map(|n| self.edges[*n].iter().filter_map(|t| index_of.get(t).copied()).collect()).collect();
        let n = nodes.len();
        let (mut index, mut low, mut on_stack) = (vec![usize::MAX; n], vec![0; n], vec![false; n]);
        let (mut stack, mut next, mut out) = (Vec::new(), 0, Vec::new());
        // Iterative Tarjan: (node, next edge to look at).
        for start in 0..n {
            if index[start] != usize::MAX {
                continue;
            }
            let mut work = vec![(start, 0usize)];
            while let Some(&(v, e)) = work.last() {
                if e == 0 && index[v] == usize::MAX {
                    index[v] = next;
                    low[v] = next;
                    next += 1;
                    stack.push(v);
                    on_stack[v] = true;
                }
                if let Some(&w) = adj[v].get(e) {
                    if let Some(top) = work.last_mut() {
                        top.1 += 1;
                    }
                    if index[w] == usize::MAX {
                        work.push((w, 0));
                    } else if on_stack[w] {
                        low[v] = low[v].min(index[w]);
                    }
                    continue;
                }
                work.pop();
                if let Some(&(parent, _)) = work.last() {
                    low[parent] = low[parent].min(low[v]);
                }
                if low[v] == index[v] {
                    let mut set = Vec::new();
                    while let Some(w) = stack.pop() {
                        on_stack[w] = false;
                        set.push(nodes[w].clone());
                        if w == v {
                            break;
                        }
                    }
                    if set.len() > 1 {
                        set.sort();
                        out.push(set);
                    }
                }
            }
        }
        out.sort();
        out
    }

    /// The edges inside one circle, `a -> b` per line, for a readable failure.
    pub fn describe(&self, circle: &[String]) -> String {
        let inside: BTreeSet<&String> = circle.iter().collect();
        circle.iter().flat_map(|a| self.edges[a].iter().filter(|b| inside.contains(b)).map(move |b| format!("  {a} -> {b}"))).collect::<Vec<_>>().join("\n")
    }
}
