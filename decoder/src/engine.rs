//! The decode loop (DECODE-1 .. DECODE-5), after llama.cpp's
//! `llama-speculative`: the engine's settings, the checks of its requests,
//! and [`Engine::run`], one [`Session`](crate::session::Session) that admits
//! a batch and steps it to the end (a server admits requests between
//! steps). The step itself, propose, window, verify, commit, is
//! `Session::step` (`session.rs`).
//!
//! Invariants: a sequence's last token is never in the target cache before
//! the step that feeds it, so after every step the cache holds exactly the
//! prompt and the emitted tokens but the last (DECODE-5; KV-6); each
//! request draws its noise from its own streams in an order that depends
//! only on its own tokens, so its output does not depend on the batch
//! (DECODE-3); stop conditions cut an accepted run at its first stopping
//! token (DECODE-6, DECODE-7); a step without drafts is a plain decode step
//! through the same verify op (GREEDY-4 with `len_b = 0`).

use specdec_backend::model::ModelBackend;

use crate::config::EngineConfig;
pub use crate::config::MAX_K;
use crate::error::DecodeError;
use crate::proposer::Proposer;
use crate::request::{Acceptance, Request, RunOutput, Timings};
use crate::sink::Sink;
use crate::stop::Detokenize;

/// The speculative decoder over one target model on one backend.
pub struct Engine<'a, B: ModelBackend> {
    pub(crate) backend: &'a B,
    pub(crate) target: &'a B::Model,
    pub(crate) vocab: usize,
    pub(crate) max_positions: usize,
    pub(crate) config: EngineConfig,
}

impl<'a, B: ModelBackend> Engine<'a, B> {
    pub fn new(backend: &'a B, target: &'a B::Model, target_config: &specdec_backend::model::LlamaConfig, config: EngineConfig) -> Result<Self, DecodeError> {
        if let Some(c) = &config.controller {
            c.validate().map_err(|e| DecodeError::Config(format!("controller: {e}")))?;
        }
        if config.payoff && config.controller.is_some() {
            return Err(DecodeError::Config("the pay-off controller and seed 001's controller both pick k: set one".into()));
        }
        if config.max_k() > MAX_K {
            return Err(DecodeError::Config(format!("k = {} is above the engine's limit of {MAX_K}", config.max_k())));
        }
        Ok(Engine { backend, target, vocab: target_config.vocab_size, max_positions: target_config.max_position_embeddings, config })
    }

    pub fn config(&self) -> &EngineConfig {
        &self.config
    }

    /// Generates every request to completion as one batch. An empty batch
    /// is a no-op (seed 001, scenario 14).
    pub fn generate(&self, requests: &[Request], proposer: &mut dyn Proposer<B>, detok: Option<&dyn Detokenize>, sink: &mut dyn Sink) -> Result<RunOutput, DecodeError> {
        if requests.is_empty() {
            return Ok(RunOutput { outputs: Vec::new(), acceptance: Acceptance::default(), batch_steps: 0, proposer_errors: 0, steps_by_k: Vec::new(), timings: Timings::default() });
        }
        self.run(requests, proposer, detok, sink).map(|(out, _)| out)
    }

    /// [`Engine::generate`], also returning the target cache (DECODE-5:
    /// it holds each prompt and its emitted tokens but the last).
    pub fn run(&self, requests: &[Request], proposer: &mut dyn Proposer<B>, detok: Option<&dyn Detokenize>, sink: &mut dyn Sink) -> Result<(RunOutput, B::ModelCache), DecodeError> {
        if requests.is_empty() {
            return Err(DecodeError::Request { index: 0, reason: "no requests".into() });
        }
        for (i, r) in requests.iter().enumerate() {
            self.check_request(i, r, self.max_positions, detok)?;
        }
        let wanted = requests.iter().map(|r| r.prompt.len() + r.max_tokens).max().unwrap_or(0) + self.config.max_k() + 1;
        let mut session = self.session(requests.len(), wanted.min(self.max_positions), proposer)?;
        let slots = session.admit(requests.to_vec(), detok)?;
        while session.active() > 0 {
            session.step(detok, sink)?;
        }
        let outputs = slots.into_iter().map(|slot| session.take(slot).ok_or_else(|| DecodeError::Internal(format!("slot {slot} has no finished output")))).collect::<Result<Vec<_>, _>>()?;
        Ok(session.finish(outputs))
    }

    /// One request against the model and a context of `capacity` positions (ERR-1).
    pub(crate) fn check_request(&self, index: usize, r: &Request, capacity: usize, detok: Option<&dyn Detokenize>) -> Result<(), DecodeError> {
        r.validate(index, self.vocab)?;
        if !r.stop_strings.is_empty() && detok.is_none() {
            return Err(DecodeError::Request { index, reason: "stop strings need a detokenizer".into() });
        }
        if r.prompt.len() >= self.max_positions {
            return Err(DecodeError::Request { index, reason: format!("{} prompt tokens leave no room in the model's {} positions", r.prompt.len(), self.max_positions) });
        }
        if r.prompt.len() >= capacity {
            return Err(DecodeError::Request { index, reason: format!("{} prompt tokens leave no room in the session's {capacity} positions", r.prompt.len()) });
        }
        Ok(())
    }
}
