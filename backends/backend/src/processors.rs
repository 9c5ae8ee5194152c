//! The processors beyond temperature, top-k and top-p (LOGITS-7 .. LOGITS-10)
//! around a port's LOGITS-1 .. LOGITS-6 kernel, written once for every port.
//!
//! A port supplies three device kernels ([`ProcessorKernels`]): a fused
//! validity check of the extra inputs (one read-back), the bias and penalties
//! on the logits, and the min-p cut on the processed distribution. The flow
//! ([`process_with_processors`]) keeps LOGITS-11's order: bias and penalties,
//! then the port's own temperature, top-k and top-p, then min-p. Invariant:
//! any defect the device finds is named by the reference on host copies of the
//! *whole* input ([`BackendError::named_by_reference`]), so a port's error is
//! the reference's error whichever stage found it.

use crate::{Backend, BackendError, LogitsParams, Penalties, RefTensor, ReferenceBackend, Result};

/// The device kernels of the extra processors, implemented by a port.
pub trait ProcessorKernels: Backend {
    /// Whether the extra inputs (min-p, penalties, bias) have the right
    /// shapes and values (LOGITS-1, LOGITS-7 .. LOGITS-10) for `logits [R, V]`.
    fn processor_inputs_ok(&self, logits: &Self::Tensor, params: &LogitsParams<'_, Self::Tensor>) -> Result<bool>;
    /// LOGITS-7 .. LOGITS-9 on valid inputs: bias, then repetition, then
    /// presence and frequency.
    fn bias_and_penalties(&self, logits: &Self::Tensor, penalties: Option<Penalties<'_, Self::Tensor>>, bias: Option<&Self::Tensor>) -> Result<Self::Tensor>;
    /// LOGITS-10 on a processed distribution `probs [R, V]`: zero every
    /// entry below `min_p[r]` times its row's largest, renormalise the rest.
    /// A row whose `min_p` is 0 must come back bit for bit as it went in: a
    /// request's output may not depend on whether a neighbour uses min-p.
    /// `logits` and `params` are what `probs` came from (a port that
    /// reproduces the reference bit for bit renormalises from them).
    fn min_p_cut(&self, logits: &Self::Tensor, params: LogitsParams<'_, Self::Tensor>, probs: &Self::Tensor, min_p: &Self::Tensor) -> Result<Self::Tensor>;
    /// The port's LOGITS-1 .. LOGITS-6 kernel.
    fn basic_process_logits(&self, logits: &Self::Tensor, params: LogitsParams<'_, Self::Tensor>) -> Result<Self::Tensor>;
}

/// [`crate::Backend::process_logits`] for a port with [`ProcessorKernels`].
pub fn process_with_processors<B: ProcessorKernels>(b: &B, logits: &B::Tensor, params: LogitsParams<'_, B::Tensor>) -> Result<B::Tensor> {
    if params.is_basic() {
        return b.basic_process_logits(logits, params);
    }
    let named = || BackendError::named_by_reference(&b.name(), on_reference(b, logits, &params));
    if !b.processor_inputs_ok(logits, &params)? {
        return Err(named());
    }
    let processed = b.bias_and_penalties(logits, params.penalties, params.logit_bias)?;
    let probs = match b.basic_process_logits(&processed, params.basic()) {
        Ok(p) => p,
        // The processed logits (or the basic parameters) are invalid: the
        // reference names which input made them so.
        Err(BackendError::Invalid(_)) => return Err(named()),
        Err(e) => return Err(e),
    };
    match params.min_p {
        Some(m) => b.min_p_cut(&processed, params.basic(), &probs, m),
        None => Ok(probs),
    }
}

/// The reference's answer on host copies of every input.
fn on_reference<B: Backend>(b: &B, logits: &B::Tensor, p: &LogitsParams<'_, B::Tensor>) -> Result<RefTensor> {
    let f = |t: &B::Tensor| b.download_f64(t).map(RefTensor::F64);
    let (z, t, k, tp) = (f(logits)?, f(p.temperature)?, RefTensor::I64(b.download_i64(p.top_k)?), f(p.top_p)?);
    let min_p = p.min_p.map(f).transpose()?;
    let pen = p.penalties.map(|x| Ok::<_, BackendError>([f(x.counts)?, f(x.repetition)?, f(x.presence)?, f(x.frequency)?])).transpose()?;
    let bias = p.logit_bias.map(f).transpose()?;
    let mut host = LogitsParams::new(&t, &k, &tp);
    host.min_p = min_p.as_ref();
    host.penalties = pen.as_ref().map(|[c, r, pr, fr]| Penalties { counts: c, repetition: r, presence: pr, frequency: fr });
    host.logit_bias = bias.as_ref();
    ReferenceBackend.process_logits(&z, host)
}
