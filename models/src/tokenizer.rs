//! The tokenizer of a model, from GGUF metadata or an HF `tokenizer.json`,
//! and its ChatML chat prompt (MODEL-6).
//!
//! Role: one [`Tokenizer`] type over `tokenizers::Tokenizer`, whichever file
//! it came from, with the special ids and the chat template beside it.
//!
//! Invariants: a GGUF tokenizer is rebuilt exactly as llama.cpp tokenizes
//! (but for a character its vocabulary has no byte of: the file's unknown
//! id, as HF gives, where llama.cpp drops it):
//! `tokenizer.ggml.model` must be `gpt2` (byte-level BPE) and the
//! pre-tokenizer must be one we reproduce exactly (`smollm`: single digits
//! split first, then the GPT-2 regex; `gpt-2`: the GPT-2 regex), under the
//! names llama.cpp gives them (it refuses any other name too); anything
//! else is a typed error rather than a tokenizer that silently splits
//! differently. Control and user-defined tokens become added tokens, so a
//! special token written in the text (`<|im_start|>`) encodes as its one id,
//! as llama.cpp and HF both do. Special ids are checked to lie inside the
//! vocabulary, and [`Tokenizer::decode`] rejects ids outside it instead of
//! skipping them. We never run Jinja: [`Tokenizer::chat_prompt`] renders
//! ChatML only, and says so for any other template.

use std::path::Path;

use serde_json::{Value, json};
use tokenizers::decoders::DecoderWrapper;
use tokenizers::models::bpe::{BPE, Merges, Vocab};
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::digits::Digits;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::processors::PostProcessorWrapper;
use tokenizers::{AddedToken, PreTokenizerWrapper};

use crate::error::{ModelError, Result};
use crate::gguf::GgufFile;

pub const TOKENIZER_FILE: &str = "tokenizer.json";
pub const TOKENIZER_CONFIG_FILE: &str = "tokenizer_config.json";

/// llama.cpp's `LLAMA_TOKEN_TYPE_CONTROL`.
const TOKEN_TYPE_CONTROL: i128 = 3;
/// llama.cpp's `LLAMA_TOKEN_TYPE_USER_DEFINED`.
const TOKEN_TYPE_USER_DEFINED: i128 = 4;

/// A ChatML turn opener; a template containing it is taken to be ChatML.
const IM_START: &str = "<|im_start|>";
const IM_END: &str = "<|im_end|>";

/// A model's tokenizer with its special ids and chat template.
#[derive(Clone)]
pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
    source: String,
    kind: String,
    bos: Option<u32>,
    eos: Option<u32>,
    pad: Option<u32>,
    unk: Option<u32>,
    add_bos: bool,
    add_eos: bool,
    chat_template: Option<String>,
    /// `inner` with special tokens encoded as the text they are written
    /// with ([`Tokenizer::encode_literal`]), made on first use.
    literal: std::sync::OnceLock<tokenizers::Tokenizer>,
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokenizer").field("source", &self.source).field("kind", &self.kind).field("vocab_size", &self.vocab_size()).field("bos", &self.bos).field("eos", &self.eos).finish()
    }
}

/// Runs a call into the `tokenizers` crate, turning a panic into an error
/// naming the file: that crate panics on some hostile `tokenizer.json`
/// files (found by the `tokenizer` fuzz target: a decoder entry of the wrong
/// shape panics inside its deserializer), and no input may panic a loader
/// (MODEL-16). The calls hold no state of ours that a panic could leave
/// half-written, so unwinding past them is sound.
fn guarded<T>(file: &str, call: impl FnOnce() -> Result<T>) -> Result<T> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(call)).unwrap_or_else(|panic| {
        let message = panic.downcast_ref::<String>().map(String::as_str).or_else(|| panic.downcast_ref::<&str>().copied()).unwrap_or("no message");
        Err(tok_err(file, format!("the tokenizers crate panicked on this file: {message}")))
    })
}

