//! The generation-level contract (ENGINE-1): what a check asks of an engine
//! and what it gets back. The same types are the wire format of the exec
//! transport's `generate` operation (PROTO-9), so a field added here is a
//! field of the protocol.

use serde::{Deserialize, Serialize};
use specdec_backend::SamplingParams;

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
}

impl GenerationRequest {
    /// A greedy request with no stop condition but `max_new_tokens`.
    pub fn greedy(prompt: Vec<u32>, max_new_tokens: usize, speculation: bool) -> Self {
        GenerationRequest { prompt, temperature: 0.0, top_k: 0, top_p: 1.0, seed: 0, max_new_tokens, eos: Vec::new(), stop: Vec::new(), speculation }
    }

    /// A sampled request with `params` and `seed`, and no stop condition but `max_new_tokens`.
    pub fn sampled(prompt: Vec<u32>, params: SamplingParams, seed: u64, max_new_tokens: usize, speculation: bool) -> Self {
        GenerationRequest { temperature: params.temperature, top_k: params.top_k, top_p: params.top_p, seed, ..GenerationRequest::greedy(prompt, max_new_tokens, speculation) }
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
}

fn takes_eos_ids() -> bool {
    true
}

fn is_true(b: &bool) -> bool {
    *b
}
