//! The OpenAI-compatible request bodies, their validation, and the error
//! body every 4xx carries.
//!
//! Unknown fields are errors (a misspelt `top_p` silently ignored would
//! change what the user asked for). Extensions are named as vLLM names them
//! where it has one: `top_k`, `return_token_ids` (the prompt's and the
//! output's ids in each choice), `stop_token_ids`, `ignore_eos`, `min_p`,
//! `repetition_penalty`; and ours, `speculation` (`false` decodes the
//! request plainly) and `penalty_scope` (what the penalties count:
//! `generated`, OpenAI's definition and the default here, or `context`).
//! Logprobs (LOGPROB-3) as OpenAI asks them (`logprobs: N` on completions,
//! `logprobs` with `top_logprobs` on chat), with vLLM's
//! `return_tokens_as_token_ids` and a per-request `logprobs_mode` (`raw`,
//! the default as vLLM's, or `processed`; vLLM fixes it at start).

use serde::Deserialize;
use serde_json::{Value, json};

/// A request that cannot be served, as the HTTP status and OpenAI's error body.
#[derive(Debug, Clone, PartialEq)]
pub struct ApiError {
    pub status: u16,
    pub message: String,
    /// The request field at fault, where one is.
    pub param: Option<String>,
}

impl ApiError {
    pub fn bad(param: &str, message: impl Into<String>) -> Self {
        ApiError { status: 400, message: message.into(), param: Some(param.to_string()) }
    }

    pub fn status(status: u16, message: impl Into<String>) -> Self {
        ApiError { status, message: message.into(), param: None }
    }

    /// OpenAI's error body: `{"error": {"message", "type", "param", "code"}}`.
    pub fn body(&self) -> Value {
        let kind = match self.status {
            401 => "authentication_error",
            404 => "not_found_error",
            413 => "request_too_large",
            503 => "service_unavailable",
            500..=599 => "server_error",
            _ => "invalid_request_error",
        };
        json!({"error": {"message": self.message, "type": kind, "param": self.param, "code": self.status}})
    }
}

/// A prompt: text, token ids, or a list of one of either.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(untagged)]
pub enum Prompt {
    Text(String),
    Ids(Vec<i64>),
    Texts(Vec<String>),
    IdLists(Vec<Vec<i64>>),
}

/// `stop`: one string or several.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(untagged)]
pub enum Stop {
    One(String),
    Many(Vec<String>),
}

#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StreamOptions {
    #[serde(default)]
    pub include_usage: bool,
}

/// The sampling and stopping fields both endpoints share.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Common {
    pub model: Option<String>,
    pub max_tokens: Option<i64>,
    pub temperature: Option<f64>,
    pub top_p: Option<f64>,
    pub top_k: Option<i64>,
    /// Any 64-bit unsigned seed (the engine checks draw them from the whole range).
    pub seed: Option<u64>,
    pub stop: Option<Stop>,
    #[serde(default)]
    pub stream: bool,
    pub stream_options: Option<StreamOptions>,
    pub n: Option<i64>,
    pub user: Option<String>,
    pub presence_penalty: Option<f64>,
    pub frequency_penalty: Option<f64>,
    /// OpenAI's map from a token id (as a string) to a bias in [-100, 100].
    pub logit_bias: Option<std::collections::BTreeMap<String, f64>>,
    pub min_p: Option<f64>,
    pub repetition_penalty: Option<f64>,
    /// Ours: `generated` (the default, OpenAI's) or `context`.
    pub penalty_scope: Option<String>,
    #[serde(default)]
    pub return_token_ids: bool,
    pub stop_token_ids: Option<Vec<i64>>,
    #[serde(default)]
    pub ignore_eos: bool,
    pub speculation: Option<bool>,
    /// vLLM's name: `raw` or `processed` (LOGPROB-1, LOGPROB-2).
    pub logprobs_mode: Option<String>,
    #[serde(default)]
    pub return_tokens_as_token_ids: bool,
    /// OpenAI's: `{"type": "text" | "json_schema" | "json_object", ..}`.
    pub response_format: Option<Value>,
    /// vLLM's: `{"regex": R}`, `{"json": S}` or `{"choice": [..]}`.
    pub structured_outputs: Option<Value>,
    /// vLLM's older names for the same.
    pub guided_regex: Option<String>,
    pub guided_json: Option<Value>,
    pub guided_choice: Option<Vec<String>>,
}

