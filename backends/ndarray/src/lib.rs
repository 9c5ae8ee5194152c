//! The ndarray port of the specdec [`Backend`] contract: a CPU backend whose
//! ops are whole-array ndarray operations (`Zip` maps and `where`s,
//! `fold_axis` reductions, `accumulate_axis_inplace` scans, `select`
//! gathers), never the reference's per-element loops, except where
//! whole-array passes cost many reads of the logits: argmax is one pass per
//! row (`kernels::row_argmax`: the row max in eight vectorisable lanes, then
//! the smallest position holding it, for lowest-id ties), and greedy verify
//! and `process_logits` without top-k or top-p (the decoder's hot path) run
//! one fused pass per row (`kernels::for_rows`: that argmax with the score
//! check folded in, then the softmax), with rows split across threads. Host loops otherwise run only over rows where ndarray
//! has no vectorised form (the per-lane sort of top-k/top-p) and over
//! n-gram sizes. Tensors ([`NdTensor`]) are
//! `ArrayD<f64>` or `ArrayD<i64>`, and verify outputs stay in them until the
//! caller downloads them. Validation (ERR-1, CONV-*): each op checks shapes
//! from the array dims and folds every value condition into one boolean with
//! array reductions, masking padding rows (CONV-7: target rows `j > len`,
//! draft rows `j >= len`) with `where` before any reduction, so NaN there is
//! neither validated nor read; only when that fast check fails are the
//! inputs copied to the host and run through the reference backend, whose
//! error names the first defect (kind, argument, index); if the reference
//! accepts what the check rejected, the op answers a device error.
//! Precision: f64 values, f64 accumulation, and every sum and cumulative sum
//! in index order (`fold_axis` and `accumulate_axis_inplace` visit a lane in
//! order; ndarray's `sum`/`sum_axis`, whose unrolled order differs, are never
//! used), so every output is bit-identical to the reference (`tests/ops.rs`
//! checks this); the stated `margin_epsilon` and `value_tolerance` are
//! therefore 0 and no decision is ever excused. The seeded verify draws
//! from `rand_pcg::Pcg64::seed_from_u64(seed)` (see
//! [`Backend::rejection_verify_seeded`] on [`NdarrayBackend`]). A
//! deliberately broken copy of this port, which the suite must reject,
//! lives in `tests/mutant_caught.rs`, outside the production code.
//!
//! Three backends in `all` share this code: `ndarray` ([`NdarrayBackend::new`]);
//! `ndarray-q8_0` ([`NdarrayBackend::q8_0`]), the same with Q8_0 weights,
//! lossless because a window rounds like its decodes; and `ndarray-f32`
//! ([`NdarrayBackend::f32_softmax`]) with f32 probabilities: `softmax_f32.rs`
//! (a vectorised f32 `exp` polynomial, sums in f64, within a stated 1e-6 of
//! the reference), its f32 tensors read as they are by the rejection verify
//! (whose decision row is one fused pass: residual, sum, inverse CDF,
//! bit-identical to the whole-array form), the greedy verify and the glue,
//! and widened exactly to f64 by every other op.
//!
//! Modules beyond the ports' common layout (see `specdec-backend`):
//! `model.rs`, the batch-invariant Llama forward (projections through
//! `specdec-rowmat`, q/k/v and gate/up stacked, attention per row over
//! exactly the positions it sees; its windows equal one-token decodes bit
//! for bit, window epsilon 0); `widest.rs` (a closure compiled for the widest
//! instruction set: the SwiGLU and attention exponentials); `glue.rs` (the
//! glue ops as `to_shape`, `select`, `concatenate` and a checked `Zip`);
//! `pool.rs`, which recycles large f32 and f64 outputs (probabilities, the
//! forward's logits) so a call does not fault in fresh pages; `tensor.rs`
//! ([`NdTensor`]).

mod backend;
mod check;
mod glue;
mod kernels;
mod kv;
mod model;
mod ngram;
mod pool;
mod sampling;
mod softmax_f32;
mod tensor;
mod verify;
mod widest;

pub use kv::NdKvCache;
pub use model::{NdModel, NdModelCache};
pub use tensor::NdTensor;

/// The ndarray backend: stateless, on the CPU, f64 throughout for the
/// verify kernels unless [`Softmax::F32`] is chosen; the model forward's
/// weights in [`WeightFormat`].
#[derive(Debug, Clone, Copy, Default)]
pub struct NdarrayBackend {
    weights: WeightFormat,
    softmax: Softmax,
}

/// The arithmetic of `process_logits`' softmax rows without top-k or top-p
/// (the decoder's hot path, and most of a verify from logits).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Softmax {
    /// f64 and the C library's `exp`, bit for bit the reference.
    #[default]
    F64,
    /// `ndarray-f32`: f32 probabilities from vectorised f32 exponentials
    /// summed in f64, within a stated tolerance of the reference (see
    /// `softmax_f32.rs`). f32 uploads and the forward's outputs stay f32;
    /// the rejection verify, reshape and the row glue read f32 as it is,
    /// every other op widens it to f64 exactly and runs the f64 path.
    F32,
}

/// How the model forward holds its projection weights (see `model.rs`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum WeightFormat {
    /// f32, as loaded.
    #[default]
    F32,
    /// GGUF's Q8_0 (blocks of 32: an f16 scale and 32 signed bytes) where the
    /// input width allows; the products are batch-invariant, so windows still
    /// equal decodes bit for bit.
    Q8_0,
}
