//! specdec's own decoder as an engine under test (dogfood: the checks that
//! judge other engines judge it the same way).

use std::sync::Arc;

use specdec_backend::model::{LlamaWeights, ModelBackend};
use specdec_backend::{BackendError, PenaltyScope};
use specdec_decoder::{Constrained, ConstraintCache, ConstraintSpec, Detokenize, Engine, EngineConfig, FinishReason, LogprobMode, MAX_TOP_LOGPROBS, NoProposer, NoSink, Proposer, Request, TokenTable};

use crate::{ConstraintKind, DraftCounts, EngineError, EngineInfo, Finish, Generation, GenerationEngine, GenerationRequest, LogprobStatement, Processor};

/// The speculative decoder on one backend with one proposer.
pub struct DecoderEngine<'a, B: ModelBackend> {
    backend: &'a B,
    weights: Arc<LlamaWeights>,
    model: B::Model,
    proposer: Box<dyn Proposer<B> + 'a>,
    config: EngineConfig,
    detok: Option<Box<dyn Detokenize + 'a>>,
    info: EngineInfo,
    /// Its constraints compiled over the model's tokens, where it takes them.
    constraints: Option<ConstraintCache>,
}

impl<'a, B: ModelBackend> DecoderEngine<'a, B> {
    /// The decoder for `weights` on `backend`, speculating with `proposer`
    /// and `config` (its `k`); `detok` turns ids into text for stop strings.
    pub fn new(backend: &'a B, weights: Arc<LlamaWeights>, proposer: Box<dyn Proposer<B> + 'a>, config: EngineConfig, detok: Option<Box<dyn Detokenize + 'a>>) -> Result<Self, EngineError> {
        let model = backend.load_model(&weights).map_err(backend_error)?;
        let info = EngineInfo {
            name: format!("specdec/{}/{}", backend.name(), proposer.name()),
            version: env!("CARGO_PKG_VERSION").into(),
            speculation: format!("{} k={}", proposer.name(), config.k),
            vocab: weights.config.vocab_size,
            greedy_epsilon: backend.model_precision().argmax_margin_epsilon,
            batch_invariant: true,
            stop_strings: detok.is_some(),
            eos_ids: true,
            processors: Processor::ALL.to_vec(),
            penalty_scopes: vec![PenaltyScope::Context, PenaltyScope::Generated],
            // The reference's f64 definition on the backend's own rows: they
            // differ from the reference forward's by its logit error, which
            // its argmax epsilon (twice the largest logit error) bounds.
            logprobs: Some(LogprobStatement { modes: LogprobMode::ALL.to_vec(), max_top: MAX_TOP_LOGPROBS, epsilon: backend.model_precision().argmax_margin_epsilon.max(LOGPROB_ROUNDING) }),
            constraints: Vec::new(),
        };
        Ok(DecoderEngine { backend, weights, model, proposer, config, detok, info, constraints: None })
    }

    /// This engine taking constraints (CONSTRAIN-1 .. CONSTRAIN-5) over
    /// `tokens`, the text of the model's ids.
    pub fn with_constraints(mut self, tokens: Arc<TokenTable>) -> Self {
        self.info.constraints = ConstraintKind::ALL.to_vec();
        self.constraints = Some(ConstraintCache::new(tokens, CONSTRAINTS_KEPT));
        self
    }

    /// `spec` compiled over the engine's token table, once per spec.
    fn constrained(&self, index: usize, spec: &ConstraintSpec) -> Result<Constrained, EngineError> {
        let cache = self.constraints.as_ref().ok_or_else(|| EngineError::Request { index, reason: "this engine takes no constraints".into() })?;
        cache.get(spec).map_err(|e| EngineError::Request { index, reason: e.to_string() })
    }

