//! llguidance's parser as the mask of a recursive grammar (CONSTRAIN-2's fast
//! path for context-free constraints; llama.cpp and vLLM mask with it too).
//!
//! The grammar goes to llguidance as [`specdec_constraint::cfg::Grammar::to_lark`]
//! writes it: every terminal one byte, nothing forced, every rule deriving
//! some text, so its language is the grammar's byte for byte and no
//! tokenization of a text is preferred. The vocabulary goes as a token trie of
//! the table's bytes (a token without bytes is never allowed; llguidance's
//! own end token is one id past the vocabulary, so the request's eos ids stay
//! the caller's to allow, where the constraint accepts). One request's
//! [`Guide`] is moved along the token path of each state its mask is asked
//! for: rolled back to the longest prefix that path shares with the last,
//! then fed the rest, so the rows of a verify window cost one token each.
//!
//! llguidance's trie reads a token whose bytes begin with 0xFF as a special
//! token, and it never allows the one-byte token 0xFF; the plain definition
//! allows neither either, since no grammar here derives the byte 0xFF (each
//! is UTF-8 text, which never holds it).
//!
//! Invariant: a mask given here equals the plain definition
//! ([`specdec_constraint::allowed`]) token for token (`tests/constrained.rs`:
//! the tiny, a byte-level and SmolLM2's vocabularies); where llguidance cannot
//! follow a path (a limit of its own, a token it refuses), [`Guide::mask`]
//! says so and the caller walks the trie instead, never a guess.

use std::sync::Arc;

use llguidance::api::TopLevelGrammar;
use llguidance::earley::SlicedBiasComputer;
use llguidance::toktrie::{ApproximateTokEnv, InferenceCapabilities, TokEnv, TokRxInfo, TokTrie};
use llguidance::{Matcher, ParserFactory};
use specdec_constraint::Vocabulary;

/// llguidance's view of one vocabulary: its token trie and parser factory,
/// built once per [`crate::TokenTable`] (SmolLM2: about 0.1 s).
pub(crate) struct GuideEnv {
    factory: ParserFactory,
    vocab: usize,
}

impl GuideEnv {
    pub(crate) fn new(vocab: &Vocabulary) -> Result<GuideEnv, String> {
        let n = vocab.len();
        // The table's bytes, and one more id as llguidance's end token (empty bytes).
        let words: Vec<Vec<u8>> = (0..n as u32).map(|t| vocab.bytes(t).map(<[u8]>::to_vec).unwrap_or_default()).chain([Vec::new()]).collect();
        let trie = TokTrie::from(&TokRxInfo::new(words.len() as u32, n as u32), &words);
        // "Approximate": not the canonical tokenizer of the text, so llguidance forces
        // no token and allows every tokenization, as CONSTRAIN-2 does.
        let env: TokEnv = Arc::new(ApproximateTokEnv::new(trie));
        let mut factory = ParserFactory::new(&env, InferenceCapabilities::default(), &SlicedBiasComputer::general_slices()).map_err(|e| e.to_string())?;
        factory.quiet();
        // A JSON grammar's byte-level rules keep more Earley items than llguidance's
        // defaults, which are set for grammars with multi-byte lexemes.
        let limits = factory.limits_mut();
        limits.step_max_items = limits.step_max_items.max(1 << 20);
        limits.max_items_in_row = limits.max_items_in_row.max(1 << 16);
        Ok(GuideEnv { factory, vocab: n })
    }
}

/// One request's parser of a recursive grammar, and the tokens it has taken.
pub(crate) struct Guide {
    matcher: Matcher,
    consumed: Vec<u32>,
    vocab: usize,
    /// It refused a path or failed a step: masks come from the trie from then on.
    lost: bool,
}

impl Guide {
    /// The parser of `lark` (a grammar as `to_lark` writes it), or why llguidance refuses it.
    pub(crate) fn new(env: &GuideEnv, lark: String) -> Result<Guide, String> {
        let matcher = Matcher::new(env.factory.create_parser(TopLevelGrammar::from_lark(lark)));
        if let Some(e) = matcher.get_error() {
            return Err(e);
        }
        Ok(Guide { matcher, consumed: Vec::new(), vocab: env.vocab, lost: false })
    }

    /// Whether it refused a path or failed a step (its masks are over).
    #[cfg(test)]
    fn is_lost(&self) -> bool {
        self.lost
    }

    /// The text tokens allowed after the tokens `path` (eos aside), or `None`
    /// where llguidance cannot follow it.
    pub(crate) fn mask(&mut self, path: &[u32]) -> Option<Vec<bool>> {
        if self.lost {
            return None;
        }
        let mask = self.step_to(path).and_then(|()| {
            if self.matcher.is_stopped() {
                // A match nothing can extend: no text token.
                return Some(vec![false; self.vocab]);
            }
            let vob = self.matcher.compute_mask().ok()?;
            Some((0..self.vocab as u32).map(|t| vob.is_allowed(t)).collect())
        });
        self.lost = mask.is_none();
        mask
    }

    /// Rolls back to the longest prefix `path` shares with what was taken, then takes the rest.
    fn step_to(&mut self, path: &[u32]) -> Option<()> {
        let shared = self.consumed.iter().zip(path).take_while(|(a, b)| a == b).count();
        if shared < self.consumed.len() {
            self.matcher.rollback(self.consumed.len() - shared).ok()?;
            // Its one kept mask is keyed by lexer state and row, which another path may
            // reach with another parse.
            self.matcher.invalidate_bias_cache();
            self.consumed.truncate(shared);
        }
        for &t in &path[shared..] {
            self.matcher.consume_token(t).ok()?;
            self.consumed.push(t);
        }
        Some(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use specdec_constraint::Constraint;

    /// Hand-worked on the tiny text (`Aa` .. `Ff`): the masks along a path and
    /// back; a finished match that nothing extends allows no text token; a
    /// path it refuses loses the guide for good, and says so.
    #[test]
    fn masks_along_paths_and_a_refused_one() {
        let vocab = Vocabulary::new((0..6u8).map(|i| Some(vec![b'A' + i, b'a' + i])).collect()).unwrap();
        let lark = Constraint::grammar(r#"root ::= ("Aa" | "Bb" | "Cc") root ("Dd" | "Ee") | "Ff""#).unwrap().lark().unwrap();
        let mut g = Guide::new(&GuideEnv::new(&vocab).unwrap(), lark).unwrap();
        let open = vec![true, true, true, false, false, true];
        assert_eq!(g.mask(&[]), Some(open.clone()));
        assert_eq!(g.mask(&[0, 5]), Some(vec![false, false, false, true, true, false]), "after AaFf: a closer");
        assert_eq!(g.mask(&[0, 1]), Some(open.clone()), "back one token, another way");
        assert_eq!(g.mask(&[5]), Some(vec![false; 6]), "Ff is a whole match: nothing extends it");
        assert!(!g.is_lost());
        assert_eq!(g.mask(&[3]), None, "Dd cannot start a match");
        assert!(g.is_lost() && g.mask(&[]).is_none(), "lost for good");
    }
}
