//! External backends: the whole `Backend` contract over a child process
//! speaking JSON lines (`specdec-exec/1`, `spec/PROTOCOL.md`: PROTO-1, PROTO-2, PROTO-3,
//! PROTO-4, PROTO-5, PROTO-6, PROTO-7, PROTO-8).
//!
//! Why: the people who most need specdec ship verify kernels in Python, C++
//! or CUDA. An adapter is any program that reads one request per line on
//! stdin and writes one reply per line on stdout; this crate makes it a
//! [`Backend`], so golden, differential (with decision margins) and
//! statistical checks (with the adapter's own seeded generator) run on it
//! unchanged.
//!
//! Invariants: tensors live host-side in this process ([`RefTensor`]); each
//! operation call sends its inputs and reads its outputs. An operation the
//! handshake does not list answers `NotSupported` without a call (PROTO-3);
//! one it lists and then refuses, a reply that is not JSON or lacks a field,
//! a crash and a hang (past the per-call timeout) are errors that fail that
//! check alone, naming the field or carrying the adapter's stderr tail; a
//! failed adapter is killed and restarted for the next call (PROTO-7), so
//! the run goes on. Nothing an adapter writes can make this crate panic.
//!
//! Modules: [`protocol`] (the wire format: requests, replies, tensors as
//! plain arrays or base64 of little-endian values) and [`child`] (one
//! adapter process: a reply line within a per-call deadline, the stderr
//! tail kept, the process group killed whole). [`ModelBackend`] answers
//! `NotSupported` throughout: the model section is not part of the
//! protocol.

pub mod child;
pub mod protocol;

use std::sync::Mutex;
use std::time::Duration;

use serde_json::{Map, Value, json};
use specdec_backend::model::{ForwardOutput, ForwardRequest, LlamaWeights, ModelPrecision};
use specdec_backend::{
    Backend, BackendError, Comparator, DflashAccepted, DrawMethod, DrawNoiseArg, LogitsParams, ModelBackend, NgramConfig, Op, Precision, RefTensor, RejectionArgs, RejectionNoise, Result, TrimMode,
    Verified,
};

pub use protocol::{ExecError, Handshake, PROTOCOL};

use child::Process;
use protocol::{ReplyError, Want, decode_tensor, encode_tensor, parse_error, parse_handshake};

/// The per-call timeout when none is given (and `SPECDEC_EXEC_TIMEOUT` is unset).
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);

/// The environment variable that overrides [`DEFAULT_TIMEOUT`], in seconds.
pub const TIMEOUT_ENV: &str = "SPECDEC_EXEC_TIMEOUT";

/// The timeout from [`TIMEOUT_ENV`], else [`DEFAULT_TIMEOUT`].
pub fn timeout_from_env() -> std::result::Result<Duration, String> {
    match std::env::var(TIMEOUT_ENV) {
        Err(_) => Ok(DEFAULT_TIMEOUT),
        Ok(s) => match s.trim().parse::<f64>() {
            Ok(v) if v.is_finite() && v > 0.0 => Ok(Duration::from_secs_f64(v)),
            _ => Err(format!("{TIMEOUT_ENV}={s:?} is not a positive number of seconds")),
        },
    }
}

/// A cache living in the adapter: its handle, valid for one adapter process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExecKvCache {
    handle: i64,
    generation: u64,
}

struct State {
    process: Option<Process>,
    /// Incremented at every (re)start: caches of an earlier process are gone.
    generation: u64,
    next_id: u64,
    restarts: u64,
}

/// A backend whose operations run in a child process (`sh -c COMMAND`).
pub struct ExecBackend {
    command: String,
    timeout: Duration,
    hello: Handshake,
    state: Mutex<State>,
}

impl std::fmt::Debug for ExecBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ExecBackend").field("command", &self.command).field("timeout", &self.timeout).field("hello", &self.hello).finish()
    }
}

impl ExecBackend {
    /// Starts `command` and reads its handshake, with the default timeout.
    pub fn new(command: &str) -> std::result::Result<ExecBackend, ExecError> {
        Self::with_timeout(command, DEFAULT_TIMEOUT)
    }

