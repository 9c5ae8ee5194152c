//! GLUE-1 .. GLUE-5 in libtorch ops: `reshape`, `index_select` along axis 0
//! with `masked_fill` zeroing the PAD rows, `cat`, and i64 `add`/`sub`
//! behind an overflow predicate; `upload_f32` stores f32 values directly.
//!
//! Invariants: shapes are checked on the host from tensor sizes; value
//! conditions (row indices in range or PAD, i64 results in range) are
//! fused predicates read back once (`TchBackend::passes`), as in every op of
//! this port, and when one fails the inputs are downloaded and the reference
//! names the defect. A PAD row gathers row 0 (which exists) and is then
//! filled with zeros (`masked_fill` replaces, it never multiplies, so a NaN
//! there cannot leak, CONV-7). The overflow predicate is computed without
//! overflowing: `MAX - max(b, 0)` and `MIN - min(b, 0)` (mirrored for `sub`)
//! are always representable, and libtorch's i64 `+`/`-`, which wrap, only
//! ever see operands whose result fits.

use specdec_backend::{Backend, BackendError, HostTensor, PAD, RefTensor, ReferenceBackend, Result};
use tch::{Kind, Tensor};

use crate::kernels::TResult;
use crate::{TchBackend, TchTensor};

/// The elementwise i64 operation of GLUE-4.
#[derive(Clone, Copy)]
pub(crate) enum IntOp {
    Add,
    Sub,
}

fn is_int(t: &TchTensor) -> bool {
    matches!(t.tensor().f_kind(), Ok(Kind::Int64 | Kind::Int | Kind::Int16 | Kind::Int8 | Kind::Uint8))
}

fn dims(t: &Tensor) -> Vec<i64> {
    t.size()
}

impl TchBackend {
    /// GLUE-5: f32 host values as they are (no f64 detour, no rounding).
    pub(crate) fn glue_upload_f32(&self, t: &HostTensor<f32>) -> Result<TchTensor> {
        self.upload(t, Ok)
    }

    /// Floats as f32, ids as i64: glue moves data, it never converts otherwise.
    fn any_kind(&self, t: &TchTensor, arg: &str) -> Result<Tensor> {
        if is_int(t) { self.int(t, arg) } else { self.float(t, arg) }
    }

    /// GLUE-1.
    pub(crate) fn glue_reshape(&self, t: &TchTensor, shape: &[usize]) -> Result<TchTensor> {
        let x = self.any_kind(t, "t")?;
        let count = shape.iter().try_fold(1usize, |acc, &d| acc.checked_mul(d));
        // A count that fits usize fits i64 here: it equals numel, an i64.
        if count != Some(x.numel()) {
            return Err(BackendError::named_by_reference(&self.name(), (|| ReferenceBackend.reshape(&self.ref_tensor(t)?, shape))()));
        }
        let shape: Vec<i64> = shape.iter().map(|&d| d as i64).collect();
        self.dev(x.f_reshape(shape.as_slice())).map(TchTensor::new)
    }

    /// GLUE-2.
    pub(crate) fn glue_gather_rows(&self, t: &TchTensor, rows: &TchTensor) -> Result<TchTensor> {
        let (x, r) = (self.any_kind(t, "t")?, self.int(rows, "rows")?);
        let size = dims(&x);
        let n = size.first().copied().unwrap_or(0);
        let dims_ok = n >= 1 && matches!(dims(&r)[..], [m] if m >= 1);
        let ok = dims_ok
            && self.passes((|| -> TResult<Vec<Tensor>> {
                let in_range = r.f_ge(0)?.f_logical_and(&r.f_lt(n)?)?;
                Ok(vec![r.f_eq(PAD)?.f_logical_or(&in_range)?])
            })())?;
        if !ok {
            let reference = (|| ReferenceBackend.gather_rows(&self.ref_tensor(t)?, &self.ref_tensor(rows)?))();
            return Err(BackendError::named_by_reference(&self.name(), reference));
        }
        self.dev((|| -> TResult<Tensor> {
            let pad = r.f_eq(PAD)?;
            let idx = r.f_where_scalarother(&pad.f_logical_not()?, 0i64)?;
            let picked = x.f_index_select(0, &idx)?;
            // `pad` as [M, 1, ..., 1] broadcasts over each row.
            let mut shape = vec![1i64; size.len()];
            shape[0] = dims(&r)[0];
            picked.f_masked_fill(&pad.f_reshape(shape.as_slice())?, 0i64)
        })())
        .map(TchTensor::new)
    }

    /// GLUE-3.
    pub(crate) fn glue_concat_rows(&self, parts: &[&TchTensor]) -> Result<TchTensor> {
        let named = || {
            let host = parts.iter().map(|p| self.ref_tensor(p)).collect::<Result<Vec<RefTensor>>>();
            BackendError::named_by_reference(&self.name(), host.and_then(|h| ReferenceBackend.concat_rows(&h.iter().collect::<Vec<_>>())))
        };
        let Some(first) = parts.first() else { return Err(named()) };
        let trailing = dims(first.tensor()).get(1..).map(<[i64]>::to_vec).unwrap_or_default();
        let shapes_ok = parts.iter().all(|p| {
            let s = dims(p.tensor());
            !s.is_empty() && s[1..] == trailing[..]
        }) && !dims(first.tensor()).is_empty();
        if !shapes_ok {
            return Err(named());
        }
        let int = is_int(first);
        let all = parts.iter().map(|p| if int { self.int(p, "parts") } else { self.float(p, "parts") }).collect::<Result<Vec<_>>>()?;
        self.dev(Tensor::f_cat(&all, 0)).map(TchTensor::new)
    }

    /// GLUE-4.
    pub(crate) fn glue_int_op(&self, op: IntOp, a: &TchTensor, b: &TchTensor) -> Result<TchTensor> {
        let (x, y) = (self.int(a, "a")?, self.int(b, "b")?);
        let ok = dims(&x) == dims(&y)
            && self.passes((|| -> TResult<Vec<Tensor>> {
                let (pos, neg) = (y.f_clamp_min(0i64)?, y.f_clamp_max(0i64)?);
                let (max, min) = (y.f_full_like(i64::MAX)?, y.f_full_like(i64::MIN)?);
                // add: x + y > MAX iff x > MAX - max(y, 0); x + y < MIN iff x < MIN - min(y, 0).
                // sub: x - y > MAX iff x > MAX + min(y, 0); x - y < MIN iff x < MIN + max(y, 0).
                let (hi, lo) = match op {
                    IntOp::Add => (max.f_sub(&pos)?, min.f_sub(&neg)?),
                    IntOp::Sub => (max.f_add(&neg)?, min.f_add(&pos)?),
                };
                Ok(vec![x.f_le_tensor(&hi)?.f_logical_and(&x.f_ge_tensor(&lo)?)?])
            })())?;
        if !ok {
            let reference = (|| {
                let (ha, hb) = (self.ref_tensor(a)?, self.ref_tensor(b)?);
                match op {
                    IntOp::Add => ReferenceBackend.add_i64(&ha, &hb),
                    IntOp::Sub => ReferenceBackend.sub_i64(&ha, &hb),
                }
            })();
            return Err(BackendError::named_by_reference(&self.name(), reference));
        }
        self.dev(match op {
            IntOp::Add => x.f_add(&y),
            IntOp::Sub => x.f_sub(&y),
        })
        .map(TchTensor::new)
    }
}
