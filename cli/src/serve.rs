//! `specdec serve`: the model and its text codec from the command line,
//! then the server of `specdec-serve` until SIGTERM or SIGINT.

use std::path::Path;
use std::sync::Arc;

use specdec_models::tiny::TinySpec;
use specdec_serve::text::Codec;

/// `specdec serve`'s flags.
#[derive(clap::Args)]
pub struct ServeArgs {
    /// A `.gguf` file, an HF-layout directory, or `tiny:NAME` (a seeded tiny model, for tests).
    #[arg(long)]
    pub model: String,
    #[arg(long, default_value = "ndarray")]
    pub backend: String,
    /// none, ngram, draft:PATH, early-exit:L, dflash:PATH or dflash-iter:PATH.
    #[arg(long, default_value = "ngram")]
    pub proposer: specdec_decoder::ProposerChoice,
    /// Drafts per step at most.
    #[arg(long, default_value_t = 4)]
    pub k: usize,
    /// The address to bind: 127.0.0.1 unless told otherwise. Without
    /// --api-key the server answers only requests whose Host is an IP
    /// address, localhost or this name (DNS rebinding): reached by another
    /// name (a LAN host name, a container's service name), set --api-key.
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    /// 0 picks a free port (the first line printed names it).
    #[arg(long, default_value_t = 8000)]
    pub port: u16,
    /// Requests decoded together at most; more wait for a slot.
    #[arg(long, default_value_t = 8)]
    pub max_batch: usize,
    /// Prompt and generated tokens of one request at most (the KV cache holds this many per slot).
    #[arg(long, default_value_t = 2048)]
    pub max_context: usize,
    /// Every request but `/health` must carry `Authorization: Bearer KEY`
    /// (default: the environment's SPECDEC_API_KEY, which keeps it out of `ps`).
    #[arg(long)]
    pub api_key: Option<String>,
    /// The name clients give as `model` (default: the model file's name).
    #[arg(long)]
    pub served_model_name: Option<String>,
    /// Request bodies larger than this are a 413.
    #[arg(long, default_value_t = 1 << 20)]
    pub max_body_bytes: usize,
    /// Seconds a shutdown lets running requests finish before failing
    /// them; the server exits soon after, whatever clients do.
    #[arg(long, default_value_t = 30)]
    pub drain_seconds: u64,
    /// Seconds a request's head (request line and headers) may take to
    /// arrive, also how long a kept-alive connection may sit idle.
    #[arg(long, default_value_t = 10.0)]
    pub header_timeout: f64,
    /// Seconds a request's body may take to arrive once its head has (408).
    #[arg(long, default_value_t = 30.0)]
    pub body_timeout: f64,
    /// Open connections at most: past it, the oldest connection with no
    /// request in flight is closed (or, when all have one, the new one is answered 503).
    #[arg(long, default_value_t = 256)]
    pub max_connections: usize,
    /// Encode special-token strings in user text (chat contents,
    /// completion prompts) as control tokens, as HF and vLLM do. Off by
    /// default: user text is text, and only the chat template writes
    /// control tokens, so a user cannot forge a system turn.
    #[arg(long)]
    pub special_tokens_in_text: bool,
    /// Prompt tokens fed per engine iteration, between the decode steps
    /// of the requests already generating (chunked prefill), so one long
    /// prompt cannot hold the rest up; 0 feeds each prompt whole when it is admitted.
    #[arg(long, default_value_t = 256)]
    pub prefill_chunk: usize,
}

/// Serves `args.model` until SIGTERM or SIGINT.
pub fn serve(args: ServeArgs) -> Result<bool, String> {
    let (weights, codec, name) = load_model(&args.model)?;
    let config = specdec_serve::ServeConfig {
        weights,
        codec,
        model_id: args.served_model_name.unwrap_or(name),
        backend: args.backend,
        proposer: args.proposer,
        k: args.k,
        host: args.host,
        port: args.port,
        max_batch: args.max_batch,
        max_context: args.max_context,
        api_key: args.api_key.or_else(|| std::env::var("SPECDEC_API_KEY").ok().filter(|k| !k.is_empty())),
        max_body_bytes: args.max_body_bytes,
        drain: std::time::Duration::from_secs(args.drain_seconds),
        limits: specdec_serve::Limits {
            header_timeout: seconds("--header-timeout", args.header_timeout)?,
            body_timeout: seconds("--body-timeout", args.body_timeout)?,
            max_connections: args.max_connections,
        },
        special_tokens_in_text: args.special_tokens_in_text,
        prefill_chunk: args.prefill_chunk,
    };
    specdec_serve::serve(config, &mut |addr| {
        println!("specdec serve: listening on http://{addr}");
        let _ = std::io::Write::flush(&mut std::io::stdout());
    })
    .map(|()| true)
}

