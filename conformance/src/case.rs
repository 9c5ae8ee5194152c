//! Loading case files (CASE-1 .. CASE-9): parse the JSON (`format.rs`), then
//! check every case against the op table (`ops.rs`). A malformed case is
//! reported with its id and field and never stops the other cases of a file.

use std::path::{Path, PathBuf};

use serde_json::Value;

pub use crate::format::*;
pub use crate::ops::{OpFields, validate};

/// Reads a case file (CASE-8). A file-level defect (not JSON, wrong format tag, no
/// `cases` array) is an `Err`; a malformed case is kept in `errors` and the
/// other cases still load.
pub fn load(path: &Path) -> Result<Loaded, CaseError> {
    let at = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|e| CaseError::new(&at, format!("cannot read: {e}")))?;
    parse(&text, path)
}

/// The fields of a case file's top level (CASE-1).
const FILE_FIELDS: [&str; 4] = ["format", "title", "description", "cases"];

/// [`load`] on text already in memory. Each case is also checked against
/// its op's fields and outputs (CASE-9), so a typo fails when the file is
/// read, whichever backend would have run it.
pub fn parse(text: &str, path: &Path) -> Result<Loaded, CaseError> {
    let at = path.display().to_string();
    let root: Value = serde_json::from_str(text).map_err(|e| CaseError::new(&at, format!("not JSON: {e}")))?;
    let format = root.get("format").and_then(Value::as_str);
    if format != Some(FORMAT) {
        return Err(CaseError::new(&at, format!("field `format` must be \"{FORMAT}\", found {format:?}")));
    }
    if let Some(unknown) = root.as_object().and_then(|o| o.keys().find(|k| !FILE_FIELDS.contains(&k.as_str()))) {
        return Err(CaseError::new(&at, format!("unknown field `{unknown}`; a case file has {}", FILE_FIELDS.join(", "))));
    }
    let title = root.get("title").and_then(Value::as_str).unwrap_or_default().to_string();
    let Some(items) = root.get("cases").and_then(Value::as_array) else {
        return Err(CaseError::new(&at, "field `cases` must be an array"));
    };
    let mut cases = Vec::new();
    let mut errors = Vec::new();
    for (i, item) in items.iter().enumerate() {
        let id = item.get("id").and_then(Value::as_str).map_or_else(|| format!("#{i}"), str::to_string);
        match serde_json::from_value::<Case>(item.clone()) {
            Ok(case) => match validate(&case) {
                Ok(()) => cases.push(case),
                Err(e) => errors.push(CaseError { case: Some(id.clone()), ..CaseError::new(format!("{at} {}", e.location), e.message) }),
            },
            Err(e) => errors.push(CaseError { case: Some(id.clone()), ..CaseError::new(format!("{at} case {id}"), e.to_string()) }),
        }
    }
    Ok(Loaded { path: path.to_path_buf(), title, cases, errors })
}

/// All `*.json` case files below `dir`, sorted, recursively.
pub fn case_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else { continue };
        for e in entries.flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else if p.extension().is_some_and(|x| x == "json") {
                out.push(p);
            }
        }
    }
    out.sort();
    out
}
