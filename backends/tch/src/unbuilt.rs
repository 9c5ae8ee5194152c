//! The stand-in compiled without the `libtorch` feature: a backend that cannot be
//! constructed, so the conformance adapter reports every check as not supported with
//! [`NOT_BUILT`] as the reason, and no tch type appears in the build. It implements
//! [`ModelBackend`] too (uninhabited model and cache), so code generic over model
//! backends compiles in both configurations.

use std::convert::Infallible;

use specdec_backend::{Backend, ForwardOutput, HostTensor, ModelBackend, ModelPrecision, Precision, Result};
use specdec_models::{ForwardRequest, LlamaWeights};

use crate::NOT_BUILT;

/// Uninhabited without libtorch; every constructor returns `Err(NOT_BUILT)`.
#[derive(Debug, Clone, Copy)]
pub struct TchBackend {
    never: Infallible,
}

impl TchBackend {
    /// Always `Err`: this build has no libtorch.
    pub fn try_cpu() -> std::result::Result<Self, String> {
        Err(NOT_BUILT.to_string())
    }

    /// Always `Err`: this build has no libtorch.
    pub fn cuda_if_available() -> std::result::Result<Self, String> {
        Err(NOT_BUILT.to_string())
    }
}

impl Backend for TchBackend {
    type Tensor = Infallible;
    type KvCache = Infallible;

    fn name(&self) -> String {
        match self.never {}
    }

    fn device(&self) -> String {
        match self.never {}
    }

    fn precision(&self) -> Precision {
        match self.never {}
    }

    fn upload_f64(&self, _t: &HostTensor<f64>) -> Result<Infallible> {
        match self.never {}
    }

    fn upload_i64(&self, _t: &HostTensor<i64>) -> Result<Infallible> {
        match self.never {}
    }

    fn download_f64(&self, t: &Infallible) -> Result<HostTensor<f64>> {
        match *t {}
    }

    fn download_i64(&self, t: &Infallible) -> Result<HostTensor<i64>> {
        match *t {}
    }
}

impl ModelBackend for TchBackend {
    type Model = Infallible;
    type ModelCache = Infallible;

    fn model_precision(&self) -> ModelPrecision {
        match self.never {}
    }

    fn load_model(&self, _weights: &LlamaWeights) -> Result<Infallible> {
        match self.never {}
    }

    fn new_model_cache(&self, model: &Infallible, _batch: usize, _capacity: usize) -> Result<Infallible> {
        match *model {}
    }

    fn forward(&self, model: &Infallible, _cache: &mut Infallible, _req: &ForwardRequest<'_>) -> Result<ForwardOutput<Infallible>> {
        match *model {}
    }

    fn cache_lens(&self, cache: &Infallible) -> Vec<usize> {
        match *cache {}
    }

    fn cache_trim(&self, cache: &mut Infallible, _amounts: &[usize]) -> Result<()> {
        match *cache {}
    }

    fn cache_contents(&self, cache: &Infallible, _layer: usize, _seq: usize) -> Result<(Vec<f64>, Vec<f64>)> {
        match *cache {}
    }
}
