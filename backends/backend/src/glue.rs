//! On-device glue, as plain host code: the reference semantics of the
//! contract's data-movement and small integer operations (GLUE-1 .. GLUE-4).
//!
//! Role: a backend-generic decoder must lay a model's ragged logits rows out
//! as the padded `[B, k+1, V]` a verify op takes, and compute per-sequence
//! trim amounts from verify outputs, without a host round trip. These
//! functions define what [`crate::Backend::reshape`],
//! [`crate::Backend::gather_rows`], [`crate::Backend::concat_rows`],
//! [`crate::Backend::add_i64`] and [`crate::Backend::sub_i64`] compute; the
//! reference backend runs them directly and the ports run them on host
//! copies only to *name* a defect their device check found.
//!
//! Invariants: every argument is validated before anything is computed and
//! the first defect is a typed [`SpecError`] naming the argument; nothing
//! panics on user input; integer arithmetic is checked (an overflow is an
//! error, never a wrap); a PAD row index yields a zero row, which is padding
//! the verify ops never read (CONV-7).

use specdec_reference::{PAD, SpecError, Tensor};

/// GLUE-1: the same elements in row-major order under a new shape. The
/// element count must match (`ShapeMismatch` naming `shape`); a shape whose
/// element count overflows `usize` cannot match and is rejected the same way.
pub fn reshape<T: Clone>(t: &Tensor<T>, shape: &[usize]) -> Result<Tensor<T>, SpecError> {
    let count = shape.iter().try_fold(1usize, |acc, &d| acc.checked_mul(d));
    if count != Some(t.len()) {
        let expected = format!("a shape of {} elements (the elements of `t` {:?})", t.len(), t.shape());
        return Err(SpecError::ShapeMismatch { arg: "shape", expected, actual: shape.to_vec() });
    }
    Tensor::new(shape.to_vec(), t.data().to_vec())
}

/// `(N, row length)` of a tensor read as rows along axis 0 (rank >= 1).
fn rows_of<T>(t: &Tensor<T>, arg: &'static str) -> Result<(usize, usize), SpecError> {
    match t.shape() {
        [] => Err(SpecError::ShapeMismatch { arg, expected: "[N, ...] (rank >= 1)".into(), actual: Vec::new() }),
        [n, rest @ ..] => Ok((*n, rest.iter().product())),
    }
}

/// GLUE-2: `t [N, ...]`, `rows [M]` -> `[M, ...]`, row `i` of the output is
/// row `rows[i]` of `t`, or zeros where `rows[i]` is PAD. `N >= 1` and
/// `M >= 1` (`EmptyBatch` naming `t` or `rows`); any other index outside
/// `[0, N)` is `TokenOutOfRange` naming `rows` (its "vocabulary" is `N`).
pub fn gather_rows<T: Clone + Default>(t: &Tensor<T>, rows: &Tensor<i64>) -> Result<Tensor<T>, SpecError> {
    let (n, width) = rows_of(t, "t")?;
    if n == 0 {
        return Err(SpecError::EmptyBatch { arg: "t" });
    }
    let [m] = *rows.shape() else {
        return Err(SpecError::ShapeMismatch { arg: "rows", expected: "[M]".into(), actual: rows.shape().to_vec() });
    };
    if m == 0 {
        return Err(SpecError::EmptyBatch { arg: "rows" });
    }
    // Validate every index before copying anything.
    for (i, &r) in rows.data().iter().enumerate() {
        if r != PAD && !(0..n as i64).contains(&r) {
            return Err(SpecError::TokenOutOfRange { arg: "rows", index: vec![i], token: r, vocab: n });
        }
    }
    let mut out = Vec::with_capacity(m * width);
    for &r in rows.data() {
        if r == PAD {
            out.extend(std::iter::repeat_n(T::default(), width));
        } else {
            let start = r as usize * width;
            out.extend_from_slice(&t.data()[start..start + width]);
        }
    }
    let mut shape = t.shape().to_vec();
    shape[0] = m;
    Tensor::new(shape, out)
}

/// GLUE-3: the parts stacked along axis 0. The list is non-empty
/// (`EmptyBatch` naming `parts`); every part has rank >= 1 and the trailing
/// dims of the first (`ShapeMismatch` naming `parts`).
pub fn concat_rows<T: Clone>(parts: &[&Tensor<T>]) -> Result<Tensor<T>, SpecError> {
    let Some(first) = parts.first() else {
        return Err(SpecError::EmptyBatch { arg: "parts" });
    };
    rows_of(first, "parts")?;
    let trailing = &first.shape()[1..];
    let mut rows = 0usize;
    for (i, p) in parts.iter().enumerate() {
        if p.shape().is_empty() || &p.shape()[1..] != trailing {
            let expected = format!("[_, {}] for part {i} (the trailing dims of part 0)", dims(trailing));
            return Err(SpecError::ShapeMismatch { arg: "parts", expected, actual: p.shape().to_vec() });
        }
        rows += p.shape()[0];
    }
    let data = parts.iter().flat_map(|p| p.data().iter().cloned()).collect();
    let mut shape = first.shape().to_vec();
    shape[0] = rows;
    Tensor::new(shape, data)
}

fn dims(d: &[usize]) -> String {
    d.iter().map(usize::to_string).collect::<Vec<_>>().join(", ")
}

/// The elementwise i64 operations of GLUE-4.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IntOp {
    Add,
    Sub,
}

impl IntOp {
    fn apply(self, a: i64, b: i64) -> Option<i64> {
        match self {
            IntOp::Add => a.checked_add(b),
            IntOp::Sub => a.checked_sub(b),
        }
    }

    fn symbol(self) -> &'static str {
        match self {
            IntOp::Add => "+",
            IntOp::Sub => "-",
        }
    }
}

/// GLUE-4: `a op b` elementwise on same-shape i64 tensors (`b`'s shape is
/// checked against `a`'s, CONV-4 argument order: `ShapeMismatch` naming `b`).
/// A result outside i64 is `InvalidParameter` naming `b`, never a wrap.
pub fn int_op(op: IntOp, a: &Tensor<i64>, b: &Tensor<i64>) -> Result<Tensor<i64>, SpecError> {
    if a.shape() != b.shape() {
        let expected = format!("{:?} (the shape of `a`)", a.shape());
        return Err(SpecError::ShapeMismatch { arg: "b", expected, actual: b.shape().to_vec() });
    }
    let mut out = Vec::with_capacity(a.len());
    for (i, (&x, &y)) in a.data().iter().zip(b.data()).enumerate() {
        match op.apply(x, y) {
            Some(v) => out.push(v),
            None => {
                let value = format!("{x} {} {y} at {:?}", op.symbol(), specdec_reference::tensor::unravel(a.shape(), i));
                return Err(SpecError::InvalidParameter { name: "b", value, reason: "the result overflows i64" });
            }
        }
    }
    Tensor::new(a.shape().to_vec(), out)
}
