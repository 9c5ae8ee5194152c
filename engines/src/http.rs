//! An engine behind an HTTP server (ENGINE-2), in one of two dialects.
//!
//! **OpenAI** (`http://HOST:PORT`): each generation request is one
//! `POST /v1/completions` on token ids, with the extension fields vLLM names
//! (`top_k`, `return_token_ids`, `stop_token_ids`, `ignore_eos`) and
//! specdec's `speculation`. What the contract needs and OpenAI's API lacks,
//! and how it is read:
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
//!   another server it is given by the caller;
//! - the processors: OpenAI's `logit_bias` (a map, ids as strings),
//!   `presence_penalty` and `frequency_penalty`, vLLM's `min_p` and
//!   `repetition_penalty`, and ours, `penalty_scope`;
//! - logprobs (LOGPROB-3): `logprobs: N` with vLLM's
//!   `return_tokens_as_token_ids` (tokens written `token_id:N`, so an
//!   alternative is an id, never a string two ids may share) and our
//!   `logprobs_mode` (`raw` or `processed`; vLLM fixes it at start);
//! - a constraint (CONSTRAIN-1): a regex as vLLM's `structured_outputs:
//!   {"regex": R}`, a GBNF grammar as its `{"grammar": G}`, a JSON schema as
//!   OpenAI's `response_format` of type `json_schema`.
//!
//! **llama.cpp's native endpoint** (`llama-cpp+http://HOST:PORT`): one
//! `POST /completion` on token ids with `return_tokens` (ids back in
//! `tokens`), every sampler of its chain the contract does not name set to
//! its neutral value (min-p 0, typical-p 1, penalties off: the server's
//! defaults are not neutral; the contract's min-p, bias pairs and penalties
//! go out as asked, the penalties over the whole context with
//! `repeat_last_n` the prompt's length plus the cap, so a penalty over the generated tokens alone is
//! refused; logprobs through `n_probs`, raw from `top_logprobs` or
//! processed from `post_sampling_probs`' `top_probs`; a JSON schema as its
//! `json_schema`, a regex as its `grammar` (the pattern's GBNF) and a GBNF
//! grammar as itself (its `root` renamed), either followed by an eos id as
//! a token; each lets the model's own end through, which
//! only a finished grammar allows), `stop_type` for the finish reason and
//! `timings.draft_n` / `draft_n_accepted` for the draft counts. What is lost:
//! the server takes no eos ids per request, only its model's own, so the
//! request goes out with `ignore_eos` and the output is cut here after the
//! first eos id; the statement then says `eos_ids: false` and the `eos`
//! check is not supported. Seeds are reduced to its 32 bits (below its
//! "random" value 0xFFFFFFFF).
//!
//! **Speculation fixed at start.** llama.cpp's server (and vLLM's) speculates
//! or not for all its requests, as it was started: `URL,plain=URL` sends the
//! requests with speculation off to a second server of the same engine
//! started without it. Without one, a llama.cpp request with speculation off
//! is not supported (sending it to the speculating server would compare the
//! server with itself, a check that could not fail).
//!
//! Requests of one call go out concurrently (a server batches them as it
//! sees fit); every reply is validated before a check reads it.

use std::time::Duration;

use serde_json::{Value, json};

use specdec_backend::PenaltyScope;
use specdec_decoder::{ConstraintSpec, LogprobMode, TokenLogprob};

use crate::{DraftCounts, EngineError, EngineInfo, Finish, Generation, GenerationEngine, GenerationRequest, validate_outputs};

/// Requests in flight at once.
const IN_FLIGHT: usize = 16;

/// llama.cpp's "random seed" value; request seeds are reduced below it.
const LLAMA_CPP_RANDOM_SEED: u64 = 0xFFFF_FFFF;

/// How requests are written and replies read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dialect {
    /// `POST /v1/completions` with vLLM's extension fields.
    OpenAi,
    /// llama.cpp's `POST /completion`.
    LlamaCpp,
}

/// An engine at an HTTP base URL, with an optional second server for the
/// requests with speculation off.
pub struct HttpEngine {
    base: String,
    plain: Option<String>,
    dialect: Dialect,
    /// llama.cpp: whether the first server speculates (its `/slots` say so), so
    /// that a reply without `draft_n` counts zero drafts rather than none.
    speculates: bool,
    agent: ureq::Agent,
    info: EngineInfo,
}