    /// Starts `command` with a per-call `timeout` (the handshake gets the same).
    pub fn with_timeout(command: &str, timeout: Duration) -> std::result::Result<ExecBackend, ExecError> {
        let (process, hello) = start(command, timeout)?;
        let state = State { process: Some(process), generation: 0, next_id: 1, restarts: 0 };
        Ok(ExecBackend { command: command.to_string(), timeout, hello, state: Mutex::new(state) })
    }

    /// What the adapter said about itself.
    pub fn handshake(&self) -> &Handshake {
        &self.hello
    }

    /// How many times the adapter was restarted after a failure.
    pub fn restarts(&self) -> u64 {
        self.lock().restarts
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // A panic elsewhere cannot leave the state inconsistent in a way
        // that matters: at worst the process is restarted.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn claims(&self, op: Op) -> bool {
        self.hello.ops.iter().any(|o| o == op.name())
    }

    fn fail(&self, e: ExecError) -> BackendError {
        BackendError::device(&self.name(), e)
    }

    /// One operation call (PROTO-5): `NotSupported` without a call if the
    /// handshake did not list `support`; otherwise the reply's outputs, or
    /// its error mapped to the contract's.
    fn call(&self, support: Op, op: &str, inputs: Map<String, Value>, params: Value, generation: Option<u64>) -> Result<(Map<String, Value>, u64)> {
        if !self.claims(support) {
            return Err(self.unsupported(support));
        }
        let mut state = self.lock();
        if state.process.is_none() {
            let (process, _) = start(&self.command, self.timeout).map_err(|e| self.fail(e))?;
            state.process = Some(process);
            state.generation += 1;
            state.restarts += 1;
        }
        if let Some(g) = generation
            && g != state.generation
        {
            return Err(BackendError::device(&self.name(), format!("`{op}`: the cache belonged to an adapter process that failed and was restarted")));
        }
        let id = state.next_id;
        state.next_id += 1;
        let request = json!({"id": id, "op": op, "inputs": inputs, "params": params}).to_string();
        let generation = state.generation;
        let process = state.process.as_mut().expect("started above");
        let reply = process.exchange(op, &request, self.timeout).and_then(|line| parse_reply(op, id, &line));
        match reply {
            Ok(Ok(outputs)) => Ok((outputs, generation)),
            Ok(Err(ReplyError::Spec(e))) => Err(BackendError::Invalid(e)),
            // Listed in the handshake, then refused: a lie, and a failure (PROTO-3).
            Ok(Err(ReplyError::NotSupported)) => Err(self.fail(ExecError::ClaimedButUnsupported { op: op.to_string() })),
            Ok(Err(ReplyError::Device(message))) => Err(BackendError::device(&self.name(), format!("`{op}`: {message}"))),
            Err(e) => {
                // The stream may be out of step (a partial write, a stale
                // reply): a fresh process is the only safe continuation.
                state.process = None;
                Err(self.fail(e))
            }
        }
    }

    fn call_op(&self, op: Op, inputs: Map<String, Value>, params: Value) -> Result<Map<String, Value>> {
        self.call(op, op.name(), inputs, params, None).map(|(o, _)| o)
    }

    fn output(&self, op: &str, outputs: &Map<String, Value>, name: &str, want: Want) -> Result<RefTensor> {
        let field = format!("outputs.{name}");
        let value = outputs.get(name).ok_or_else(|| self.fail(ExecError::Malformed { op: op.into(), field: field.clone(), reason: "is missing".into() }))?;
        decode_tensor(value, &field, want).map_err(|e| self.fail(e.in_op(op)))
    }

    fn verified(&self, op: &str, outputs: &Map<String, Value>) -> Result<Verified<RefTensor>> {
        Ok(Verified { tokens: self.output(op, outputs, "tokens", Want::Int)?, num_accepted: self.output(op, outputs, "num_accepted", Want::Int)? })
    }
}

