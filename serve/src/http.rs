//! The HTTP side: axum handlers, one small function per endpoint.
//!
//! A handler validates its body (a 4xx naming the problem, before the
//! engine sees anything), turns it into a decoder [`Request`], sends it to
//! the engine thread with a channel for its events, and answers from those
//! events: one JSON body, or server-sent events as tokens arrive. Dropping
//! the events' receiver (a client gone mid-request or mid-stream) is how
//! the engine learns to free the slot; a stream's handler also watches its
//! client while the request waits for a slot, so a client that leaves a
//! queued stream costs no prefill.
//!
//! Before a body is read: `Content-Type: application/json` on the JSON
//! endpoints (415), and, without an API key, a `Host` that names this
//! server (an IP address, `localhost`, or the `--host` name; 403), so that
//! a web page elsewhere cannot drive a local server through DNS rebinding.
//! The body must arrive within the body timeout (408); parsing, validation
//! and tokenization run on the blocking pool, off the async workers.

use std::convert::Infallible;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::Sender;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use axum::Router;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, FromRequest, Request as HttpRequest, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use rand::{RngExt, SeedableRng};
use serde_json::{Value, json};
use specdec_decoder::{Acceptance, FinishReason, Request, TokenLogprob};
use tokio::sync::mpsc::{UnboundedReceiver, unbounded_channel};

use crate::api::{self, ApiError, ChatBody, CompletionBody, Prompt, Sampling};
use crate::metrics::Metrics;
use crate::scheduler::{Event, Job, Msg};
use crate::text::{Codec, cut_at_stop, first_stop, sendable};

/// What every handler shares.
pub struct AppState {
    pub engine: Mutex<Sender<Msg>>,
    pub model_id: String,
    pub codec: Arc<Codec>,
    pub vocab: usize,
    /// Prompt and generated tokens of one request at most.
    pub context: usize,
    /// The model's eos ids (a request's `ignore_eos` drops them).
    pub eos: Vec<u32>,
    pub metrics: Arc<Metrics>,
    pub api_key: Option<String>,
    /// What `/v1/models` says of the engine (the engine checks read it).
    pub statement: Value,
    pub next_id: AtomicU64,
    /// Seeds for requests that give none: each request its own.
    pub seeds: Mutex<rand_pcg::Pcg64>,
    /// A `Host` name accepted besides IP addresses and `localhost` (the bound `--host`).
    pub allowed_host: String,
    /// A request body must arrive within this once its head has.
    pub body_timeout: Duration,
    /// Special-token strings in user text encode as control tokens (opted into).
    pub special_tokens_in_text: bool,
    /// Constraints compiled over the model's tokens, kept by spec, where
    /// the tokenizer has a byte reading (CONSTRAIN-2 needs it).
    pub constraints: Option<specdec_decoder::ConstraintCache>,
}

impl AppState {
    fn send(&self, job: Job) -> Result<(), ApiError> {
        let tx = self.engine.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        tx.send(Msg::Job(Box::new(job))).map_err(|_| ApiError::status(503, "the engine has stopped"))
    }

    fn seed(&self) -> u64 {
        self.seeds.lock().unwrap_or_else(std::sync::PoisonError::into_inner).random()
    }
}

/// A fresh seed source for unseeded requests (the clock: a server is not reproducible run to run unless asked).
pub fn seed_source() -> Mutex<rand_pcg::Pcg64> {
    let nanos = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos());
    Mutex::new(rand_pcg::Pcg64::seed_from_u64(nanos as u64 ^ u64::from(std::process::id())))
}

/// The router: `/v1/completions`, `/v1/chat/completions`, `/v1/models`,
/// `/health`, `/metrics`; bodies over `max_body` bytes are a 413.
pub fn router(state: Arc<AppState>, max_body: usize) -> Router {
    Router::new()
        .route("/v1/completions", post(completions))
        .route("/v1/chat/completions", post(chat))
        .route("/v1/models", get(models))
        .route("/metrics", get(metrics))
        .route("/health", get(|| async { "ok" }))
        .fallback(|| async { error(ApiError::status(404, "no such endpoint")) })
        .method_not_allowed_fallback(|| async { error(ApiError::status(405, "method not allowed on this endpoint")) })
        .layer(middleware::from_fn_with_state(Arc::clone(&state), auth))
        .layer(DefaultBodyLimit::max(max_body))
        .with_state(state)
}

