//! Llama-family models for specdec: the files, the tokenizer, tiny seeded
//! models, and the f64 reference forward pass every backend is checked against.
//!
//! Role: everything about a model that is not a backend. Files come in two
//! layouts, GGUF (`llama` architecture, v2/v3; F32, F16, Q8_0, Q4_0, Q4_1
//! dequantized on load) and HF (`config.json`, `model.safetensors` or a
//! sharded index, `tokenizer.json`); both load into one host convention,
//! [`LlamaWeights`] (f32, `[out, in]`, HF row order, rotate-half RoPE).
//!
//! Invariants: a file is never trusted: every header number is checked
//! against the file size before anything is allocated from it, and every
//! defect is a typed [`ModelError`] naming the file and the field
//! (MODEL-16); the reference forward ([`reference::RefModel`]) uses plain
//! f64 loops in a fixed order and no tensor library, so it can be the oracle
//! of the model section of the conformance suite.

pub mod config;
pub mod error;
pub mod export;
pub mod forward;
pub mod gguf;
pub mod hf;
pub mod load;
pub mod reference;
pub mod tiny;
pub mod tokenizer;
pub mod weights;

pub use config::LlamaConfig;
pub use error::{ModelError, Result};
pub use forward::{ForwardPlan, ForwardRequest, LogitRows, SeqRows};
pub use load::{LoadedModel, load};
pub use reference::{RefCache, RefModel};
pub use tokenizer::Tokenizer;
pub use weights::{LayerWeights, LlamaWeights, Matrix};