/// `POST /v1/completions`'s own fields (the rest are [`Common`]).
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct CompletionBody {
    pub prompt: Prompt,
    #[serde(default)]
    pub echo: bool,
    /// Alternatives per token (0 reports the chosen token's alone).
    pub logprobs: Option<i64>,
}

impl CompletionBody {
    pub const FIELDS: &[&str] = &["prompt", "echo", "logprobs"];
}

/// One chat message.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Message {
    pub role: String,
    pub content: String,
    pub name: Option<String>,
}

/// `POST /v1/chat/completions`'s own fields (the rest are [`Common`]).
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct ChatBody {
    pub messages: Vec<Message>,
    /// Chat's name for `max_tokens` (either may be given; this one wins).
    pub max_completion_tokens: Option<i64>,
    pub logprobs: Option<bool>,
    pub top_logprobs: Option<i64>,
}

impl ChatBody {
    pub const FIELDS: &[&str] = &["messages", "max_completion_tokens", "logprobs", "top_logprobs"];
}

/// Parses a JSON object body into an endpoint's own fields `T` (named
/// `own`) and the [`Common`] rest; a syntax error, a wrong type, a missing
/// field or an unknown one is a 400 with serde's words, which name it.
pub fn parse<T: serde::de::DeserializeOwned>(body: &[u8], own: &[&str]) -> Result<(T, Common), ApiError> {
    let invalid = |e: serde_json::Error| ApiError { status: 400, message: format!("invalid request body: {e}"), param: None };
    let mut all: serde_json::Map<String, Value> = serde_json::from_slice(body).map_err(invalid)?;
    let mine: serde_json::Map<String, Value> = own.iter().filter_map(|k| all.remove(*k).map(|v| (k.to_string(), v))).collect();
    let own_fields = serde_json::from_value(Value::Object(mine.clone())).map_err(|e| named(e, &mine, |m| serde_json::from_value::<T>(m).map(drop)))?;
    let common = serde_json::from_value(Value::Object(all.clone())).map_err(|e| named(e, &all, |m| serde_json::from_value::<Common>(m).map(drop)))?;
    Ok((own_fields, common))
}

/// serde's error, with the field at fault named: serde's type errors do not
/// say which field they are about, so each field is tried alone (a missing
/// required field fails every try and keeps serde's own words).
fn named(e: serde_json::Error, fields: &serde_json::Map<String, Value>, parse: impl Fn(Value) -> Result<(), serde_json::Error>) -> ApiError {
    for (k, v) in fields {
        let alone: serde_json::Map<String, Value> = [(k.clone(), v.clone())].into_iter().collect();
        if let Err(one) = parse(Value::Object(alone))
            && !one.to_string().starts_with("missing field")
        {
            return ApiError { status: 400, message: format!("invalid request body: field `{k}`: {one}"), param: Some(k.clone()) };
        }
    }
    ApiError { status: 400, message: format!("invalid request body: {e}"), param: None }
}

/// Stop strings a request may give at most.
pub const MAX_STOP_STRINGS: usize = 16;
/// Bytes of one stop string at most.
pub const MAX_STOP_BYTES: usize = 256;
/// `stop_token_ids` at most.
pub const MAX_STOP_TOKEN_IDS: usize = 64;

