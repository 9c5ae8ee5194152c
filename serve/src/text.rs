//! Text in and out of a served model: the model's own tokenizer, or the
//! tiny models' two-letter text (so a test server needs no tokenizer file).

use specdec_models::Tokenizer;
use specdec_models::tiny::{tiny_ids, tiny_text};

/// How a served model reads and writes text.
pub enum Codec {
    Tokenizer(Box<Tokenizer>),
    /// A tiny seeded model: id `i` is the two letters `A + i`, `a + i`.
    Tiny {
        vocab: usize,
    },
}

impl Codec {
    /// The ids of a user's text: a special token's string written in it
    /// encodes as text, unless `special` (the server's opt-in), when it
    /// encodes as the control token.
    pub fn encode_text(&self, text: &str, special: bool) -> Result<Vec<u32>, String> {
        match self {
            Codec::Tokenizer(t) if special => t.encode(text, false).map_err(|e| e.to_string()),
            Codec::Tokenizer(t) => t.encode_literal(text).map_err(|e| e.to_string()),
            Codec::Tiny { vocab } => tiny_ids(text, *vocab).map_err(|e| e.to_string()),
        }
    }

    /// A conversation's generation prompt as ids: the chat template's
    /// control tokens and the contents as text ([`Codec::encode_text`]'s
    /// `special` the same way: opted in, the rendered prompt is encoded
    /// whole and a content's special strings become control tokens).
    pub fn chat_ids(&self, turns: &[(&str, &str)], special: bool) -> Result<Vec<u32>, String> {
        match self {
            Codec::Tokenizer(t) if special => t.chat_conversation(turns).and_then(|text| t.encode(&text, false)).map_err(|e| e.to_string()),
            Codec::Tokenizer(t) => t.chat_conversation_ids(turns).map_err(|e| e.to_string()),
            Codec::Tiny { vocab } => tiny_ids(&turns.iter().map(|(_, c)| *c).collect::<String>(), *vocab).map_err(|e| e.to_string()),
        }
    }

    /// The bytes each of the model's `vocab` ids adds to the output text,
    /// for constraints (CONSTRAIN-2); an error where the tokenizer's kind
    /// has no byte reading (the server then takes no constraints).
    pub fn token_table(&self, vocab: usize) -> Result<std::sync::Arc<specdec_decoder::TokenTable>, String> {
        match self {
            Codec::Tiny { vocab } => Ok(specdec_decoder::TokenTable::tiny(*vocab)),
            Codec::Tokenizer(t) => specdec_decoder::TokenTable::of_tokenizer(t, vocab),
        }
    }

    /// The text of generated ids, special tokens left out. Ids come from the
    /// engine, inside the vocabulary, so a failure here is the tokenizer's
    /// own and yields what it could not decode as nothing.
    pub fn decode(&self, ids: &[u32]) -> String {
        match self {
            Codec::Tokenizer(t) => t.decode(ids, true).unwrap_or_default(),
            Codec::Tiny { .. } => tiny_text(ids),
        }
    }
}

/// What of a growing output's text a stream may send now: not a trailing
/// incomplete character (the decoder writes U+FFFD for it), and not the
/// last `hold` bytes, which could still begin a stop string the client must
/// not see.
pub fn sendable(text: &str, hold: usize) -> usize {
    let mut end = text.trim_end_matches('\u{FFFD}').len().saturating_sub(hold);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    end
}

/// Where the first stop string in `text` starts, and which one it is.
pub fn first_stop<'s>(text: &str, stops: &'s [String]) -> Option<(usize, &'s String)> {
    stops.iter().filter_map(|s| text.find(s.as_str()).map(|at| (at, s))).min()
}

/// The output text as a client sees it: cut before the first stop string
/// when the output stopped on one (OpenAI's convention).
pub fn cut_at_stop(text: &str, stops: &[String]) -> String {
    match first_stop(text, stops) {
        Some((at, _)) => text[..at].to_string(),
        None => text.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn streams_hold_back_what_may_still_change() {
        assert_eq!(sendable("abcdef", 0), 6);
        assert_eq!(sendable("abcdef", 2), 4);
        assert_eq!(sendable("ab\u{FFFD}", 0), 2);
        assert_eq!(sendable("aé", 1), 1, "never inside a character");
        assert_eq!(sendable("ab", 5), 0);
        assert_eq!(cut_at_stop("hello world", &["o w".into(), "ld".into()]), "hell");
        assert_eq!(cut_at_stop("hello", &["x".into()]), "hello");
    }
}
