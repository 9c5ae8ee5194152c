//! The candle port of the specdec [`Backend`] contract: every operation is
//! written once as candle tensor ops on a `candle_core::Device` (CPU, or CUDA
//! behind the `cuda` feature) and outputs stay on the device. Validation
//! (ERR-1): shapes are checked on the host from tensor dims, values by
//! device masks (non-finite, negative, row sum, id range, padding, lengths,
//! noise range) reduced to one flag read back once per op; padding rows
//! (CONV-7) are excluded with `where`, never by multiplication, so their NaN
//! cannot leak. Only when that check fails are the inputs downloaded and the
//! reference operation run on them to *name* the defect (kind, argument and
//! index are the reference's own); if the reference accepts what the device
//! rejected, the answer is a `Device` error. Precision (CONV-9): values are
//! stored and computed in f32; sums, running sums (a pairwise O(n log n)
//! scan: candle's `cumsum` needs an n x n matrix) and the arithmetic of each
//! decision (accept test, inverse CDF, race quotient) are f64, because an
//! f32 running sum over a 150k vocabulary can err by n 2^-24 ~ 1e-2, beyond
//! CONV-2's 1e-4 and every decision margin. Decisions then differ from the reference
//! only through the f32 rounding of the inputs (2^-24 relative), which moves
//! probability decisions by a few 1e-7: `margin_epsilon = 1e-6`. Not covered:
//! inverse-CDF draws from a residual of tiny mass R (error ~2^-23 / R) and
//! top-p on logits with |l| / T beyond ~8 (error ~2^-23 |l| / T). Float
//! outputs (f32 softmax, residuals, gathered K/V) are within
//! `value_tolerance = 1e-5` under the same conditions. Uploads round to f32;
//! a nonzero value below its range stays nonzero (the smallest subnormal),
//! so signs and zero weights are judged as the reference judges them; a
//! value beyond its range becomes infinite and is rejected (as in the tch
//! port), where the reference accepts it unless a row total overflows. Ties go to the lowest id (CONV-8) by construction, not by
//! candle's `argmax`, whose CUDA kernel does not promise it. Randomness: see
//! `noise`; `rejection_verify_seeded` is reproducible from its seed on every
//! device (cuRAND on CUDA; PCG64 on the CPU, whose candle generator cannot
//! be seeded). Limits: the top-p tie-break needs V < 2^24,
//! and candle's CUDA argsort (one row in shared memory) limits top-k/top-p
//! to V <= 8192; the sorts are skipped when no row uses them.
//!
//! The Llama forward pass (`ModelBackend`, MODEL-8 .. MODEL-11) is in
//! `model`: weights resident on the same device, a per-layer KV cache, and
//! its own measured precision ([`specdec_backend::ModelBackend::model_precision`]).
//! It is written in candle ops, device-generic: q/k/v and gate/up are
//! stacked weights, and RMSNorm, RoPE and the softmax are candle-nn's fused
//! kernels, because on a GPU a step costs its launches. Its linear weights
//! come in a [`WeightFormat`] (f32; f16; GGUF Q8_0 through candle's quantized
//! matmul); f16 and Q8_0 are backends by name only (`candle-cpu-f16`,
//! `candle-cpu-q8_0`: their windows and decodes take other kernels and round
//! apart, so the model section's window check fails on both and the
//! end-to-end section on Q8_0), each stating its own measured precision,
//! the hidden-state and window bounds included. `glue.rs` holds the glue ops
//! (`reshape`, `index_select`, `cat`, masked i64 `add`/`sub`) and the direct
//! f32 upload. The module layout is the ports' common one (see
//! `specdec-backend`), with `noise.rs` for the seeded verify's noise.

mod backend;
mod check;
mod glue;
mod kernels;
mod kv;
mod model;
mod ngram;
mod noise;
mod sampling;
mod verify;

pub use kv::CandleKvCache;
pub use model::{CandleModel, CandleModelCache};

use candle_core::Device;

/// How a model's linear weights are held on the device (MODEL-11: each
/// format states its own precision, see
/// [`specdec_backend::ModelBackend::model_precision`]). The kernels are the
/// same in every format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WeightFormat {
    /// f32, as loaded: the reference's numbers within f32 rounding.
    F32,
    /// f16 linear weights; each product rounds its activations to f16 and
    /// returns f32 (norms, attention and the residual stream stay f32). A
    /// decode step reads half the f32 bytes. Not lossless for speculative
    /// decoding either (see `model_precision`).
    F16,
    /// GGUF's Q8_0 blocks (32 weights, one f16 scale, 8-bit values: 8.5 bits
    /// a weight), multiplied by candle's quantized matmul; a matrix whose
    /// input width is not a multiple of 32 stays f32. A decode step reads
    /// 27 % of the f32 bytes. Not lossless for speculative decoding (its
    /// windows and decodes round apart; see `model_precision`).
    Q8_0,
}

/// specdec on a candle device.
#[derive(Debug, Clone)]
pub struct CandleBackend {
    device: Device,
    name: &'static str,
    weights: WeightFormat,
}