/// What a request asks for once validated (everything but the prompt).
#[derive(Debug, Clone, PartialEq)]
pub struct Sampling {
    /// `None`: as many as the context leaves (chat), or 16 (completions, OpenAI's default).
    pub max_tokens: Option<usize>,
    /// Temperature, top-k, top-p, min-p and the penalties (LOGITS-1 .. LOGITS-12).
    pub params: specdec_backend::SamplingParams,
    /// `(id, bias)` pairs (LOGITS-7).
    pub logit_bias: Vec<(u32, f64)>,
    /// `None`: the server draws one (each request its own).
    pub seed: Option<u64>,
    pub stop: Vec<String>,
    pub stop_token_ids: Vec<u32>,
    pub ignore_eos: bool,
    pub speculation: bool,
    pub stream: bool,
    pub include_usage: bool,
    pub return_token_ids: bool,
    /// Set by the endpoint from its own fields ([`logprobs`]).
    pub logprobs: Option<specdec_decoder::LogprobRequest>,
    /// Tokens in logprobs written `token_id:N`.
    pub tokens_as_ids: bool,
    mode: specdec_decoder::LogprobMode,
    /// The constraint the output must match (CONSTRAIN-1), and the field it came from.
    pub constraint: Option<specdec_decoder::ConstraintSpec>,
    pub constraint_param: &'static str,
    /// It compiled over the served model's tokens (by the endpoint, off the runtime).
    pub compiled: Option<specdec_decoder::Constrained>,
}

impl Sampling {
    /// Logprobs with `top` alternatives, asked through `param`: 0 ..= 20
    /// (OpenAI's range), in the request's mode.
    pub fn ask_logprobs(&mut self, top: i64, param: &str) -> Result<(), ApiError> {
        let max = specdec_decoder::MAX_TOP_LOGPROBS;
        let top = usize::try_from(top).ok().filter(|&t| t <= max).ok_or_else(|| ApiError::bad(param, format!("{param} = {top} must be in [0, {max}]")))?;
        self.logprobs = Some(specdec_decoder::LogprobRequest { top, mode: self.mode });
        Ok(())
    }
}

