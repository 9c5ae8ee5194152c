//! What one forward call asks for, shared by the reference and every backend
//! (MODEL-8, MODEL-9).
//!
//! A call carries, for each sequence of a batched KV cache, the new tokens to
//! run (possibly none: that sequence is left untouched). Each sequence's new
//! tokens sit at positions `len .. len + n` of its own cache, attend causally
//! to each other and to everything already cached, and are appended to the
//! cache. A one-token decode, a `(k+1)`-token verify window and a ragged
//! prefill are the same call. Output rows are laid out sequence by sequence,
//! in batch order, tokens in order ([`ForwardPlan::rows`]).

use crate::config::LlamaConfig;
use crate::error::{ModelError, Result};

/// Which logits rows a call returns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogitRows {
    /// One row per new token (verify windows).
    All,
    /// Only each sequence's last new token (prefill, plain decode).
    Last,
    /// No logits (a draft that only needs its cache filled).
    None,
}

/// One forward call over a batch (MODEL-8).
#[derive(Debug, Clone, Copy)]
pub struct ForwardRequest<'a> {
    /// `tokens[b]` are sequence `b`'s new tokens; `tokens.len()` is the batch.
    pub tokens: &'a [Vec<u32>],
    pub logits: LogitRows,
    /// Decoder layers whose outputs are returned, concatenated in this order
    /// (`K·hidden` per token, MODEL-9); empty for none.
    pub hidden_layers: &'a [usize],
}

impl<'a> ForwardRequest<'a> {
    /// A call returning the logits of every new token and no hidden states.
    pub fn all_logits(tokens: &'a [Vec<u32>]) -> Self {
        ForwardRequest { tokens, logits: LogitRows::All, hidden_layers: &[] }
    }

    /// A call returning only each sequence's last logits row.
    pub fn last_logits(tokens: &'a [Vec<u32>]) -> Self {
        ForwardRequest { tokens, logits: LogitRows::Last, hidden_layers: &[] }
    }
}

/// Where each sequence's rows landed in a call's outputs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SeqRows {
    pub seq: usize,
    /// First position written to the cache (the cache length before the call).
    pub start_pos: usize,
    /// New tokens of this sequence.
    pub count: usize,
    /// First row of this sequence in the hidden-state output (one row per token).
    pub token_row: usize,
    /// First row in the logits output, and how many rows it has there.
    pub logit_row: usize,
    pub logit_count: usize,
}

/// A validated call: row layout and totals.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ForwardPlan {
    pub rows: Vec<SeqRows>,
    pub total_tokens: usize,
    pub logit_rows: usize,
}

/// Checks a request against the config and the cache state, and lays out
/// its output rows. Every defect is a typed error naming the argument; a
/// backend calls this before touching its device (the checked mode).
pub fn plan(config: &LlamaConfig, lens: &[usize], capacity: usize, req: &ForwardRequest<'_>) -> Result<ForwardPlan> {
    let bad = |arg: &'static str, reason: String| Err(ModelError::InvalidInput { arg, reason });
    if req.tokens.len() != lens.len() {
        return bad("tokens", format!("{} sequences given for a cache of batch {}", req.tokens.len(), lens.len()));
    }
    let mut seen = vec![false; config.num_hidden_layers];
    for &l in req.hidden_layers {
        if l >= config.num_hidden_layers {
            return bad("hidden_layers", format!("layer {l} is outside [0, {})", config.num_hidden_layers));
        }
        if std::mem::replace(&mut seen[l], true) {
            return bad("hidden_layers", format!("layer {l} is requested twice"));
        }
    }
    let mut rows = Vec::new();
    let (mut token_row, mut logit_row) = (0, 0);
    for (seq, (toks, &len)) in req.tokens.iter().zip(lens).enumerate() {
        if let Some((i, t)) = toks.iter().enumerate().find(|(_, t)| **t as usize >= config.vocab_size) {
            return bad("tokens", format!("sequence {seq} token {i} is id {t}, outside the vocabulary of {}", config.vocab_size));
        }
        if len + toks.len() > capacity {
            return bad("tokens", format!("sequence {seq}: {} new tokens after {len} cached exceed the capacity {capacity}", toks.len()));
        }
        if toks.is_empty() {
            continue;
        }
        let logit_count = match req.logits {
            LogitRows::All => toks.len(),
            LogitRows::Last => 1,
            LogitRows::None => 0,
        };
        rows.push(SeqRows { seq, start_pos: len, count: toks.len(), token_row, logit_row, logit_count });
        token_row += toks.len();
        logit_row += logit_count;
    }
    if token_row == 0 {
        return bad("tokens", "no sequence has a new token".to_string());
    }
    Ok(ForwardPlan { rows, total_tokens: token_row, logit_rows: logit_row })
}