fn tok_err(file: &str, message: impl std::fmt::Display) -> ModelError {
    ModelError::Tokenizer { file: file.to_string(), message: message.to_string() }
}

impl Tokenizer {
    /// Builds the byte-level BPE a `gpt2`-model GGUF file describes (MODEL-6).
    pub fn from_gguf(g: &GgufFile) -> Result<Self> {
        let file = g.file();
        let model = g.get_str("tokenizer.ggml.model")?;
        if model != "gpt2" {
            return Err(tok_err(file, format!("tokenizer.ggml.model `{model}` is not supported (only `gpt2`, byte-level BPE)")));
        }
        let tokens = g.get_str_array("tokenizer.ggml.tokens")?;
        let merges_text = g.get_str_array("tokenizer.ggml.merges")?;
        let pre = g.get_str("tokenizer.ggml.pre")?;

        let mut vocab = Vocab::with_capacity(tokens.len());
        for (id, token) in tokens.iter().enumerate() {
            let id = u32::try_from(id).map_err(|_| tok_err(file, "more than 2^32 tokens"))?;
            if vocab.insert(token.clone(), id).is_some() {
                return Err(ModelError::invalid(file, "tokenizer.ggml.tokens", format!("token {token:?} appears twice")));
            }
        }
        let mut merges: Merges = Vec::with_capacity(merges_text.len());
        for (i, m) in merges_text.iter().enumerate() {
            let Some((a, b)) = m.split_once(' ') else {
                return Err(ModelError::invalid(file, "tokenizer.ggml.merges", format!("merge #{i} {m:?} is not two space-separated tokens")));
            };
            merges.push((a.to_string(), b.to_string()));
        }
        // A character the vocabulary has no byte of encodes as the unknown
        // token where the file names one, as HF's tokenizer does; llama.cpp
        // drops it from the text, and so would a BPE without one.
        let unk_id = g.opt_u32("tokenizer.ggml.unknown_token_id")?;
        let mut builder = BPE::builder().vocab_and_merges(vocab, merges);
        if let Some(id) = unk_id {
            let token = tokens.get(id as usize).ok_or_else(|| ModelError::invalid(file, "tokenizer.ggml.unknown_token_id", format!("{id} is outside the vocabulary of {}", tokens.len())))?;
            builder = builder.unk_token(token.clone());
        }
        let bpe = builder.build().map_err(|e| tok_err(file, format!("BPE: {e}")))?;

        let mut inner = tokenizers::Tokenizer::new(bpe);
        // HF's byte-level tokenizers prefix no space; llama.cpp's `gpt2`
        // vocabularies do not either.
        let byte_level = ByteLevel::new(false, true, true);
        let pre_tokenizer: PreTokenizerWrapper = match pre {
            // llama.cpp's `smollm`: `\p{N}` (each digit alone), then the GPT-2 regex.
            "smollm" => Sequence::new(vec![PreTokenizerWrapper::Digits(Digits::new(true)), PreTokenizerWrapper::ByteLevel(byte_level)]).into(),
            // llama.cpp's `gpt-2`: the GPT-2 regex alone.
            "gpt-2" => byte_level.into(),
            other => return Err(tok_err(file, format!("pre-tokenizer `tokenizer.ggml.pre` = `{other}` is not supported (smollm, gpt-2)"))),
        };
        inner.with_pre_tokenizer(Some(pre_tokenizer));
        inner.with_decoder(Some(DecoderWrapper::ByteLevel(ByteLevel::default())));

        if g.get("tokenizer.ggml.token_type").is_some() {
            let types = g.get_int_array("tokenizer.ggml.token_type")?;
            if types.len() != tokens.len() {
                return Err(ModelError::invalid(file, "tokenizer.ggml.token_type", format!("{} types for {} tokens", types.len(), tokens.len())));
            }
            let pick = |want: i128| -> Vec<AddedToken> { tokens.iter().zip(&types).filter(|(_, t)| **t == want).map(|(s, _)| AddedToken::from(s.clone(), want == TOKEN_TYPE_CONTROL)).collect() };
            inner.add_special_tokens(pick(TOKEN_TYPE_CONTROL)).map_err(|e| tok_err(file, e))?;
            inner.add_tokens(pick(TOKEN_TYPE_USER_DEFINED)).map_err(|e| tok_err(file, e))?;
        }

        let mut t = Tokenizer {
            inner,
            source: file.to_string(),
            kind: format!("gguf {model} (byte-level BPE, pre {pre})"),
            bos: g.opt_u32("tokenizer.ggml.bos_token_id")?,
            eos: g.opt_u32("tokenizer.ggml.eos_token_id")?,
            pad: g.opt_u32("tokenizer.ggml.padding_token_id")?,
            unk: g.opt_u32("tokenizer.ggml.unknown_token_id")?,
            add_bos: g.opt_bool("tokenizer.ggml.add_bos_token")?.unwrap_or(false),
            add_eos: g.opt_bool("tokenizer.ggml.add_eos_token")?.unwrap_or(false),
            chat_template: g.opt_str("tokenizer.chat_template")?.map(str::to_string),
            literal: Default::default(),
        };
        t.check_special_ids()?;
        t.install_post_processor()?;
        Ok(t)
    }