/// Checks the shared fields against the served model (`model_id`, a
/// vocabulary of `vocab`); every out-of-range value is a 400 naming it.
pub fn validate(c: &Common, model_id: &str, vocab: usize) -> Result<Sampling, ApiError> {
    if let Some(m) = &c.model
        && m != model_id
    {
        return Err(ApiError { status: 404, message: format!("the model `{m}` does not exist; this server serves `{model_id}`"), param: Some("model".into()) });
    }
    if let Some(n) = c.n
        && n != 1
    {
        return Err(ApiError::bad("n", format!("n = {n}: only one choice per request is supported")));
    }
    for (name, v) in [("presence_penalty", c.presence_penalty), ("frequency_penalty", c.frequency_penalty)] {
        if let Some(v) = v
            && !(-2.0..=2.0).contains(&v)
        {
            return Err(ApiError::bad(name, format!("{name} = {v:?} must be in [-2, 2]")));
        }
    }
    let penalty_scope = match c.penalty_scope.as_deref() {
        None => specdec_backend::PenaltyScope::Generated,
        Some(name) => specdec_backend::PenaltyScope::from_name(name).ok_or_else(|| ApiError::bad("penalty_scope", format!("penalty_scope = {name:?} must be \"generated\" or \"context\"")))?,
    };
    // Linear in the number of entries: a body may name every id of the vocabulary.
    let mut logit_bias = Vec::new();
    let mut named = std::collections::HashSet::new();
    for (id, &bias) in c.logit_bias.iter().flatten() {
        let parsed = id.parse::<i64>().map_err(|_| ApiError::bad("logit_bias", format!("logit_bias key {id:?} is not a token id")))?;
        let id = ids(&[parsed], vocab, "logit_bias")?[0];
        if !(-100.0..=100.0).contains(&bias) {
            return Err(ApiError::bad("logit_bias", format!("logit_bias[{id}] = {bias:?} must be in [-100, 100]")));
        }
        if !named.insert(id) {
            return Err(ApiError::bad("logit_bias", format!("logit_bias names id {id} twice")));
        }
        logit_bias.push((id, bias));
    }
    let max_tokens = match c.max_tokens {
        None => None,
        Some(m) if m >= 1 => Some(usize::try_from(m).map_err(|_| ApiError::bad("max_tokens", format!("max_tokens = {m} is too large")))?),
        Some(m) => return Err(ApiError::bad("max_tokens", format!("max_tokens = {m} must be at least 1"))),
    };
    let temperature = c.temperature.unwrap_or(1.0);
    if !(temperature.is_finite() && (0.0..=100.0).contains(&temperature)) {
        return Err(ApiError::bad("temperature", format!("temperature = {temperature:?} must be a finite number in [0, 100]")));
    }
    let top_p = c.top_p.unwrap_or(1.0);
    if !(top_p > 0.0 && top_p <= 1.0) {
        return Err(ApiError::bad("top_p", format!("top_p = {top_p:?} must be in (0, 1]")));
    }
    let top_k = match c.top_k {
        None | Some(-1) | Some(0) => 0,
        Some(k) if k > 0 => usize::try_from(k).unwrap_or(usize::MAX).min(vocab),
        Some(k) => return Err(ApiError::bad("top_k", format!("top_k = {k} must be -1 or 0 (every id) or positive"))),
    };
    let seed = c.seed;
    let stop = match &c.stop {
        None => Vec::new(),
        Some(Stop::One(s)) => vec![s.clone()],
        Some(Stop::Many(v)) => v.clone(),
    };
    if stop.len() > MAX_STOP_STRINGS {
        return Err(ApiError::bad("stop", format!("{} stop strings; at most {MAX_STOP_STRINGS}", stop.len())));
    }
    if let Some(s) = stop.iter().find(|s| s.is_empty() || s.len() > MAX_STOP_BYTES) {
        return Err(ApiError::bad("stop", format!("a stop string of {} bytes; each must have 1 to {MAX_STOP_BYTES}", s.len())));
    }
    let stop_token_ids = ids(c.stop_token_ids.as_deref().unwrap_or(&[]), vocab, "stop_token_ids")?;
    if stop_token_ids.len() > MAX_STOP_TOKEN_IDS {
        return Err(ApiError::bad("stop_token_ids", format!("{} stop token ids; at most {MAX_STOP_TOKEN_IDS}", stop_token_ids.len())));
    }
    let params = specdec_backend::SamplingParams {
        min_p: c.min_p.unwrap_or(0.0),
        repetition_penalty: c.repetition_penalty.unwrap_or(1.0),
        presence_penalty: c.presence_penalty.unwrap_or(0.0),
        frequency_penalty: c.frequency_penalty.unwrap_or(0.0),
        penalty_scope,
        ..specdec_backend::SamplingParams::new(temperature, top_k, top_p)
    };
    // The spec's own ranges (LOGITS-1), named by the field they came from.
    params.validate().map_err(|e| match e {
        specdec_backend::SpecError::InvalidParameter { name, value, reason } => ApiError::bad(name, format!("{name} = {value} {reason}")),
        other => ApiError::bad("sampling", other.to_string()),
    })?;
    let mode = match c.logprobs_mode.as_deref() {
        None => specdec_decoder::LogprobMode::Raw,
        Some(m) => specdec_decoder::LogprobMode::from_name(m).ok_or_else(|| ApiError::bad("logprobs_mode", format!("logprobs_mode = {m:?} must be \"raw\" or \"processed\"")))?,
    };
    let (constraint, constraint_param) = constraint(c)?;
    Ok(Sampling {
        constraint,
        constraint_param,
        compiled: None,
        logprobs: None,
        tokens_as_ids: c.return_tokens_as_token_ids,
        mode,
        max_tokens,
        params,
        logit_bias,
        seed,
        stop,
        stop_token_ids,
        ignore_eos: c.ignore_eos,
        speculation: c.speculation.unwrap_or(true),
        stream: c.stream,
        include_usage: c.stream_options.as_ref().is_some_and(|o| o.include_usage),
        return_token_ids: c.return_token_ids,
    })
}