/// `URL[,plain=URL]`, each `http://HOST:PORT` or `llama-cpp+http://HOST:PORT`
/// (both of one dialect), as the base URLs and the dialect.
pub fn parse_http_engine(spec: &str) -> Result<(Dialect, String, Option<String>), String> {
    let one = |url: &str| -> Result<(Dialect, String), String> {
        let (dialect, rest) = match url.strip_prefix("llama-cpp+") {
            Some(rest) => (Dialect::LlamaCpp, rest),
            None => (Dialect::OpenAi, url),
        };
        let host = rest.strip_prefix("http://").ok_or_else(|| format!("`{url}`: expected http://HOST:PORT or llama-cpp+http://HOST:PORT (only http:// is supported)"))?;
        if host.trim_end_matches('/').is_empty() {
            return Err(format!("`{url}`: no host"));
        }
        Ok((dialect, rest.trim_end_matches('/').trim_end_matches("/v1").to_string()))
    };
    let (main, plain) = match spec.split_once(',') {
        Some((main, rest)) => (main, Some(rest.strip_prefix("plain=").ok_or_else(|| format!("`{spec}`: after the comma, expected plain=URL"))?)),
        None => (spec, None),
    };
    let (dialect, base) = one(main)?;
    let plain = match plain {
        Some(p) => {
            let (d, b) = one(p)?;
            if d != dialect {
                return Err(format!("`{spec}`: the plain server must speak the same dialect as the first"));
            }
            Some(b)
        }
        None => None,
    };
    Ok((dialect, base, plain))
}

impl HttpEngine {
    /// Connects to the servers of `spec` ([`parse_http_engine`]) and reads
    /// the engine's statement from `/v1/models` (or takes `statement` when
    /// the server publishes none); each request has `timeout`.
    pub fn connect(spec: &str, statement: Option<EngineInfo>, timeout: Duration) -> Result<HttpEngine, EngineError> {
        let (dialect, base, plain) = parse_http_engine(spec).map_err(EngineError::Failed)?;
        let agent: ureq::Agent = ureq::Agent::config_builder().timeout_global(Some(timeout)).http_status_as_error(false).build().into();
        let models: Value = get_json(&agent, &format!("{base}/v1/models"))?;
        if let Some(p) = &plain {
            get_json(&agent, &format!("{p}/v1/models"))?;
        }
        let published = models.pointer("/data/0/specdec").cloned();
        let mut info: EngineInfo = match (published, statement) {
            (_, Some(given)) => given,
            (Some(v), None) => serde_json::from_value(v).map_err(|e| EngineError::Contract(format!("{base}/v1/models: `data[0].specdec`: {e}")))?,
            (None, None) => return Err(EngineError::NotSupported(format!("{base}/v1/models publishes no engine statement (`data[0].specdec`); give one"))),
        };
        let mut speculates = false;
        if dialect == Dialect::LlamaCpp {
            // What the transport can do, whatever the statement says (module doc).
            info.eos_ids = false;
            let slots = get_json(&agent, &format!("{base}/slots"))?;
            speculates = slots.pointer("/0/speculative").and_then(Value::as_bool).ok_or_else(|| EngineError::Contract(format!("{base}/slots: no `[0].speculative`")))?;
        }
        Ok(HttpEngine { base, plain, dialect, speculates, agent, info })
    }

    /// The server a request goes to.
    fn server(&self, r: &GenerationRequest) -> Result<&str, EngineError> {
        match (&self.plain, r.speculation, self.dialect) {
            (Some(plain), false, _) => Ok(plain),
            (None, false, Dialect::LlamaCpp) => Err(EngineError::NotSupported("llama.cpp's server speculates as it was started: give a second server without speculation (`URL,plain=URL`)".into())),
            _ => Ok(&self.base),
        }
    }

    /// Where a request goes and what is sent: every request of a call is
    /// prepared before any is sent, so a refused one stops the call unsent.
    fn prepare(&self, r: &GenerationRequest) -> Result<(String, Value), EngineError> {
        let base = self.server(r)?;
        Ok(match self.dialect {
            Dialect::OpenAi => (format!("{base}/v1/completions"), openai_body(r)),
            Dialect::LlamaCpp => (format!("{base}/completion"), llama_cpp_body(r)?),
        })
    }

    fn one(&self, r: &GenerationRequest, (url, body): &(String, Value)) -> Result<Generation, EngineError> {
        let mut reply = self.agent.post(url).send_json(body).map_err(|e| EngineError::Failed(format!("{url}: {e}")))?;
        let status = reply.status().as_u16();
        let text = reply.body_mut().read_to_string().map_err(|e| EngineError::Failed(format!("{url}: reading the reply: {e}")))?;
        let v: Value = serde_json::from_str(&text).map_err(|e| EngineError::Contract(format!("{url} answered {status} with no JSON ({e})")))?;
        if status != 200 {
            let message = v.pointer("/error/message").and_then(Value::as_str).unwrap_or(&text).to_string();
            return Err(if (400..500).contains(&status) { EngineError::Request { index: 0, reason: message } } else { EngineError::Failed(format!("{status}: {message}")) });
        }
        match self.dialect {
            Dialect::OpenAi => parse_choice(&v, r),
            Dialect::LlamaCpp => parse_llama_cpp(&v, r, self.speculates && r.speculation),
        }
    }
}

