//! An engine in any language, as a child process speaking the exec
//! protocol (`spec/PROTOCOL.md`, PROTO-9): the handshake lists the
//! `generate` operation and carries the engine's [`EngineInfo`] under
//! `engine`; a `generate` request carries the requests under
//! `params.requests`, and the reply the outputs under
//! `outputs.generations`.

use std::io::{BufRead, Write};
use std::time::Duration;

use serde_json::{Value, json};
use specdec_exec::child::Process;
use specdec_exec::{PROTOCOL, parse_reply};

use crate::{EngineError, EngineInfo, Generation, GenerationEngine, GenerationRequest, validate_outputs};

/// The operation name.
pub const GENERATE: &str = "generate";

/// An engine behind a child process.
pub struct ExecEngine {
    command: String,
    process: Process,
    info: EngineInfo,
    next_id: u64,
    timeout: Duration,
}

impl ExecEngine {
    /// Starts `command` (`sh -c`) and reads its handshake; every call has
    /// `timeout` (a whole batch of generations).
    pub fn spawn(command: &str, timeout: Duration) -> Result<ExecEngine, EngineError> {
        let failed = |e: specdec_exec::ExecError| EngineError::Failed(e.to_string());
        let mut process = Process::spawn(command).map_err(failed)?;
        let hello = json!({"id": 0, "op": "handshake", "protocol": PROTOCOL}).to_string();
        let line = process.exchange("handshake", &hello, timeout).map_err(failed)?;
        let reply = parse_reply("handshake", 0, &line).map_err(failed)?.map_err(|e| EngineError::Failed(format!("the handshake was refused: {e:?}")))?;
        let info = parse_engine_handshake(&reply).map_err(|e| EngineError::Contract(format!("`{command}`'s handshake: {e}")))?;
        Ok(ExecEngine { command: command.into(), process, info, next_id: 1, timeout })
    }

    pub fn command(&self) -> &str {
        &self.command
    }
}

/// The engine's part of a handshake reply: the protocol, `generate` among
/// the operations, and the [`EngineInfo`] under `engine`.
fn parse_engine_handshake(reply: &serde_json::Map<String, Value>) -> Result<EngineInfo, String> {
    match reply.get("protocol").and_then(Value::as_str) {
        Some(p) if p == PROTOCOL => {}
        other => return Err(format!("protocol {other:?}, expected {PROTOCOL:?}")),
    }
    let ops = reply.get("ops").and_then(Value::as_array).ok_or("`ops` is missing or not a list")?;
    if !ops.iter().any(|o| o.as_str() == Some(GENERATE)) {
        return Err(format!("`ops` does not list `{GENERATE}`"));
    }
    let engine = reply.get("engine").ok_or("`engine` is missing")?;
    let info: EngineInfo = serde_json::from_value(engine.clone()).map_err(|e| format!("`engine`: {e}"))?;
    if info.vocab == 0 || !(info.greedy_epsilon >= 0.0 && info.greedy_epsilon.is_finite()) {
        return Err(format!("`engine`: vocab {} and greedy_epsilon {} must be positive and finite", info.vocab, info.greedy_epsilon));
    }
    Ok(info)
}

impl GenerationEngine for ExecEngine {
    fn info(&self) -> &EngineInfo {
        &self.info
    }

    fn generate(&mut self, requests: &[GenerationRequest]) -> Result<Vec<Generation>, EngineError> {
        let id = self.next_id;
        self.next_id += 1;
        let line = json!({"id": id, "op": GENERATE, "inputs": {}, "params": {"requests": requests}}).to_string();
        let reply = self.process.exchange(GENERATE, &line, self.timeout).map_err(|e| EngineError::Failed(e.to_string()))?;
        if let Some(refusal) = refusal(&reply) {
            return Err(refusal);
        }
        let outputs = match parse_reply(GENERATE, id, &reply).map_err(|e| EngineError::Contract(e.to_string()))? {
            Ok(outputs) => outputs,
            Err(specdec_exec::protocol::ReplyError::Device(message)) => return Err(EngineError::Failed(message)),
            Err(specdec_exec::protocol::ReplyError::NotSupported) => return Err(EngineError::NotSupported("the engine answered `generate` with NotSupported".into())),
            Err(e) => return Err(EngineError::Failed(format!("{e:?}"))),
        };
        let generations = outputs.get("generations").ok_or_else(|| EngineError::Contract("`outputs.generations` is missing".into()))?;
        let generations: Vec<Generation> = serde_json::from_value(generations.clone()).map_err(|e| EngineError::Contract(format!("`outputs.generations`: {e}")))?;
        validate_outputs(&self.info, requests, &generations)?;
        Ok(generations)
    }
}

/// A refused request (PROTO-9): an error of kind `NotSupported` whose
/// `index` names the request the engine cannot run as asked.
fn refusal(reply: &str) -> Option<EngineError> {
    let v: Value = serde_json::from_str(reply.trim_end()).ok()?;
    let error = v.get("error")?;
    if error.get("kind")?.as_str()? != "NotSupported" {
        return None;
    }
    let index = error.get("index")?.as_array()?.first()?.as_u64()?;
    let reason = error.get("message").and_then(Value::as_str).unwrap_or("refused").to_string();
    Some(EngineError::Request { index: usize::try_from(index).ok()?, reason })
}

/// The adapter side: answers the handshake and `generate` requests read
/// from `input` with `engine`, one reply line each, until `input` ends. A
/// malformed request gets an error reply naming the problem (PROTO-6); the
/// loop goes on.
pub fn serve_exec(engine: &mut dyn GenerationEngine, input: impl BufRead, mut output: impl Write) -> std::io::Result<()> {
    for line in input.lines() {
        let line = line?;
        if line.trim().is_empty() {
            continue;
        }
        let reply = answer(engine, &line);
        writeln!(output, "{reply}")?;
        output.flush()?;
    }
    Ok(())
}

fn answer(engine: &mut dyn GenerationEngine, line: &str) -> Value {
    let request: Value = match serde_json::from_str(line) {
        Ok(v) => v,
        Err(e) => return error_reply(Value::Null, &format!("the request line is not JSON: {e}")),
    };
    let id = request.get("id").cloned().unwrap_or(Value::Null);
    match request.get("op").and_then(Value::as_str) {
        Some("handshake") => {
            json!({"id": id, "protocol": PROTOCOL, "name": engine.info().name, "device": "cpu", "ops": [GENERATE], "engine": engine.info()})
        }
        Some(GENERATE) => {
            let requests = request.pointer("/params/requests").cloned().unwrap_or(Value::Null);
            let requests: Vec<GenerationRequest> = match serde_json::from_value(requests) {
                Ok(r) => r,
                Err(e) => return error_reply(id, &format!("params.requests: {e}")),
            };
            match engine.generate(&requests) {
                Ok(generations) => json!({"id": id, "outputs": {"generations": generations}}),
                Err(EngineError::Request { index, reason }) => json!({"id": id, "error": {"kind": "NotSupported", "arg": "requests", "index": [index], "message": reason}}),
                Err(e) => error_reply(id, &e.to_string()),
            }
        }
        Some(other) => json!({"id": id, "error": {"kind": "NotSupported", "arg": other, "message": format!("this engine implements only `{GENERATE}`")}}),
        None => error_reply(id, "the request has no `op`"),
    }
}

/// An engine's failure or a malformed request: a `Device` error (PROTO-6 has
/// no spec kind for a whole generation).
fn error_reply(id: Value, message: &str) -> Value {
    json!({"id": id, "error": {"kind": "Device", "arg": GENERATE, "message": message}})
}
