//! Engines under test (spec section 21): the generation-level contract a
//! whole inference engine is checked through, and the ways to reach one.
//!
//! Role: the engine checks (`specdec-conformance`'s engine section) see an
//! engine only through [`GenerationEngine`]: token-id prompts, sampling
//! parameters, a seed, limits, eos ids, stop strings and speculation on or
//! off in; generated ids, the finish reason and (where the engine counts
//! them) draft counts out (ENGINE-1). Reached (ENGINE-2) in process ([`DecoderEngine`]: specdec's
//! own decoder on any backend with any proposer) or as a child process in
//! any language over the exec protocol's `generate` operation
//! ([`ExecEngine`], PROTO-9; [`serve_exec`] is the adapter side, which
//! `specdec engine-adapter` runs for specdec's own decoder), or at the URL
//! of an HTTP server ([`HttpEngine`]: token ids in and out, through the
//! extension fields vLLM names on an OpenAI-compatible server, `specdec
//! serve` among them, or through llama.cpp's native endpoint).
//!
//! Invariants: every reply is validated ([`validate_outputs`]: one output
//! per request, ids inside the vocabulary the engine states, no more drafts
//! accepted than proposed) by the exec transport and by the engine section
//! before a check reads it; a malformed, short or hostile reply is a typed
//! [`EngineError`] naming the request and the field, never a panic. What an
//! engine generates past its limits is not corrected here: that is for the
//! checks to see.
//!
//! Modules: `contract.rs` (requests, generations, what an engine states of
//! itself: the same types are PROTO-9's wire format), this file (the trait
//! and the validation), `decoder.rs` ([`DecoderEngine`]), `exec.rs`
//! ([`ExecEngine`] and [`serve_exec`]), `http.rs` ([`HttpEngine`], both
//! dialects).

mod contract;
mod decoder;
mod exec;
mod http;

pub use contract::{ConstraintKind, DraftCounts, EngineInfo, Finish, Generation, GenerationRequest, LogprobStatement, Processor};
pub use decoder::DecoderEngine;
pub use exec::{ExecEngine, serve_exec};
pub use http::{Dialect, HttpEngine, parse_http_engine};

/// Why an engine could not answer.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum EngineError {
    /// A request is invalid for this engine (the engine said why).
    #[error("request {index}: {reason}")]
    Request { index: usize, reason: String },
    /// The engine broke the contract (a missing output, an id outside its
    /// vocabulary, a malformed reply).
    #[error("the engine broke the contract: {0}")]
    Contract(String),
    /// The engine, or the backend under it, does not implement what was
    /// asked (reported as not supported, never as a pass).
    #[error("not supported: {0}")]
    NotSupported(String),
    /// The engine failed or its transport did (a crash, a timeout).
    #[error("the engine failed: {0}")]
    Failed(String),
}

/// An engine under test (ENGINE-1).
pub trait GenerationEngine {
    fn info(&self) -> &EngineInfo;

    /// Generates every request, possibly as one batch; outputs in request order.
    fn generate(&mut self, requests: &[GenerationRequest]) -> Result<Vec<Generation>, EngineError>;
}

/// Checks an engine's outputs against the contract: one per request, every
/// id inside the vocabulary.
pub fn validate_outputs(info: &EngineInfo, requests: &[GenerationRequest], outputs: &[Generation]) -> Result<(), EngineError> {
    if outputs.len() != requests.len() {
        let first = outputs.len().min(requests.len());
        return Err(EngineError::Contract(format!("{} outputs for {} requests (request {first} has no output, or output {first} no request)", outputs.len(), requests.len())));
    }
    for (i, o) in outputs.iter().enumerate() {
        if let Some(d) = o.drafts
            && d.accepted > d.proposed
        {
            return Err(EngineError::Contract(format!("request {i}: {} drafts accepted of {} proposed", d.accepted, d.proposed)));
        }
        if let Some(t) = o.tokens.iter().find(|&&t| t as usize >= info.vocab) {
            return Err(EngineError::Contract(format!("request {i}: generated id {t}, outside the vocabulary of {}", info.vocab)));
        }
        if o.tokens.is_empty() && o.finish != Finish::Capacity {
            return Err(EngineError::Contract(format!("request {i}: no token generated, finish {:?}", o.finish)));
        }
        validate_logprobs(info, &requests[i], o).map_err(|e| EngineError::Contract(format!("request {i}: logprobs: {e}")))?;
    }
    Ok(())
}

/// The shape of an output's logprobs (LOGPROB-3): present exactly when
/// asked, each entry's id the token at its position (where there is one),
/// at most `top` alternatives, ids in the vocabulary, values finite and at
/// most 0. How many entries there are is for the checks to judge (entries
/// end where the output ends).
fn validate_logprobs(info: &EngineInfo, r: &GenerationRequest, o: &Generation) -> Result<(), String> {
    let (ask, entries) = match (&r.logprobs, &o.logprobs) {
        (None, None) => return Ok(()),
        (None, Some(_)) => return Err("reported, though the request asked for none".into()),
        (Some(_), None) => return Err("asked for, none reported".into()),
        (Some(ask), Some(entries)) => (ask, entries),
    };
    for (t, e) in entries.iter().enumerate() {
        if let Some(&token) = o.tokens.get(t)
            && e.id != token
        {
            return Err(format!("entry {t} is of id {}, the token there is {token}", e.id));
        }
        if e.top.len() > ask.top {
            return Err(format!("entry {t} lists {} alternatives, {} were asked", e.top.len(), ask.top));
        }
        for (id, lp) in std::iter::once((e.id, e.logprob)).chain(e.top.iter().copied()) {
            if id as usize >= info.vocab {
                return Err(format!("entry {t} names id {id}, outside the vocabulary of {}", info.vocab));
            }
            // f32 rounding may put a certain token's logprob a hair above 0.
            if !(lp.is_finite() && lp <= 1e-6) {
                return Err(format!("entry {t}: logprob {lp} of id {id} is not a finite value <= 0"));
            }
        }
    }
    Ok(())
}