    /// The tokenizer at `path`, whatever holds it: a `.gguf` file, an HF
    /// folder, or a `tokenizer.json` file (its folder's other files read as
    /// [`Tokenizer::from_dir`] reads them).
    pub fn open(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        if path.is_dir() {
            return Self::from_dir(path);
        }
        if path.extension().is_some_and(|e| e.eq_ignore_ascii_case("gguf")) {
            return Self::from_gguf(&GgufFile::open(path)?);
        }
        match (path.file_name().and_then(|n| n.to_str()), path.parent()) {
            (Some(TOKENIZER_FILE), Some(dir)) => Self::from_dir(if dir.as_os_str().is_empty() { Path::new(".") } else { dir }),
            _ => Err(tok_err(&path.display().to_string(), "not a tokenizer: expected a .gguf file, an HF folder or a tokenizer.json file")),
        }
    }

    /// The ids of a prompt: `text` wrapped in the chat template where
    /// `chat`, encoded without added special tokens (the template writes
    /// its own), as every prompt file of the project is read.
    pub fn prompt_ids(&self, text: &str, chat: bool) -> Result<Vec<u32>> {
        if chat { self.encode(&self.chat_prompt(text)?, false) } else { self.encode(text, false) }
    }

    /// The ids that end a generation of this tokenizer's model: its eos,
    /// and the end-of-turn and end-of-text tokens where it has them
    /// (`<|im_end|>`, `<|endoftext|>`, `<|eot_id|>`, `<|end|>`), ascending.
    pub fn end_ids(&self) -> Vec<u32> {
        let mut ids: Vec<u32> = self.eos.into_iter().chain(["<|im_end|>", "<|endoftext|>", "<|eot_id|>", "<|end|>"].iter().filter_map(|t| self.inner.token_to_id(t))).collect();
        ids.sort_unstable();
        ids.dedup();
        ids
    }