/// `--api-key`: every endpoint but `/health` wants `Authorization: Bearer
/// KEY`. Without a key, the `Host` must name this server ([`host_allowed`]).
async fn auth(State(s): State<Arc<AppState>>, headers: HeaderMap, req: HttpRequest, next: Next) -> Response {
    if req.uri().path() == "/health" {
        return next.run(req).await;
    }
    match &s.api_key {
        Some(key) => {
            let given = headers.get(header::AUTHORIZATION).and_then(|v| v.to_str().ok()).and_then(|v| v.strip_prefix("Bearer ")).unwrap_or("");
            if !constant_time_eq(given.as_bytes(), key.as_bytes()) {
                return error(ApiError::status(401, "missing or wrong API key (Authorization: Bearer KEY)"));
            }
        }
        None => {
            let host = headers.get(header::HOST).map(|h| String::from_utf8_lossy(h.as_bytes()).to_string());
            if !host.as_deref().is_some_and(|h| host_allowed(h, &s.allowed_host)) {
                let host = host.map_or("no Host header".to_string(), |h| format!("Host `{h}`"));
                let why = "a server without an API key answers only requests addressed to an IP address, localhost or its --host name (set --api-key to serve other names)";
                return error(ApiError::status(403, format!("{host}: {why}")));
            }
        }
    }
    next.run(req).await
}

/// Whether a `Host` header (`name[:port]`) names this server: an IP
/// address, `localhost`, or `bound` (the `--host` it was given). A DNS
/// rebinding page sends its own domain name, which none of these is.
pub fn host_allowed(host: &str, bound: &str) -> bool {
    let is_port = |p: &str| p.is_empty() || (p.len() <= 5 && p.bytes().all(|b| b.is_ascii_digit()));
    let name = match host.strip_prefix('[') {
        Some(v6) => match v6.split_once(']') {
            Some((addr, rest)) if rest.is_empty() || rest.strip_prefix(':').is_some_and(is_port) => addr,
            _ => return false,
        },
        None => match host.rsplit_once(':') {
            Some((name, port)) if is_port(port) => name,
            Some(_) => return false,
            None => host,
        },
    };
    // A fully qualified name may end in a dot.
    let name = name.strip_suffix('.').unwrap_or(name);
    !name.is_empty() && (name.parse::<std::net::IpAddr>().is_ok() || name.eq_ignore_ascii_case("localhost") || name.eq_ignore_ascii_case(bound))
}

#[cfg(test)]
mod tests {
    use super::host_allowed;

    #[test]
    fn hosts_that_name_the_server_and_hosts_that_do_not() {
        for host in ["127.0.0.1", "127.0.0.1:8000", "localhost:8000", "LOCALHOST", "localhost.:80", "[::1]", "[::1]:8000", "10.0.0.5:8000", "myhost:8000"] {
            assert!(host_allowed(host, "myhost"), "{host}");
        }
        for host in ["evil.example", "evil.example:8000", "localhost.evil.example", "[::1]evil", "[::1]:80x", "127.0.0.1:99999999", "", "127.0.0.1:80:80"] {
            assert!(!host_allowed(host, "myhost"), "{host}");
        }
    }
}

/// Compares secrets without an early exit on the first differing byte.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

fn error(e: ApiError) -> Response {
    let status = StatusCode::from_u16(e.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    (status, axum::Json(e.body())).into_response()
}

async fn models(State(s): State<Arc<AppState>>) -> Response {
    axum::Json(json!({"object": "list", "data": [{"id": s.model_id, "object": "model", "created": now(), "owned_by": "specdec", "max_model_len": s.context, "specdec": s.statement}]})).into_response()
}

async fn metrics(State(s): State<Arc<AppState>>) -> Response {
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], s.metrics.render()).into_response()
}

/// Which endpoint a response answers, and its object names.
#[derive(Clone, Copy)]
enum Kind {
    Completion,
    Chat,
}

impl Kind {
    /// The request field the prompt came from.
    fn prompt_field(self) -> &'static str {
        match self {
            Kind::Completion => "prompt",
            Kind::Chat => "messages",
        }
    }

    /// What an empty prompt is told.
    fn no_tokens(self) -> &'static str {
        match self {
            Kind::Completion => "the prompt has no tokens",
            Kind::Chat => "the messages give a prompt of no tokens",
        }
    }

    fn name(self) -> &'static str {
        match self {
            Kind::Completion => "completions",
            Kind::Chat => "chat_completions",
        }
    }
}

