//! Small table-driven autoregressive target and draft models
//! (`fixtures/models/*.json`), for losslessness checks over whole sequences.

use std::collections::BTreeMap;
use std::path::Path;

use serde::Deserialize;

/// Format tag of model files.
pub const FORMAT: &str = "specdec-model/1";

/// An order-1 (bigram) model pair: the next-token law depends on the last token.
#[derive(Debug, Clone, Deserialize)]
pub struct TableModel {
    pub format: String,
    pub name: String,
    #[serde(default)]
    pub description: String,
    pub vocab: usize,
    pub order: usize,
    /// The prompt the generation continues.
    pub context: Vec<i64>,
    /// `target[i]`: the target's law after token `i`.
    pub target: Vec<Vec<f64>>,
    /// `draft[i]`: the drafter's law after token `i`.
    pub draft: Vec<Vec<f64>>,
}

impl TableModel {
    /// Parses and validates a model file's text.
    pub fn parse(text: &str) -> Result<TableModel, String> {
        let m: TableModel = serde_json::from_str(text).map_err(|e| format!("invalid model file: {e}"))?;
        if m.format != FORMAT {
            return Err(format!("model `format` must be \"{FORMAT}\", found \"{}\"", m.format));
        }
        if m.order != 1 {
            return Err(format!("model {}: only order 1 is supported, found {}", m.name, m.order));
        }
        if m.context.is_empty() || m.context.iter().any(|&t| t < 0 || t as usize >= m.vocab) {
            return Err(format!("model {}: the context must be non-empty ids below {}", m.name, m.vocab));
        }
        for (what, table) in [("target", &m.target), ("draft", &m.draft)] {
            if table.len() != m.vocab {
                return Err(format!("model {}: {what} needs {} rows", m.name, m.vocab));
            }
            for (i, row) in table.iter().enumerate() {
                let sum: f64 = row.iter().sum();
                if row.len() != m.vocab || row.iter().any(|x| !x.is_finite() || *x < 0.0) || (sum - 1.0).abs() > 1e-12 {
                    return Err(format!("model {}: {what} row {i} is not a distribution over {} ids", m.name, m.vocab));
                }
            }
        }
        Ok(m)
    }

    pub fn load(path: &Path) -> Result<TableModel, String> {
        let text = std::fs::read_to_string(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        Self::parse(&text)
    }

    fn last(prefix: &[i64]) -> usize {
        *prefix.last().expect("contexts are never empty") as usize
    }

    /// The target's law of the token after `prefix`.
    pub fn target(&self, prefix: &[i64]) -> &[f64] {
        &self.target[Self::last(prefix)]
    }

    /// The drafter's law of the token after `prefix`.
    pub fn draft(&self, prefix: &[i64]) -> &[f64] {
        &self.draft[Self::last(prefix)]
    }

    /// The target's exact law of the next `m` tokens after the context.
    pub fn target_law(&self, m: usize) -> BTreeMap<Vec<i64>, f64> {
        let mut law = BTreeMap::from([(Vec::new(), 1.0)]);
        for _ in 0..m {
            let mut next = BTreeMap::new();
            for (seq, p) in law {
                let mut prefix = self.context.clone();
                prefix.extend(&seq);
                for (x, &px) in self.target(&prefix).iter().enumerate() {
                    if px > 0.0 {
                        let mut s = seq.clone();
                        s.push(x as i64);
                        next.insert(s, p * px);
                    }
                }
            }
            law = next;
        }
        law
    }
}

/// The model files shipped in `fixtures/models/`, embedded.
pub fn shipped_models() -> Vec<TableModel> {
    crate::fixtures::MODEL_FILES.iter().map(|(path, text)| TableModel::parse(text).unwrap_or_else(|e| panic!("fixtures/models/{path}: {e}"))).collect()
}
