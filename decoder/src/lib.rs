//! The backend-generic speculative decoder: a batch of requests, each with
//! its own prompt, sampling parameters, seed, stop conditions and KV state,
//! driven through propose → one target forward → verify on the device →
//! rollback → emit, on any [`ModelBackend`](specdec_backend::ModelBackend).
//!
//! Role: the loop every seed describes, written once against the Backend
//! and ModelBackend contracts, so that it is lossless on every backend whose
//! kernels and forward pass pass the conformance suite. Proposers (n-gram,
//! a draft model, early exit, DFlash blocks) sit behind one trait.
//!
//! Invariants (spec section 20, DECODE-1 .. DECODE-8): greedy output equals
//! plain greedy decoding token for token; sampled output has the law of
//! plain sampling; after every step the target cache holds exactly the
//! prompt and the emitted tokens but the last; a request's output does not
//! depend on the other requests in its batch; nothing is emitted after a
//! stop condition. The decoder moves only draft ids, accepted tokens and
//! counts between host and device on its hot path (a DFlash drafter also
//! reads the target's hidden states).
//!
//! Layout: [`engine`] holds the [`Engine`] (its settings in [`config`])
//! and the checks of its requests, and runs a batch as one [`Session`] ([`session`]: the loop over fixed request
//! slots, which requests join between steps with one prefill forward and
//! leave by `take` or `cancel`, so a server batches continuously with the
//! very step the checks prove). [`Session::step`] reads as four parts:
//! propose (the [`proposer`]s); `window.rs`, one ragged target forward
//! over each sequence's `[last, drafts..]` and its rows laid out for the
//! verify; `verify.rs`, greedy, DFlash or rejection sampling on the
//! device, downloading only emitted tokens and counts; `commit.rs`,
//! emission up to a stop ([`stop`]), the rollback (per sequence or
//! min-accepted) and the step's counts; `logprobs.rs` reports each emitted
//! token's logprobs from its own verify row (LOGPROB-4), for the requests
//! that ask; `masks.rs` masks each verify row of a constrained request
//! with its constraint's state after the drafts before it (CONSTRAIN-3),
//! the constraint and its fast mask being [`constrained`]. `ledger.rs` keeps the step's
//! bookkeeping behind one helper: which controller picks `k` (seed 001's
//! dynamic controller, `specdec_reference::controller`, switched on in
//! [`config`], or the pay-off controller in
//! [`payoff`], CTRL-7 .. CTRL-10: each step's `k` from the run's own step
//! times and acceptance), and the timings it learns from.
//!
//! Beside them: [`error`] ([`DecodeError`], the one error type), `seq.rs`
//! (a request's state and its two noise streams), `device.rs` (the uploads,
//! processed distributions and draws engine and proposers share), [`sink`],
//! [`request`] (requests, outputs, the one acceptance counter, whose
//! metrics are the controller's formulas), [`choice`] (the one parser of
//! proposer names), `fault.rs` (the decoder bugs the negative controls
//! inject: the engine injects one only with the `negative-controls`
//! feature, though `Fault` and `Proposer::inject` exist in every build), [`proposer`] (the
//! trait, with `proposer/ngram.rs`, `proposer/draft.rs` for a draft model
//! or early exit, and `proposer/dflash.rs` for block drafts, parallel or
//! iterative), and [`record`] (records the target's hidden rows as draft
//! training data while decoding plainly: it rides on the proposer hooks
//! but never proposes). A crate of its own because it is the one consumer
//! of both traits every backend shares, and neither `specdec-models` nor
//! the backends should depend on proposers.
//!
//! Tests: `tests/engine.rs` (greedy output equals an independent plain
//! greedy loop for every proposer, with and without penalties; one named
//! test per scenario of seed 001's section 9.2; `mod faults`: the six
//! faults of `fixtures/faults.json`, each caught), `tests/session.rs` (requests
//! joining a running session, or a slot another request left, give their
//! output alone; a prompt fed in slices, the output of one fed whole, and no
//! prompt starved of slices); the conformance suite's end-to-end and engine sections
//! run the decoder on every backend, with `fault.rs`'s bugs as negative
//! controls.

pub mod choice;
mod commit;
pub mod config;
pub mod constrained;
pub(crate) mod device;
pub mod engine;
pub mod error;
mod fault;
mod guide;
mod ledger;
mod logprobs;
mod masks;
pub mod payoff;
pub mod proposer;
pub mod record;
pub mod request;
mod seq;
pub mod session;
pub mod sink;
pub mod stop;
mod verify;
mod window;

pub use choice::ProposerChoice;
pub use config::{EngineConfig, MAX_K, OnProposerError, Rollback};
pub use constrained::{Constrained, ConstraintCache, TokenTable};
pub use engine::Engine;
pub use error::DecodeError;
pub use fault::Fault;
pub use payoff::Payoff;
pub use proposer::{DflashMode, DflashProposer, DraftModelProposer, NgramProposer, NoProposer, Proposal, Proposer, SeqView, VerifyRule};
pub use record::{HiddenRecorder, Recorded, record_hidden};
pub use request::{Acceptance, FinishReason, Output, Request, RunOutput, Timings};
pub use seq::noise_streams;
pub use session::Session;
pub use sink::{NoSink, Sink};
pub use specdec_constraint::gbnf::{from_regex as gbnf_from_regex, with_end as gbnf_with_end};
pub use specdec_constraint::{ConstraintError, ConstraintSpec, Vocabulary};
pub use specdec_reference::{LogprobMode, LogprobRequest, MAX_TOP_LOGPROBS, TokenLogprob};
pub use stop::Detokenize;
