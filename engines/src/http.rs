//! An engine behind an OpenAI-compatible HTTP server (ENGINE-2): each
//! generation request is one `POST /v1/completions` on token ids, with the
//! extension fields vLLM names (`top_k`, `return_token_ids`,
//! `stop_token_ids`, `ignore_eos`) and specdec's `speculation`.
//!
//! What the contract needs and OpenAI's API lacks, and how it is read:
//! - generated ids: `choices[0].token_ids` (vLLM's `return_token_ids`); a
//!   server that returns text only cannot be checked token for token, and
//!   its replies are refused as a contract breach naming the field;
//! - exact eos ids: sent as `stop_token_ids` with `ignore_eos` (the model's
//!   own eos would otherwise end outputs the reference continues);
//! - eos against stop string: `finish_reason` `stop` with vLLM's
//!   `stop_reason` (an id for an eos, the string for a stop string);
//! - draft counts: `choices[0].draft_tokens` where the server reports them;
//! - the engine's statement (vocabulary, greedy epsilon, batch invariance):
//!   `/v1/models`' `data[0].specdec`, which `specdec serve` publishes; for
//!   another server it is given by the caller.
//!
//! Requests of one call go out concurrently (a server batches them as it
//! sees fit); every reply is validated before a check reads it.

use std::time::Duration;

use serde_json::{Value, json};

use crate::{DraftCounts, EngineError, EngineInfo, Finish, Generation, GenerationEngine, GenerationRequest, validate_outputs};

/// Requests in flight at once.
const IN_FLIGHT: usize = 16;

/// An engine at an HTTP base URL (`http://HOST:PORT`).
pub struct HttpEngine {
    base: String,
    agent: ureq::Agent,
    info: EngineInfo,
}

impl HttpEngine {
    /// Connects to `url` and reads the engine's statement from `/v1/models`
    /// (or takes `statement` when the server publishes none); each request
    /// has `timeout`.
    pub fn connect(url: &str, statement: Option<EngineInfo>, timeout: Duration) -> Result<HttpEngine, EngineError> {
        let base = url.trim_end_matches('/').trim_end_matches("/v1").to_string();
        if !base.starts_with("http://") {
            return Err(EngineError::Failed(format!("`{url}`: only http:// URLs are supported")));
        }
        let agent: ureq::Agent = ureq::Agent::config_builder().timeout_global(Some(timeout)).http_status_as_error(false).build().into();
        let models: Value = get_json(&agent, &format!("{base}/v1/models"))?;
        let published = models.pointer("/data/0/specdec").cloned();
        let info = match (published, statement) {
            (_, Some(given)) => given,
            (Some(v), None) => serde_json::from_value(v).map_err(|e| EngineError::Contract(format!("{base}/v1/models: `data[0].specdec`: {e}")))?,
            (None, None) => return Err(EngineError::NotSupported(format!("{base}/v1/models publishes no engine statement (`data[0].specdec`); give one"))),
        };
        Ok(HttpEngine { base, agent, info })
    }

    fn one(&self, r: &GenerationRequest) -> Result<Generation, EngineError> {
        let mut body = json!({
            "prompt": r.prompt, "max_tokens": r.max_new_tokens, "temperature": r.temperature, "top_p": r.top_p, "seed": r.seed,
            "stop_token_ids": r.eos, "ignore_eos": true, "return_token_ids": true, "speculation": r.speculation,
        });
        if r.top_k > 0 {
            body["top_k"] = json!(r.top_k);
        }
        if !r.stop.is_empty() {
            body["stop"] = json!(r.stop);
        }
        let url = format!("{}/v1/completions", self.base);
        let mut reply = self.agent.post(&url).send_json(&body).map_err(|e| EngineError::Failed(format!("{url}: {e}")))?;
        let status = reply.status().as_u16();
        let text = reply.body_mut().read_to_string().map_err(|e| EngineError::Failed(format!("{url}: reading the reply: {e}")))?;
        let v: Value = serde_json::from_str(&text).map_err(|e| EngineError::Contract(format!("{url} answered {status} with no JSON ({e})")))?;
        if status != 200 {
            let message = v.pointer("/error/message").and_then(Value::as_str).unwrap_or(&text).to_string();
            return Err(if (400..500).contains(&status) { EngineError::Request { index: 0, reason: message } } else { EngineError::Failed(format!("{status}: {message}")) });
        }
        parse_choice(&v)
    }
}