/// Checks a cache geometry before anything is allocated for it.
pub fn check_cache_shape(config: &LlamaConfig, batch: usize, capacity: usize) -> Result<()> {
    let bad = |arg: &'static str, reason: String| Err(ModelError::InvalidInput { arg, reason });
    if batch == 0 {
        return bad("batch", "the batch is empty".to_string());
    }
    if capacity == 0 || capacity > config.max_position_embeddings {
        return bad("capacity", format!("{capacity} is outside [1, max_position_embeddings = {}]", config.max_position_embeddings));
    }
    let per_token = 2 * config.num_hidden_layers * config.num_key_value_heads * config.head_dim();
    let elements = batch.checked_mul(capacity).and_then(|n| n.checked_mul(per_token));
    match elements {
        Some(n) if n <= (1usize << 36) => Ok(()),
        _ => bad("capacity", format!("a cache of {batch} x {capacity} positions would hold more than 2^36 values")),
    }
}

/// Checks per-sequence trim amounts against the cache lengths (strict, KV-4).
pub fn check_trim(lens: &[usize], amounts: &[usize]) -> Result<()> {
    if amounts.len() != lens.len() {
        return Err(ModelError::InvalidInput { arg: "amounts", reason: format!("{} amounts for a batch of {}", amounts.len(), lens.len()) });
    }
    for (seq, (&a, &len)) in amounts.iter().zip(lens).enumerate() {
        if a > len {
            return Err(ModelError::InvalidInput { arg: "amounts", reason: format!("sequence {seq}: cannot trim {a} positions from a cache holding {len}") });
        }
    }
    Ok(())
}

/// Trims per-sequence lengths after [`check_trim`]: positions past a length
/// are never read and the next append overwrites them, so a cache whose
/// storage is preallocated trims by moving lengths alone (KV-3, KV-4).
pub fn trim_lens(lens: &mut [usize], amounts: &[usize]) -> Result<()> {
    check_trim(lens, amounts)?;
    for (len, a) in lens.iter_mut().zip(amounts) {
        *len -= a;
    }
    Ok(())
}

/// The rotary angle table of one position: `cos`, `sin` of
/// `pos · theta^(-2i/head_dim)` for `i < head_dim/2`, in f64 (MODEL-10).
pub fn rope_angles(pos: usize, head_dim: usize, theta: f64) -> (Vec<f64>, Vec<f64>) {
    rope_angles_of(pos, head_dim, &crate::config::Rope::plain(theta))
}

/// A validated config's rotary embedding (with Llama 3's scaling where it
/// has it, MODEL-17), read once per forward call: the config's JSON is not
/// parsed again for every position.
pub fn config_rope(cfg: &LlamaConfig) -> crate::config::Rope {
    cfg.rope().unwrap_or(crate::config::Rope::plain(cfg.rope_theta))
}

/// The angles of `pos` under `rope`.
pub fn rope_angles_of(pos: usize, head_dim: usize, rope: &crate::config::Rope) -> (Vec<f64>, Vec<f64>) {
    let half = head_dim / 2;
    (0..half)
        .map(|i| {
            let inv_freq = rope.inv_freq(i, head_dim);
            let a = pos as f64 * inv_freq;
            (a.cos(), a.sin())
        })
        .unzip()
}

/// Rotate-half RoPE in place on every head of `x` (`[heads · head_dim]`)
/// with one position's angles (MODEL-10): f64 in the reference forward, f32
/// in the host drafter and the ndarray port, one definition for all.
pub fn rope<T: Copy + std::ops::Mul<Output = T> + std::ops::Add<Output = T> + std::ops::Sub<Output = T>>(x: &mut [T], head_dim: usize, cos: &[T], sin: &[T]) {
    let half = head_dim / 2;
    for head in x.chunks_exact_mut(head_dim) {
        for i in 0..half {
            let (a, b) = (head[i], head[i + half]);
            head[i] = a * cos[i] - b * sin[i];
            head[i + half] = b * cos[i] + a * sin[i];
        }
    }
}