fn openai_body(r: &GenerationRequest) -> Value {
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
    // OpenAI's fields, vLLM's `min_p` and `repetition_penalty`, and ours:
    // `penalty_scope` (OpenAI counts presence and frequency over the
    // generated tokens) and `logprobs_mode` (vLLM fixes it at start).
    if r.min_p != 0.0 {
        body["min_p"] = json!(r.min_p);
    }
    if !r.logit_bias.is_empty() {
        body["logit_bias"] = Value::Object(r.logit_bias.iter().map(|(id, b)| (id.to_string(), json!(b))).collect());
    }
    for (name, value, neutral) in [("repetition_penalty", r.repetition_penalty, 1.0), ("presence_penalty", r.presence_penalty, 0.0), ("frequency_penalty", r.frequency_penalty, 0.0)] {
        if value != neutral {
            body[name] = json!(value);
        }
    }
    if r.params().penalised() {
        body["penalty_scope"] = json!(r.penalty_scope.name());
    }
    if let Some(ask) = r.logprobs {
        body["logprobs"] = json!(ask.top);
        body["logprobs_mode"] = json!(ask.mode.name());
        body["return_tokens_as_token_ids"] = json!(true);
    }
    // A regex or a grammar as vLLM's `structured_outputs`, a schema as OpenAI's `response_format`.
    match &r.constraint {
        Some(ConstraintSpec::Regex(re)) => body["structured_outputs"] = json!({"regex": re}),
        Some(ConstraintSpec::Grammar(g)) => body["structured_outputs"] = json!({"grammar": g}),
        Some(ConstraintSpec::JsonSchema(s)) => body["response_format"] = json!({"type": "json_schema", "json_schema": {"name": "specdec", "schema": s, "strict": true}}),
        None => {}
    }
    body
}

/// llama.cpp's native request: every sampler the contract does not name
/// neutral (its defaults are top-k 40, top-p 0.95, min-p 0.05, T 0.8). Its
/// penalties count the last `repeat_last_n` tokens of the context, prompt
/// included (sent as the whole context; its server refuses -1), so a
/// request whose penalties count the generated tokens alone is refused.
fn llama_cpp_body(r: &GenerationRequest) -> Result<Value, EngineError> {
    if r.params().penalised() && r.penalty_scope != PenaltyScope::Context {
        return Err(EngineError::Request { index: 0, reason: "llama.cpp's penalties count the prompt too: the `generated` penalty scope cannot be asked of it".into() });
    }
    // The whole context: its server refuses -1 (which once meant the context size).
    let context = r.prompt.len() + r.max_new_tokens;
    let mut body = json!({
        "prompt": r.prompt, "n_predict": r.max_new_tokens, "temperature": r.temperature, "top_k": r.top_k, "top_p": r.top_p,
        "min_p": r.min_p, "typical_p": 1.0, "repeat_penalty": r.repetition_penalty, "repeat_last_n": context,
        "presence_penalty": r.presence_penalty, "frequency_penalty": r.frequency_penalty,
        "dry_multiplier": 0.0, "xtc_probability": 0.0, "top_n_sigma": -1.0, "mirostat": 0, "dynatemp_range": 0.0,
        "seed": r.seed % LLAMA_CPP_RANDOM_SEED, "ignore_eos": true, "return_tokens": true, "stream": false, "stop": r.stop,
        "logit_bias": r.logit_bias.iter().map(|(id, b)| json!([id, b])).collect::<Vec<_>>(),
    });
    // A finished grammar lets only the model's own end through, which
    // `ignore_eos` bans (its server then fails the request): a constrained
    // request lets it through, and it can come only once the grammar is done.
    match &r.constraint {
        Some(ConstraintSpec::JsonSchema(s)) => {
            body["json_schema"] = s.clone();
            body["ignore_eos"] = json!(false);
        }
        Some(ConstraintSpec::Regex(pattern)) => {
            body["grammar"] = json!(llama_cpp_grammar(&Constrained::Regex(pattern), &r.eos)?);
            body["ignore_eos"] = json!(false);
        }
        Some(ConstraintSpec::Grammar(g)) => {
            body["grammar"] = json!(llama_cpp_grammar(&Constrained::Grammar(g), &r.eos)?);
            body["ignore_eos"] = json!(false);
        }
        None => {}
    }
    if let Some(ask) = r.logprobs {
        // `n_probs` 0 reports nothing; the alternatives are cut to `top` on reading.
        body["n_probs"] = json!(ask.top.max(1));
        body["post_sampling_probs"] = json!(ask.mode == LogprobMode::Processed);
    }
    Ok(body)
}

