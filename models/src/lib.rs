//! Llama-family models for specdec: the files, the tokenizer, tiny seeded
//! models, and the f64 reference forward pass every backend is checked against.
//!
//! Role: everything about a model that is not a backend. Files come in two
//! layouts, GGUF (`llama` architecture, v2/v3; F32, F16, Q8_0, Q4_0, Q4_1
//! dequantized on load) and HF (`config.json`, `model.safetensors` or a
//! sharded index, `tokenizer.json`); both load into one host convention,
//! [`LlamaWeights`] (f32, `[out, in]`, HF row order, rotate-half RoPE).
//!
//! Modules: [`config`] (`config.json`, and [`config::LAYER_TENSORS`], the one
//! table of a layer's tensor names in HF and GGUF); [`weights`] (the host
//! convention); [`gguf`], by concern (`types`, `value`, `reader` with every
//! count bounded before allocation, `dequant`, `file`, `llama` with the q/k
//! un-permutation, `write` for f32 GGUF files); [`hf`] (safetensors and
//! sharded indexes); [`fused`] (Phi-3's fused projections, split on load
//! and fused on write); [`tokenizer`] (from GGUF metadata or `tokenizer.json`,
//! with the ChatML template); [`export`]; `load.rs` (format dispatch and
//! `info`); [`forward`], the forward-call contract every backend shares
//! (request, row layout, validation, RoPE angles and the one rotate-half
//! RoPE); [`tiny`] (seeded models); [`reference`] (the f64 forward);
//! [`prompts`] (the prompt files of the suite, the report and draft
//! training); [`draft_data`] (draft training data on disk: greedy
//! continuations, hidden rows in f16). [`parallel`] is the reference's host
//! row split, re-exported for the ndarray port.
//!
//! [`dflash`] holds the DFlash block drafter (DRAFT-6 .. DRAFT-9): its
//! checkpoint (`fc`, `hidden_norm`, Llama layers, `norm`; no embedding and no
//! head of its own, it borrows the target's) validated against the target's
//! config, and its f64 forward in the reference's style and summation order:
//! context features from the target's hidden states, non-causal attention
//! inside the block, parallel and iterative (deterministic) drafting, built on
//! the reference's DRAFT-1 .. DRAFT-4 pieces. [`dflash_f32`] is the same
//! block forward in f32, the drafter the decoder runs: sgemm
//! (`matrixmultiply`, whose threads split the output, never the sums, so
//! results do not depend on the thread count) for many rows,
//! `specdec-rowmat` for a block's few, the
//! target's head optionally in Q8_0 (its tests bound the distance to the f64
//! drafter).
//!
//! Invariants: a file is never trusted: every header number is checked
//! against the file size before anything is allocated from it, and every
//! defect is a typed [`ModelError`] naming the file and the field
//! (MODEL-16; `tests/hostile_files.rs`, and the fuzz corpus); prompt files and
//! draft data are read as untrusted too; the reference forward
//! ([`reference::RefModel`]) uses plain f64 loops in a fixed order and no
//! tensor library, so it can be the oracle of the model section of the
//! conformance suite, and its windows equal its one-token decodes exactly
//! (`tests/forward.rs`).

pub mod config;
pub mod dflash;
pub mod dflash_f32;
pub mod draft_data;
pub mod error;
pub mod export;
pub mod forward;
pub mod fused;
pub mod gguf;
pub mod hf;
pub mod load;
pub mod prompts;
pub mod reference;
pub mod tiny;
pub mod tokenizer;
pub mod weights;

pub use config::LlamaConfig;
pub use dflash::{DflashConfig, DflashContext, DflashDraft, DflashSpec, DflashWeights, export_dflash, load_dflash, seeded_dflash};
pub use draft_data::{DraftData, DraftSequence};
pub use error::{ModelError, Result};
pub use forward::{ForwardPlan, ForwardRequest, LogitRows, SeqRows};
pub use load::{LoadedModel, load};
pub use reference::{RefCache, RefModel};
/// The host row split lives with the reference (its n-gram index uses it too).
pub use specdec_reference::parallel;
pub use tokenizer::Tokenizer;
pub use weights::{LayerWeights, LlamaWeights, Matrix};
