//! A minimal owned, row-major n-dimensional array.
//!
//! The reference deliberately uses no tensor library: this type only carries a
//! shape next to a flat `Vec`, so every algorithm is written as plain loops
//! whose order (and therefore whose f64 rounding) the spec fixes (CONV-9).

use serde::{Deserialize, Serialize};

use crate::error::{Result, SpecError};

/// Row-major array: `data.len() == shape.iter().product()`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Tensor<T> {
    shape: Vec<usize>,
    data: Vec<T>,
}

impl<T> Tensor<T> {
    /// Builds a tensor, checking that `data` fills `shape` exactly.
    pub fn new(shape: Vec<usize>, data: Vec<T>) -> Result<Self> {
        // A shape whose element count overflows usize can hold no data.
        let want = shape.iter().try_fold(1usize, |n, &d| n.checked_mul(d));
        if want != Some(data.len()) {
            return Err(SpecError::DataLength { arg: "tensor", shape, len: data.len() });
        }
        Ok(Tensor { shape, data })
    }

    /// Builds a 1-D tensor.
    pub fn from_vec(data: Vec<T>) -> Self {
        Tensor { shape: vec![data.len()], data }
    }

    /// Builds a 2-D tensor from rows; ragged rows are a `DataLength` error.
    pub fn from_rows(rows: Vec<Vec<T>>) -> Result<Self> {
        let cols = rows.first().map_or(0, Vec::len);
        let shape = vec![rows.len(), cols];
        let mut data = Vec::with_capacity(rows.len() * cols);
        for row in rows {
            if row.len() != cols {
                return Err(SpecError::DataLength { arg: "tensor", shape, len: row.len() });
            }
            data.extend(row);
        }
        Ok(Tensor { shape, data })
    }

    /// Builds a 3-D tensor from nested rows; ragged input is a `DataLength` error.
    pub fn from_nested(blocks: Vec<Vec<Vec<T>>>) -> Result<Self> {
        let rows = blocks.first().map_or(0, Vec::len);
        let cols = blocks.first().and_then(|b| b.first()).map_or(0, Vec::len);
        let shape = vec![blocks.len(), rows, cols];
        let mut data = Vec::with_capacity(blocks.len() * rows * cols);
        for block in blocks {
            if block.len() != rows {
                return Err(SpecError::DataLength { arg: "tensor", shape, len: block.len() });
            }
            for row in block {
                if row.len() != cols {
                    return Err(SpecError::DataLength { arg: "tensor", shape, len: row.len() });
                }
                data.extend(row);
            }
        }
        Ok(Tensor { shape, data })
    }

    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    pub fn data(&self) -> &[T] {
        &self.data
    }

    pub fn data_mut(&mut self) -> &mut [T] {
        &mut self.data
    }

    pub fn into_data(self) -> Vec<T> {
        self.data
    }

    pub fn rank(&self) -> usize {
        self.shape.len()
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        self.data.len()
    }

    pub fn is_empty(&self) -> bool {
        self.data.is_empty()
    }

    /// Flat offset of a full index, or `None` if it is out of bounds.
    pub fn offset(&self, index: &[usize]) -> Option<usize> {
        if index.len() != self.shape.len() {
            return None;
        }
        let mut off = 0;
        for (&i, &n) in index.iter().zip(&self.shape) {
            if i >= n {
                return None;
            }
            off = off * n + i;
        }
        Some(off)
    }

    /// Element at a full index.
    pub fn get(&self, index: &[usize]) -> Option<&T> {
        self.offset(index).map(|o| &self.data[o])
    }

    /// The contiguous last-axis lane selected by `prefix` (all axes but the last).
    pub fn lane(&self, prefix: &[usize]) -> Option<&[T]> {
        let (&last, lead) = self.shape.split_last()?;
        if prefix.len() != lead.len() {
            return None;
        }
        let mut off = 0;
        for (&i, &n) in prefix.iter().zip(lead) {
            if i >= n {
                return None;
            }
            off = off * n + i;
        }
        Some(&self.data[off * last..(off + 1) * last])
    }

    /// Like [`Tensor::lane`], for indices the caller has already validated.
    pub(crate) fn lane_at(&self, prefix: &[usize]) -> &[T] {
        self.lane(prefix).expect("index validated by the caller")
    }

    pub(crate) fn at(&self, index: &[usize]) -> &T {
        self.get(index).expect("index validated by the caller")
    }

    /// Elementwise map into a tensor of the same shape.
    pub fn map<U>(&self, f: impl FnMut(&T) -> U) -> Tensor<U> {
        Tensor { shape: self.shape.clone(), data: self.data.iter().map(f).collect() }
    }
}

impl<T: Clone> Tensor<T> {
    /// A tensor of `shape` filled with `value`.
    /// Panics if the element count overflows; used for output shapes that
    /// validated inputs bound.
    pub fn full(shape: Vec<usize>, value: T) -> Self {
        let n = shape.iter().try_fold(1usize, |n, &d| n.checked_mul(d)).expect("output shapes are bounded by validated inputs");
        Tensor { shape, data: vec![value; n] }
    }
}

/// Expands a flat offset back into a full index (for error messages).
pub fn unravel(shape: &[usize], mut offset: usize) -> Vec<usize> {
    let mut index = vec![0; shape.len()];
    for (slot, &n) in index.iter_mut().zip(shape).rev() {
        if n > 0 {
            *slot = offset % n;
            offset /= n;
        }
    }
    index
}