    /// Loads `tokenizer.json` and, when present, HF's `tokenizer_config.json`
    /// (special tokens, `add_bos_token`, `chat_template`) from `dir` (MODEL-6).
    /// Special ids missing there fall back to `config.json`'s ids. What
    /// `encode` adds is decided by `tokenizer.json`'s post-processor (as in
    /// HF's fast tokenizers); `add_bos_token` is reported as written.
    pub fn from_dir(dir: impl AsRef<Path>) -> Result<Self> {
        let dir = dir.as_ref();
        let path = dir.join(TOKENIZER_FILE);
        let file = path.display().to_string();
        let bytes = std::fs::read(&path).map_err(|e| ModelError::io(&path, e))?;
        let inner = guarded(&file, || tokenizers::Tokenizer::from_bytes(&bytes).map_err(|e| tok_err(&file, e)))?;
        let kind = match inner.get_model() {
            tokenizers::ModelWrapper::BPE(_) => "tokenizer.json (BPE)",
            tokenizers::ModelWrapper::WordPiece(_) => "tokenizer.json (WordPiece)",
            tokenizers::ModelWrapper::WordLevel(_) => "tokenizer.json (WordLevel)",
            tokenizers::ModelWrapper::Unigram(_) => "tokenizer.json (Unigram)",
        };
        let mut t =
            Tokenizer { inner, source: file, kind: kind.to_string(), bos: None, eos: None, pad: None, unk: None, add_bos: false, add_eos: false, chat_template: None, literal: Default::default() };

        let cfg_path = dir.join(TOKENIZER_CONFIG_FILE);
        if cfg_path.is_file() {
            let cfg_file = cfg_path.display().to_string();
            let text = std::fs::read_to_string(&cfg_path).map_err(|e| ModelError::io(&cfg_path, e))?;
            let cfg: Value = serde_json::from_str(&text).map_err(|e| ModelError::invalid(&cfg_file, "tokenizer_config.json", e.to_string()))?;
            let special = |field: &str| -> Result<Option<u32>> {
                let content = match cfg.get(field) {
                    None | Some(Value::Null) => return Ok(None),
                    Some(Value::String(s)) => s.as_str(),
                    Some(v) => v.get("content").and_then(Value::as_str).ok_or_else(|| ModelError::invalid(&cfg_file, field, "neither a string nor {\"content\": ...}"))?,
                };
                t.inner.token_to_id(content).map(Some).ok_or_else(|| ModelError::invalid(&cfg_file, field, format!("{content:?} is not in the vocabulary")))
            };
            let (bos, eos, pad, unk) = (special("bos_token")?, special("eos_token")?, special("pad_token")?, special("unk_token")?);
            let flag = |field: &str| -> Result<bool> {
                match cfg.get(field) {
                    None | Some(Value::Null) => Ok(false),
                    Some(Value::Bool(b)) => Ok(*b),
                    Some(_) => Err(ModelError::invalid(&cfg_file, field, "is not a boolean")),
                }
            };
            let (add_bos, add_eos) = (flag("add_bos_token")?, flag("add_eos_token")?);
            let chat_template = match cfg.get("chat_template") {
                None | Some(Value::Null) => None,
                Some(Value::String(s)) => Some(s.clone()),
                Some(_) => return Err(ModelError::invalid(&cfg_file, "chat_template", "is not a string (named templates are not supported)")),
            };
            (t.bos, t.eos, t.pad, t.unk, t.add_bos, t.add_eos, t.chat_template) = (bos, eos, pad, unk, add_bos, add_eos, chat_template);
        }

        let config_path = dir.join(crate::hf::CONFIG_FILE);
        if (t.bos.is_none() || t.eos.is_none()) && config_path.is_file() {
            let text = std::fs::read_to_string(&config_path).map_err(|e| ModelError::io(&config_path, e))?;
            if let Ok(v) = serde_json::from_str::<Value>(&text) {
                let id = |k: &str| v.get(k).and_then(Value::as_u64).and_then(|x| u32::try_from(x).ok());
                t.bos = t.bos.or_else(|| id("bos_token_id"));
                t.eos = t.eos.or_else(|| id("eos_token_id"));
            }
        }
        t.check_special_ids()?;
        Ok(t)
    }

    fn check_special_ids(&self) -> Result<()> {
        let n = self.vocab_size();
        for (field, id) in [("bos", self.bos), ("eos", self.eos), ("pad", self.pad), ("unk", self.unk)] {
            if let Some(id) = id
                && id as usize >= n
            {
                return Err(ModelError::invalid(&self.source, &format!("{field}_token_id"), format!("{id} is outside the vocabulary of {n}")));
            }
        }
        Ok(())
    }

