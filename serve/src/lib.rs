//! `specdec serve`: the speculative decoder behind an OpenAI-compatible
//! HTTP API (`/v1/completions`, `/v1/chat/completions`, streamed or not,
//! `/v1/models`, `/health`, Prometheus `/metrics`).
//!
//! Role: the way engines are used, so that specdec's decoder can be timed
//! under load beside other engines and checked black-box over HTTP by the
//! engine checks. Two halves: an engine thread that owns the backend and
//! one decoder session with continuous batching (`scheduler.rs`), and axum
//! handlers on tokio that validate, enqueue and answer (`http.rs`).
//!
//! Invariants: nothing reaches the engine unvalidated (every bad request is
//! a 4xx whose message names the field, `api.rs`); a request's output does
//! not depend on the load (its own noise streams and cache slot, DECODE-3),
//! so greedy speculative output equals plain output under any load; a
//! client that goes away frees its slot at the next step, or its place in
//! the queue before any prefill (streams included); the server binds
//! 127.0.0.1 unless told otherwise, and without an API key answers only a
//! `Host` naming it; user text is text (only the chat template writes
//! control tokens, unless `--special-tokens-in-text`); a slow client costs
//! one connection, never the service (header and body timeouts, a
//! connection cap that closes idle connections first); a SIGTERM or SIGINT
//! stops accepting, lets running requests finish for the drain time, fails
//! what is left with a 503 and exits soon after, whatever clients do.
//!
//! Modules: `scheduler.rs` is the engine thread: it owns the backend and
//! one decoder `Session` for the server's lifetime, takes requests from a
//! channel between steps, frees the slots of clients that went away,
//! admits waiting requests into free slots, feeds one chunk of their
//! prompts (chunked prefill), steps the generating batch and sends each
//! request its tokens. `connections.rs` is the accept
//! loop over hyper's HTTP/1 connections (timeouts, the cap, the bounded
//! shutdown). `http.rs` holds the axum
//! handlers (one small function per endpoint, validation before anything is
//! enqueued, SSE streams, `--api-key`, the body limit); `api.rs` the request
//! bodies and their typed 400s (unknown fields and wrong types named);
//! `text.rs` the text codec (the model's tokenizer, or the tiny models'
//! two-letter text) and what a stream may send; `metrics.rs` the Prometheus
//! exposition; `load.rs` the load generator of `specdec load` and the
//! speedup report. Tests: `cli/tests/serve.rs` (a real server process:
//! hostile requests and hostile clients, 32 concurrent clients,
//! disconnects, SIGTERM, the OpenAI Python client, the engine checks over HTTP).

pub mod api;
pub mod connections;
pub mod http;
pub mod load;
pub mod logprobs;
pub mod metrics;
pub mod scheduler;
pub mod text;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, mpsc};
use std::time::Duration;

use serde_json::json;
use specdec_backend::model::{LlamaWeights, ModelBackend};
use specdec_decoder::ProposerChoice;

pub use crate::connections::Limits;
use crate::http::AppState;
use crate::metrics::Metrics;
use crate::scheduler::{EngineSetup, Msg, Ready};
use crate::text::Codec;

/// Everything `specdec serve` is told.
pub struct ServeConfig {
    pub weights: Arc<LlamaWeights>,
    pub codec: Codec,
    /// The name clients give as `model`.
    pub model_id: String,
    pub backend: String,
    pub proposer: ProposerChoice,
    pub k: usize,
    pub host: String,
    pub port: u16,
    /// Requests decoded together at most; more wait for a slot.
    pub max_batch: usize,
    /// Prompt and generated tokens of one request at most.
    pub max_context: usize,
    pub api_key: Option<String>,
    pub max_body_bytes: usize,
    /// How long a shutdown lets running requests finish.
    pub drain: Duration,
    /// What one connection may cost: header and body timeouts, a cap.
    pub limits: Limits,
    /// Prompt tokens fed per engine iteration between decode steps
    /// (chunked prefill); 0 feeds each prompt whole at admission.
    pub prefill_chunk: usize,
    /// Special-token strings in user text (chat contents, completion
    /// prompts) encode as control tokens: the old behaviour, opted into.
    /// Off, user text is text and only the chat template writes control tokens.
    pub special_tokens_in_text: bool,
}

