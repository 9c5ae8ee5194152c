//! One request's state during a run: its context, output, stop state,
//! acceptance counts and its own two noise streams (DECODE-3).

use rand::RngExt;
use rand_pcg::Pcg64;

use crate::request::{Acceptance, FinishReason, Request};
use crate::stop::StopState;

/// One request's state during a run.
pub(crate) struct Seq<'r> {
    pub(crate) req: &'r Request,
    /// Prompt and emitted tokens; the last is the next input.
    pub(crate) context: Vec<u32>,
    pub(crate) out: Vec<u32>,
    pub(crate) finish: Option<FinishReason>,
    pub(crate) verify_noise: VerifyNoise<'r>,
    pub(crate) draft_rng: Pcg64,
    pub(crate) acceptance: Acceptance,
    pub(crate) stop: StopState<'r>,
}

/// Where a request's verify uniforms come from (DECODE-3).
pub(crate) enum VerifyNoise<'r> {
    /// The seed's verify stream.
    Stream(Pcg64),
    /// Given by the request, read in order.
    Given { given: &'r [f64], read: usize },
}

impl VerifyNoise<'_> {
    /// The next verify uniform; `None` when given uniforms ran out.
    pub(crate) fn next(&mut self) -> Option<f64> {
        match self {
            VerifyNoise::Stream(rng) => Some(rng.random::<f64>()),
            VerifyNoise::Given { given, read } => {
                let u = given.get(*read).copied();
                *read += 1;
                u
            }
        }
    }
}

/// The noise streams of a request: verify and draft, independent (DECODE-3).
pub fn noise_streams(seed: u64) -> (Pcg64, Pcg64) {
    // Distinct PCG streams of one seed (odd increments), not seed arithmetic.
    (Pcg64::new(u128::from(seed), 0x5851_f42d_4c95_7f2d_1405_7b7e_f767_814f), Pcg64::new(u128::from(seed), 0xda3e_39cb_94b9_5bdb_0a8f_2f6d_3b4b_8a71))
}

impl<'r> Seq<'r> {
    /// A request's state; its noise streams are `seed`'s (the request's own
    /// seed but in a negative control).
    pub(crate) fn new(req: &'r Request, seed: u64) -> Self {
        let (verify_rng, draft_rng) = noise_streams(seed);
        let verify_noise = match &req.verify_uniforms {
            Some(given) => VerifyNoise::Given { given, read: 0 },
            None => VerifyNoise::Stream(verify_rng),
        };
        Seq { req, context: req.prompt.clone(), out: Vec::new(), finish: None, verify_noise, draft_rng, acceptance: Acceptance::default(), stop: StopState::new(req) }
    }

    /// The last token: the next input of the target.
    pub(crate) fn last(&self) -> u32 {
        *self.context.last().expect("contexts are never empty")
    }
}
