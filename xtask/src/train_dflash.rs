//! `cargo xtask train-dflash`: the CPU recipe of a DFlash draft for
//! SmolLM2-135M-Instruct, end to end and reproducible on any machine: the
//! training data (`specdec draft-data`, cached under `.cache/dflash/` by the
//! prompts and the recipe), then `specdec-train` (libtorch on the CPU, seeded).
//!
//! It made the first shipped draft (73 k anchors, held-out tau 1.21). The
//! draft shipped now (`fixtures/dflash/smollm2-135m-instruct`) comes from the
//! same training at GPU volume, `train/gpu-recipe.sh` (1.4 M tokens, tau
//! 1.54); each checkpoint's `training.json` records its training config.

use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};

use crate::{cargo_with, libtorch, smollm2_env};

const PROMPTS: &str = "fixtures/dflash/prompts.json";
/// Target layers read by `fc`: DFlash's spacing from layer 1 to `L - 3`
/// (SGLang's `build_target_layer_ids`) for K = 3 of SmolLM2's 30 layers.
const LAYERS: &str = "1,14,27";
const MAX_TOKENS: &str = "160";
/// `<empty_output>`: a special token no prompt or continuation contains.
const MASK_TOKEN_ID: &str = "16";
pub const STEPS: usize = 1000;

pub fn train(root: &Path, backend: &str, steps: usize, out: Option<PathBuf>) -> Result<(), String> {
    let lt = libtorch::ensure_libtorch(root)?;
    let env = smollm2_env(root)?;
    let gguf = env.iter().find(|(k, _)| k == crate::smollm2::GGUF_ENV).map(|(_, v)| v.clone()).ok_or("no SmolLM2 GGUF in the model environment")?;
    let prompts = std::fs::read(root.join(PROMPTS)).map_err(|e| format!("{PROMPTS}: {e}"))?;
    let mut h = DefaultHasher::new();
    (prompts, LAYERS, MAX_TOKENS, backend).hash(&mut h);
    let cache = root.join(".cache/dflash").join(format!("data-{:016x}", h.finish()));
    let cli = ["run", "--release", "--quiet", "-p", "specdec-cli", "--features", "tch", "--"];
    for (split, batch) in [("train", "64"), ("heldout", "64")] {
        let dir = cache.join(split);
        if dir.join("data.json").exists() {
            eprintln!("xtask: training data `{split}` cached in {}", dir.display());
            continue;
        }
        let args: Vec<String> = [
            "draft-data",
            "--model",
            &gguf.display().to_string(),
            "--backend",
            backend,
            "--prompts",
            PROMPTS,
            "--split",
            split,
            "--layers",
            LAYERS,
            "--max-tokens",
            MAX_TOKENS,
            "--batch",
            batch,
            "--out",
            &dir.display().to_string(),
        ]
        .map(String::from)
        .to_vec();
        cargo_with(root, &cli, &args, Some(&lt), &env)?;
    }
    let out = out.unwrap_or_else(|| root.join(".cache/dflash/smollm2-135m-instruct"));
    let args: Vec<String> = [
        "--target",
        &gguf.display().to_string(),
        "--data",
        &cache.join("train").display().to_string(),
        "--heldout",
        &cache.join("heldout").display().to_string(),
        "--out",
        &out.display().to_string(),
        "--steps",
        &steps.to_string(),
        "--eval-every",
        "250",
        "--mask-token-id",
        MASK_TOKEN_ID,
    ]
    .map(String::from)
    .to_vec();
    cargo_with(root, &["run", "--release", "--quiet", "-p", "specdec-train", "--features", "libtorch", "--"], &args, Some(&lt), &env)
}