/// Distinct constraints a server keeps compiled, with their mask caches
/// (a tool-call schema is a few hundred states; its masks are the cost).
const CONSTRAINTS_KEPT: usize = 32;

/// Runs the server until SIGTERM or SIGINT; `listening` is called with the
/// bound address once requests are accepted.
pub fn serve(config: ServeConfig, listening: &mut dyn FnMut(SocketAddr)) -> Result<(), String> {
    serve_until(config, listening, None)
}

/// [`serve`], also shutting down (with the same drain) once `stop` is set:
/// how a program that embeds the server (the speedup report) stops it.
pub fn serve_until(config: ServeConfig, listening: &mut dyn FnMut(SocketAddr), stop: Option<Arc<AtomicBool>>) -> Result<(), String> {
    let (context, max_k) = context_of(&config)?;
    config.limits.validate()?;
    let metrics = Arc::new(Metrics::default());
    let codec = Arc::new(config.codec);
    let setup = EngineSetup {
        weights: Arc::clone(&config.weights),
        codec: Arc::clone(&codec),
        proposer: config.proposer.clone(),
        k: config.k,
        max_batch: config.max_batch,
        capacity: context + max_k + 1,
        prefill_chunk: (config.prefill_chunk > 0).then_some(config.prefill_chunk),
        metrics: Arc::clone(&metrics),
    };
    let (tx, rx) = mpsc::channel::<Msg>();
    let (engine, ready) = start_engine(config.backend, setup, rx)?;
    let vocab = config.weights.config.vocab_size;
    // Constraints need each token's bytes; a tokenizer without a byte reading serves without them.
    let constraints = codec.token_table(vocab).ok().map(|t| specdec_decoder::ConstraintCache::new(t, CONSTRAINTS_KEPT));
    let state = Arc::new(AppState {
        engine: Mutex::new(tx.clone()),
        model_id: config.model_id,
        codec,
        vocab,
        context,
        eos: config.weights.config.eos_ids(),
        metrics,
        api_key: config.api_key,
        statement: statement(&ready, &config.proposer, vocab, constraints.is_some()),
        constraints,
        next_id: AtomicU64::new(0),
        seeds: http::seed_source(),
        allowed_host: config.host.clone(),
        body_timeout: config.limits.body_timeout,
        special_tokens_in_text: config.special_tokens_in_text,
    });
    let router = http::router(Arc::clone(&state), config.max_body_bytes);
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().map_err(|e| format!("cannot start the async runtime: {e}"))?;
    let served = runtime.block_on(listen(router, (config.host.as_str(), config.port), config.limits, config.drain, tx.clone(), listening, stop));
    // No sender left: the engine thread ends once idle.
    drop(tx);
    drop(state);
    runtime.shutdown_timeout(Duration::from_secs(1));
    engine.join().map_err(|_| "the engine thread panicked".to_string())?;
    served
}

/// The context a request may fill, and the drafts a step adds past it, from
/// the flags and the model's positions.
fn context_of(config: &ServeConfig) -> Result<(usize, usize), String> {
    if config.max_batch == 0 {
        return Err("--max-batch must be at least 1".into());
    }
    let max_k = if config.proposer == ProposerChoice::None { 0 } else { config.k };
    if config.k == 0 || config.k > specdec_decoder::MAX_K {
        return Err(format!("--k {} must be in [1, {}]", config.k, specdec_decoder::MAX_K));
    }
    let positions = config.weights.config.max_position_embeddings;
    // The session holds a context and one step's drafts past it.
    let context = config.max_context.min(positions.saturating_sub(max_k + 1));
    if context < 2 {
        return Err(format!("a context of {context} tokens (--max-context {}, the model's {positions} positions, k {max_k}) leaves no room to generate", config.max_context));
    }
    Ok((context, max_k))
}

