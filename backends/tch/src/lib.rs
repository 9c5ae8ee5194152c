//! The libtorch (tch 0.26) port of the specdec [`Backend`](specdec_backend::Backend) contract,
//! one code path for CPU and CUDA (the device is chosen at run time).
//!
//! Role and invariants: every operation is a short sequence of libtorch tensor operations
//! (comparisons, `where`, `cumsum`/`cumprod`, `gather`/`scatter`/`index_select`, stable
//! `sort`, reductions) on the backend's device; no host loop runs over the batch, positions
//! or vocabulary (the n-gram proposer loops over n-gram sizes, a configuration), and
//! results stay on the device until the caller downloads them. Validation (ERR-1) is
//! two-stage: shapes are checked on the host from tensor dims, then all value checks of an
//! operation (finiteness, signs, f64 row sums, id ranges, PAD layout, lengths, noise
//! ranges) are fused into one device reduction whose single boolean is read back. Only
//! when that check fails, or a shape is wrong, are the inputs downloaded and handed to the
//! reference ([`specdec_backend::ReferenceBackend`], i.e. the `specdec_reference`
//! functions) to *name* the first defect, so error kinds and argument names are the
//! reference's by construction; if the reference accepts what the device rejected, the
//! answer is `BackendError::Device`. Padding rows (CONV-7) are masked with `where` before
//! any reduction, so NaN there never reaches an output. Argmax ties go to the lowest id
//! through an explicit `min(where(x == max, id, V))`, never through the device's argmax
//! kernel. Precision: inputs are stored as f32 (`upload_f64` rounds to nearest, but never
//! across 0 or 1, so signs, zero weights and uniform ranges are judged as the reference
//! judges the f64 input; magnitudes beyond `f32::MAX` become infinite and are rejected as
//! `NonFinite`, where the reference accepts them unless a row total overflows); row sums,
//! cumulative sums, accept tests, race scores and normalisations run in f64
//! (`Kind::Double`). Decisions thus differ from
//! the f64 reference only through the f32 rounding of the inputs (unit roundoff 6e-8): at
//! most about 2.4e-7 on the SAMPLE-3 margins of O(1) probabilities and uniforms, and of
//! logits with |logit| / T <= 8, hence `margin_epsilon = 1e-6`; distributions and O(1)
//! K/V values match within `value_tolerance = 1e-6` (K/V exactly when f32-representable).
//! Outside that statement: logits far larger than T, row sums within 1e-7 of the 1e-4
//! tolerance, and residual masses `sum max(0, p - q)` comparable to the rounding of `p`
//! and `q`. The seeded verify uses libtorch's global generator, seeded with
//! `tch::manual_seed` under a process-wide lock (tch 0.26 exposes no per-call generator).
//! The Llama forward pass ([`specdec_backend::ModelBackend`], MODEL-8 .. MODEL-11) lives in
//! `model.rs`, with its own f32 precision statement; it uses no RNG.
//! Without the `libtorch` feature the crate still compiles: [`BUILT`] is false and the
//! constructors answer [`NOT_BUILT`] (`unbuilt.rs`, an uninhabited stand-in that reports
//! "not built"); `cargo xtask` supplies a cached libtorch and turns the feature on.
//!
//! Layout: the ports' common one (see `specdec-backend`), with the verify, sampling and
//! n-gram kernels in `kernels.rs`; `model.rs` is the Llama forward in libtorch ops,
//! `glue.rs` the glue ops (`reshape`, `index_select`, `cat`, guarded i64 `add`/`sub`) and
//! the direct f32 upload. With a CUDA libtorch (`cargo xtask cuda`: libtorch 2.11, the GPU
//! machines' PyTorch, through a patched torch-sys) the same code runs on CUDA, where the
//! forward states candle-cuda's bound (cuBLAS picks its kernel by the number of rows).

#[cfg(feature = "libtorch")]
mod backend;
#[cfg(feature = "libtorch")]
mod check;
#[cfg(feature = "libtorch")]
mod glue;
#[cfg(feature = "libtorch")]
mod kernels;
#[cfg(feature = "libtorch")]
mod kv;
#[cfg(feature = "libtorch")]
mod model;
#[cfg(all(test, feature = "libtorch"))]
mod tests;
#[cfg(not(feature = "libtorch"))]
mod unbuilt;

#[cfg(feature = "libtorch")]
pub use kv::TchKvCache;
#[cfg(feature = "libtorch")]
pub use model::{TchModel, TchModelCache};
#[cfg(feature = "libtorch")]
use tch::{Device, Tensor};
#[cfg(not(feature = "libtorch"))]
pub use unbuilt::TchBackend;

#[cfg(feature = "libtorch")]
/// A device tensor handle: f32 values or i64 ids. Cloning shares storage (a shallow
/// clone); no operation of this crate mutates a tensor it was given.
pub struct TchTensor(Tensor);

#[cfg(feature = "libtorch")]
impl TchTensor {
    /// Wraps a libtorch tensor (float kinds are used as f32, integer kinds as i64).
    pub fn new(t: Tensor) -> Self {
        TchTensor(t)
    }

    #[cfg(feature = "libtorch")]
    /// The libtorch tensor.
    pub fn tensor(&self) -> &Tensor {
        &self.0
    }
}

#[cfg(feature = "libtorch")]
impl Clone for TchTensor {
    fn clone(&self) -> Self {
        TchTensor(self.0.shallow_clone())
    }
}

#[cfg(feature = "libtorch")]
impl std::fmt::Debug for TchTensor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Shape and placement only: printing the values could mean a device download.
        write!(f, "TchTensor({:?}, {:?}, {:?})", self.0.size(), self.0.f_kind().ok(), self.0.device())
    }
}

#[cfg(feature = "libtorch")]
/// The libtorch backend on one device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TchBackend {
    device: Device,
}

/// Whether this build links libtorch (the `libtorch` feature).
pub const BUILT: bool = cfg!(feature = "libtorch");

/// Why the constructors fail in a build without the `libtorch` feature.
pub const NOT_BUILT: &str = "tch backend not built: the `libtorch` feature is off (cargo xtask test builds it with a cached libtorch)";