/// Spawns the adapter and reads its handshake (PROTO-2).
fn start(command: &str, timeout: Duration) -> std::result::Result<(Process, Handshake), ExecError> {
    let mut process = Process::spawn(command)?;
    let request = json!({"id": 0, "op": "handshake", "protocol": PROTOCOL}).to_string();
    let line = process.exchange("handshake", &request, timeout)?;
    let reply = match parse_reply("handshake", 0, &line)? {
        Ok(map) => map,
        Err(e) => return Err(ExecError::Malformed { op: "handshake".into(), field: "error".into(), reason: format!("the adapter refused the handshake: {e:?}") }),
    };
    let hello = parse_handshake(&reply).map_err(|e| e.in_op("handshake"))?;
    Ok((process, hello))
}

/// Parses one reply line (PROTO-5, PROTO-6): `Ok(Ok(outputs))`, `Ok(Err(error))`,
/// or a malformed-reply error naming the field. The handshake's fields sit
/// at the top level, an operation's under `outputs`.
pub fn parse_reply(op: &str, id: u64, line: &str) -> std::result::Result<std::result::Result<Map<String, Value>, ReplyError>, ExecError> {
    let malformed = |field: &str, reason: String| ExecError::Malformed { op: op.into(), field: field.into(), reason };
    let value: Value = serde_json::from_str(line.trim_end()).map_err(|e| {
        let shown: String = line.chars().take(120).collect();
        malformed("(line)", format!("not JSON ({e}): {shown:?}"))
    })?;
    let Value::Object(mut obj) = value else { return Err(malformed("(line)", "a reply must be a JSON object".into())) };
    match obj.get("id").and_then(Value::as_u64) {
        Some(got) if got == id => {}
        Some(got) => return Err(malformed("id", format!("{got}, but the request was {id}"))),
        None => return Err(malformed("id", format!("missing or not an integer (the request was {id})"))),
    }
    if let Some(e) = obj.get("error") {
        return parse_error(e).map(Err).map_err(|e| e.in_op(op));
    }
    if op == "handshake" {
        return Ok(Ok(obj));
    }
    match obj.remove("outputs") {
        Some(Value::Object(outputs)) => Ok(Ok(outputs)),
        Some(_) => Err(malformed("outputs", "must be an object of named tensors".into())),
        None => Err(malformed("outputs", "is missing (and there is no `error`)".into())),
    }
}

fn inputs<'a>(named: impl IntoIterator<Item = (&'a str, Option<&'a RefTensor>)>) -> Map<String, Value> {
    named.into_iter().filter_map(|(n, t)| t.map(|t| (n.to_string(), encode_tensor(t)))).collect()
}

fn noise_input(n: DrawNoiseArg<'_, RefTensor>) -> (&'static str, &RefTensor) {
    match n {
        DrawNoiseArg::InverseCdf(u) => ("draw_uniforms", u),
        DrawNoiseArg::ExponentialRace(e) => ("draw_exponentials", e),
    }
}

fn rejection_inputs<'a>(args: &RejectionArgs<'a, RefTensor>) -> Vec<(&'a str, Option<&'a RefTensor>)> {
    vec![("target_probs", Some(args.target_probs)), ("draft_probs", args.draft_probs), ("draft_tokens", Some(args.draft_tokens)), ("proposal_lens", Some(args.proposal_lens))]
}

fn to_json<T: serde::Serialize>(v: &T) -> Value {
    serde_json::to_value(v).unwrap_or(Value::Null)
}

impl Backend for ExecBackend {
    type Tensor = RefTensor;
    type KvCache = ExecKvCache;

    /// `exec-<adapter name>`: a file-name-safe label for reports.
    fn name(&self) -> String {
        format!("exec-{}", self.hello.name)
    }

    fn device(&self) -> String {
        self.hello.device.clone()
    }

    fn precision(&self) -> Precision {
        self.hello.precision()
    }

    specdec_backend::reference_transfers!();

    fn greedy_verify(&self, scores: &RefTensor, drafts: &RefTensor, lens: &RefTensor) -> Result<Verified<RefTensor>> {
        let i = inputs([("target_scores", Some(scores)), ("draft_tokens", Some(drafts)), ("proposal_lens", Some(lens))]);
        let out = self.call_op(Op::GreedyVerify, i, json!({}))?;
        self.verified("greedy_verify", &out)
    }

