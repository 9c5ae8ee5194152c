//! The device tensor of this backend and its host transfers.

use ndarray::{ArrayD, IxDyn};
use specdec_backend::{BackendError, HostTensor, RefTensor, Result};

/// The backend's short name, used in device errors.
pub(crate) const NAME: &str = "ndarray";

/// A tensor "on the device" (host memory owned by ndarray): f64 values or i64 ids.
#[derive(Debug, Clone, PartialEq)]
pub enum NdTensor {
    F64(ArrayD<f64>),
    I64(ArrayD<i64>),
}

impl NdTensor {
    /// The float array, or a device error naming `arg` for an id tensor.
    pub fn floats(&self, arg: &str) -> Result<&ArrayD<f64>> {
        match self {
            NdTensor::F64(a) => Ok(a),
            NdTensor::I64(_) => Err(device(format!("`{arg}` must be a float tensor"))),
        }
    }

    /// The id array, or a device error naming `arg` for a float tensor.
    pub fn ints(&self, arg: &str) -> Result<&ArrayD<i64>> {
        match self {
            NdTensor::I64(a) => Ok(a),
            NdTensor::F64(_) => Err(device(format!("`{arg}` must be an i64 tensor"))),
        }
    }

    pub fn shape(&self) -> &[usize] {
        match self {
            NdTensor::F64(a) => a.shape(),
            NdTensor::I64(a) => a.shape(),
        }
    }

    /// A host copy for the reference, used only to name a defect.
    pub(crate) fn to_ref(&self) -> RefTensor {
        match self {
            NdTensor::F64(a) => RefTensor::F64(host(a)),
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
