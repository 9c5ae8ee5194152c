//! GLUE-1 .. GLUE-4 on ndarray arrays: `to_shape` (row-major) for reshape,
//! `select` along axis 0 for the row gather, `concatenate` for the row
//! concatenation, `Zip` with checked arithmetic for the i64 operations.
//!
//! Invariants: as in the rest of the port, shapes are checked from the
//! array dims and values with one fold; when a check fails, host copies go
//! to the reference backend, whose error names the defect (kind, argument,
//! index), so the errors are the reference's by construction. A PAD row of a
//! gather selects row 0 (in range by the check) and is then overwritten
//! with zeros, never multiplied, so whatever row 0 holds cannot leak
//! (CONV-7). Integer results are computed with `checked_add`/`checked_sub`:
//! an overflow is the reference's `InvalidParameter`, never a wrap.

use ndarray::{ArrayD, ArrayViewD, Axis, IxDyn, Zip, concatenate};
use specdec_backend::{Backend, BackendError, PAD, RefTensor, ReferenceBackend, Result};

use crate::NdarrayBackend;
use crate::tensor::NAME;
use crate::tensor::{NdTensor, device};

/// The elementwise i64 operation of GLUE-4.
#[derive(Clone, Copy)]
pub(crate) enum IntOp {
    Add,
    Sub,
}

impl NdarrayBackend {
    /// GLUE-1.
    pub(crate) fn glue_reshape(&self, t: &NdTensor, shape: &[usize]) -> Result<NdTensor> {
        let count = shape.iter().try_fold(1usize, |acc, &d| acc.checked_mul(d));
        if count != Some(t.shape().iter().product()) {
            return Err(BackendError::named_by_reference(NAME, ReferenceBackend.reshape(&t.to_ref(), shape)));
        }
        fn to<T: Clone>(a: &ArrayD<T>, shape: &[usize]) -> Result<ArrayD<T>> {
            Ok(a.to_shape(IxDyn(shape)).map_err(device)?.into_owned())
        }
        Ok(match t {
            NdTensor::F64(a) => NdTensor::F64(to(a, shape)?),
            // Into a pooled buffer: a verify reshapes its probabilities.
            NdTensor::F32(a) => NdTensor::pooled_f32(shape, |buffer| {
                match a.as_slice() {
                    Some(values) => buffer.copy_from_slice(values),
                    None => buffer.iter_mut().zip(a.iter()).for_each(|(o, &x)| *o = x),
                }
                true
            })
            .ok_or_else(|| device("reshape lost its element count"))?,
            NdTensor::I64(a) => NdTensor::I64(to(a, shape)?),
        })
    }

    /// GLUE-2.
    pub(crate) fn glue_gather_rows(&self, t: &NdTensor, rows: &NdTensor) -> Result<NdTensor> {
        let r = rows.ints("rows")?;
        let n = t.shape().first().copied().unwrap_or(0);
        let valid = r.ndim() == 1 && !r.is_empty() && n >= 1 && Zip::from(r).all(|&i| i == PAD || (0..n as i64).contains(&i));
        if !valid {
            return Err(BackendError::named_by_reference(NAME, ReferenceBackend.gather_rows(&t.to_ref(), &rows.to_ref())));
        }
        // PAD reads row 0 (which exists) and is zeroed below.
        let idx: Vec<usize> = r.iter().map(|&i| if i == PAD { 0 } else { i as usize }).collect();
        fn gather<T: Clone + Default>(a: &ArrayD<T>, idx: &[usize], rows: &ArrayD<i64>) -> ArrayD<T> {
            let mut out = a.select(Axis(0), idx);
            for (mut row, &i) in out.outer_iter_mut().zip(rows.iter()) {
                if i == PAD {
                    row.fill(T::default());
                }
            }
            out
        }
        Ok(match t {
            NdTensor::F64(a) => NdTensor::F64(gather(a, &idx, r)),
            NdTensor::F32(a) => NdTensor::F32(gather(a, &idx, r)),
            NdTensor::I64(a) => NdTensor::I64(gather(a, &idx, r)),
        })
    }

    /// GLUE-3.
    pub(crate) fn glue_concat_rows(&self, parts: &[&NdTensor]) -> Result<NdTensor> {
        let named = || {
            let host: Vec<RefTensor> = parts.iter().map(|p| p.to_ref()).collect();
            BackendError::named_by_reference(NAME, ReferenceBackend.concat_rows(&host.iter().collect::<Vec<_>>()))
        };
        let Some(first) = parts.first() else { return Err(named()) };
        let trailing = first.shape().get(1..).unwrap_or(&[]);
        let shapes_ok = !first.shape().is_empty() && parts.iter().all(|p| !p.shape().is_empty() && &p.shape()[1..] == trailing);
        if !shapes_ok {
            return Err(named());
        }
        fn cat<T: Clone>(views: Vec<ArrayViewD<'_, T>>) -> Result<ArrayD<T>> {
            concatenate(Axis(0), &views).map_err(device)
        }
        Ok(match first {
            // All f32: stays f32; any f64 part makes the whole f64.
            NdTensor::F32(_) if parts.iter().all(|p| matches!(p, NdTensor::F32(_))) => {
                NdTensor::F32(cat(parts.iter().filter_map(|p| if let NdTensor::F32(a) = p { Some(a.view()) } else { None }).collect())?)
            }
            NdTensor::F64(_) | NdTensor::F32(_) => {
                let floats = parts.iter().map(|p| p.floats("parts")).collect::<Result<Vec<_>>>()?;
                NdTensor::F64(cat(floats.iter().map(|a| a.view()).collect())?)
            }
            NdTensor::I64(_) => NdTensor::I64(cat(parts.iter().map(|p| p.ints("parts").map(|a| a.view())).collect::<Result<_>>()?)?),
        })
    }

    /// GLUE-4.
    pub(crate) fn glue_int_op(&self, op: IntOp, a: &NdTensor, b: &NdTensor) -> Result<NdTensor> {
        let (x, y) = (a.ints("a")?, b.ints("b")?);
        let named = || {
            let (ha, hb) = (a.to_ref(), b.to_ref());
            BackendError::named_by_reference(
                NAME,
                match op {
                    IntOp::Add => ReferenceBackend.add_i64(&ha, &hb),
                    IntOp::Sub => ReferenceBackend.sub_i64(&ha, &hb),
                },
            )
        };
        if x.shape() != y.shape() {
            return Err(named());
        }
        let out = Zip::from(x).and(y).map_collect(|&x, &y| match op {
            IntOp::Add => x.checked_add(y),
            IntOp::Sub => x.checked_sub(y),
        });
        if !Zip::from(&out).all(Option::is_some) {
            return Err(named());
        }
        Ok(NdTensor::I64(out.mapv(|v| v.unwrap_or_default())))
    }
}
