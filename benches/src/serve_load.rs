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
}

/// Serves `weights` on `backend` with n-gram drafts and runs every level
/// with speculation on and off.
pub fn measure(backend: &str, weights: &Arc<LlamaWeights>, tokenizer: &Tokenizer) -> Result<ServeLoad, String> {
    let (k, max_batch) = (3, 16);
    let config = specdec_serve::ServeConfig {
        weights: Arc::clone(weights),
        codec: Codec::Tokenizer(Box::new(tokenizer.clone())),
        model_id: "smollm2".into(),
        backend: backend.into(),
        proposer: ProposerChoice::Ngram,
        k,
        host: "127.0.0.1".into(),
        port: 0,
        max_batch,
        max_context: 512,
        api_key: None,
        max_body_bytes: 1 << 20,
        drain: Duration::from_secs(5),
        limits: specdec_serve::Limits::default(),
        special_tokens_in_text: false,
    };
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
    let addr = addr_rx.recv().map_err(|_| "the server ended before it listened".to_string());
    let mut results = Vec::new();
    let run = addr.and_then(|addr| {
        for c in LEVELS {
            for on in [true, false] {
                let spec = LoadSpec {
                    url: format!("http://{addr}"),
                    model: None,
                    prompts: PROMPTS.iter().map(|p| p.to_string()).collect(),
                    max_tokens: MAX_TOKENS,
                    concurrency: c,
                    requests: REQUESTS,
                    speculation: Some(on),
                    temperature: 0.0,
                    timeout: Duration::from_secs(600),
                };
                eprintln!("bench: serve load on {backend}, concurrency {c}, speculation {}", if on { "on" } else { "off" });
                results.push(specdec_serve::load::run(&spec)?);
            }
        }
        Ok(())
    });
    stop.store(true, Ordering::Relaxed);
    let served = server.join().map_err(|_| "the server thread panicked".to_string())?;
    run?;
    served?;
    Ok(ServeLoad { backend: backend.into(), proposer: "ngram".into(), k, max_batch, results })
}