    /// `add_bos`/`add_eos` become a template post-processor (as HF's
    /// converted Llama tokenizers do); otherwise the byte-level
    /// post-processor, which touches offsets only.
    fn install_post_processor(&mut self) -> Result<()> {
        let processor: PostProcessorWrapper = if self.add_bos || self.add_eos {
            let mut specials = serde_json::Map::new();
            let mut wrap = |flag: bool, id: Option<u32>, what: &str| -> Result<Vec<Value>> {
                if !flag {
                    return Ok(vec![]);
                }
                let id = id.ok_or_else(|| tok_err(&self.source, format!("add_{what}_token is set but there is no {what} token id")))?;
                let content = self.inner.id_to_token(id).ok_or_else(|| tok_err(&self.source, format!("{what} id {id} has no token")))?;
                specials.insert(content.clone(), json!({"id": content, "ids": [id], "tokens": [content]}));
                Ok(vec![json!({"SpecialToken": {"id": content, "type_id": 0}})])
            };
            let (bos, eos) = (wrap(self.add_bos, self.bos, "bos")?, wrap(self.add_eos, self.eos, "eos")?);
            let seq = |s: &str, type_id: u32| json!({"Sequence": {"id": s, "type_id": type_id}});
            let single: Vec<Value> = bos.iter().cloned().chain([seq("A", 0)]).chain(eos.iter().cloned()).collect();
            let mut pair = single.clone();
            pair.extend(bos.iter().cloned().chain([seq("B", 1)]).chain(eos.iter().cloned()));
            // Built through serde so token text is never re-parsed (a
            // token containing `:` or a space would confuse the string form).
            let spec = json!({"type": "TemplateProcessing", "single": single, "pair": pair, "special_tokens": specials});
            serde_json::from_value(spec).map_err(|e| tok_err(&self.source, format!("post-processor: {e}")))?
        } else {
            PostProcessorWrapper::ByteLevel(ByteLevel::new(true, false, true))
        };
        self.inner.with_post_processor(Some(processor));
        Ok(())
    }

    /// Token ids of `text`. Special tokens written in the text encode as
    /// their ids; `add_special_tokens` adds BOS/EOS where the tokenizer
    /// says so (`add_bos_token`).
    pub fn encode(&self, text: &str, add_special_tokens: bool) -> Result<Vec<u32>> {
        let enc = guarded(&self.source, || self.inner.encode(text, add_special_tokens).map_err(|e| tok_err(&self.source, e)))?;
        Ok(enc.get_ids().to_vec())
    }

    /// Token ids of `text` read as text: a special token's string written
    /// in it (`<|im_start|>`) encodes as the ordinary tokens of those
    /// characters, never as the control id. How user content is encoded, so
    /// that a user cannot forge a turn of the conversation.
    pub fn encode_literal(&self, text: &str) -> Result<Vec<u32>> {
        let literal = self.literal.get_or_init(|| {
            let mut t = self.inner.clone();
            t.set_encode_special_tokens(true);
            t
        });
        let enc = guarded(&self.source, || literal.encode(text, false).map_err(|e| tok_err(&self.source, e)))?;
        Ok(enc.get_ids().to_vec())
    }

