//! GLUE-1 .. GLUE-5 in candle ops: `reshape`, `index_select` along axis 0
//! with `where_cond` zeroing the PAD rows, `cat`, and i64 `add`/`sub` behind
//! an overflow mask; `upload_f32` stores f32 values directly.
//!
//! Invariants: shapes are checked on the host from tensor dims; value
//! conditions (row indices in range or PAD, i64 results in range) are
//! device masks reduced to one flag and read back once, as in every op of
//! this port; when a check fails the inputs are downloaded and the reference
//! names the defect. A PAD row gathers row 0 (which exists) and is replaced
//! by zeros with a `where`, never a multiplication, so a NaN there cannot
//! leak (CONV-7). The overflow mask is computed without overflowing: the
//! bounds `MAX - max(b, 0)`, `MIN - min(b, 0)` (and their mirror images for
//! `sub`) are always representable, and candle's own i64 `+`/`-` (which
//! would panic or wrap on overflow) only ever sees operands whose result
//! fits.

use candle_core::Tensor;
use specdec_backend::{Backend, BackendError, HostTensor, RefTensor, ReferenceBackend, Result};

use crate::CandleBackend;
use crate::kernels::{PAD, and, not, or, scalar, select};

/// The elementwise i64 operation of GLUE-4.
#[derive(Clone, Copy)]
pub(crate) enum IntOp {
    Add,
    Sub,
}

impl CandleBackend {
    /// GLUE-5: f32 host values as they are (no f64 detour, no rounding).
    pub(crate) fn glue_upload_f32(&self, t: &HostTensor<f32>) -> Result<Tensor> {
        self.dev(Tensor::from_vec(t.data().to_vec(), t.shape().to_vec(), &crate::kernels::home(t.data().len(), self.candle_device())))
    }

    /// Floats stay in their dtype, ids in i64: glue moves data, it never converts.
    fn any_dtype(&self, t: &Tensor, arg: &str) -> Result<Tensor> {
        if t.dtype().is_float() { self.float(t, arg) } else { self.int(t, arg) }
    }

    /// GLUE-1.
    pub(crate) fn glue_reshape(&self, t: &Tensor, shape: &[usize]) -> Result<Tensor> {
        let count = shape.iter().try_fold(1usize, |acc, &d| acc.checked_mul(d));
        if count != Some(t.elem_count()) {
            return Err(BackendError::named_by_reference(self.name, ReferenceBackend.reshape(&self.host(t)?, shape)));
        }
        let t = self.any_dtype(t, "t")?;
        self.dev(t.reshape(shape))
    }

    /// GLUE-2.
    pub(crate) fn glue_gather_rows(&self, t: &Tensor, rows: &Tensor) -> Result<Tensor> {
        let (x, r) = (self.any_dtype(t, "t")?, self.int(rows, "rows")?);
        let n = x.dims().first().copied().unwrap_or(0);
        let dims_ok = n >= 1 && matches!(*r.dims(), [m] if m >= 1);
        let masks = || {
            let pad = r.eq(PAD)?;
            let out_of_range = or(&r.lt(0i64)?, &r.ge(n as i64)?)?;
            Ok(vec![and(&not(&pad)?, &out_of_range)?])
        };
        if !dims_ok || self.invalid(masks())? {
            return Err(BackendError::named_by_reference(self.name, ReferenceBackend.gather_rows(&self.host(&x)?, &self.host(&r)?)));
        }
        self.dev((|| {
            let dev = x.device();
            let pad = r.eq(PAD)?;
            let idx = select(&pad, &scalar(0i64, dev)?, &r)?;
            let picked = x.index_select(&idx, 0)?;
            // `pad` as [M, 1, ..., 1] broadcasts over each row.
            let mut shape = vec![1usize; x.rank()];
            shape[0] = r.dim(0)?;
            let zero = Tensor::zeros((), x.dtype(), dev)?;
            select(&pad.reshape(shape)?, &zero, &picked)
        })())
    }

    /// GLUE-3.
    pub(crate) fn glue_concat_rows(&self, parts: &[&Tensor]) -> Result<Tensor> {
        let named = |this: &Self| -> Result<Tensor> {
            let host = parts.iter().map(|p| this.host(p)).collect::<Result<Vec<RefTensor>>>()?;
            Err(BackendError::named_by_reference(this.name, ReferenceBackend.concat_rows(&host.iter().collect::<Vec<_>>())))
        };
        let Some(first) = parts.first() else { return named(self) };
        let trailing = first.dims().get(1..).unwrap_or(&[]);
        let shapes_ok = first.rank() >= 1 && parts.iter().all(|p| p.rank() >= 1 && &p.dims()[1..] == trailing);
        if !shapes_ok {
            return named(self);
        }
        let float = first.dtype().is_float();
        let convert = |p: &Tensor| if float { self.float(p, "parts") } else { self.int(p, "parts") };
        let all = parts.iter().map(|&p| convert(p)).collect::<Result<Vec<_>>>()?;
        // Parts with no rows contribute nothing; keep one so the result has a dtype and shape.
        let mut kept: Vec<Tensor> = all.iter().filter(|p| p.dim(0).is_ok_and(|d| d > 0)).cloned().collect();
        if kept.is_empty() {
            kept.push(all[0].clone());
        }
        self.dev(Tensor::cat(&kept, 0))
    }

    /// GLUE-4.
    pub(crate) fn glue_int_op(&self, op: IntOp, a: &Tensor, b: &Tensor) -> Result<Tensor> {
        let (x, y) = (self.int(a, "a")?, self.int(b, "b")?);
        let reference = |this: &Self| -> Result<Tensor> {
            let (ha, hb) = (this.host(&x)?, this.host(&y)?);
            Err(BackendError::named_by_reference(
                this.name,
                match op {
                    IntOp::Add => ReferenceBackend.add_i64(&ha, &hb),
                    IntOp::Sub => ReferenceBackend.sub_i64(&ha, &hb),
                },
            ))
        };
        if x.dims() != y.dims() {
            return reference(self);
        }
        let overflow = || {
            let dev = x.device();
            let zero = scalar(0i64, dev)?;
            let pos = select(&y.gt(0i64)?, &y, &zero)?;
            let neg = select(&y.lt(0i64)?, &y, &zero)?;
            let (max, min) = (scalar(i64::MAX, dev)?, scalar(i64::MIN, dev)?);
            // add: x + y > MAX iff x > MAX - max(y, 0); x + y < MIN iff x < MIN - min(y, 0).
            // sub: x - y > MAX iff x > MAX + min(y, 0); x - y < MIN iff x < MIN + max(y, 0).
            let (hi, lo) = match op {
                IntOp::Add => (max.broadcast_sub(&pos)?, min.broadcast_sub(&neg)?),
                IntOp::Sub => (max.broadcast_add(&neg)?, min.broadcast_add(&pos)?),
            };
            Ok(vec![or(&x.gt(&hi)?, &x.lt(&lo)?)?])
        };
        if x.elem_count() > 0 && self.invalid(overflow())? {
            return reference(self);
        }
        self.dev(match op {
            IntOp::Add => x.add(&y),
            IntOp::Sub => x.sub(&y),
        })
    }
}
