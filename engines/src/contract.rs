//! The generation-level contract (ENGINE-1): what a check asks of an engine
//! and what it gets back. The same types are the wire format of the exec
//! transport's `generate` operation (PROTO-9), so a field added here is a
//! field of the protocol.

use serde::{Deserialize, Serialize};
use specdec_backend::{PenaltyScope, SamplingParams};
use specdec_decoder::{ConstraintSpec, LogprobMode, LogprobRequest, TokenLogprob};

/// One generation request: token-id prompt, sampling, seed, limits, stops,
/// and whether the engine speculates (with its own proposer configuration).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GenerationRequest {
    /// Prompt token ids; at least one.
    pub prompt: Vec<u32>,
    /// 0 is greedy (ties to the lowest id, LOGITS-2).
    pub temperature: f64,
    /// 0 keeps every id.
    pub top_k: usize,
    /// 1 keeps every id.
    pub top_p: f64,
    /// The request's seed: the same request with the same seed gives the same output.
    pub seed: u64,
    /// Generated tokens at most, the stopping token included; at least one.
    pub max_new_tokens: usize,
    /// Ids that end the output; the eos is its last token.
    #[serde(default)]
    pub eos: Vec<u32>,
    /// Strings that end the output at the token whose text completes them.
    #[serde(default)]
    pub stop: Vec<String>,
    /// Speculation on (the engine's own proposer) or off (plain decoding).
    pub speculation: bool,
    /// The processors after the bias (LOGITS-8 .. LOGITS-12); absent fields
    /// are off, so an engine that knows none of them reads the other
    /// requests as before (and must refuse, never ignore, one it cannot honour).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub min_p: f64,
    /// `(id, bias)` pairs added to the logits first (LOGITS-7).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub logit_bias: Vec<(u32, f64)>,
    #[serde(default = "one", skip_serializing_if = "is_one")]
    pub repetition_penalty: f64,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub presence_penalty: f64,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub frequency_penalty: f64,
    #[serde(default, skip_serializing_if = "is_context")]
    pub penalty_scope: PenaltyScope,
    /// The logprobs to report with each generated token (LOGPROB-3).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub logprobs: Option<LogprobRequest>,
    /// The constraint the output text must match (CONSTRAIN-1 .. CONSTRAIN-5):
    /// `{"regex": R}`, `{"json_schema": S}` or `{"grammar": G}` (GBNF); absent means none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub constraint: Option<ConstraintSpec>,
}

impl GenerationRequest {
    /// A greedy request with no stop condition but `max_new_tokens`.
    pub fn greedy(prompt: Vec<u32>, max_new_tokens: usize, speculation: bool) -> Self {
        GenerationRequest {
            prompt,
            temperature: 0.0,
            top_k: 0,
            top_p: 1.0,
            seed: 0,
            max_new_tokens,
            eos: Vec::new(),
            stop: Vec::new(),
            speculation,
            min_p: 0.0,
            logit_bias: Vec::new(),
            repetition_penalty: 1.0,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            penalty_scope: PenaltyScope::Context,
            logprobs: None,
            constraint: None,
        }
    }

    /// A sampled request with `params` and `seed`, and no stop condition but `max_new_tokens`.
    pub fn sampled(prompt: Vec<u32>, params: SamplingParams, seed: u64, max_new_tokens: usize, speculation: bool) -> Self {
        GenerationRequest { seed, ..GenerationRequest::greedy(prompt, max_new_tokens, speculation) }.with_params(params)
    }

    /// This request with every processor of `params` (LOGITS-1 .. LOGITS-12).
    pub fn with_params(self, p: SamplingParams) -> Self {
        GenerationRequest {
            temperature: p.temperature,
            top_k: p.top_k,
            top_p: p.top_p,
            min_p: p.min_p,
            repetition_penalty: p.repetition_penalty,
            presence_penalty: p.presence_penalty,
            frequency_penalty: p.frequency_penalty,
            penalty_scope: p.penalty_scope,
            ..self
        }
    }