    /// The ids of [`Tokenizer::chat_conversation`]'s prompt with the control
    /// tokens the template writes and no others: the text between two of
    /// them (a role, a turn's content, the newline after a turn) is encoded
    /// by [`Tokenizer::encode_literal`]. For a byte-level BPE (every GGUF
    /// tokenizer here, and HF's ByteLevel ones) a special token splits the
    /// text before the pre-tokenizer runs, so for contents that hold no
    /// special token's string the ids equal those of encoding the rendered
    /// prompt (`models/tests/smollm2.rs`). A tokenizer whose `<|im_start|>`
    /// or `<|im_end|>` is an added token not marked special would still
    /// match it in text: that is refused, never encoded.
    pub fn chat_conversation_ids(&self, turns: &[(&str, &str)]) -> Result<Vec<u32>> {
        // The rendered prompt is checked and built by the one renderer; its
        // control tokens are then put back by id, its text encoded as text.
        self.chat_conversation(turns)?;
        let control = |token: &str| self.token_to_id(token).ok_or_else(|| tok_err(&self.source, format!("the chat template's `{token}` is not a token of this tokenizer")));
        let (start, end) = (control(IM_START)?, control(IM_END)?);
        let mut ids = Vec::new();
        let mut turn = |role: &str, content: Option<&str>| -> Result<()> {
            ids.push(start);
            match content {
                Some(content) => {
                    let text = self.encode_literal(&format!("{role}\n{content}"))?;
                    if text.iter().any(|&id| id == start || id == end) {
                        return Err(tok_err(
                            &self.source,
                            format!("`{IM_START}` and `{IM_END}` are not special tokens here, so a message's text that writes them would encode as them; refusing the conversation"),
                        ));
                    }
                    ids.extend(text);
                    ids.push(end);
                    ids.extend(self.encode_literal("\n")?);
                }
                None => ids.extend(self.encode_literal(&format!("{role}\n"))?),
            }
            Ok(())
        };
        if turns.first().is_none_or(|(role, _)| *role != "system")
            && let Some(system) = self.default_system()
        {
            turn("system", Some(&system))?;
        }
        for (role, content) in turns {
            turn(role, Some(content))?;
        }
        turn("assistant", None)?;
        Ok(ids)
    }

    /// The text of `ids`; every id must lie inside the vocabulary.
    pub fn decode(&self, ids: &[u32], skip_special_tokens: bool) -> Result<String> {
        let n = self.vocab_size();
        if let Some(bad) = ids.iter().find(|&&id| id as usize >= n) {
            return Err(ModelError::InvalidInput { arg: "ids", reason: format!("id {bad} is outside the vocabulary of {n}") });
        }
        guarded(&self.source, || self.inner.decode(ids, skip_special_tokens).map_err(|e| tok_err(&self.source, e)))
    }

    /// Each id's bytes as the output text gets them (CONSTRAIN-2), `None`
    /// for a special token: a byte-level BPE piece read back through GPT-2's
    /// byte-to-character table, a non-special added token as its text. Other
    /// tokenizer kinds are an error naming the decoder.
    pub fn token_bytes(&self) -> Result<Vec<Option<Vec<u8>>>> {
        if !matches!(self.inner.get_decoder(), Some(DecoderWrapper::ByteLevel(_))) {
            return Err(tok_err(&self.source, "token bytes are read for byte-level BPE tokenizers only"));
        }
        let table = gpt2_unicode_to_byte();
        let added = self.inner.get_added_tokens_decoder();
        (0..self.vocab_size() as u32)
            .map(|id| {
                if let Some(t) = added.get(&id) {
                    return Ok((!t.special && !t.content.is_empty()).then(|| t.content.as_bytes().to_vec()));
                }
                let Some(piece) = self.inner.id_to_token(id) else { return Ok(None) };
                let bytes = piece
                    .chars()
                    .map(|c| table.get(&c).copied().ok_or_else(|| tok_err(&self.source, format!("token {id} {piece:?}: {c:?} is no byte-level character"))))
                    .collect::<Result<Vec<u8>>>()?;
                Ok((!bytes.is_empty()).then_some(bytes))
            })
            .collect()
    }

    /// Vocabulary size, added tokens included.
    pub fn vocab_size(&self) -> usize {
        self.inner.get_vocab_size(true)
    }

    pub fn bos_id(&self) -> Option<u32> {
        self.bos
    }

    pub fn eos_id(&self) -> Option<u32> {
        self.eos
    }

    pub fn pad_id(&self) -> Option<u32> {
        self.pad
    }

    pub fn unk_id(&self) -> Option<u32> {
        self.unk
    }

    pub fn add_bos(&self) -> bool {
        self.add_bos
    }

    pub fn token_to_id(&self, token: &str) -> Option<u32> {
        self.inner.token_to_id(token)
    }

