//! Small device helpers the engine and the proposers share: uploads of
//! per-row sampling parameters, processed distributions, and draws whose
//! ids (only) come back to the host.

use rand::RngExt;
use rand_pcg::Pcg64;
use specdec_backend::model::ModelBackend;
use specdec_backend::{DrawNoiseArg, HostTensor, LogitsParams, Penalties, SamplingParams};
use specdec_reference::penalty_counts;

use crate::error::DecodeError;

pub(crate) fn upload_f64<B: ModelBackend>(b: &B, shape: Vec<usize>, data: Vec<f64>) -> Result<B::Tensor, DecodeError> {
    Ok(b.upload_f64(&HostTensor::new(shape, data).map_err(|e| DecodeError::Internal(e.to_string()))?)?)
}

pub(crate) fn upload_i64<B: ModelBackend>(b: &B, shape: Vec<usize>, data: Vec<i64>) -> Result<B::Tensor, DecodeError> {
    Ok(b.upload_i64(&HostTensor::new(shape, data).map_err(|e| DecodeError::Internal(e.to_string()))?)?)
}

/// The processor inputs of one row (LOGITS-7 .. LOGITS-13).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Row<'a> {
    pub(crate) params: SamplingParams,
    /// The tokens the penalties count: the request's scope of its context (LOGITS-12) ...
    pub(crate) counted: &'a [u32],
    /// ... plus the drafts before this row (LOGITS-13).
    pub(crate) drafts: &'a [u32],
    /// `(id, bias)` pairs, validated with the request (LOGITS-7).
    pub(crate) bias: &'a [(u32, f64)],
    /// The tokens a constraint allows at this row (CONSTRAIN-1, CONSTRAIN-3);
    /// the others' logits become `-inf` before every processor.
    pub(crate) allowed: Option<&'a [bool]>,
}

impl<'a> Row<'a> {
    /// The row after `drafts` of a request whose context (prompt, then
    /// generated tokens) is `context`, its prompt the first `prompt_len`.
    pub(crate) fn after(params: SamplingParams, context: &'a [u32], prompt_len: usize, bias: &'a [(u32, f64)], drafts: &'a [u32]) -> Self {
        Row { params, counted: params.penalty_scope.counted(context, prompt_len), drafts, bias, allowed: None }
    }

    /// The row's penalty counts `[V]`: its context's scope, then the drafts
    /// before it (LOGITS-12, LOGITS-13).
    pub(crate) fn counts(&self, vocab: usize) -> Vec<f64> {
        let mut row = penalty_counts(self.counted, vocab);
        for &d in self.drafts {
            row[d as usize] += 1.0;
        }
        row
    }

    /// A row with no penalty context and no bias: LOGITS-1 .. LOGITS-6 and min-p.
    pub(crate) fn plain(params: SamplingParams) -> Self {
        Row { params, counted: &[], drafts: &[], bias: &[], allowed: None }
    }
}

/// `logits [R, V]` processed row by row with `rows[r]` (LOGITS-1 .. LOGITS-13).
///
/// The penalty counts and the bias are built on the host from tokens the
/// decoder already holds (each step's emitted ids come back for the stop
/// checks; drafts are host ids) and uploaded once per call as `[R, V]`, only
/// when some row uses them: nothing is downloaded for them (BACKEND-1).
pub(crate) fn process<B: ModelBackend>(b: &B, logits: &B::Tensor, rows: &[Row<'_>], vocab: usize) -> Result<B::Tensor, DecodeError> {
    let r = rows.len();
    let masked = rows.iter().any(|x| x.allowed.is_some()).then(|| mask(b, logits, rows, vocab)).transpose()?;
    let logits = masked.as_ref().unwrap_or(logits);
    let column = |f: &dyn Fn(&SamplingParams) -> f64| upload_f64(b, vec![r], rows.iter().map(|x| f(&x.params)).collect());
    let temperature = column(&|p| p.temperature)?;
    let top_k = upload_i64(b, vec![r], rows.iter().map(|x| x.params.top_k as i64).collect())?;
    let top_p = column(&|p| p.top_p)?;
    let min_p = rows.iter().any(|x| x.params.min_p > 0.0).then(|| column(&|p| p.min_p)).transpose()?;
    let penalised = rows.iter().any(|x| x.params.penalised());
    let penalties = penalised
        .then(|| {
            let mut counts = Vec::with_capacity(r * vocab);
            for x in rows {
                counts.extend(x.counts(vocab));
            }
            Ok::<_, DecodeError>([upload_f64(b, vec![r, vocab], counts)?, column(&|p| p.repetition_penalty)?, column(&|p| p.presence_penalty)?, column(&|p| p.frequency_penalty)?])
        })
        .transpose()?;
    let bias = rows
        .iter()
        .any(|x| !x.bias.is_empty())
        .then(|| {
            let mut data = vec![0.0; r * vocab];
            for (i, x) in rows.iter().enumerate() {
                for &(id, v) in x.bias {
                    data[i * vocab + id as usize] = v;
                }
            }
            upload_f64(b, vec![r, vocab], data)
        })
        .transpose()?;
    let mut params = LogitsParams::new(&temperature, &top_k, &top_p);
    params.min_p = min_p.as_ref();
    params.penalties = penalties.as_ref().map(|[c, rep, pres, freq]| Penalties { counts: c, repetition: rep, presence: pres, frequency: freq });
    params.logit_bias = bias.as_ref();
    Ok(b.process_logits(logits, params)?)
}

/// `logits [R, V]` with every token a row's constraint refuses at `-inf`
/// (CONSTRAIN-1): downloaded, masked on the host and uploaded again, the
/// values of the allowed tokens bit for bit (an f32 logit widens to f64 and
/// narrows back exactly).
fn mask<B: ModelBackend>(b: &B, logits: &B::Tensor, rows: &[Row<'_>], vocab: usize) -> Result<B::Tensor, DecodeError> {
    let mut host = b.download_f64(logits)?;
    let shape = host.shape().to_vec();
    if shape != [rows.len(), vocab] {
        return Err(DecodeError::Internal(format!("masking logits of shape {shape:?} with {} rows of {vocab}", rows.len())));
    }
    let data = host.data_mut();
    for (r, row) in rows.iter().enumerate() {
        if let Some(allowed) = row.allowed {
            for (x, &ok) in data[r * vocab..][..vocab].iter_mut().zip(allowed) {
                if !ok {
                    *x = f64::NEG_INFINITY;
                }
            }
        }
    }
    upload_f64(b, shape, host.into_data())
}

/// Whether a row's greedy argmax differs from the raw logits' (bias,
/// penalties or a constraint move it, LOGITS-2).
pub(crate) fn moves_argmax(rows: &[Row<'_>]) -> bool {
    rows.iter().any(|x| !x.bias.is_empty() || x.params.penalised() || x.allowed.is_some())
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
