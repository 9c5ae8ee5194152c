//! The case and model files of `fixtures/`, embedded at build time
//! (`build.rs`), so that a vendor's test binary needs no path to this
//! repository: golden cases (`cases/`), host cases (`host/`) and the
//! table-driven models (`models/`), each as `(path below its folder, text)`.

use crate::case::{Loaded, parse};
use crate::format::{Case, CaseError};

include!(concat!(env!("OUT_DIR"), "/fixtures.rs"));

/// Every file of `files`, parsed; `stem` is its path without `.json`.
pub fn parsed(files: &'static [(&'static str, &'static str)]) -> Vec<(&'static str, Result<Loaded, CaseError>)> {
    files.iter().map(|(path, text)| (path.trim_end_matches(".json"), parse(text, std::path::Path::new(path)))).collect()
}

/// The golden cases of `op` that load (a malformed one fails its own check).
pub fn golden_cases_of(op: &str) -> Vec<Case> {
    parsed(GOLDEN_FILES).into_iter().filter_map(|(_, loaded)| loaded.ok()).flat_map(|l| l.cases).filter(|c| c.op == op).collect()
}