    fn dflash_accept(&self, candidates: &RefTensor, predict: &RefTensor, vocab: usize) -> Result<DflashAccepted<RefTensor>> {
        let i = inputs([("candidates", Some(candidates)), ("target_predict", Some(predict))]);
        let out = self.call_op(Op::DflashAccept, i, json!({"vocab": vocab}))?;
        Ok(DflashAccepted { accept_len: self.output("dflash_accept", &out, "accept_len", Want::Int)?, bonus: self.output("dflash_accept", &out, "bonus", Want::Int)? })
    }

    fn rejection_verify(&self, args: RejectionArgs<'_, RefTensor>, n: RejectionNoise<'_, RefTensor>, cmp: Comparator) -> Result<Verified<RefTensor>> {
        let mut named = rejection_inputs(&args);
        named.push(("accept_uniforms", Some(n.accept_uniforms)));
        let (noise_name, noise) = noise_input(n.draw);
        named.push((noise_name, Some(noise)));
        let out = self.call_op(Op::RejectionVerify, inputs(named), json!({"comparator": to_json(&cmp)}))?;
        self.verified("rejection_verify", &out)
    }

    /// BACKEND-5: the seed goes to the adapter, whose own generator draws the noise.
    fn rejection_verify_seeded(&self, args: RejectionArgs<'_, RefTensor>, method: DrawMethod, cmp: Comparator, seed: u64) -> Result<Verified<RefTensor>> {
        let params = json!({"method": to_json(&method), "comparator": to_json(&cmp), "seed": seed});
        let out = self.call_op(Op::RejectionVerifySeeded, inputs(rejection_inputs(&args)), params)?;
        self.verified("rejection_verify_seeded", &out)
    }

    fn residual(&self, target: &RefTensor, draft: Option<&RefTensor>, drafted: &RefTensor) -> Result<RefTensor> {
        let i = inputs([("target_probs", Some(target)), ("draft_probs", draft), ("drafted", Some(drafted))]);
        let out = self.call_op(Op::Residual, i, json!({}))?;
        self.output("residual", &out, "residual", Want::Float)
    }

    fn process_logits(&self, logits: &RefTensor, p: LogitsParams<'_, RefTensor>) -> Result<RefTensor> {
        if !p.is_basic() && !self.hello.ops.iter().any(|o| o == protocol::LOGITS_PROCESSORS) {
            return Err(self.unsupported(Op::ProcessLogits));
        }
        let pen = p.penalties;
        let i = inputs([
            ("logits", Some(logits)),
            ("temperature", Some(p.temperature)),
            ("top_k", Some(p.top_k)),
            ("top_p", Some(p.top_p)),
            ("min_p", p.min_p),
            ("penalty_counts", pen.map(|x| x.counts)),
            ("repetition_penalty", pen.map(|x| x.repetition)),
            ("presence_penalty", pen.map(|x| x.presence)),
            ("frequency_penalty", pen.map(|x| x.frequency)),
            ("logit_bias", p.logit_bias),
        ]);
        let out = self.call_op(Op::ProcessLogits, i, json!({}))?;
        self.output("process_logits", &out, "probs", Want::Float)
    }

    fn draw(&self, weights: &RefTensor, n: DrawNoiseArg<'_, RefTensor>) -> Result<RefTensor> {
        let (noise_name, noise) = noise_input(n);
        let out = self.call_op(Op::Draw, inputs([("weights", Some(weights)), (noise_name, Some(noise))]), json!({}))?;
        self.output("draw", &out, "tokens", Want::Int)
    }

    fn ngram_propose(&self, contexts: &RefTensor, lens: &RefTensor, vocab: usize, cfg: &NgramConfig) -> Result<(RefTensor, RefTensor)> {
        let i = inputs([("contexts", Some(contexts)), ("context_lens", Some(lens))]);
        let out = self.call_op(Op::NgramPropose, i, json!({"vocab": vocab, "config": to_json(cfg)}))?;
        Ok((self.output("ngram_propose", &out, "drafts", Want::Int)?, self.output("ngram_propose", &out, "proposal_lens", Want::Int)?))
    }

