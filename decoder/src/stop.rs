//! Stop conditions applied token by token to an accepted run (DECODE-6,
//! DECODE-7): the cut is at the first token that ends the generation, so a
//! run that holds eos, completes a stop string, or reaches `max_tokens`
//! emits nothing after it.

use crate::request::{FinishReason, Request};

/// Turns token ids into text (a tokenizer's decode), for stop strings.
pub trait Detokenize {
    fn detokenize(&self, ids: &[u32]) -> String;
}

impl<F: Fn(&[u32]) -> String> Detokenize for F {
    fn detokenize(&self, ids: &[u32]) -> String {
        self(ids)
    }
}

/// The outcome of appending one token.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Appended {
    Continue,
    Finished(FinishReason),
}

/// Applies one request's stop conditions to its growing output.
pub struct StopState {
    eos: Vec<u32>,
    stop_strings: Vec<String>,
    max_tokens: usize,
    /// Bytes of decoded text already searched for stop strings: a match
    /// must end past this point, so each token's check only looks at the
    /// tail that could hold a new one (a string straddling tokens included).
    searched: usize,
    longest_stop: usize,
}

impl StopState {
    pub fn new(req: &Request) -> Self {
        let longest_stop = req.stop_strings.iter().map(String::len).max().unwrap_or(0);
        StopState { eos: req.eos.clone(), stop_strings: req.stop_strings.clone(), max_tokens: req.max_tokens, searched: 0, longest_stop }
    }

    /// Checks `out` after its last token was appended. Eos wins over a stop
    /// string, which wins over the length limit (all end at this token).
    pub fn check(&mut self, out: &[u32], detok: Option<&dyn Detokenize>) -> Appended {
        let last = *out.last().expect("check follows an append");
        if self.eos.contains(&last) {
            return Appended::Finished(FinishReason::Eos);
        }
        if let (Some(d), false) = (detok, self.stop_strings.is_empty()) {
            let text = d.detokenize(out);
            let mut from = self.searched.saturating_sub(self.longest_stop.saturating_sub(1));
            while !text.is_char_boundary(from) {
                from -= 1;
            }
            if self.stop_strings.iter().any(|s| text[from..].contains(s.as_str())) {
                return Appended::Finished(FinishReason::Stop);
            }
            self.searched = text.len();
        }
        if out.len() >= self.max_tokens {
            return Appended::Finished(FinishReason::Length);
        }
        Appended::Continue
    }
}