async fn completions(State(s): State<Arc<AppState>>, req: HttpRequest) -> Response {
    let kind = Kind::Completion;
    let prepared = match json_body(&s, req).await {
        Ok(body) => off_the_runtime(&s, move |s| completion_prompt(s, &body)).await,
        Err(e) => Err(e),
    };
    answer(&s, kind, prepared).await
}

/// A completion body's prompt ids and sampling.
fn completion_prompt(s: &AppState, body: &[u8]) -> Result<(Vec<u32>, Sampling), ApiError> {
    let (own, common) = api::parse::<CompletionBody>(body, CompletionBody::FIELDS)?;
    let mut sampling = api::validate(&common, &s.model_id, s.vocab)?;
    if own.echo {
        return Err(ApiError::bad("echo", "echo is not supported"));
    }
    if let Some(top) = own.logprobs {
        sampling.ask_logprobs(top, "logprobs")?;
    }
    compile_constraint(s, &mut sampling)?;
    let text = |t: &str| s.codec.encode_text(t, s.special_tokens_in_text).map_err(|e| ApiError::bad("prompt", e));
    let prompt = match own.prompt {
        Prompt::Text(t) => text(&t)?,
        Prompt::Ids(ids) => api::ids(&ids, s.vocab, "prompt")?,
        Prompt::Texts(t) if t.len() == 1 => text(&t[0])?,
        Prompt::IdLists(l) if l.len() == 1 => api::ids(&l[0], s.vocab, "prompt")?,
        _ => return Err(ApiError::bad("prompt", "a list of several prompts: send one prompt per request")),
    };
    Ok((prompt, sampling))
}

async fn chat(State(s): State<Arc<AppState>>, req: HttpRequest) -> Response {
    let kind = Kind::Chat;
    let prepared = match json_body(&s, req).await {
        Ok(body) => off_the_runtime(&s, move |s| chat_prompt(s, &body)).await,
        Err(e) => Err(e),
    };
    answer(&s, kind, prepared).await
}

/// A chat body's prompt ids and sampling: the template's control tokens,
/// the contents as text (unless the server opted into the old behaviour).
fn chat_prompt(s: &AppState, body: &[u8]) -> Result<(Vec<u32>, Sampling), ApiError> {
    let (own, mut common) = api::parse::<ChatBody>(body, ChatBody::FIELDS)?;
    if own.max_completion_tokens.is_some() {
        common.max_tokens = own.max_completion_tokens;
    }
    let mut sampling = api::validate(&common, &s.model_id, s.vocab)?;
    match (own.logprobs, own.top_logprobs) {
        (Some(true), top) => sampling.ask_logprobs(top.unwrap_or(0), "top_logprobs")?,
        (_, Some(_)) => return Err(ApiError::bad("top_logprobs", "top_logprobs needs logprobs: true")),
        _ => {}
    }
    if own.messages.is_empty() {
        return Err(ApiError::bad("messages", "no messages"));
    }
    compile_constraint(s, &mut sampling)?;
    let turns: Vec<(&str, &str)> = own.messages.iter().map(|m| (m.role.as_str(), m.content.as_str())).collect();
    let prompt = s.codec.chat_ids(&turns, s.special_tokens_in_text).map_err(|e| ApiError::bad("messages", e))?;
    Ok((prompt, sampling))
}

/// Compiles the request's constraint over the model's tokens (CONSTRAIN-2),
/// here, off the async runtime: a hostile pattern's DFA may cost up to its
/// size limit, and must not hold a thread that answers other clients.
fn compile_constraint(s: &AppState, p: &mut Sampling) -> Result<(), ApiError> {
    p.compiled = match (&p.constraint, &s.constraints) {
        (None, _) => None,
        (Some(_), None) => return Err(ApiError::bad(p.constraint_param, "this server's tokenizer has no byte reading, so it takes no constraints")),
        (Some(spec), Some(cache)) => Some(cache.get(spec).map_err(|e| ApiError::bad(p.constraint_param, e.to_string()))?),
    };
    Ok(())
}

/// A JSON endpoint's body: `Content-Type: application/json` (415), within
/// the size limit (413) and the body timeout (408).
async fn json_body(s: &AppState, req: HttpRequest) -> Result<Bytes, ApiError> {
    let content_type = req.headers().get(header::CONTENT_TYPE).map(|v| String::from_utf8_lossy(v.as_bytes()).to_string());
    let essence = content_type.as_deref().map(|t| t.split(';').next().unwrap_or("").trim().to_ascii_lowercase());
    if essence.as_deref() != Some("application/json") {
        let given = content_type.map_or("none".to_string(), |t| format!("`{t}`"));
        return Err(ApiError::status(415, format!("Content-Type must be application/json (given: {given})")));
    }
    match tokio::time::timeout(s.body_timeout, Bytes::from_request(req, &())).await {
        Ok(body) => body.map_err(rejected),
        Err(_) => Err(ApiError::status(408, format!("the request body did not arrive within {} s", s.body_timeout.as_secs_f64()))),
    }
}

