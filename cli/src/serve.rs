//! `specdec serve`: the model and its text codec from the command line,
//! then the server of `specdec-serve` until SIGTERM or SIGINT.

use std::path::Path;
use std::sync::Arc;

use specdec_models::tiny::TinySpec;
use specdec_serve::text::Codec;

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
