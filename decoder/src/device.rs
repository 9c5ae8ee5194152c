//! Small device helpers the engine and the proposers share: uploads of
//! per-row sampling parameters, processed distributions, and draws whose
//! ids (only) come back to the host.

use rand::RngExt;
use rand_pcg::Pcg64;
use specdec_backend::model::ModelBackend;
use specdec_backend::{DrawNoiseArg, HostTensor, LogitsParams, SamplingParams};

use crate::DecodeError;

pub(crate) fn upload_f64<B: ModelBackend>(b: &B, shape: Vec<usize>, data: Vec<f64>) -> Result<B::Tensor, DecodeError> {
    Ok(b.upload_f64(&HostTensor::new(shape, data).map_err(|e| DecodeError::Internal(e.to_string()))?)?)
}

pub(crate) fn upload_i64<B: ModelBackend>(b: &B, shape: Vec<usize>, data: Vec<i64>) -> Result<B::Tensor, DecodeError> {
    Ok(b.upload_i64(&HostTensor::new(shape, data).map_err(|e| DecodeError::Internal(e.to_string()))?)?)
}

/// `logits [R, V]` processed row by row with `params[r]` (LOGITS-1 .. LOGITS-6).
pub(crate) fn process<B: ModelBackend>(b: &B, logits: &B::Tensor, params: &[SamplingParams]) -> Result<B::Tensor, DecodeError> {
    let r = params.len();
    let temperature = upload_f64(b, vec![r], params.iter().map(|p| p.temperature).collect())?;
    let top_k = upload_i64(b, vec![r], params.iter().map(|p| p.top_k as i64).collect())?;
    let top_p = upload_f64(b, vec![r], params.iter().map(|p| p.top_p).collect())?;
    Ok(b.process_logits(logits, LogitsParams { temperature: &temperature, top_k: &top_k, top_p: &top_p })?)
}

/// One id per row of `probs [R, V]` by inverse CDF, row `r` with the next
/// uniform of `rngs[r]` (a greedy row is one-hot: any uniform gives its argmax).
pub(crate) fn draw<B: ModelBackend>(b: &B, probs: &B::Tensor, rngs: &mut [Pcg64]) -> Result<Vec<u32>, DecodeError> {
    let u: Vec<f64> = rngs.iter_mut().map(|r| r.random::<f64>()).collect();
    let u = upload_f64(b, vec![u.len()], u)?;
    let ids = b.draw(probs, DrawNoiseArg::InverseCdf(&u))?;
    download_ids(b, &ids)
}

pub(crate) fn download_ids<B: ModelBackend>(b: &B, t: &B::Tensor) -> Result<Vec<u32>, DecodeError> {
    b.download_i64(t)?.data().iter().map(|&x| u32::try_from(x).map_err(|_| DecodeError::Internal(format!("the backend returned token id {x}")))).collect()
}