    fn kv_new(&self, batch: usize, heads: usize, head_dim: usize, capacity: usize) -> Result<ExecKvCache> {
        let params = json!({"batch": batch, "heads": heads, "head_dim": head_dim, "capacity": capacity});
        let (out, generation) = self.call(Op::KvCache, "kv_new", Map::new(), params, None)?;
        let handle = out
            .get("cache")
            .and_then(Value::as_i64)
            .ok_or_else(|| self.fail(ExecError::Malformed { op: "kv_new".into(), field: "outputs.cache".into(), reason: "must be an integer handle".into() }))?;
        Ok(ExecKvCache { handle, generation })
    }

    fn kv_append(&self, cache: &mut ExecKvCache, keys: &RefTensor, values: &RefTensor, counts: &RefTensor) -> Result<()> {
        let i = inputs([("new_keys", Some(keys)), ("new_values", Some(values)), ("counts", Some(counts))]);
        self.call(Op::KvCache, "kv_append", i, json!({"cache": cache.handle}), Some(cache.generation)).map(|_| ())
    }

    fn kv_trim(&self, cache: &mut ExecKvCache, amounts: &RefTensor, mode: TrimMode) -> Result<RefTensor> {
        let params = json!({"cache": cache.handle, "mode": to_json(&mode)});
        let (out, _) = self.call(Op::KvCache, "kv_trim", inputs([("amounts", Some(amounts))]), params, Some(cache.generation))?;
        self.output("kv_trim", &out, "trimmed", Want::Int)
    }

    fn kv_lens(&self, cache: &ExecKvCache) -> Result<RefTensor> {
        let (out, _) = self.call(Op::KvCache, "kv_lens", Map::new(), json!({"cache": cache.handle}), Some(cache.generation))?;
        self.output("kv_lens", &out, "lens", Want::Int)
    }

    fn kv_contents(&self, cache: &ExecKvCache) -> Result<(RefTensor, RefTensor)> {
        let (out, _) = self.call(Op::KvCache, "kv_contents", Map::new(), json!({"cache": cache.handle}), Some(cache.generation))?;
        Ok((self.output("kv_contents", &out, "keys", Want::Float)?, self.output("kv_contents", &out, "values", Want::Float)?))
    }

    fn paged_gather(&self, pages: &RefTensor, table: &RefTensor, lens: &RefTensor) -> Result<RefTensor> {
        let i = inputs([("pages", Some(pages)), ("block_table", Some(table)), ("context_lens", Some(lens))]);
        let out = self.call_op(Op::PagedGather, i, json!({}))?;
        self.output("paged_gather", &out, "gathered", Want::Float)
    }
}

/// The protocol carries kernel operations only: an adapter is a port of
/// the verify kernels, not of a model runtime, so every model method answers
/// `NotSupported` (reported, never a pass; BACKEND-3). `Op` has no model
/// operation, so the error names `kv_cache`, the closest contract op (a
/// forward pass is what fills a model's KV cache).
impl ModelBackend for ExecBackend {
    type Model = ();
    type ModelCache = ();

    fn model_precision(&self) -> ModelPrecision {
        ModelPrecision { weight_dtype: "none", compute_dtype: "none", logit_rel_tolerance: 0.0, hidden_rel_tolerance: 0.0, argmax_margin_epsilon: 0.0, window_margin_epsilon: 0.0 }
    }

    fn load_model(&self, _weights: &LlamaWeights) -> Result<()> {
        Err(self.unsupported(Op::KvCache))
    }

    fn new_model_cache(&self, _model: &(), _batch: usize, _capacity: usize) -> Result<()> {
        Err(self.unsupported(Op::KvCache))
    }

    fn forward(&self, _model: &(), _cache: &mut (), _req: &ForwardRequest<'_>) -> Result<ForwardOutput<RefTensor>> {
        Err(self.unsupported(Op::KvCache))
    }

    fn cache_lens(&self, _cache: &()) -> Vec<usize> {
        Vec::new()
    }

    fn cache_trim(&self, _cache: &mut (), _amounts: &[usize]) -> Result<()> {
        Err(self.unsupported(Op::KvCache))
    }

    fn cache_contents(&self, _cache: &(), _layer: usize, _seq: usize) -> Result<(Vec<f64>, Vec<f64>)> {
        Err(self.unsupported(Op::KvCache))
    }
}
