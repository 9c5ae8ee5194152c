//! The report's load section: `specdec serve` on SmolLM2, embedded in the
//! bench and stopped by it, under 1 to 16 concurrent streaming clients,
//! each request with speculation on and off on the same server (DECODE-3:
//! the same model, slots and noise either way), so the throughput and
//! latency of plain and speculative decoding are measured side by side and
//! their crossover stated.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use serde::Serialize;
use specdec_decoder::ProposerChoice;
use specdec_models::{LlamaWeights, Tokenizer};
use specdec_serve::load::{LoadResult, LoadSpec, PROMPTS};
use specdec_serve::text::Codec;

/// Concurrency levels of the run.
pub const LEVELS: [usize; 5] = [1, 2, 4, 8, 16];
/// Requests each client sends, and tokens each generates.
pub const REQUESTS: usize = 2;
pub const MAX_TOKENS: usize = 32;

/// What the load section measured.
#[derive(Debug, Clone, Serialize)]
pub struct ServeLoad {
    pub backend: String,
    pub proposer: String,
    pub k: usize,
    pub max_batch: usize,
    pub results: Vec<LoadResult>,
    /// Short requests beside a long prompt: prefilled whole, then in chunks.
    pub beside_long: Vec<BesideLong>,
}

/// Serves `weights` on `backend` with n-gram drafts and runs every level
/// with speculation on and off; then the short requests beside a long
/// prompt, with and without chunked prefill ([`beside_long`]).
pub fn measure(backend: &str, weights: &Arc<LlamaWeights>, tokenizer: &Tokenizer) -> Result<ServeLoad, String> {
    let (k, max_batch) = (3, 16);
    let config = server_config(backend, weights, tokenizer, k, max_batch, 512, CHUNK);
    let results = with_server(config, |addr| {
        let mut results = Vec::new();
        for c in LEVELS {
            for on in [true, false] {
                eprintln!("bench: serve load on {backend}, concurrency {c}, speculation {}", if on { "on" } else { "off" });
                results.push(specdec_serve::load::run(&short_load(addr, c, REQUESTS, MAX_TOKENS, Some(on)))?);
            }
        }
        Ok(results)
    })?;
    let beside_long = [0, CHUNK].into_iter().map(|chunk| beside_long(backend, weights, tokenizer, chunk)).collect::<Result<Vec<_>, _>>()?;
    Ok(ServeLoad { backend: backend.into(), proposer: "ngram".into(), k, max_batch, results, beside_long })
}

/// The prefill chunk of the served runs (`specdec serve`'s default).
pub const CHUNK: usize = 256;
/// Prompt tokens of the long request beside which short ones are timed.
pub const LONG_PROMPT: usize = 1536;
/// Short clients beside the long request, requests each, tokens each.
pub const SHORT: (usize, usize, usize) = (2, 2, 16);

/// Short requests timed while one long prompt is prefilled.
#[derive(Debug, Clone, Serialize)]
pub struct BesideLong {
    /// Prompt tokens fed per engine iteration; 0: each prompt whole at admission.
    pub prefill_chunk: usize,
    /// The short requests (streamed chat, greedy, speculation on), sent as the long one is admitted.
    pub short: LoadResult,
    /// From the long request's sending to its answer.
    pub long_latency_s: f64,
    /// The long request's greedy tokens (the same with either setting: lossless).
    pub long_tokens: Vec<u32>,
}

/// One server with `--prefill-chunk chunk`: a warm-up request, then a
/// [`LONG_PROMPT`]-token greedy completion and, 50 ms after it is sent,
/// the short clients of [`SHORT`].
pub fn beside_long(backend: &str, weights: &Arc<LlamaWeights>, tokenizer: &Tokenizer, chunk: usize) -> Result<BesideLong, String> {
    let text: String = PROMPTS.iter().cycle().take(160).copied().collect::<Vec<_>>().join(" ");
    let mut long: Vec<u32> = tokenizer.encode(&text, false).map_err(|e| e.to_string())?;
    if long.len() < LONG_PROMPT {
        return Err(format!("the long prompt has {} tokens, fewer than {LONG_PROMPT}", long.len()));
    }
    long.truncate(LONG_PROMPT);
    let config = server_config(backend, weights, tokenizer, 3, 8, 2048, chunk);
    with_server(config, |addr| {
        let (clients, requests, tokens) = SHORT;
        specdec_serve::load::run(&short_load(addr, 1, 1, 4, Some(true)))?;
        eprintln!("bench: serve, short requests beside a {LONG_PROMPT}-token prompt, prefill chunk {chunk}");
        std::thread::scope(|s| {
            let long_run = s.spawn(|| {
                let agent: ureq::Agent = ureq::Agent::config_builder().timeout_global(Some(Duration::from_secs(600))).build().into();
                let started = std::time::Instant::now();
                let body = serde_json::json!({"prompt": long, "max_tokens": tokens, "temperature": 0, "return_token_ids": true});
                let mut reply = agent.post(&format!("http://{addr}/v1/completions")).send_json(&body).map_err(|e| format!("the long request: {e}"))?;
                let v: serde_json::Value = reply.body_mut().read_json().map_err(|e| format!("the long request's answer: {e}"))?;
                let ids = v["choices"][0]["token_ids"].as_array().ok_or("the long request's answer has no token_ids")?.iter().filter_map(|t| t.as_u64().map(|t| t as u32)).collect();
                Ok::<_, String>((started.elapsed().as_secs_f64(), ids))
            });
            std::thread::sleep(Duration::from_millis(50));
            let short = specdec_serve::load::run(&short_load(addr, clients, requests, tokens, Some(true)));
            let (long_latency_s, long_tokens) = long_run.join().map_err(|_| "the long request's thread panicked".to_string())??;
            Ok(BesideLong { prefill_chunk: chunk, short: short?, long_latency_s, long_tokens })
        })
    })
}