/// Runs `f` on the blocking pool: parsing a large body, validating it and
/// tokenizing its prompt must not hold an async worker (`/health` and the
/// streams run there).
async fn off_the_runtime<T: Send + 'static>(s: &Arc<AppState>, f: impl FnOnce(&AppState) -> Result<T, ApiError> + Send + 'static) -> Result<T, ApiError> {
    let s = Arc::clone(s);
    tokio::task::spawn_blocking(move || f(&s)).await.unwrap_or_else(|e| Err(ApiError::status(500, format!("reading the request failed: {e}"))))
}

fn rejected(r: BytesRejection) -> ApiError {
    ApiError::status(r.status().as_u16(), format!("request body: {}", r.body_text()))
}

/// Builds the decoder request, sends it, and answers (streamed or not).
async fn answer(s: &Arc<AppState>, kind: Kind, prepared: Result<(Vec<u32>, Sampling), ApiError>) -> Response {
    let arrived = Instant::now();
    let built = prepared.and_then(|(prompt, sampling)| {
        let request = request(s, kind, prompt, &sampling)?;
        let (tx, rx) = unbounded_channel();
        s.send(Job { request: request.clone(), events: tx, arrived })?;
        Ok((request, sampling, rx))
    });
    let (request, sampling, rx) = match built {
        Ok(x) => x,
        Err(e) => {
            s.metrics.request(kind.name(), e.status);
            return error(e);
        }
    };
    let head = Head { id: format!("{}-{}", if matches!(kind, Kind::Chat) { "chatcmpl" } else { "cmpl" }, s.next_id.fetch_add(1, Ordering::Relaxed)), created: now(), kind };
    if sampling.stream {
        s.metrics.request(kind.name(), 200);
        return stream(Arc::clone(s), head, request, sampling, rx);
    }
    let response = whole(s, &head, &request, &sampling, rx).await;
    s.metrics.request(kind.name(), response.status().as_u16());
    response
}

/// The decoder request of a validated body: eos from the model unless
/// `ignore_eos`, plus `stop_token_ids`; the context checked.
fn request(s: &AppState, kind: Kind, prompt: Vec<u32>, p: &Sampling) -> Result<Request, ApiError> {
    let field = kind.prompt_field();
    if prompt.is_empty() {
        return Err(ApiError::bad(field, kind.no_tokens()));
    }
    if prompt.len() >= s.context {
        return Err(ApiError::bad(field, format!("the prompt has {} tokens; this model's context is {} tokens", prompt.len(), s.context)));
    }
    let room = s.context - prompt.len();
    let max_tokens = match (p.max_tokens, kind) {
        (Some(m), _) if m > room => {
            return Err(ApiError::bad("max_tokens", format!("this model's context is {} tokens; the prompt has {} and max_tokens asks {m} more", s.context, prompt.len())));
        }
        (Some(m), _) => m,
        (None, Kind::Completion) => 16.min(room),
        (None, Kind::Chat) => room,
    };
    let mut eos = if p.ignore_eos { Vec::new() } else { s.eos.clone() };
    eos.extend(p.stop_token_ids.iter().filter(|t| !s.eos.contains(t) || p.ignore_eos));
    eos.dedup();
    let constraint = p.compiled.clone();
    if constraint.is_some() && eos.is_empty() {
        return Err(ApiError::bad("ignore_eos", "a constrained output ends with an eos at a match: ignore_eos with no stop_token_ids leaves it none"));
    }
    Ok(Request {
        constraint,
        sampling: p.params,
        logit_bias: p.logit_bias.clone(),
        seed: p.seed.unwrap_or_else(|| s.seed()),
        eos,
        stop_strings: p.stop.clone(),
        speculate: p.speculation,
        logprobs: p.logprobs,
        ..Request::greedy(prompt, max_tokens)
    })
}

struct Head {
    id: String,
    created: u64,
    kind: Kind,
}

