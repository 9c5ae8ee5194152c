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
    let located = f.prompts.into_iter().map(|p| (format!("prompts[id {}]", p.id()), p)).collect();
    validated(file, located)
}

/// Parses a JSON Lines prompt file (one prompt object per line, blank lines
/// skipped), with the same checks as [`parse_prompts`]; a defect names its line.
pub fn parse_prompt_lines<P: PromptEntry>(file: &str, text: &str) -> Result<Vec<P>> {
    let mut located = Vec::new();
    for (i, line) in text.lines().enumerate().filter(|(_, l)| !l.trim().is_empty()) {
        let at = format!("line {}", i + 1);
        let p: P = serde_json::from_str(line).map_err(|e| ModelError::invalid(file, &at, e.to_string()))?;
        located.push((at, p));
    }
    if located.is_empty() {
        return Err(ModelError::invalid(file, "prompts", "the file holds no prompt"));
    }
    validated(file, located)
}

/// The prompts, each with where it stands in the file, once every id is
/// unique, every text non-empty and every kind-specific field sound.
fn validated<P: PromptEntry>(file: &str, located: Vec<(String, P)>) -> Result<Vec<P>> {
    let mut seen = std::collections::HashSet::new();
    for (at, p) in &located {
        let bad = |field: &str, reason: String| Err(ModelError::invalid(file, &format!("{at}.{field}"), reason));
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
    Ok(located.into_iter().map(|(_, p)| p).collect())
}

/// Reads the prompt file at `path`: JSON Lines where it ends `.jsonl`, else
/// the `{"about", "prompts"}` envelope.
pub fn read_prompts<P: PromptEntry>(path: impl AsRef<Path>) -> Result<Vec<P>> {
    let path = path.as_ref();
    let text = std::fs::read_to_string(path).map_err(|e| ModelError::io(path, e))?;
    if path.extension().is_some_and(|e| e == "jsonl") {
        return parse_prompt_lines(&path.display().to_string(), &text);
    }
    parse_prompts(&path.display().to_string(), &text)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A vendor's `--prompts FILE.jsonl`: one prompt per line; each defect a
    /// typed error naming its line, never a panic.
    #[test]
    fn prompt_lines_are_read_as_untrusted() {
        let ok = "{\"id\": \"a\", \"chat\": true, \"text\": \"hi\"}\n\n{\"id\": \"b\", \"chat\": false, \"text\": \"yo\"}\n";
        let p: Vec<Prompt> = parse_prompt_lines("p.jsonl", ok).unwrap();
        assert_eq!(p.iter().map(|p| p.id.as_str()).collect::<Vec<_>>(), ["a", "b"]);
        for (text, want) in [
            ("", "holds no prompt"),
            ("{\"id\": \"a\", \"chat\": true, \"text\": \"hi\"}\n{\"id\": \"a\", \"chat\": true, \"text\": \"ho\"}", "line 2.id"),
            ("{\"id\": \"a\", \"chat\": true, \"text\": \"\"}", "line 1.text"),
            ("{\"id\": \"a\", \"chat\": true, \"text\": \"x\", \"extra\": 1}", "line 1"),
            ("not json", "line 1"),
            ("{\"id\": \"a\", \"text\": \"x\"}", "chat"),
        ] {
            let e = parse_prompt_lines::<Prompt>("p.jsonl", text).unwrap_err().to_string();
            assert!(e.contains(want), "{text:?}: {e}");
        }
    }
}

/// The shipped tool-call mix (`fixtures/prompts/tool_calls.json`): chat
/// prompts whose answer is a JSON tool call, and the schema (CONSTRAIN-5's
/// subset) that constrains it.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
struct ToolCallFile {
    #[allow(dead_code)]
    about: String,
    schema: serde_json::Value,
    prompts: Vec<ToolCallPrompt>,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
struct ToolCallPrompt {
    id: String,
    text: String,
}

const TOOL_CALLS: &str = include_str!("../../fixtures/prompts/tool_calls.json");

/// The tool-call mix as requests: the requests of the speedup report's
/// features section and of ENGINE-10's `constrained` check on a served model.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolCallMix {
    /// The JSON schema every answer is constrained to.
    pub schema: serde_json::Value,
    /// `(id, ids)` of each prompt, in the tokenizer's chat template (as plain
    /// text for a model without one, a base model's).
    pub prompts: Vec<(String, Vec<u32>)>,
}

/// The shipped tool-call mix, its prompts encoded by `tok`: in its chat
/// template, or as plain text where it has none.
pub fn tool_call_mix(tok: &crate::Tokenizer) -> Result<ToolCallMix> {
    let file = "tool_calls.json";
    let f: ToolCallFile = serde_json::from_str(TOOL_CALLS).map_err(|e| ModelError::invalid(file, "prompts", e.to_string()))?;
    if f.prompts.is_empty() {
        return Err(ModelError::invalid(file, "prompts", "the mix holds no prompt"));
    }
    let chat = tok.chat_template().is_some();
    let prompts = f.prompts.into_iter().map(|p| Ok((p.id, tok.prompt_ids(&p.text, chat)?))).collect::<Result<_>>()?;
    Ok(ToolCallMix { schema: f.schema, prompts })
}