fn server_config(backend: &str, weights: &Arc<LlamaWeights>, tokenizer: &Tokenizer, k: usize, max_batch: usize, max_context: usize, prefill_chunk: usize) -> specdec_serve::ServeConfig {
    specdec_serve::ServeConfig {
        weights: Arc::clone(weights),
        codec: Codec::Tokenizer(Box::new(tokenizer.clone())),
        model_id: "smollm2".into(),
        backend: backend.into(),
        proposer: ProposerChoice::Ngram,
        k,
        host: "127.0.0.1".into(),
        port: 0,
        max_batch,
        max_context,
        api_key: None,
        max_body_bytes: 1 << 20,
        drain: Duration::from_secs(5),
        limits: specdec_serve::Limits::default(),
        prefill_chunk,
        special_tokens_in_text: false,
    }
}

/// Greedy streamed chat clients on the load prompts.
fn short_load(addr: std::net::SocketAddr, concurrency: usize, requests: usize, max_tokens: usize, speculation: Option<bool>) -> LoadSpec {
    LoadSpec {
        url: format!("http://{addr}"),
        model: None,
        prompts: PROMPTS.iter().map(|p| p.to_string()).collect(),
        max_tokens,
        concurrency,
        requests,
        speculation,
        temperature: 0.0,
        timeout: Duration::from_secs(600),
    }
}

/// Runs `f` against a server with `config`, started here and stopped after.
fn with_server<T>(config: specdec_serve::ServeConfig, f: impl FnOnce(std::net::SocketAddr) -> Result<T, String>) -> Result<T, String> {
    let stop = Arc::new(AtomicBool::new(false));
    let (addr_tx, addr_rx) = std::sync::mpsc::channel();
    let server_stop = Arc::clone(&stop);
    let server = std::thread::spawn(move || {
        specdec_serve::serve_until(
            config,
            &mut |a| {
                let _ = addr_tx.send(a);
            },
            Some(server_stop),
        )
    });
    let run = addr_rx.recv().map_err(|_| "the server ended before it listened".to_string()).and_then(f);
    stop.store(true, Ordering::Relaxed);
    let served = server.join().map_err(|_| "the server thread panicked".to_string())?;
    let out = run?;
    served?;
    Ok(out)
}

/// The report's table of short requests beside a long prompt.
pub fn beside_long_md(runs: &[BesideLong], md: &mut String) {
    use std::fmt::Write;
    if runs.is_empty() {
        return;
    }
    let (clients, requests, tokens) = SHORT;
    let _ = writeln!(
        md,
        "### Short requests beside a long prompt\n\nOne greedy completion of a {LONG_PROMPT}-token prompt ({tokens} tokens); 50 ms after it is sent, {clients} streaming chat clients send {requests} short requests of {tokens} tokens each (speculation on), on a fresh server (`--max-batch 8`, after one warm-up request), with each prompt prefilled whole when admitted (`--prefill-chunk 0`) and in chunks of {CHUNK} tokens between decode steps.\n"
    );
    let _ = writeln!(
        md,
        "| prefill chunk | short TTFT p50 / p90 (ms) | short inter-token p50 / p90 (ms) | short latency p50 / p90 (s) | short requests (failed) | long request latency (s) | long tokens as prefilled whole |\n|---|---|---|---|---|---|---|"
    );
    let whole = runs.iter().find(|r| r.prefill_chunk == 0).map(|r| &r.long_tokens);
    for r in runs {
        let chunk = if r.prefill_chunk == 0 { "whole (0)".to_string() } else { r.prefill_chunk.to_string() };
        let same = match whole {
            Some(w) if r.prefill_chunk == 0 => format!("({} tokens)", w.len()),
            Some(w) => (if *w == r.long_tokens { "same" } else { "DIFFERENT" }).to_string(),
            None => "n/a".into(),
        };
        let s = &r.short;
        let _ = writeln!(
            md,
            "| {chunk} | {:.0} / {:.0} | {:.1} / {:.1} | {:.2} / {:.2} | {} ({}) | {:.2} | {same} |",
            s.ttft_p50_s * 1e3,
            s.ttft_p90_s * 1e3,
            s.itl_p50_s * 1e3,
            s.itl_p90_s * 1e3,
            s.latency_p50_s,
            s.latency_p90_s,
            s.requests,
            s.failed,
            r.long_latency_s
        );
    }
    md.push('\n');
}