    /// Runs `requests` (all with the same speculation setting) as one batch.
    fn run(&mut self, requests: &[(usize, &GenerationRequest)], speculate: bool) -> Result<Vec<Generation>, EngineError> {
        let mut reqs = Vec::with_capacity(requests.len());
        for &(i, r) in requests {
            let constraint = r.constraint.as_ref().map(|spec| self.constrained(i, spec)).transpose()?;
            reqs.push(Request { constraint, ..to_request(r) });
        }
        let config = if speculate { self.config.clone() } else { EngineConfig { k: 0, controller: None, ..self.config.clone() } };
        let engine = Engine::new(self.backend, &self.model, &self.weights.config, config).map_err(|e| EngineError::Failed(e.to_string()))?;
        let proposer: &mut dyn Proposer<B> = if speculate { self.proposer.as_mut() } else { &mut NoProposer };
        let out = engine.generate(&reqs, proposer, self.detok.as_deref(), &mut NoSink).map_err(|e| match e {
            specdec_decoder::DecodeError::Request { index, reason } => EngineError::Request { index: requests[index].0, reason },
            specdec_decoder::DecodeError::Backend(e) => backend_error(e),
            other => EngineError::Failed(other.to_string()),
        })?;
        out.outputs
            .into_iter()
            .zip(requests)
            .map(|(o, &(index, _))| {
                let finish = match o.finish {
                    FinishReason::Eos => Finish::Eos,
                    FinishReason::Stop => Finish::Stop,
                    FinishReason::Length => Finish::Length,
                    FinishReason::Capacity => Finish::Capacity,
                    // A request that failed alone (a constraint its vocabulary cannot continue).
                    FinishReason::Error => return Err(EngineError::Request { index, reason: o.error.unwrap_or_default() }),
                };
                Ok(Generation { tokens: o.tokens, finish, drafts: speculate.then_some(DraftCounts { proposed: o.acceptance.proposed, accepted: o.acceptance.accepted }), logprobs: o.logprobs })
            })
            .collect()
    }
}

/// A backend that does not run models (an exec adapter of kernels) makes the
/// engine not supported; any other backend error is a failure.
fn backend_error(e: BackendError) -> EngineError {
    match e {
        e if e.is_not_supported() => EngineError::NotSupported(e.to_string()),
        other => EngineError::Failed(other.to_string()),
    }
}

fn to_request(r: &GenerationRequest) -> Request {
    Request {
        sampling: r.params(),
        logit_bias: r.logit_bias.clone(),
        seed: r.seed,
        eos: r.eos.clone(),
        stop_strings: r.stop.clone(),
        logprobs: r.logprobs,
        ..Request::greedy(r.prompt.clone(), r.max_new_tokens)
    }
}

/// Distinct constraints kept compiled (a check asks for a handful).
const CONSTRAINTS_KEPT: usize = 16;

/// The f64 arithmetic of a logprob on the host (a log-sum-exp over the
/// vocabulary): the least epsilon any backend states, the reference's own included.
const LOGPROB_ROUNDING: f64 = 1e-9;

impl<B: ModelBackend> GenerationEngine for DecoderEngine<'_, B> {
    fn info(&self) -> &EngineInfo {
        &self.info
    }

    /// The speculating requests run as one batch and the plain ones as
    /// another (a request's output does not depend on its batch, DECODE-3).
    fn generate(&mut self, requests: &[GenerationRequest]) -> Result<Vec<Generation>, EngineError> {
        let mut out: Vec<Option<Generation>> = vec![None; requests.len()];
        for speculate in [true, false] {
            let group: Vec<(usize, &GenerationRequest)> = requests.iter().enumerate().filter(|(_, r)| r.speculation == speculate).collect();
            if group.is_empty() {
                continue;
            }
            for ((i, _), g) in group.iter().zip(self.run(&group, speculate)?) {
                out[*i] = Some(g);
            }
        }
        out.into_iter().map(|g| g.ok_or_else(|| EngineError::Failed("a request got no output".into()))).collect()
    }
}