    pub fn id_to_token(&self, id: u32) -> Option<String> {
        self.inner.id_to_token(id)
    }

    pub fn chat_template(&self) -> Option<&str> {
        self.chat_template.as_deref()
    }

    /// Where the tokenizer came from (a file name).
    pub fn source(&self) -> &str {
        &self.source
    }

    /// What kind of tokenizer this is, in words.
    pub fn kind(&self) -> &str {
        &self.kind
    }

    /// The underlying `tokenizers` tokenizer.
    pub fn inner(&self) -> &tokenizers::Tokenizer {
        &self.inner
    }

    /// The system message a ChatML template inserts when the conversation
    /// has none, read from the template's own string literal (SmolLM2's
    /// is "You are a helpful AI assistant named SmolLM, trained by Hugging Face").
    pub fn default_system(&self) -> Option<String> {
        self.chat_template.as_deref().and_then(chatml_default_system)
    }

    /// The generation prompt for one user message (MODEL-6):
    /// `<|im_start|>system\n{default}<|im_end|>\n<|im_start|>user\n{text}<|im_end|>\n<|im_start|>assistant\n`,
    /// the system turn present only when the template has a default system
    /// message. Only ChatML templates are rendered; we do not run Jinja.
    pub fn chat_prompt(&self, user_text: &str) -> Result<String> {
        Ok(format!("{}{user_text}{IM_END}\n{IM_START}assistant\n", self.chat_user_prefix()?))
    }

    /// The generation prompt of a whole conversation, `(role, content)`
    /// turns in order (roles `system`, `user`, `assistant`): each turn as
    /// `<|im_start|>{role}\n{content}<|im_end|>\n`, the template's default
    /// system turn first when the conversation has none, then
    /// `<|im_start|>assistant\n`. ChatML only, as [`Tokenizer::chat_prompt`].
    pub fn chat_conversation(&self, turns: &[(&str, &str)]) -> Result<String> {
        let template = self.chatml_template()?;
        let mut out = String::new();
        if turns.first().is_none_or(|(role, _)| *role != "system")
            && let Some(system) = chatml_default_system(template)
        {
            out.push_str(&format!("{IM_START}system\n{system}{IM_END}\n"));
        }
        for (role, content) in turns {
            if !matches!(*role, "system" | "user" | "assistant") {
                return Err(ModelError::InvalidInput { arg: "role", reason: format!("`{role}` is not system, user or assistant") });
            }
            out.push_str(&format!("{IM_START}{role}\n{content}{IM_END}\n"));
        }
        out.push_str(&format!("{IM_START}assistant\n"));
        Ok(out)
    }

    /// The chat template, when it is ChatML (the only kind rendered here).
    fn chatml_template(&self) -> Result<&str> {
        let Some(template) = &self.chat_template else {
            return Err(ModelError::MissingField { file: self.source.clone(), field: "chat_template".to_string() });
        };
        if !template.contains(IM_START) {
            return Err(tok_err(&self.source, "the chat template is not ChatML; other templates would need a Jinja engine"));
        }
        Ok(template)
    }

    /// The text before a user message's content:
    /// `<|im_start|>system\n{default}<|im_end|>\n<|im_start|>user\n` (the system
    /// turn as in [`Tokenizer::chat_prompt`]). A model continuing it writes a
    /// user message of its own, ended by `<|im_end|>`.
    pub fn chat_user_prefix(&self) -> Result<String> {
        let template = self.chatml_template()?;
        let mut out = String::new();
        if let Some(system) = chatml_default_system(template) {
            out.push_str(&format!("{IM_START}system\n{system}{IM_END}\n"));
        }
        out.push_str(&format!("{IM_START}user\n"));
        Ok(out)
    }

