//! Prompt files, read as untrusted: `{"about": "...", "prompts": [...]}`,
//! one envelope and one reader for the prompts the suite and the speedup
//! report run (`fixtures/prompts/smollm2.json`, [`Prompt`]) and those a
//! draft is trained on (`fixtures/dflash/prompts.json`, [`DraftPrompt`]).
//!
//! Invariants: unknown fields are refused, ids are unique, texts are not
//! empty, and each kind of prompt checks its own fields; a defect is a typed
//! error naming the file and the prompt's field.

use std::path::Path;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::error::{ModelError, Result};

/// One prompt the suite's SmolLM2 sections and the speedup report run.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Prompt {
    pub id: String,
    /// Wrap `text` in the model's chat template.
    pub chat: bool,
    pub text: String,
}

/// One prompt of a draft-training prompt file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DraftPrompt {
    pub id: usize,
    /// `train` (data for training) or `heldout` (for measuring only).
    pub split: String,
    pub kind: String,
    /// Wrap `text` in the target's chat template.
    pub chat: bool,
    pub text: String,
}

/// What the reader needs of one kind of prompt.
pub trait PromptEntry: DeserializeOwned {
    fn id(&self) -> String;
    fn text(&self) -> &str;
    /// A field this kind constrains further and what is wrong with it.
    fn defect(&self) -> Option<(&'static str, String)> {
        None
    }
}

impl PromptEntry for Prompt {
    fn id(&self) -> String {
        self.id.clone()
    }
    fn text(&self) -> &str {
        &self.text
    }
}

impl PromptEntry for DraftPrompt {
    fn id(&self) -> String {
        self.id.to_string()
    }
    fn text(&self) -> &str {
        &self.text
    }
    fn defect(&self) -> Option<(&'static str, String)> {
        (self.split != "train" && self.split != "heldout").then(|| ("split", format!("`{}` is neither `train` nor `heldout`", self.split)))
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PromptFile<P> {
    #[allow(dead_code)]
    about: String,
    prompts: Vec<P>,
}

/// Parses the prompt file `file` (its name, for errors) from `json`.
pub fn parse_prompts<P: PromptEntry>(file: &str, json: &str) -> Result<Vec<P>> {
    let f: PromptFile<P> = serde_json::from_str(json).map_err(|e| ModelError::invalid(file, "prompts", e.to_string()))?;
    let mut seen = std::collections::HashSet::new();
    for p in &f.prompts {
        let bad = |field: &str, reason: String| Err(ModelError::invalid(file, &format!("prompts[id {}].{field}", p.id()), reason));
        if !seen.insert(p.id()) {
            return bad("id", "is used twice".into());
        }
        if let Some((field, reason)) = p.defect() {
            return bad(field, reason);
        }
        if p.text().is_empty() {
            return bad("text", "is empty".into());
        }
    }
    Ok(f.prompts)
}

/// Reads the prompt file at `path`.
pub fn read_prompts<P: PromptEntry>(path: impl AsRef<Path>) -> Result<Vec<P>> {
    let path = path.as_ref();
    let text = std::fs::read_to_string(path).map_err(|e| ModelError::io(path, e))?;
    parse_prompts(&path.display().to_string(), &text)
}
