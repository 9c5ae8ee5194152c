//! `specdec model info PATH`, `specdec model export GGUF DIR` (MODEL-5) and
//! `specdec model tiny --preset NAME DIR` (MODEL-12), with its GGUF files and
//! its seeded DFlash drafter (DRAFT-6) on request.

use std::path::PathBuf;

use clap::Subcommand;

#[derive(Subcommand)]
pub enum ModelCommand {
    /// Architecture, sizes, dtypes, tokenizer and special tokens of a `.gguf`
    /// file or an HF-layout directory.
    Info {
        path: PathBuf,
        /// Print JSON instead of lines.
        #[arg(long)]
        json: bool,
    },
    /// Writes the HF layout (`config.json`, `model.safetensors`,
    /// `tokenizer.json`) of a model file into DIR.
    Export {
        model: PathBuf,
        dir: PathBuf,
        /// Weight dtype of `model.safetensors`: f32 (exact), f16 or bf16.
        #[arg(long, default_value = "f32")]
        dtype: String,
    },
    /// Writes a tiny seeded model (MODEL-12) in HF layout: `--preset NAME DIR`.
    Tiny {
        /// One of the presets (`tiny-v16-l1`, `tiny-v12-l2`, `tiny-v32-l2`).
        #[arg(long)]
        preset: String,
        dir: PathBuf,
        /// Also writes `DIR/NAME.gguf` (f32, llama.cpp's layout, the two-letter
        /// pieces as its vocabulary), for engines that read only GGUF, and
        /// `DIR/NAME-end.gguf`, the same model with an end token of its own
        /// past the vocabulary (zero rows), for llama.cpp's server, whose
        /// `ignore_eos` bans the model's eos.
        #[arg(long)]
        gguf: bool,
        /// Also writes `DIR/dflash-seeded/`, the end-to-end section's seeded
        /// DFlash drafter for the model (DRAFT-6's checkpoint layout, f32),
        /// for engines that drive a DFlash draft of their own.
        #[arg(long)]
        dflash: bool,
    },
}

pub fn run(command: ModelCommand) -> Result<bool, String> {
    match command {
        ModelCommand::Info { path, json } => {
            let info = specdec_models::load::info(&path).map_err(|e| e.to_string())?;
            if json {
                println!("{}", serde_json::to_string_pretty(&info).map_err(|e| e.to_string())?);
            } else if let Some(obj) = info.as_object() {
                for (k, v) in obj {
                    println!("{k:<22} {}", if let Some(s) = v.as_str() { s.to_string() } else { v.to_string() });
                }
            }
            Ok(true)
        }
        ModelCommand::Export { model, dir, dtype } => {
            let dtype = specdec_models::hf::SaveDtype::parse(&dtype).map_err(|e| e.to_string())?;
            let loaded = specdec_models::load(&model).map_err(|e| e.to_string())?;
            specdec_models::export::export_hf(&loaded.weights, loaded.tokenizer.as_ref(), &dir, dtype).map_err(|e| e.to_string())?;
            println!("wrote {} (config.json, model.safetensors{})", dir.display(), if loaded.tokenizer.is_some() { ", tokenizer files" } else { "" });
            Ok(true)
        }
        ModelCommand::Tiny { preset, dir, gguf, dflash } => {
            let names: Vec<&str> = specdec_models::tiny::TinySpec::PRESETS.iter().map(|(n, _)| *n).collect();
            let spec = specdec_models::tiny::TinySpec::preset(&preset).ok_or_else(|| format!("unknown preset `{preset}`; known: {}", names.join(", ")))?;
            let weights = spec.weights().map_err(|e| e.to_string())?;
            specdec_models::export::export_hf(&weights, None, &dir, specdec_models::hf::SaveDtype::F32).map_err(|e| e.to_string())?;
            println!("wrote {} ({preset}: config.json, model.safetensors)", dir.display());
            if gguf {
                let pieces: Vec<String> = (0..spec.vocab as u32).map(|i| specdec_models::tiny::tiny_text(&[i])).collect();
                // llama.cpp wants a bos and an eos id; engines under test take eos per request.
                let vocab = specdec_models::gguf::GgufVocab { pieces: &pieces, bos: 0, eos: spec.vocab as u32 - 1 };
                let path = dir.join(format!("{preset}.gguf"));
                specdec_models::gguf::write_llama_gguf(&path, &weights, &preset, &vocab).map_err(|e| e.to_string())?;
                println!("wrote {}", path.display());
                // For llama.cpp's server, which bans its model's eos under `ignore_eos`:
                // an end token of its own past the vocabulary, so that no id of the
                // model's law is banned.
                let padded = specdec_models::gguf::with_end_token(&weights);
                let mut pieces = pieces;
                pieces.push("<end>".into());
                let vocab = specdec_models::gguf::GgufVocab { pieces: &pieces, bos: 0, eos: spec.vocab as u32 };
                let path = dir.join(format!("{preset}-end.gguf"));
                specdec_models::gguf::write_llama_gguf(&path, &padded, &preset, &vocab).map_err(|e| e.to_string())?;
                println!("wrote {}", path.display());
            }
            if dflash {
                let draft = specdec_conformance::e2e_section::seeded_dflash(&weights)?;
                let path = dir.join("dflash-seeded");
                specdec_models::export_dflash(&draft, &path, specdec_models::hf::SaveDtype::F32).map_err(|e| e.to_string())?;
                println!("wrote {} (DFlash drafter: config.json, model.safetensors)", path.display());
            }
            Ok(true)
        }
    }
}
