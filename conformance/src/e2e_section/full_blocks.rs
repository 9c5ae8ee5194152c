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
//! prompts, the trained DFlash draft). The seeded draft (a random model that
//! agrees with SmolLM2 on three tokens with probability about `49152^-3` a
//! step) and early exit after 8 of 30 layers (6 of 537 drafts accepted, no
//! whole block, on ndarray, 2026-11-28) never get one, so their SmolLM2
//! `full-blocks` check runs a drafter of the same kind that agrees with the
//! target ([`smollm2_stand_in`]: the target as its own draft model; early
//! exit two layers before the last) on the greedy prompts at k = 1 and 2,
//! the same identity and [`MIN_BONUS`] whole blocks asked: the proposer's
//! code after a whole block (the draft cache catching up with the bonus
//! token) is the same whichever weights it drafts with.

use rand::{RngExt, SeedableRng};
use rand_pcg::Pcg64;
use specdec_backend::model::ModelBackend;
use specdec_decoder::{EngineConfig, NoSink, Request};

use super::{Plain, build_proposer, engine, err_of};
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

/// The drafter SmolLM2's `full-blocks` check runs for `proposer`: the same
/// kind, agreeing with the target. `None` where the greedy check's own run
/// already has whole blocks ([`SMOLLM2_FULL_BLOCKS`]).
pub fn smollm2_stand_in(proposer: &str, layers: usize) -> Option<String> {
    match proposer {
        "draft:seeded" => Some("draft:self".into()),
        p if p.starts_with("early-exit:") => Some(format!("early-exit:{}", layers.saturating_sub(2).max(1))),
        _ => None,
    }
}

/// Whether SmolLM2 has a `full-blocks` check for `proposer`.
pub fn has_smollm2_stand_in(proposer: &str) -> bool {
    smollm2_stand_in(proposer, 30).is_some()
}

/// Runs the check for `proposer` on the tiny model.
pub(super) fn check<B: ModelBackend>(b: &B, s: &Subject, m: &B::Model, proposer: &str, config: &EngineConfig) -> Result<usize, String> {
    let vocab = s.weights.config.vocab_size;
    let prompts = prompts(vocab);
    let plain = model_section::greedy(b, m, &prompts, TOKENS, &[], vocab)?;
    let requests: Vec<Request> = prompts.iter().map(|q| Request::greedy(q.clone(), TOKENS)).collect();
    identity_with_whole_blocks(b, s, m, proposer, &requests, &plain, config)
}

/// Runs the check for `proposer` on SmolLM2: its stand-in on the greedy
/// check's prompts, against their plain run.
pub(super) fn check_smollm2<B: ModelBackend>(b: &B, s: &Subject, m: &B::Model, plain: &Plain, proposer: &str, config: &EngineConfig) -> Result<usize, String> {
    let stand_in = smollm2_stand_in(proposer, s.weights.config.num_hidden_layers).ok_or_else(|| format!("`{proposer}` has no SmolLM2 stand-in: its greedy check asks whole blocks"))?;
    identity_with_whole_blocks(b, s, m, &stand_in, &plain.set.requests(), &plain.runs, config).map_err(|e| format!("{stand_in} (standing in for {proposer}): {e}"))
}

/// `requests` decoded with `proposer` at every k of [`KS`] give `plain`'s
/// tokens (a divergence excused below the window epsilon, and counted), with
/// at least [`MIN_BONUS`] steps whose every draft was accepted over them all.
fn identity_with_whole_blocks<B: ModelBackend>(
    b: &B,
    s: &Subject,
    m: &B::Model,
    proposer: &str,
    requests: &[Request],
    plain: &[model_section::GreedyRun],
    config: &EngineConfig,
) -> Result<usize, String> {
    let eps = b.model_precision().window_margin_epsilon;
    let mut excused = 0;
    let mut acceptance = specdec_decoder::Acceptance::default();
    for k in KS {
        let mut p = build_proposer(b, proposer, &s.weights)?;
        let config = EngineConfig { k, ..config.clone() };
        let out = engine(b, &s.weights, m, &config)?.generate(requests, p.as_mut(), None, &mut NoSink).map_err(|e| err_of(&e))?;
        for (i, (o, e)) in out.outputs.iter().zip(plain).enumerate() {
            match e.divergence(&o.tokens, eps) {
                Divergence::Excused(_) => excused += 1,
                Divergence::Unexcused(step) => {
                    let (got, want, margin) = (o.tokens[step], e.tokens[step], e.margins[step]);
                    return Err(format!("k = {k}, prompt {i} ({:?}): token {step} is {got}, plain greedy gives {want} (plain top-2 margin {margin:.3e} >= epsilon {eps:e})", requests[i].prompt));
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
