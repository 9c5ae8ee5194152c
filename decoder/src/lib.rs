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

pub mod choice;
mod commit;
pub mod config;
pub(crate) mod device;
pub mod engine;
mod fault;
pub mod payoff;
pub mod proposer;
pub mod request;
mod seq;
pub mod session;
pub mod sink;
pub mod stop;
mod verify;
mod window;

pub use choice::ProposerChoice;
pub use config::{EngineConfig, MAX_K, OnProposerError, Rollback};
pub use engine::Engine;
pub use fault::Fault;
pub use payoff::Payoff;
pub use proposer::{DflashMode, DflashProposer, DraftModelProposer, HiddenRecorder, NgramProposer, NoProposer, Proposal, Proposer, Recorded, SeqView, VerifyRule, record_hidden};
pub use request::{Acceptance, FinishReason, Output, Request, RunOutput, Timings};
pub use seq::noise_streams;
pub use session::Session;
pub use sink::{NoSink, Sink};
pub use stop::Detokenize;

use specdec_backend::BackendError;

/// Why a generation could not run.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum DecodeError {
    /// A request is invalid (empty prompt, ids out of range, bad parameters).
    #[error("request {index}: {reason}")]
    Request { index: usize, reason: String },
    /// The engine or a proposer is misconfigured.
    #[error("configuration: {0}")]
    Config(String),
    /// A proposer broke its contract or failed.
    #[error("proposer `{proposer}`: {reason}")]
    Proposer { proposer: String, reason: String },
    /// The backend rejected an operation.
    #[error(transparent)]
    Backend(#[from] BackendError),
    /// A broken invariant of the decoder itself (a bug, reported, never a panic).
    #[error("decoder invariant broken: {0}")]
    Internal(String),
}

impl DecodeError {
    pub fn proposer(name: &str, reason: impl std::fmt::Display) -> Self {
        DecodeError::Proposer { proposer: name.to_string(), reason: reason.to_string() }
    }
}
