//! The `stop` check (DECODE-7, DECODE-6): stop strings end a generation at
//! the token that completes them, wherever it falls: inside an accepted run,
//! across two tokens of a run, or across two steps.
//!
//! The strings are cut from the backend's own plain greedy output: for
//! several positions `j`, the whole text of token `j`, and the last
//! character of tokens `..=j` with the first character that token `j + 1`
//! adds. The expected output is computed independently of the decoder: the
//! plain tokens up to the first prefix whose text holds the string. Each
//! request carries one string; the speculative run must give exactly that
//! prefix and finish with `Stop`, a divergence being excused (and counted)
//! only where the plain top-2 margin is below the backend's window epsilon.
//!
//! The tiny model has no tokenizer: its ids read as two letters each (`Aa`,
//! `Bb`, ...), so strings straddle tokens as real ones do.

use specdec_backend::model::ModelBackend;
use specdec_decoder::{Detokenize, EngineConfig, FinishReason, NoSink, Request};

use super::{Plain, build_proposer, engine, err_of};
use crate::model_section::{Divergence, Subject};

/// Cut positions `j` of the tiny model's outputs (generations of up to 22
/// tokens, k = 3: inside a run and across a step boundary), and SmolLM2's.
const TINY_CUTS: [usize; 4] = [2, 3, 4, 5];
const SMOLLM2_CUTS: [usize; 2] = [3, 6];
/// SmolLM2 prompts used (its generations are costly).
const SMOLLM2_PROMPTS: usize = 2;

pub use specdec_models::tiny::tiny_text;

/// The stop strings of one plain output, each with the number of tokens the
/// output keeps when it stops (the string completes at the last of them).
pub fn cuts(tokens: &[u32], cut_at: &[usize], text: &dyn Fn(&[u32]) -> String) -> Vec<(String, usize)> {
    let mut out = Vec::new();
    for &j in cut_at.iter().filter(|&&j| j + 1 < tokens.len()) {
        let (upto, next) = (text(&tokens[..=j]), text(&tokens[..=j + 1]));
        let whole = text(&tokens[j..=j]);
        let straddle = match (upto.chars().last(), next.strip_prefix(upto.as_str()).and_then(|rest| rest.chars().next())) {
            (Some(a), Some(b)) => Some(format!("{a}{b}")),
            _ => None,
        };
        // Not a string holding U+FFFD: that is how a token ending inside a
        // UTF-8 character decodes, and no engine's output text holds it there.
        for s in [Some(whole), straddle].into_iter().flatten().filter(|s| !s.trim().is_empty() && !s.contains(char::REPLACEMENT_CHARACTER)) {
            // The first prefix of the output whose text holds it.
            if let Some(keep) = (1..=tokens.len()).find(|&n| text(&tokens[..n]).contains(s.as_str())) {
                out.push((s, keep));
            }
        }
    }
    out
}

/// Runs the check; `Ok` is the number of excused requests.
pub(super) fn check<B: ModelBackend>(b: &B, s: &Subject, m: &B::Model, plain: &Plain, proposer: &str, config: &EngineConfig) -> Result<usize, String> {
    let decode = |ids: &[u32]| -> String {
        match &s.loaded {
            Some(l) => l.tokenizer.as_ref().and_then(|t| t.decode(ids, false).ok()).unwrap_or_default(),
            None => tiny_text(ids),
        }
    };
    let (cut_at, prompts): (&[usize], usize) = if s.loaded.is_some() { (&SMOLLM2_CUTS, SMOLLM2_PROMPTS) } else { (&TINY_CUTS, plain.set.prompts.len()) };
    let base = plain.set.requests();
    let mut requests = Vec::new();
    let mut expected = Vec::new();
    for (i, run) in plain.runs.iter().enumerate().take(prompts) {
        for (stop, keep) in cuts(&run.tokens, cut_at, &decode) {
            requests.push(Request { stop_strings: vec![stop.clone()], ..base[i].clone() });
            expected.push((i, stop, keep));
        }
    }
    if requests.is_empty() {
        return Err("no plain output is long enough to cut stop strings from".into());
    }
    let mut p = build_proposer(b, proposer, &s.weights)?;
    let out = engine(b, &s.weights, m, config)?.run(&requests, p.as_mut(), Some(&decode as &dyn Detokenize), &mut NoSink).map_err(|e| err_of(&e))?.0;
    let eps = b.model_precision().window_margin_epsilon;
    let mut excused = 0;
    for (o, (i, stop, keep)) in out.outputs.iter().zip(&expected) {
        let plain_run = &plain.runs[*i];
        let want = &plain_run.tokens[..*keep];
        // Eos wins over a stop string completed by the same token.
        let finish = if want.last().is_some_and(|t| plain.set.eos.contains(t)) { FinishReason::Eos } else { FinishReason::Stop };
        if o.tokens == want && o.finish == finish {
            continue;
        }
        match plain_run.divergence(&o.tokens[..o.tokens.len().min(*keep)], eps) {
            Divergence::Excused(_) => excused += 1,
            _ => {
                return Err(format!(
                    "prompt {i}, stop string {stop:?}: the run gave {} tokens ({:?}, finish {:?}), the plain output stops after {keep} ({want:?})",
                    o.tokens.len(),
                    o.tokens,
                    o.finish
                ));
            }
        }
    }
    Ok(excused)
}

#[cfg(test)]
mod tests {
    use super::cuts;

    /// A byte-level decoder: ids are bytes, a prefix ending inside a UTF-8
    /// character decodes with U+FFFD, as SmolLM2's tokenizer does.
    fn bytes(ids: &[u32]) -> String {
        String::from_utf8_lossy(&ids.iter().map(|&b| b as u8).collect::<Vec<u8>>()).into_owned()
    }

    /// ENGINE-10 / DECODE-7: a stop string is whole text. A token that ends
    /// inside a character (the first byte of `こ`) gives none, and neither
    /// does a straddle through it; whole characters still give theirs, each
    /// with the prefix it completes at. (Found on llama.cpp's server, which
    /// never matched a stop string of U+FFFD, rightly.)
    #[test]
    fn stop_strings_are_never_cut_inside_a_character() {
        let ids: Vec<u32> = "abこcd".bytes().map(u32::from).collect();
        let got = cuts(&ids, &[1, 2, 3, 4, 5], &bytes);
        assert!(got.iter().all(|(s, _)| !s.contains(char::REPLACEMENT_CHARACTER)), "{got:?}");
        assert!(got.contains(&("b".to_string(), 2)) && got.contains(&("こc".to_string(), 6)), "{got:?}");
        assert!(!got.iter().any(|(_, keep)| *keep == 3 || *keep == 4), "no cut inside the character: {got:?}");
    }
}
