//! A hand-written GGUF v2/v3 reader and the `llama` loader on top of it
//! (MODEL-3, MODEL-4).
//!
//! Role: open a `.gguf` file (memory-mapped), parse its header, metadata and
//! tensor table, dequantize tensors to f32 (F32, F16, Q8_0, Q4_0, Q4_1), and
//! assemble a [`LlamaWeights`] in the host convention (HF names, `[out, in]`,
//! HF row order for `q`/`k`).
//!
//! Invariants (MODEL-16): the file is hostile until proven otherwise.
//! Every count and length read from the header is bounded by the bytes that
//! remain before anything is allocated from it (a count `n` of entries that
//! take at least `m` bytes each must satisfy `n·m <= remaining`), arrays nest
//! at most [`MAX_ARRAY_DEPTH`] deep, every tensor's byte range is checked to
//! lie inside the file when the file is opened, and every defect is a typed
//! [`ModelError`] naming the file and the key or tensor at fault. Nothing in
//! this module panics on file content.
//!
//! We parse GGUF ourselves (rather than through a tensor library) precisely
//! so that these checks happen before any allocation.
//!
//! By concern, bottom up: `types` (the ggml tensor types), `value` (metadata
//! values), `reader` (the bounded byte reader: header, metadata, tensor
//! table), `dequant`, `file` ([`GgufFile`]: an opened file) and `llama` (the
//! architecture's config and weights, and the q/k permutation); `write`
//! writes f32 `llama` files (the tiny models, for engines that read GGUF).

mod dequant;
mod file;
mod llama;
mod reader;
mod types;
mod value;
mod write;

pub use file::GgufFile;
pub(crate) use file::map_file;
pub use llama::{gguf_tensor_name, llama_config, llama_weights, load_llama_gguf, permute_qk, unpermute_qk};
pub use reader::{DEFAULT_ALIGNMENT, GGUF_MAGIC, GgufTensor, MAX_ARRAY_DEPTH, MAX_DIMS};
pub use types::GgmlType;
pub use value::{GgufArray, GgufValue};
pub use write::{GgufVocab, with_end_token, write_llama_gguf};