/// A constraint llama.cpp's server takes as a grammar.
enum Constrained<'a> {
    Regex(&'a str),
    Grammar(&'a str),
}

/// A regex or grammar constraint as llama.cpp's grammar (its server takes no
/// regexes): the pattern's GBNF (a grammar's rules written again, its `root`
/// renamed), then one of the request's eos ids as a token (`<[id]>`,
/// matched by id, never by its text), so an eos is allowed exactly where the
/// output matches (CONSTRAIN-2). With no eos id the output could not end
/// where it matches, so the request is refused.
fn llama_cpp_grammar(c: &Constrained, eos: &[u32]) -> Result<String, EngineError> {
    let refuse = |reason: String| EngineError::Request { index: 0, reason };
    if eos.is_empty() {
        return Err(refuse("a regex or grammar constraint asked of llama.cpp's server needs an eos id to end where the output matches".into()));
    }
    let ends = eos.iter().map(|id| format!("<[{id}]>")).collect::<Vec<_>>().join(" | ");
    match c {
        Constrained::Regex(pattern) => {
            let expression = specdec_decoder::gbnf_from_regex(pattern).map_err(|e| refuse(e.to_string()))?;
            Ok(format!("root ::= ({expression}) ({ends})"))
        }
        Constrained::Grammar(g) => specdec_decoder::gbnf_with_end(g, &ends).map_err(|e| refuse(e.to_string())),
    }
}

/// One `/completion` reply as a [`Generation`], cut after the first of the
/// request's eos ids (module doc); `counted`: a speculating server answered
/// it, whose `timings` lack `draft_n` when it drafted nothing.
fn parse_llama_cpp(v: &Value, r: &GenerationRequest, counted: bool) -> Result<Generation, EngineError> {
    let bad = |m: String| EngineError::Contract(m);
    let ids = v.get("tokens").and_then(Value::as_array).ok_or_else(|| bad("`tokens` is missing: the server does not return ids (`return_tokens`)".into()))?;
    let mut tokens = ids.iter().map(|t| t.as_u64().and_then(|t| u32::try_from(t).ok()).ok_or_else(|| bad(format!("`tokens` holds {t}, not an id")))).collect::<Result<Vec<u32>, _>>()?;
    let mut finish = match v.get("stop_type").and_then(Value::as_str) {
        Some("limit") => Finish::Length,
        Some("word") => Finish::Stop,
        Some("eos") => Finish::Eos,
        other => return Err(bad(format!("`stop_type` {other:?} is not `limit`, `word` or `eos`"))),
    };
    let mut logprobs = match r.logprobs {
        Some(ask) => Some(llama_cpp_logprobs(v, ask.top)?),
        None => None,
    };
    if let Some(i) = tokens.iter().position(|t| r.eos.contains(t)) {
        tokens.truncate(i + 1);
        if let Some(l) = logprobs.as_mut() {
            l.truncate(i + 1);
        }
        finish = Finish::Eos;
    }
    let drafts = match (counted, v.get("timings")) {
        (true, Some(t)) => {
            let count = |name: &str| match t.get(name) {
                None => Ok(0),
                Some(n) => n.as_u64().ok_or_else(|| bad(format!("`timings.{name}` is not a count"))),
            };
            Some(DraftCounts { proposed: count("draft_n")?, accepted: count("draft_n_accepted")? })
        }
        _ => None,
    };
    Ok(Generation { tokens, finish, drafts, logprobs })
}

/// llama.cpp's `completion_probabilities`: per token `id` and `logprob` with
/// `top_logprobs` (raw), or `prob` with `top_probs` (`post_sampling_probs`);
/// the alternatives cut to the `top` asked.
fn llama_cpp_logprobs(v: &Value, top: usize) -> Result<Vec<TokenLogprob>, EngineError> {
    let bad = |m: String| EngineError::Contract(m);
    let probs = v.get("completion_probabilities").and_then(Value::as_array).ok_or_else(|| bad("`completion_probabilities` is missing (`n_probs`)".into()))?;
    let one = |e: &Value| -> Result<(u32, f64), EngineError> {
        let id = e.get("id").and_then(Value::as_u64).and_then(|t| u32::try_from(t).ok()).ok_or_else(|| bad(format!("a probability entry has no `id`: {e}")))?;
        let lp = match (e.get("logprob").and_then(Value::as_f64), e.get("prob").and_then(Value::as_f64)) {
            (Some(lp), _) => lp,
            (None, Some(p)) => p.ln(),
            _ => return Err(bad(format!("a probability entry has neither `logprob` nor `prob`: {e}"))),
        };
        Ok((id, lp))
    };
    probs
        .iter()
        .map(|e| {
            let (id, logprob) = one(e)?;
            let alts = e.get("top_logprobs").or_else(|| e.get("top_probs")).and_then(Value::as_array).ok_or_else(|| bad(format!("a probability entry has no `top_logprobs`: {e}")))?;
            let top = sorted_top(alts.iter().map(one).collect::<Result<Vec<_>, _>>()?, top);
            Ok(TokenLogprob { id, logprob, top })
        })
        .collect()
}

/// Alternatives in LOGPROB-3's order (logprob descending, then id), the first `n`.
fn sorted_top(mut top: Vec<(u32, f64)>, n: usize) -> Vec<(u32, f64)> {
    top.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
    top.truncate(n);
    top
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
fn parse_choice(v: &Value, r: &GenerationRequest) -> Result<Generation, EngineError> {
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
    let logprobs = match choice.get("logprobs") {
        Some(l) if !l.is_null() => Some(openai_logprobs(l, r.logprobs.map_or(0, |a| a.top))?),
        _ => None,
    };
    Ok(Generation { tokens, finish, drafts, logprobs })
}

/// A completion's `logprobs` (`tokens`, `token_logprobs`, `top_logprobs`),
/// its tokens written `token_id:N` (vLLM's `return_tokens_as_token_ids`).
fn openai_logprobs(l: &Value, top: usize) -> Result<Vec<TokenLogprob>, EngineError> {
    let bad = |m: String| EngineError::Contract(m);
    let id = |s: &str| s.strip_prefix("token_id:").and_then(|n| n.parse::<u32>().ok()).ok_or_else(|| bad(format!("logprobs token {s:?} is not written `token_id:N` (`return_tokens_as_token_ids`)")));
    let list = |name: &str| l.get(name).and_then(Value::as_array).ok_or_else(|| bad(format!("`logprobs.{name}` is missing or not a list")));
    let (tokens, values, tops) = (list("tokens")?, list("token_logprobs")?, list("top_logprobs")?);
    if values.len() != tokens.len() || tops.len() != tokens.len() {
        return Err(bad(format!("`logprobs` lists {} tokens, {} logprobs and {} top lists", tokens.len(), values.len(), tops.len())));
    }
    let mut out = Vec::with_capacity(tokens.len());
    for ((t, v), alts) in tokens.iter().zip(values).zip(tops) {
        let token = id(t.as_str().ok_or_else(|| bad(format!("logprobs token {t} is not a string")))?)?;
        let logprob = v.as_f64().ok_or_else(|| bad(format!("token logprob {v} is not a number")))?;
        let alts = alts.as_object().ok_or_else(|| bad(format!("a top_logprobs entry {alts} is not an object")))?;
        let alts = alts.iter().map(|(k, v)| Ok((id(k)?, v.as_f64().ok_or_else(|| bad(format!("top logprob {v} is not a number")))?))).collect::<Result<Vec<_>, EngineError>>()?;
        out.push(TokenLogprob { id: token, logprob, top: sorted_top(alts, top) });
    }
    Ok(out)
}

impl GenerationEngine for HttpEngine {
    fn info(&self) -> &EngineInfo {
        &self.info
    }

    fn generate(&mut self, requests: &[GenerationRequest]) -> Result<Vec<Generation>, EngineError> {
        let this: &HttpEngine = self;
        let prepared = requests
            .iter()
            .enumerate()
            .map(|(i, r)| match this.prepare(r) {
                Err(EngineError::Request { reason, .. }) => Err(EngineError::Request { index: i, reason }),
                other => other,
            })
            .collect::<Result<Vec<_>, _>>()?;
        let mut out: Vec<Option<Result<Generation, EngineError>>> = (0..requests.len()).map(|_| None).collect();
        let pairs: Vec<_> = requests.iter().zip(&prepared).collect();
        for (chunk, slots) in pairs.chunks(IN_FLIGHT).zip(out.chunks_mut(IN_FLIGHT)) {
            std::thread::scope(|s| {
                let handles: Vec<_> = chunk.iter().map(|&(r, p)| s.spawn(move || this.one(r, p))).collect();
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