    /// Writes `tokenizer.json` and an HF `tokenizer_config.json` (special
    /// tokens by content, `add_bos_token`, `chat_template`) into `dir`.
    pub fn save(&self, dir: impl AsRef<Path>) -> Result<()> {
        let dir = dir.as_ref();
        std::fs::create_dir_all(dir).map_err(|e| ModelError::io(dir, e))?;
        let path = dir.join(TOKENIZER_FILE);
        self.inner.save(&path, false).map_err(|e| ModelError::io(&path, e))?;
        let token = |id: Option<u32>| id.and_then(|id| self.inner.id_to_token(id));
        let cfg = json!({
            "tokenizer_class": "PreTrainedTokenizerFast",
            "add_bos_token": self.add_bos,
            "add_eos_token": self.add_eos,
            "bos_token": token(self.bos),
            "eos_token": token(self.eos),
            "pad_token": token(self.pad),
            "unk_token": token(self.unk),
            "clean_up_tokenization_spaces": false,
            "chat_template": self.chat_template,
        });
        let path = dir.join(TOKENIZER_CONFIG_FILE);
        let text = serde_json::to_string_pretty(&cfg).map_err(|e| ModelError::io(&path, e))?;
        std::fs::write(&path, text).map_err(|e| ModelError::io(&path, e))
    }
}

/// The default system message of a ChatML template: the body of the first
/// string literal `'<|im_start|>system\n…<|im_end|>` whose body is plain
/// text (not an expression such as `' + messages[0]['content'] + '`).
/// Jinja escapes (`\n`, `\'`, `\"`, `\\`) are undone.
pub fn chatml_default_system(template: &str) -> Option<String> {
    let mut rest = template;
    while let Some(at) = rest.find(IM_START) {
        let after = &rest[at + IM_START.len()..];
        rest = after;
        let Some(body) = after.strip_prefix("system\n").or_else(|| after.strip_prefix("system\\n")) else { continue };
        let Some(end) = body.find(IM_END) else { continue };
        if let Some(text) = jinja_literal_text(&body[..end]) {
            return Some(text);
        }
    }
    None
}

/// `s` unescaped, or `None` if it leaves the string literal (an unescaped
/// quote) or holds template syntax.
fn jinja_literal_text(s: &str) -> Option<String> {
    if ["{{", "{%", "}}", "%}"].iter().any(|p| s.contains(p)) {
        return None;
    }
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => match chars.next()? {
                'n' => out.push('\n'),
                't' => out.push('\t'),
                other => out.push(other),
            },
            '\'' | '"' => return None,
            c => out.push(c),
        }
    }
    Some(out)
}

/// GPT-2's byte-level alphabet read backwards: the printable bytes stand
/// for themselves, the others for the characters from U+0100 on, in order.
fn gpt2_unicode_to_byte() -> std::collections::HashMap<char, u8> {
    let printable = |b: u8| (b'!'..=b'~').contains(&b) || (0xA1..=0xAC).contains(&b) || b >= 0xAE;
    let mut next = 256u32;
    (0..=255u8)
        .map(|b| {
            let c = if printable(b) {
                char::from(b)
            } else {
                next += 1;
                char::from_u32(next - 1).expect("below U+0200")
            };
            (c, b)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// MODEL-6: SmolLM2's template (real newlines inside the literals, as the
    /// converter stores it) yields its default system message.
    #[test]
    fn default_system_from_smollm2_template() {
        let t = "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";
        assert_eq!(chatml_default_system(t).as_deref(), Some("You are a helpful AI assistant named SmolLM, trained by Hugging Face"));
    }

    /// MODEL-6: an expression in the system turn is not a default; a later
    /// literal is (Qwen-style templates), and escapes are undone.
    #[test]
    fn default_system_skips_expressions() {
        let t = r#"{{ '<|im_start|>system\n' + messages[0]['content'] + '<|im_end|>\n' }}{% else %}{{ '<|im_start|>system\nYou\'re \"ok\".<|im_end|>\n' }}"#;
        assert_eq!(chatml_default_system(t).as_deref(), Some("You're \"ok\"."));
        assert_eq!(chatml_default_system("{{'<|im_start|>' + m['role'] + '\n'}}"), None);
    }
}
