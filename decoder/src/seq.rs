//! One request's state during a run: its context, output, stop state,
//! acceptance counts and its own two noise streams (DECODE-3).

use rand::RngExt;
use rand_pcg::Pcg64;

use crate::device::Row;
use crate::request::{Acceptance, FinishReason, Request};
use crate::stop::StopState;
use specdec_constraint::State;
use specdec_reference::TokenLogprob;

/// One request's state during a run.
pub(crate) struct Seq {
    pub(crate) req: Request,
    /// Prompt and emitted tokens; the last is the next input.
    pub(crate) context: Vec<u32>,
    pub(crate) out: Vec<u32>,
    pub(crate) finish: Option<FinishReason>,
    pub(crate) verify_noise: VerifyNoise,
    pub(crate) draft_rng: Pcg64,
    pub(crate) acceptance: Acceptance,
    pub(crate) stop: StopState,
    /// One entry per emitted token, where the request asked for logprobs.
    pub(crate) logprobs: Vec<TokenLogprob>,
    /// The constraint's state after `out` (CONSTRAIN-4); `None` without one.
    pub(crate) constraint: Option<State>,
    /// Why it failed, where it finished with `FinishReason::Error`.
    pub(crate) error: Option<String>,
}

/// Where a request's verify uniforms come from (DECODE-3).
pub(crate) enum VerifyNoise {
    /// The seed's verify stream.
    Stream(Pcg64),
    /// Given by the request, read in order.
    Given { given: Vec<f64>, read: usize },
}

impl VerifyNoise {
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

impl Seq {
    /// The processor inputs of this sequence's row after `drafts` (LOGITS-13).
    pub(crate) fn row<'a>(&'a self, drafts: &'a [u32]) -> Row<'a> {
        Row::after(self.req.sampling, &self.context, self.req.prompt.len(), &self.req.logit_bias, drafts)
    }

    /// A request's state; its noise streams are `seed`'s (the request's own
    /// seed but in a negative control).
    pub(crate) fn new(req: Request, seed: u64) -> Self {
        let (verify_rng, draft_rng) = noise_streams(seed);
        let verify_noise = match &req.verify_uniforms {
            Some(given) => VerifyNoise::Given { given: given.clone(), read: 0 },
            None => VerifyNoise::Stream(verify_rng),
        };
        let stop = StopState::new(&req);
        let constraint = req.constraint.as_ref().map(|c| c.constraint().start());
        Seq { context: req.prompt.clone(), req, out: Vec::new(), finish: None, verify_noise, draft_rng, acceptance: Acceptance::default(), stop, logprobs: Vec::new(), constraint, error: None }
    }

    /// The state of a slot that holds no request: finished, never active.
    pub(crate) fn vacant() -> Self {
        Seq { finish: Some(FinishReason::Capacity), ..Seq::new(Request::greedy(vec![0], 1), 0) }
    }

    /// The last token: the next input of the target.
    pub(crate) fn last(&self) -> u32 {
        *self.context.last().expect("contexts are never empty")
    }
}