/// The engine thread: loads the model on `backend`, says it is ready, then
/// serves the jobs of `rx` until every sender is gone.
fn start_engine(backend: String, setup: EngineSetup, rx: mpsc::Receiver<Msg>) -> Result<(std::thread::JoinHandle<()>, Ready), String> {
    let (ready_tx, ready_rx) = mpsc::channel::<Result<Ready, String>>();
    let engine = std::thread::Builder::new()
        .name("specdec-engine".into())
        .spawn(move || {
            struct Job<'a> {
                setup: EngineSetup,
                rx: Option<mpsc::Receiver<Msg>>,
                ready: &'a mpsc::Sender<Result<Ready, String>>,
            }
            impl specdec_registry::Job for Job<'_> {
                type Out = ();
                fn run<B: ModelBackend>(&mut self, name: &str, backend: &B) {
                    let Some(rx) = self.rx.take() else { return };
                    scheduler::run(backend, name, &self.setup, rx, &mut |r| {
                        let _ = self.ready.send(r);
                    });
                }
            }
            if let Err(e) = specdec_registry::with_backend(&backend, &mut Job { setup, rx: Some(rx), ready: &ready_tx }) {
                let _ = ready_tx.send(Err(e));
            }
        })
        .map_err(|e| format!("cannot start the engine thread: {e}"))?;
    let ready = ready_rx.recv().map_err(|_| "the engine thread ended before loading the model".to_string())??;
    Ok((engine, ready))
}

/// What the server states of itself to the engine checks (`/v1/models`' `specdec` field).
fn statement(ready: &Ready, proposer: &ProposerChoice, vocab: usize, constraints: bool) -> serde_json::Value {
    let mut statement = json!({
        "name": format!("specdec/{}/{proposer}", ready.backend),
        "version": env!("CARGO_PKG_VERSION"),
        "speculation": ready.proposer,
        "vocab": vocab,
        "greedy_epsilon": ready.greedy_epsilon,
        "batch_invariant": true,
        "stop_strings": true,
        "processors": ["min_p", "logit_bias", "repetition_penalty", "presence_penalty", "frequency_penalty"],
        "penalty_scopes": ["context", "generated"],
        // The decoder's statement (specdec-engines' DecoderEngine): the
        // reference's f64 definition on the backend's rows.
        "logprobs": {"modes": ["raw", "processed"], "max_top": specdec_decoder::MAX_TOP_LOGPROBS, "epsilon": ready.greedy_epsilon.max(1e-9)},
    });
    if constraints {
        statement["constraints"] = json!(["regex", "json_schema", "grammar"]);
    }
    statement
}

/// Binds `addr`, tells `listening`, and serves `router` until a signal or
/// `stop`; then running requests have `drain` to finish before `engine` is
/// told to fail what is left, and the connections still open are dropped
/// (`connections.rs`): a shutdown is bounded whatever clients do.
async fn listen(
    router: axum::Router,
    addr: (&str, u16),
    limits: Limits,
    drain: Duration,
    engine: mpsc::Sender<Msg>,
    listening: &mut dyn FnMut(SocketAddr),
    stop: Option<Arc<AtomicBool>>,
) -> Result<(), String> {
    let listener = tokio::net::TcpListener::bind(addr).await.map_err(|e| format!("cannot bind {}:{}: {e}", addr.0, addr.1))?;
    let bound = listener.local_addr().map_err(|e| e.to_string())?;
    // The handlers are installed before anyone is told the address: a SIGTERM
    // that arrives right after must drain, not kill.
    let signals = Signals::install().map_err(|e| format!("cannot install the signal handlers: {e}"))?;
    listening(bound);
    let shutdown = async move {
        tokio::select! {
            _ = signals.received() => {}
            _ = stopped(stop) => {}
        }
        eprintln!("specdec serve: shutting down; running requests have {} s to finish", drain.as_secs_f64());
    };
    // After the drain time, whatever still runs is failed with a 503.
    let cancel = move || {
        let _ = engine.send(Msg::CancelAll("the server is shutting down".into()));
    };
    connections::serve(listener, router, limits, shutdown, drain, cancel).await;
    Ok(())
}

/// Resolves once `stop` is set (never without one).
async fn stopped(stop: Option<Arc<AtomicBool>>) {
    let Some(stop) = stop else { return std::future::pending().await };
    while !stop.load(Ordering::Relaxed) {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// SIGTERM and SIGINT, registered when installed (not when first awaited).
struct Signals {
    terminate: tokio::signal::unix::Signal,
    interrupt: tokio::signal::unix::Signal,
}

impl Signals {
    fn install() -> std::io::Result<Signals> {
        use tokio::signal::unix::{SignalKind, signal};
        Ok(Signals { terminate: signal(SignalKind::terminate())?, interrupt: signal(SignalKind::interrupt())? })
    }

    async fn received(mut self) {
        tokio::select! {
            _ = self.terminate.recv() => {}
            _ = self.interrupt.recv() => {}
        }
    }
}