impl Head {
    /// A reply body: this response's id and object, `choices` and the serving model.
    fn body(&self, s: &AppState, chunk: bool, choices: Value) -> Value {
        let object = match (self.kind, chunk) {
            (Kind::Chat, false) => "chat.completion",
            (Kind::Chat, true) => "chat.completion.chunk",
            (Kind::Completion, _) => "text_completion",
        };
        json!({"id": self.id, "object": object, "created": self.created, "model": s.model_id, "choices": choices})
    }

    /// The one choice of a reply: the whole message (`delta: None`) or a
    /// stream chunk's delta (`Some(first)`: a chat stream's first names the role).
    fn choice(&self, text: &str, finish_reason: Value, stop_reason: Value, delta: Option<bool>) -> Value {
        match (self.kind, delta) {
            (Kind::Completion, _) => json!({"index": 0, "text": text, "logprobs": null, "finish_reason": finish_reason, "stop_reason": stop_reason}),
            (Kind::Chat, None) => json!({"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": null, "finish_reason": finish_reason, "stop_reason": stop_reason}),
            (Kind::Chat, Some(first)) => {
                let delta = if first { json!({"role": "assistant", "content": text}) } else { json!({"content": text}) };
                json!({"index": 0, "delta": delta, "logprobs": null, "finish_reason": finish_reason, "stop_reason": stop_reason})
            }
        }
    }
}

impl Head {
    /// A choice's `logprobs` in this endpoint's layout, for entries whose
    /// text starts `offset` characters into the output (completions count
    /// it); returns the offset after them.
    fn logprobs(&self, s: &AppState, p: &Sampling, entries: &[TokenLogprob], offset: usize) -> (Value, usize) {
        let tokens = crate::logprobs::Tokens { codec: &s.codec, as_ids: p.tokens_as_ids };
        match self.kind {
            Kind::Completion => tokens.completion(entries, offset),
            Kind::Chat => (tokens.chat(entries), offset),
        }
    }
}

fn now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

/// A finished output as a client sees it: its text (no eos token's text,
/// nothing from a stop string on), OpenAI's finish reason and vLLM's
/// `stop_reason` (the eos id or the stop string that ended it); the tokens
/// are decoded once.
fn finished(codec: &Codec, tokens: &[u32], finish: FinishReason, eos: &[u32], stops: &[String]) -> (String, &'static str, Value) {
    let mut text = codec.decode(without_eos(tokens, eos));
    let stop = first_stop(&text, stops).map(|(at, s)| (at, s.clone()));
    if let Some((at, _)) = stop {
        text.truncate(at);
    }
    let (reason, stop_reason) = match finish {
        FinishReason::Eos => ("stop", tokens.last().map_or(Value::Null, |&t| json!(t))),
        FinishReason::Stop => ("stop", stop.map_or(Value::Null, |(_, s)| json!(s))),
        FinishReason::Length | FinishReason::Capacity => ("length", Value::Null),
        // Sent as a failure, never as a finish (the scheduler's `Event::Failed`).
        FinishReason::Error => ("error", Value::Null),
    };
    (text, reason, stop_reason)
}

/// The tokens whose text a client sees: all but a final eos.
fn without_eos<'t>(tokens: &'t [u32], eos: &[u32]) -> &'t [u32] {
    match tokens.split_last() {
        Some((last, rest)) if eos.contains(last) => rest,
        _ => tokens,
    }
}

/// The text of a growing output a client may see: [`finished`]'s text. A
/// stop string in the text always ends the output there (the decoder checks
/// every token), so the cut holds before the output is finished too.
fn visible_text(codec: &Codec, tokens: &[u32], eos: &[u32], stops: &[String]) -> String {
    cut_at_stop(&codec.decode(without_eos(tokens, eos)), stops)
}