/// The request's constraint, from whichever one field gives it (OpenAI's
/// `response_format`, vLLM's `structured_outputs` or its older `guided_*`),
/// with that field's name; what the subset does not take is a 400 naming it.
fn constraint(c: &Common) -> Result<(Option<specdec_decoder::ConstraintSpec>, &'static str), ApiError> {
    use specdec_decoder::ConstraintSpec;
    let json = |param: &'static str, v: &Value| -> Result<ConstraintSpec, ApiError> {
        match v {
            Value::Object(_) => Ok(ConstraintSpec::JsonSchema(v.clone())),
            Value::String(s) => serde_json::from_str(s).map(ConstraintSpec::JsonSchema).map_err(|e| ApiError::bad(param, format!("{param}: the schema is not JSON: {e}"))),
            _ => Err(ApiError::bad(param, format!("{param}: a JSON schema is an object"))),
        }
    };
    // OpenAI's `json_object`: the schema of a free-form object (CONSTRAIN-5).
    let any_json_object = || ConstraintSpec::JsonSchema(serde_json::json!({"type": "object"}));
    let mut found: Vec<(ConstraintSpec, &'static str)> = Vec::new();
    if let Some(f) = &c.response_format {
        match f.get("type").and_then(Value::as_str) {
            Some("text") => {}
            Some("json_schema") => {
                let schema = f.get("json_schema").and_then(|j| j.get("schema")).ok_or_else(|| ApiError::bad("response_format", "response_format json_schema needs json_schema.schema"))?;
                found.push((json("response_format", schema)?, "response_format"));
            }
            // Any JSON object (CONSTRAIN-5's free-form object, five levels deep at most).
            Some("json_object") => found.push((any_json_object(), "response_format")),
            _ => return Err(ApiError::bad("response_format", "response_format.type must be \"text\", \"json_schema\" or \"json_object\"")),
        }
    }
    if let Some(s) = &c.structured_outputs {
        let obj = s.as_object().ok_or_else(|| ApiError::bad("structured_outputs", "structured_outputs is an object"))?;
        for (key, v) in obj {
            let spec = match (key.as_str(), v) {
                ("regex", Value::String(r)) => ConstraintSpec::Regex(r.clone()),
                ("json", v) => json("structured_outputs", v)?,
                ("choice", Value::Array(items)) => ConstraintSpec::choice(
                    &items
                        .iter()
                        .map(|i| i.as_str().map(str::to_string))
                        .collect::<Option<Vec<_>>>()
                        .ok_or_else(|| ApiError::bad("structured_outputs", "structured_outputs.choice is a list of strings"))?,
                ),
                ("json_object", Value::Bool(true)) => any_json_object(),
                ("json_object", Value::Bool(false)) => continue,
                // A GBNF grammar: its regex where no rule recurses, else context-free (CONSTRAIN-5).
                ("grammar", Value::String(g)) => ConstraintSpec::grammar(g).map_err(|e| ApiError::bad("structured_outputs", format!("structured_outputs.grammar: {e}")))?,
                ("structural_tag", _) => {
                    return Err(ApiError::bad("structured_outputs", "structured_outputs.structural_tag is not supported: give a regex, a json schema, json_object, a grammar or a choice"));
                }
                _ => return Err(ApiError::bad("structured_outputs", format!("structured_outputs.{key} is not a regex string, a json schema, a choice list, a grammar string or json_object: true"))),
            };
            found.push((spec, "structured_outputs"));
        }
    }
    if let Some(r) = &c.guided_regex {
        found.push((ConstraintSpec::Regex(r.clone()), "guided_regex"));
    }
    if let Some(v) = &c.guided_json {
        found.push((json("guided_json", v)?, "guided_json"));
    }
    if let Some(choices) = &c.guided_choice {
        found.push((ConstraintSpec::choice(choices), "guided_choice"));
    }
    match found.len() {
        0 => Ok((None, "response_format")),
        1 => Ok(found.pop().map(|(s, p)| (Some(s), p)).expect("one")),
        _ => Err(ApiError::bad(found[1].1, "one constraint per request: response_format, structured_outputs and guided_* each give one")),
    }
}

/// Token ids from a request: each inside the vocabulary.
pub fn ids(raw: &[i64], vocab: usize, param: &str) -> Result<Vec<u32>, ApiError> {
    raw.iter()
        .enumerate()
        .map(|(i, &t)| if t >= 0 && (t as u64) < vocab as u64 { Ok(t as u32) } else { Err(ApiError::bad(param, format!("{param}[{i}] = {t} is outside the vocabulary of {vocab}"))) })
        .collect()
}
