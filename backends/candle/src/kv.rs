//! The batched KV cache (KV-1 .. KV-5) and the paged gather (KV-8/9) on
//! validated input.

use candle_core::{DType, Device, Result, Tensor};

use crate::kernels::{home, ids, scalar, select};

/// KV-1 on the device: keys and values `[B, H, C + 1, D]` f32 and lengths
/// `[B]` i64. Slot `C` is a write sink: the rows of an append beyond a
/// sequence's count are scattered there, so one `scatter_set` writes every
/// sequence at its own length (KV-2) in O(B H T D). It is never read.
/// The storage is never handed out, so the in-place scatter cannot alias a
/// tensor a caller holds; `lens` is replaced, never mutated, so a tensor
/// from `kv_lens` stays a snapshot.
#[derive(Debug, Clone)]
pub struct CandleKvCache {
    keys: Tensor,
    values: Tensor,
    lens: Tensor,
    batch: usize,
    heads: usize,
    head_dim: usize,
    capacity: usize,
}

impl CandleKvCache {
    pub(crate) fn new(dev: &Device, batch: usize, heads: usize, head_dim: usize, capacity: usize) -> Result<Self> {
        let shape = (batch, heads, capacity + 1, head_dim);
        Ok(CandleKvCache {
            keys: Tensor::zeros(shape, DType::F32, dev)?,
            values: Tensor::zeros(shape, DType::F32, dev)?,
            lens: Tensor::zeros(batch, DType::I64, dev)?,
            batch,
            heads,
            head_dim,
            capacity,
        })
    }

    /// `(B, H, D, C)`.
    pub fn dims(&self) -> (usize, usize, usize, usize) {
        (self.batch, self.heads, self.head_dim, self.capacity)
    }

    /// `[B]` i64 lengths, on the device.
    pub fn lens(&self) -> &Tensor {
        &self.lens
    }

    /// KV-2 on validated input: `keys`, `values` `[B, H, T, D]` f32, `counts [B]`.
    pub(crate) fn append(&mut self, keys: &Tensor, values: &Tensor, counts: &Tensor) -> Result<()> {
        let t = keys.dim(2)?;
        if t > 0 {
            let dev = keys.device();
            let step = ids(t, dev)?.unsqueeze(0)?;
            let dst = self.lens.unsqueeze(1)?.broadcast_add(&step)?;
            let dst = select(&step.broadcast_lt(&counts.unsqueeze(1)?)?, &dst, &scalar(self.capacity as i64, dev)?)?;
            let index = dst.reshape((self.batch, 1, t, 1))?.broadcast_as(keys.shape())?.contiguous()?;
            self.keys.scatter_set(&index, &keys.contiguous()?, 2)?;
            self.values.scatter_set(&index, &values.contiguous()?, 2)?;
        }
        self.lens = (&self.lens + counts)?;
        Ok(())
    }

    /// KV-3 .. KV-5 on validated amounts: subtracts what is trimmed.
    pub(crate) fn trim(&mut self, cut: &Tensor) -> Result<()> {
        self.lens = (&self.lens - cut)?;
        Ok(())
    }

    /// The valid keys and values `[B, H, max len, D]`, zero past each length.
    /// The output shape needs `max len` on the host: one scalar read.
    pub(crate) fn contents(&self) -> Result<(Tensor, Tensor)> {
        let max = self.lens.max(0)?.to_scalar::<i64>()?.max(0) as usize;
        let dev = self.keys.device();
        if max == 0 {
            let empty = Tensor::zeros((self.batch, self.heads, 0, self.head_dim), DType::F32, &home(0, dev))?;
            return Ok((empty.clone(), empty));
        }
        let keep = ids(max, dev)?.unsqueeze(0)?.broadcast_lt(&self.lens.unsqueeze(1)?)?;
        let keep = keep.reshape((self.batch, 1, max, 1))?;
        let view = |store: &Tensor| -> Result<Tensor> { select(&keep, &store.narrow(2, 0, max)?, &scalar(0f32, dev)?) };
        Ok((view(&self.keys)?, view(&self.values)?))
    }
}

/// KV-8 on validated input: `pages [P, S, H, D]` f32, `table [B, M]`,
/// `lens [B]` -> `[B, max len, H, D]`, zero past each length.
pub fn paged_gather(pages: &Tensor, table: &Tensor, lens: &Tensor) -> Result<Tensor> {
    let (num_pages, page, heads, dim) = pages.dims4()?;
    let batch = table.dim(0)?;
    let dev = pages.device();
    let max = lens.max(0)?.to_scalar::<i64>()?.max(0) as usize;
    if max == 0 {
        return Tensor::zeros((batch, 0, heads, dim), DType::F32, &home(0, dev));
    }
    let pos = ids(max, dev)?.unsqueeze(0)?; // [1, T]
    let page_t = scalar(page as i64, dev)?;
    let slot = pos.broadcast_div(&page_t)?; // integer division
    let offset = pos.broadcast_sub(&slot.broadcast_mul(&page_t)?)?;
    let block = table.contiguous()?.gather(&slot.broadcast_as((batch, max))?.contiguous()?, 1)?;
    let valid = pos.broadcast_lt(&lens.unsqueeze(1)?)?;
    // Past a length the slot may hold PAD: read row 0 there and mask it.
    let row = select(&valid, &block.broadcast_mul(&page_t)?.broadcast_add(&offset)?, &scalar(0i64, dev)?)?;
    let rows = pages.reshape((num_pages * page, heads * dim))?.index_select(&row.flatten_all()?, 0)?;
    let rows = rows.reshape((batch, max, heads, dim))?;
    select(&valid.reshape((batch, max, 1, 1))?, &rows, &scalar(0f32, dev)?)
}
