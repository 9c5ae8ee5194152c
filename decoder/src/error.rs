//! The decoder's one error type: every way a generation can fail, typed,
//! so a caller (the CLI, the server, the engine checks) can tell a bad
//! request from a misconfiguration, a proposer's fault, the backend's
//! refusal and a broken invariant of the decoder itself.

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