    /// Its sampling parameters, every processor but the bias.
    pub fn params(&self) -> SamplingParams {
        SamplingParams {
            min_p: self.min_p,
            repetition_penalty: self.repetition_penalty,
            presence_penalty: self.presence_penalty,
            frequency_penalty: self.frequency_penalty,
            penalty_scope: self.penalty_scope,
            ..SamplingParams::new(self.temperature, self.top_k, self.top_p)
        }
    }

    /// The processors it uses beyond temperature, top-k and top-p, by the
    /// names an engine states ([`Processor`]), with the scope of its penalties.
    pub fn processors(&self) -> Vec<Processor> {
        let mut out = Vec::new();
        let on = [
            (Processor::MinP, self.min_p != 0.0),
            (Processor::LogitBias, !self.logit_bias.is_empty()),
            (Processor::RepetitionPenalty, self.repetition_penalty != 1.0),
            (Processor::PresencePenalty, self.presence_penalty != 0.0),
            (Processor::FrequencyPenalty, self.frequency_penalty != 0.0),
        ];
        out.extend(on.into_iter().filter(|(_, on)| *on).map(|(p, _)| p));
        out
    }
}

/// A processor beyond temperature, top-k and top-p that an engine may take
/// (LOGITS-7 .. LOGITS-10).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Processor {
    MinP,
    LogitBias,
    RepetitionPenalty,
    PresencePenalty,
    FrequencyPenalty,
}

impl Processor {
    pub const ALL: [Processor; 5] = [Processor::MinP, Processor::LogitBias, Processor::RepetitionPenalty, Processor::PresencePenalty, Processor::FrequencyPenalty];

    /// Its name on the wire and in statements.
    pub fn name(self) -> &'static str {
        match self {
            Processor::MinP => "min_p",
            Processor::LogitBias => "logit_bias",
            Processor::RepetitionPenalty => "repetition_penalty",
            Processor::PresencePenalty => "presence_penalty",
            Processor::FrequencyPenalty => "frequency_penalty",
        }
    }

    /// Whether it is a penalty (so it counts a scope, LOGITS-12).
    pub fn is_penalty(self) -> bool {
        matches!(self, Processor::RepetitionPenalty | Processor::PresencePenalty | Processor::FrequencyPenalty)
    }
}

/// Why an output ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Finish {
    /// An eos id was generated (it is the last token).
    Eos,
    /// A stop string completed at the last token.
    Stop,
    /// `max_new_tokens` were generated.
    Length,
    /// The engine ran out of positions.
    Capacity,
}

/// One request's output.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Generation {
    pub tokens: Vec<u32>,
    pub finish: Finish,
    /// Drafts proposed and accepted, where the engine counts them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub drafts: Option<DraftCounts>,
    /// One entry per generated token, where the request asked for them (LOGPROB-3).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub logprobs: Option<Vec<TokenLogprob>>,
}

/// An engine's draft counts for one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DraftCounts {
    pub proposed: u64,
    pub accepted: u64,
}

/// What an engine says of itself; the checks read their expectations from it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EngineInfo {
    /// Its name in reports, e.g. `specdec/ndarray/ngram`.
    pub name: String,
    pub version: String,
    /// Its speculation setting in its own words (proposer and `k`).
    pub speculation: String,
    /// Its vocabulary size: every generated id is below it.
    pub vocab: usize,
    /// A greedy token may differ from the f64 reference forward's only where
    /// the reference's top-2 logit margin is below this (counted, ENGINE-3).
    pub greedy_epsilon: f64,
    /// Whether a request's output is the same alone and in any batch (ENGINE-6).
    pub batch_invariant: bool,
    /// Whether it honours stop strings (with the model's detokenizer).
    pub stop_strings: bool,
    /// Whether it takes eos ids per request (absent: it does). An engine that
    /// stops only at its model's own end-of-generation tokens (llama.cpp's
    /// server) is asked with eos ids ignored and its output cut after the
    /// first eos by the transport; the `eos` check is then not supported,
    /// since it would judge the cut, not the engine (ENGINE-5).
    #[serde(default = "takes_eos_ids", skip_serializing_if = "is_true")]
    pub eos_ids: bool,
    /// The processors beyond temperature, top-k and top-p it takes (absent:
    /// none); a request with another is refused, and its check not supported.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub processors: Vec<Processor>,
    /// The penalty scopes it counts (LOGITS-12), where it takes a penalty.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub penalty_scopes: Vec<PenaltyScope>,
    /// The logprobs it reports (absent: none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub logprobs: Option<LogprobStatement>,
    /// The constraint kinds it takes (absent: none; CONSTRAIN-1 .. CONSTRAIN-5).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub constraints: Vec<ConstraintKind>,
}