/// A duration flag given in seconds: finite, positive, and within a day.
fn seconds(flag: &str, s: f64) -> Result<std::time::Duration, String> {
    if !(s.is_finite() && s > 0.0 && s <= 86_400.0) {
        return Err(format!("{flag} {s:?} must be a number of seconds in (0, 86400]"));
    }
    Ok(std::time::Duration::from_secs_f64(s))
}

/// The weights, the text codec and the served name of `--model`: a `.gguf`
/// file, an HF-layout directory, or `tiny:NAME` (a seeded tiny model with
/// two-letter text, for tests).
pub fn load_model(model: &str) -> Result<(Arc<specdec_models::LlamaWeights>, Codec, String), String> {
    if let Some(name) = model.strip_prefix("tiny:") {
        let spec = TinySpec::preset(name).ok_or_else(|| format!("no tiny model `{name}` (one of {})", TinySpec::PRESETS.iter().map(|(n, _)| *n).collect::<Vec<_>>().join(", ")))?;
        let weights = spec.weights().map_err(|e| e.to_string())?;
        return Ok((Arc::new(weights), Codec::Tiny { vocab: spec.vocab }, model.to_string()));
    }
    let loaded = specdec_models::load(model).map_err(|e| e.to_string())?;
    let tokenizer = loaded.tokenizer.ok_or_else(|| format!("{model} has no tokenizer; serve needs one to read and write text"))?;
    let name = Path::new(model).file_name().map_or_else(|| model.to_string(), |n| n.to_string_lossy().trim_end_matches(".gguf").to_string());
    Ok((Arc::new(loaded.weights), Codec::Tokenizer(Box::new(tokenizer)), name))
}

/// `specdec load`: runs each concurrency with speculation on and off (or
/// as asked) against the server at `url`, prints the table and the crossover.
#[allow(clippy::too_many_arguments)]
pub fn load(url: &str, concurrency: &[usize], requests: usize, max_tokens: usize, temperature: f64, prompts: Option<&Path>, speculation: &str, json: Option<&Path>) -> Result<bool, String> {
    let prompts: Vec<String> = match prompts {
        Some(p) => serde_json::from_str(&std::fs::read_to_string(p).map_err(|e| format!("{}: {e}", p.display()))?).map_err(|e| format!("{}: a JSON list of strings: {e}", p.display()))?,
        None => specdec_serve::load::PROMPTS.iter().map(|p| p.to_string()).collect(),
    };
    let modes: Vec<Option<bool>> = match speculation {
        "both" => vec![Some(true), Some(false)],
        "on" => vec![Some(true)],
        "off" => vec![Some(false)],
        "server" => vec![None],
        other => return Err(format!("--speculation {other}: expected both, on, off or server")),
    };
    let mut results = Vec::new();
    for &c in concurrency {
        for &mode in &modes {
            let spec = specdec_serve::load::LoadSpec {
                url: url.to_string(),
                model: None,
                prompts: prompts.clone(),
                max_tokens,
                concurrency: c,
                requests,
                speculation: mode,
                temperature,
                timeout: std::time::Duration::from_secs(600),
            };
            let r = specdec_serve::load::run(&spec)?;
            eprintln!("load: concurrency {c}, speculation {mode:?}: {:.1} tokens/s, {} failed", r.tokens_per_s, r.failed);
            results.push(r);
        }
    }
    print!("{}", specdec_serve::load::markdown(&results));
    if let Some(path) = json {
        std::fs::write(path, serde_json::to_string_pretty(&results).map_err(|e| e.to_string())?).map_err(|e| format!("{}: {e}", path.display()))?;
    }
    Ok(results.iter().all(|r| r.failed == 0))
}
