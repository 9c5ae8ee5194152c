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
    Ok((Arc::new(loaded.weights), Codec::Tokenizer(tokenizer), name))
}
