//! The batched n-gram proposer (NGRAM-2 .. NGRAM-5, NGRAM-7) on validated input.
//!
//! For each n, every candidate start of every sequence is compared with the
//! sequence's last n tokens at once (`[B, L]` masks). The host loops only
//! over the configured n-gram sizes and the n offsets inside one n-gram
//! (O(ngram_max^2) tensor ops), never over positions or sequences.

use candle_core::{Result, Tensor};
use specdec_backend::NgramConfig;
use specdec_reference::ngram::NgramPolicy;

use crate::kernels::{PAD, and, first_true, gather_last, ids, last_true, not, or, scalar, select};

/// Where the key of size `n` last (or first) occurs before the suffix:
/// returns the found mask `[B]` and the start `[B]` i64.
fn occurrence(ctx: &Tensor, padded: &Tensor, lens: &Tensor, n: usize, policy: NgramPolicy) -> Result<(Tensor, Tensor)> {
    let (dev, width) = (ctx.device(), ctx.dim(1)?);
    let key_start = lens.broadcast_sub(&scalar(n as i64, dev)?)?;
    // NGRAM-2: candidate starts are i in [0, N - n); none when N < n + 1.
    let mut hit = ids(width, dev)?.unsqueeze(0)?.broadcast_lt(&key_start.unsqueeze(1)?)?;
    for t in 0..n {
        let key_pos = key_start.broadcast_add(&scalar(t as i64, dev)?)?.clamp(0i64, width as i64 - 1)?;
        let key = gather_last(ctx, &key_pos)?;
        hit = and(&hit, &padded.narrow(1, t, width)?.broadcast_eq(&key.unsqueeze(1)?)?)?;
    }
    match policy {
        NgramPolicy::LargestNMostRecent => {
            let at = last_true(&hit)?;
            Ok((at.ge(0i64)?, at))
        }
        NgramPolicy::LargestNEarliest => {
            let at = first_true(&hit)?;
            Ok((at.lt(width as i64)?, at))
        }
    }
}

/// NGRAM-5: `min(k, max_model_len - N - 1)`, saturating at 0, per sequence.
fn capped_k(lens: &Tensor, cfg: &NgramConfig) -> Result<Tensor> {
    let dev = lens.device();
    let k = Tensor::full(cfg.k as i64, lens.dim(0)?, dev)?;
    match cfg.max_model_len {
        None => Ok(k),
        Some(max) => k.minimum(&scalar(max as i64 - 1, dev)?.broadcast_sub(lens)?.maximum(0i64)?),
    }
}

/// NGRAM-7: `contexts [B, L]`, `lens [B]` -> drafts `[B, k]`, lengths `[B]`.
pub fn propose(ctx: &Tensor, lens: &Tensor, cfg: &NgramConfig) -> Result<(Tensor, Tensor)> {
    let (batch, width) = ctx.dims2()?;
    let dev = ctx.device();
    // Windows that run past the row read PAD, which never equals an id.
    let padded = Tensor::cat(&[ctx, &Tensor::full(PAD, (batch, cfg.ngram_max), dev)?], 1)?;
    let mut found = Tensor::zeros(batch, candle_core::DType::U8, dev)?;
    let mut start = Tensor::zeros(batch, candle_core::DType::I64, dev)?;
    // NGRAM-2: the largest n with a match wins.
    for n in (cfg.ngram_min..=cfg.ngram_max).rev() {
        let (hit, at) = occurrence(ctx, &padded, lens, n, cfg.policy)?;
        let take = and(&hit, &not(&found)?)?;
        start = select(&take, &at.broadcast_add(&scalar(n as i64, dev)?)?, &start)?;
        found = or(&found, &hit)?;
    }
    // NGRAM-3: context[start .. min(start + k', N)].
    let available = lens.broadcast_sub(&start)?;
    let len = select(&found, &capped_k(lens, cfg)?.minimum(&available)?, &scalar(0i64, dev)?)?;
    let slot = ids(cfg.k, dev)?.unsqueeze(0)?;
    let src = start.unsqueeze(1)?.broadcast_add(&slot)?.clamp(0i64, width as i64 - 1)?.contiguous()?;
    let drafts = select(&slot.broadcast_lt(&len.unsqueeze(1)?)?, &ctx.contiguous()?.gather(&src, 1)?, &scalar(PAD, dev)?)?;
    Ok((drafts, len))
}