/// A kind of constraint an engine may take.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ConstraintKind {
    Regex,
    JsonSchema,
    /// A GBNF grammar, recursive or not (CONSTRAIN-5).
    Grammar,
}

impl ConstraintKind {
    pub const ALL: [ConstraintKind; 3] = [ConstraintKind::Regex, ConstraintKind::JsonSchema, ConstraintKind::Grammar];

    /// The kind of `spec`.
    pub fn of(spec: &ConstraintSpec) -> Self {
        match spec {
            ConstraintSpec::Regex(_) => ConstraintKind::Regex,
            ConstraintSpec::JsonSchema(_) => ConstraintKind::JsonSchema,
            ConstraintSpec::Grammar(_) => ConstraintKind::Grammar,
        }
    }

    /// Its name on the wire and in statements.
    pub fn name(self) -> &'static str {
        match self {
            ConstraintKind::Regex => "regex",
            ConstraintKind::JsonSchema => "json_schema",
            ConstraintKind::Grammar => "grammar",
        }
    }
}

/// What an engine says of the logprobs it reports (LOGPROB-1 .. LOGPROB-4).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LogprobStatement {
    /// The distributions it reports: raw, processed or both.
    pub modes: Vec<LogprobMode>,
    /// The most alternatives per token it reports.
    pub max_top: usize,
    /// Its reported logprobs may differ from the f64 reference's by this
    /// much (0 for a forward equal to the reference's); at most 1e-2.
    pub epsilon: f64,
}

impl EngineInfo {
    /// Why the engine cannot run `r` as asked, by its own statement: a
    /// processor, penalty scope or logprob mode it does not state.
    pub fn refuses(&self, r: &GenerationRequest) -> Option<String> {
        for p in r.processors() {
            if !self.processors.contains(&p) {
                return Some(format!("the engine does not state that it takes `{}`", p.name()));
            }
            if p.is_penalty() && !self.penalty_scopes.contains(&r.penalty_scope) {
                return Some(format!("the engine does not state that its penalties count the `{}` scope", r.penalty_scope.name()));
            }
        }
        if let Some(kind) = r.constraint.as_ref().map(ConstraintKind::of)
            && !self.constraints.contains(&kind)
        {
            return Some(format!("the engine does not state that it takes `{}` constraints", kind.name()));
        }
        match (&r.logprobs, &self.logprobs) {
            (Some(_), None) => Some("the engine does not state that it reports logprobs".into()),
            (Some(ask), Some(s)) if !s.modes.contains(&ask.mode) => Some(format!("the engine does not report {} logprobs", ask.mode.name())),
            (Some(ask), Some(s)) if ask.top > s.max_top => Some(format!("{} top logprobs asked, the engine reports at most {}", ask.top, s.max_top)),
            _ => None,
        }
    }
}

fn takes_eos_ids() -> bool {
    true
}

fn is_true(b: &bool) -> bool {
    *b
}

fn one() -> f64 {
    1.0
}

fn is_one(x: &f64) -> bool {
    *x == 1.0
}

fn is_zero(x: &f64) -> bool {
    *x == 0.0
}

fn is_context(s: &PenaltyScope) -> bool {
    *s == PenaltyScope::Context
}
