//! The device tensor of this backend and its host transfers.

use std::borrow::Cow;

use ndarray::{ArrayD, IxDyn};
use specdec_backend::{BackendError, HostTensor, RefTensor, Result};

/// The backend's short name, used in device errors.
pub(crate) const NAME: &str = "ndarray";

/// A tensor "on the device" (host memory owned by ndarray): f64 values,
/// f32 values (`ndarray-f32`'s uploads of f32 data and its probabilities),
/// or i64 ids.
#[derive(Debug, Clone, PartialEq)]
pub enum NdTensor {
    F64(ArrayD<f64>),
    F32(ArrayD<f32>),
    I64(ArrayD<i64>),
}

/// Float buffers go back to [`crate::pool`] for the next output to reuse.
impl Drop for NdTensor {
    fn drop(&mut self) {
        match self {
            NdTensor::F32(a) => crate::pool::give(std::mem::take(a).into_raw_vec_and_offset().0),
            NdTensor::F64(a) => crate::pool::give(std::mem::take(a).into_raw_vec_and_offset().0),
            NdTensor::I64(_) => {}
        }
    }
}

impl NdTensor {
    /// An f32 tensor of `shape` from [`crate::pool`], each value written by
    /// `fill` (which must write all of them: the buffer's contents are
    /// arbitrary); `None` when `fill` reports a failure.
    pub(crate) fn pooled_f32(shape: &[usize], fill: impl FnOnce(&mut [f32]) -> bool) -> Option<NdTensor> {
        let mut buffer = crate::pool::take(shape.iter().product());
        let ok = fill(&mut buffer);
        let tensor = ArrayD::from_shape_vec(IxDyn(shape), buffer).map(NdTensor::F32);
        match tensor {
            Ok(t) if ok => Some(t),
            _ => None, // dropped: the buffer goes back
        }
    }

    /// The float array in f64 (f32 values widened exactly, in a copy), or a
    /// device error naming `arg` for an id tensor. The ops that read f32
    /// arrays natively (the f32 softmax, the unchecked rejection verify,
    /// reshape and the row glue) match on the variant instead.
    pub fn floats(&self, arg: &str) -> Result<Cow<'_, ArrayD<f64>>> {
        match self {
            NdTensor::F64(a) => Ok(Cow::Borrowed(a)),
            NdTensor::F32(a) => Ok(Cow::Owned(a.mapv(f64::from))),
            NdTensor::I64(_) => Err(device(format!("`{arg}` must be a float tensor"))),
        }
    }

    /// The id array, or a device error naming `arg` for a float tensor.
    pub fn ints(&self, arg: &str) -> Result<&ArrayD<i64>> {
        match self {
            NdTensor::I64(a) => Ok(a),
            NdTensor::F64(_) | NdTensor::F32(_) => Err(device(format!("`{arg}` must be an i64 tensor"))),
        }
    }

    pub fn shape(&self) -> &[usize] {
        match self {
            NdTensor::F64(a) => a.shape(),
            NdTensor::F32(a) => a.shape(),
            NdTensor::I64(a) => a.shape(),
        }
    }

    /// A host copy for the reference, used only to name a defect.
    pub(crate) fn to_ref(&self) -> RefTensor {
        match self {
            NdTensor::F64(a) => RefTensor::F64(host(a)),
            NdTensor::F32(a) => RefTensor::F64(host(&a.mapv(f64::from))),
            NdTensor::I64(a) => RefTensor::I64(host(a)),
        }
    }
}

pub(crate) fn device(message: impl std::fmt::Display) -> BackendError {
    BackendError::device(NAME, message)
}

pub(crate) fn upload<T: Clone>(t: &HostTensor<T>) -> Result<ArrayD<T>> {
    ArrayD::from_shape_vec(IxDyn(t.shape()), t.data().to_vec()).map_err(device)
}

/// Host copy in row-major order (`iter` is logical order whatever the layout).
pub(crate) fn host<T: Clone>(a: &ArrayD<T>) -> HostTensor<T> {
    HostTensor::new(a.shape().to_vec(), a.iter().cloned().collect()).expect("an array's length matches its shape")
}
