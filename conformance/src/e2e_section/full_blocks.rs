//! The `full-blocks` check (GREEDY-4, GREEDY-5, DECODE-2): greedy runs in
//! which whole blocks are accepted, so the token after them is the bonus,
//! read from row `len` of the window. A seeded drafter rarely agrees with
//! the target on the section's few greedy prompts, so a bonus row read from
//! the wrong place would go unseen there; here the prompts are many seeded
//! ones, decoded with one draft per step (a seeded drafter that agrees with
//! the target on one token in fifty still has whole blocks accepted) and
//! with two (the bonus row is then row 2, past a row a port could mistake
//! for it), and the check fails unless whole blocks were accepted.
//!
//! Tiny model: [`PROMPTS`] seeded prompts of 2 to 9 ids, [`TOKENS`] tokens
//! each, at k = 1 and k = 2, the emitted tokens equal to the backend's
//! plain greedy decoding (a divergence excused and counted below the window
//! epsilon, as in `greedy`), and at least [`MIN_BONUS`] steps with every
//! draft accepted over both.
//! SmolLM2 asks the same of the `greedy` check's own run (k = 3), at least
//! one step with every draft accepted, for the proposers that get whole
//! blocks accepted there ([`SMOLLM2_FULL_BLOCKS`]: n-gram on its quoting
//! prompts, the trained DFlash draft). Not for the seeded draft, a random
//! model that agrees with SmolLM2 on three tokens with probability about
//! `49152^-3` a step, nor for early exit after 8 of 30 layers, which had 6
//! of 537 drafts accepted and no whole block on ndarray (2026-11-28): the
//! bonus row of those two is read on the tiny model only.

use rand::{RngExt, SeedableRng};
use rand_pcg::Pcg64;
use specdec_backend::model::ModelBackend;
use specdec_decoder::{EngineConfig, NoSink, Request};

use super::{build_proposer, engine, err_of};
use crate::model_section::{self, Divergence, Subject};

pub(super) const RULES: &[&str] = &["GREEDY-4", "GREEDY-5", "DECODE-2"];
/// Seeded prompts of the tiny model's check.
pub const PROMPTS: usize = 48;
/// Tokens per prompt.
pub const TOKENS: usize = 12;
/// Drafts per step, one run each.
pub const KS: [usize; 2] = [1, 2];
/// Steps with every draft accepted the tiny model's check needs.
pub const MIN_BONUS: u64 = 4;
/// The SmolLM2 proposers whose greedy check needs a whole block accepted.
pub const SMOLLM2_FULL_BLOCKS: [&str; 2] = ["ngram", "dflash:trained"];

/// The tiny model's prompts: seeded ids, 2 to 9 of them.
fn prompts(vocab: usize) -> Vec<Vec<u32>> {
    let mut rng = Pcg64::seed_from_u64(0x6675_6c6c);
    (0..PROMPTS).map(|_| (0..rng.random_range(2..10)).map(|_| rng.random_range(0..vocab as u32)).collect()).collect()
}

/// Runs the check for `proposer` on the tiny model.
pub(super) fn check<B: ModelBackend>(b: &B, s: &Subject, m: &B::Model, proposer: &str, config: &EngineConfig) -> Result<usize, String> {
    let vocab = s.weights.config.vocab_size;
    let prompts = prompts(vocab);
    let plain = model_section::greedy(b, m, &prompts, TOKENS, &[], vocab)?;
    let requests: Vec<Request> = prompts.iter().map(|q| Request::greedy(q.clone(), TOKENS)).collect();
    let eps = b.model_precision().window_margin_epsilon;
    let mut excused = 0;
    let mut acceptance = specdec_decoder::Acceptance::default();
    for k in KS {
        let mut p = build_proposer(b, proposer, &s.weights)?;
        let config = EngineConfig { k, ..config.clone() };
        let out = engine(b, &s.weights, m, &config)?.generate(&requests, p.as_mut(), None, &mut NoSink).map_err(|e| err_of(&e))?;
        for (i, (o, e)) in out.outputs.iter().zip(&plain).enumerate() {
            match e.divergence(&o.tokens, eps) {
                Divergence::Excused(_) => excused += 1,
                Divergence::Unexcused(step) => {
                    let (got, want, margin) = (o.tokens[step], e.tokens[step], e.margins[step]);
                    return Err(format!("k = {k}, prompt {i} ({:?}): token {step} is {got}, plain greedy gives {want} (plain top-2 margin {margin:.3e} >= epsilon {eps:e})", prompts[i]));
                }
                Divergence::None if o.tokens.len() != e.tokens.len() => return Err(format!("k = {k}, prompt {i}: {} tokens, plain greedy generated {}", o.tokens.len(), e.tokens.len())),
                Divergence::None => {}
            }
        }
        acceptance.merge(&out.acceptance);
    }
    enough_bonus(&acceptance, MIN_BONUS)?;
    Ok(excused)
}

/// `Err` unless at least `min` steps accepted every draft.
pub(super) fn enough_bonus(a: &specdec_decoder::Acceptance, min: u64) -> Result<(), String> {
    if a.bonus < min {
        return Err(format!("{} of {} steps accepted every draft ({} of {} drafts accepted), fewer than {min}: the bonus row is hardly read", a.bonus, a.steps, a.accepted, a.proposed));
    }
    Ok(())
}