fn usage(prompt: usize, completion: usize) -> Value {
    json!({"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion})
}

fn drafts(a: &Acceptance) -> Value {
    json!({"proposed": a.proposed, "accepted": a.accepted, "steps": a.steps})
}

/// Waits for the whole output and answers with one JSON body.
async fn whole(s: &AppState, head: &Head, request: &Request, p: &Sampling, mut rx: UnboundedReceiver<Event>) -> Response {
    let (mut tokens, mut entries) = (Vec::new(), Vec::new());
    loop {
        match rx.recv().await {
            Some(Event::Tokens(ids, logprobs)) => {
                tokens.extend(ids);
                entries.extend(logprobs);
            }
            Some(Event::Done { finish, acceptance }) => {
                let (text, reason, stop_reason) = finished(&s.codec, &tokens, finish, &request.eos, &request.stop_strings);
                let mut choice = head.choice(&text, json!(reason), stop_reason, None);
                if p.logprobs.is_some() {
                    choice["logprobs"] = head.logprobs(s, p, &entries, 0).0;
                }
                if p.return_token_ids {
                    choice["token_ids"] = json!(tokens);
                    choice["prompt_token_ids"] = json!(request.prompt);
                }
                if request.speculate {
                    choice["draft_tokens"] = drafts(&acceptance);
                }
                let mut body = head.body(s, false, json!([choice]));
                body["usage"] = usage(request.prompt.len(), tokens.len());
                return axum::Json(body).into_response();
            }
            Some(Event::Failed { status, message }) => return error(ApiError::status(status, message)),
            None => return error(ApiError::status(500, "the engine dropped the request")),
        }
    }
}

/// Streams the output as server-sent events: a chunk per step's new text
/// (and ids on request), a last chunk with the finish reason, the usage
/// chunk when asked, then `[DONE]`.
fn stream(s: Arc<AppState>, head: Head, request: Request, p: Sampling, mut rx: UnboundedReceiver<Event>) -> Response {
    let (tx, out) = tokio::sync::mpsc::channel::<Result<SseEvent, Infallible>>(64);
    tokio::spawn(async move {
        // Characters of the output the logprobs chunks have covered (their `text_offset`).
        let mut offset = 0;
        let mut chunk = |delta_text: &str, ids: &[u32], logprobs: &[TokenLogprob], finish: Option<(&str, Value)>, first: bool| -> Value {
            let (reason, stop_reason) = finish.map_or((Value::Null, Value::Null), |(r, sr)| (json!(r), sr));
            let mut choice = head.choice(delta_text, reason, stop_reason, Some(first));
            if p.return_token_ids {
                choice["token_ids"] = json!(ids);
            }
            if p.logprobs.is_some() && !logprobs.is_empty() {
                let (v, end) = head.logprobs(&s, &p, logprobs, offset);
                choice["logprobs"] = v;
                offset = end;
            }
            head.body(&s, true, json!([choice]))
        };
        let send = |v: Value| {
            let tx = tx.clone();
            async move { tx.send(Ok(SseEvent::default().data(v.to_string()))).await.is_ok() }
        };
        let hold = request.stop_strings.iter().map(String::len).max().unwrap_or(1) - 1;
        let (mut tokens, mut sent, mut first) = (Vec::<u32>::new(), 0usize, true);
        loop {
            // A client that leaves closes `out`: the stream ends here, which
            // drops `rx`, and the engine frees the request's slot, or skips
            // its prefill while it still waits for one.
            let event = tokio::select! {
                event = rx.recv() => event,
                _ = tx.closed() => return,
            };
            match event {
                Some(Event::Tokens(ids, logprobs)) => {
                    tokens.extend(&ids);
                    let text = visible_text(&s.codec, &tokens, &request.eos, &request.stop_strings);
                    let end = sendable(&text, hold);
                    let delta = if end > sent && text.is_char_boundary(sent) { &text[sent..end] } else { "" };
                    // Ids and logprobs go with the chunk of the step that emitted them.
                    if !delta.is_empty() || p.return_token_ids || p.logprobs.is_some() {
                        if !send(chunk(delta, &ids, &logprobs, None, first)).await {
                            return;
                        }
                        first = false;
                        sent = sent.max(end);
                    }
                }
                Some(Event::Done { finish, .. }) => {
                    let (text, reason, stop_reason) = finished(&s.codec, &tokens, finish, &request.eos, &request.stop_strings);
                    let rest = if text.len() > sent && text.is_char_boundary(sent) { &text[sent..] } else { "" };
                    if !send(chunk(rest, &[], &[], Some((reason, stop_reason)), first)).await {
                        return;
                    }
                    if p.include_usage {
                        let mut body = head.body(&s, true, json!([]));
                        body["usage"] = usage(request.prompt.len(), tokens.len());
                        let _ = send(body).await;
                    }
                    let _ = tx.send(Ok(SseEvent::default().data("[DONE]"))).await;
                    return;
                }
                Some(Event::Failed { status, message }) => {
                    let _ = send(ApiError::status(status, message).body()).await;
                    return;
                }
                None => return,
            }
        }
    });
    Sse::new(tokio_stream::wrappers::ReceiverStream::new(out)).keep_alive(KeepAlive::default()).into_response()
}