fn get_json(agent: &ureq::Agent, url: &str) -> Result<Value, EngineError> {
    let mut reply = agent.get(url).call().map_err(|e| EngineError::Failed(format!("{url}: {e}")))?;
    if reply.status() != 200 {
        return Err(EngineError::Failed(format!("{url}: status {}", reply.status())));
    }
    let text = reply.body_mut().read_to_string().map_err(|e| EngineError::Failed(format!("{url}: {e}")))?;
    serde_json::from_str(&text).map_err(|e| EngineError::Contract(format!("{url}: {e}")))
}

/// One completion reply as a [`Generation`].
fn parse_choice(v: &Value) -> Result<Generation, EngineError> {
    let bad = |m: String| EngineError::Contract(m);
    let choice = v.pointer("/choices/0").ok_or_else(|| bad("the reply has no `choices[0]`".into()))?;
    let ids = choice.get("token_ids").and_then(Value::as_array).ok_or_else(|| bad("`choices[0].token_ids` is missing: the server does not return ids (`return_token_ids`)".into()))?;
    let tokens = ids.iter().map(|t| t.as_u64().and_then(|t| u32::try_from(t).ok()).ok_or_else(|| bad(format!("`token_ids` holds {t}, not an id")))).collect::<Result<Vec<u32>, _>>()?;
    let finish = match (choice.get("finish_reason").and_then(Value::as_str), choice.get("stop_reason")) {
        (Some("length"), _) => Finish::Length,
        (Some("stop"), Some(Value::String(_))) => Finish::Stop,
        (Some("stop"), _) => Finish::Eos,
        (other, _) => return Err(bad(format!("`finish_reason` {other:?} is not `stop` or `length`"))),
    };
    let drafts = match choice.get("draft_tokens") {
        Some(d) => Some(DraftCounts {
            proposed: d.get("proposed").and_then(Value::as_u64).ok_or_else(|| bad("`draft_tokens.proposed` is not a count".into()))?,
            accepted: d.get("accepted").and_then(Value::as_u64).ok_or_else(|| bad("`draft_tokens.accepted` is not a count".into()))?,
        }),
        None => None,
    };
    Ok(Generation { tokens, finish, drafts })
}

impl GenerationEngine for HttpEngine {
    fn info(&self) -> &EngineInfo {
        &self.info
    }

    fn generate(&mut self, requests: &[GenerationRequest]) -> Result<Vec<Generation>, EngineError> {
        let this: &HttpEngine = self;
        let mut out: Vec<Option<Result<Generation, EngineError>>> = (0..requests.len()).map(|_| None).collect();
        for (chunk, slots) in requests.chunks(IN_FLIGHT).zip(out.chunks_mut(IN_FLIGHT)) {
            std::thread::scope(|s| {
                let handles: Vec<_> = chunk.iter().map(|r| s.spawn(move || this.one(r))).collect();
                for (h, slot) in handles.into_iter().zip(slots.iter_mut()) {
                    *slot = Some(h.join().unwrap_or_else(|_| Err(EngineError::Failed("a request thread panicked".into()))));
                }
            });
        }
        let outputs = out
            .into_iter()
            .enumerate()
            .map(|(i, g)| match g {
                Some(Err(EngineError::Request { reason, .. })) => Err(EngineError::Request { index: i, reason }),
                Some(g) => g,
                None => Err(EngineError::Failed(format!("request {i} got no answer"))),
            })
            .collect::<Result<Vec<_>, _>>()?;
        validate_outputs(&this.info, requests, &outputs)?;
        Ok(outputs)
    }
}
