//! Export to the HF layout (MODEL-5): `config.json`, `model.safetensors`,
//! and the tokenizer files.
//!
//! Role: turn any loaded model (typically a dequantized GGUF file) into a
//! directory that HF transformers and [`crate::hf::load_hf_dir`] read.
//!
//! Invariants: weights are written in the host convention they are held in
//! (HF names, `[out, in]`, HF q/k row order), so an F32 export loads back
//! bit-identical; `torch_dtype` in `config.json` names the dtype written.

use std::path::Path;

use crate::error::{ModelError, Result};
use crate::hf::{CONFIG_FILE, SINGLE_FILE, SaveDtype, write_safetensors};
use crate::tokenizer::Tokenizer;
use crate::weights::LlamaWeights;

/// Writes `weights` (and `tokenizer`, when given) into `dir` as an HF model
/// directory, tensors in `dtype`. Creates `dir` if needed; overwrites the
/// files it writes.
pub fn export_hf(weights: &LlamaWeights, tokenizer: Option<&Tokenizer>, dir: impl AsRef<Path>, dtype: SaveDtype) -> Result<()> {
    let dir = dir.as_ref();
    if weights.config.rope().is_ok_and(|r| r.freq_factors.is_some()) {
        return Err(ModelError::InvalidInput { arg: "config", reason: "per-frequency rotary factors (a GGUF's `rope_freqs`) have no HF config form".into() });
    }
    std::fs::create_dir_all(dir).map_err(|e| ModelError::io(dir, e))?;

    let mut config = weights.config.clone();
    config.torch_dtype = Some(dtype.torch_name().to_string());
    let config_path = dir.join(CONFIG_FILE);
    let text = serde_json::to_string_pretty(&config).map_err(|e| ModelError::io(&config_path, e))?;
    std::fs::write(&config_path, text + "\n").map_err(|e| ModelError::io(&config_path, e))?;

    let stored = crate::fused::stored_named(weights)?;
    let named: Vec<(String, &crate::weights::Matrix)> = stored.iter().map(|(n, m)| (n.clone(), m.as_ref())).collect();
    write_safetensors(dir.join(SINGLE_FILE), &named, dtype)?;

    if let Some(t) = tokenizer {
        t.save(dir)?;
    }
    Ok(())
}
