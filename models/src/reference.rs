//! The reference Llama forward pass: plain f64 loops, the oracle of the
//! model section of the conformance suite (MODEL-8 .. MODEL-11).
//!
//! Invariants: weights stay f32 as loaded and are widened exactly to f64 at
//! each use; every activation is f64; every dot product sums in one fixed
//! order (eight interleaved partial sums combined left to right, so the loop
//! vectorises and the result never depends on thread count or batch
//! composition); each token's computation reads only the cache rows at
//! positions up to its own. Consequently a `(k+1)`-token verify window gives
//! bit-identical logits to `k+1` one-token decodes, and a sequence's logits do
//! not depend on the other sequences of the batch: the reference has no
//! batch-invariance drift by construction, which the conformance suite
//! asserts exactly.

use crate::config::LlamaConfig;
use crate::error::Result;
use crate::forward::{self, ForwardPlan, ForwardRequest, LogitRows};
use crate::weights::{LlamaWeights, Matrix};

/// A model ready for the reference forward.
#[derive(Debug, Clone)]
pub struct RefModel {
    weights: LlamaWeights,
}

/// The reference KV cache: per layer, per sequence, keys and values of every
/// position (`[len, kv_heads, head_dim]` row-major).
#[derive(Debug, Clone, PartialEq)]
pub struct RefCache {
    capacity: usize,
    /// Values per position: `kv_heads · head_dim`.
    kv_width: usize,
    lens: Vec<usize>,
    /// `keys[layer][seq]`.
    keys: Vec<Vec<Vec<f64>>>,
    values: Vec<Vec<Vec<f64>>>,
}

impl RefCache {
    pub fn lens(&self) -> &[usize] {
        &self.lens
    }

    pub fn layers(&self) -> usize {
        self.keys.len()
    }

    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Keys of `layer` for sequence `seq`: `[len, kv_heads, head_dim]`.
    pub fn keys(&self, layer: usize, seq: usize) -> &[f64] {
        &self.keys[layer][seq]
    }

    pub fn values(&self, layer: usize, seq: usize) -> &[f64] {
        &self.values[layer][seq]
    }

    /// Removes the last `amounts[b]` positions of each sequence, every layer (KV-3, KV-4 strict).
    pub fn trim(&mut self, amounts: &[usize]) -> Result<()> {
        forward::check_trim(&self.lens, amounts)?;
        for (seq, &a) in amounts.iter().enumerate() {
            let new_len = self.lens[seq] - a;
            for layer in 0..self.keys.len() {
                self.keys[layer][seq].truncate(new_len * self.kv_width);
                self.values[layer][seq].truncate(new_len * self.kv_width);
            }
            self.lens[seq] = new_len;
        }
        Ok(())
    }
}

/// Outputs of one reference forward call.
#[derive(Debug, Clone, PartialEq)]
pub struct RefOutput {
    pub plan: ForwardPlan,
    /// `[plan.logit_rows, vocab]` row-major.
    pub logits: Vec<f64>,
    /// `[plan.total_tokens, K·hidden]` row-major (empty when no layer was asked).
    pub hidden: Vec<f64>,
}

impl RefOutput {
    /// Logits row `r`.
    pub fn logits_row(&self, r: usize, vocab: usize) -> &[f64] {
        &self.logits[r * vocab..(r + 1) * vocab]
    }
}

impl RefModel {
    pub fn new(weights: LlamaWeights) -> Self {
        RefModel { weights }
    }

    pub fn config(&self) -> &LlamaConfig {
        &self.weights.config
    }

    pub fn weights(&self) -> &LlamaWeights {
        &self.weights
    }

    /// An empty cache for `batch` sequences of up to `capacity` positions.
    pub fn new_cache(&self, batch: usize, capacity: usize) -> Result<RefCache> {
        forward::check_cache_shape(self.config(), batch, capacity)?;
        let layers = self.config().num_hidden_layers;
        Ok(RefCache {
            capacity,
            kv_width: self.config().num_key_value_heads * self.config().head_dim(),
            lens: vec![0; batch],
            keys: vec![vec![Vec::new(); batch]; layers],
            values: vec![vec![Vec::new(); batch]; layers],
        })
    }

    /// One forward call (MODEL-8): runs every sequence's new tokens, appends
    /// them to the cache, returns the requested logits and hidden states.
    pub fn forward(&self, cache: &mut RefCache, req: &ForwardRequest<'_>) -> Result<RefOutput> {
        let cfg = self.config();
        let plan = forward::plan(cfg, &cache.lens, cache.capacity, req)?;
        let (h, hd, nh, nkv, v) = (cfg.hidden_size, cfg.head_dim(), cfg.num_attention_heads, cfg.num_key_value_heads, cfg.vocab_size);
        // Each new token with its sequence and position, in output-row order.
        let mut slots = Vec::with_capacity(plan.total_tokens);
        let mut x: Vec<Vec<f64>> = Vec::with_capacity(plan.total_tokens);
        for r in &plan.rows {
            for (i, &t) in req.tokens[r.seq].iter().enumerate() {
                slots.push((r.seq, r.start_pos + i));
                x.push(self.weights.embed.row(t as usize).iter().map(|&w| f64::from(w)).collect());
            }
        }
        let rope = forward::config_rope(cfg);
        let angles: Vec<(Vec<f64>, Vec<f64>)> = slots.iter().map(|&(_, pos)| forward::rope_angles_of(pos, hd, &rope)).collect();
        let k_width = req.hidden_layers.len() * h;
        let mut hidden = vec![0.0; if k_width == 0 { 0 } else { plan.total_tokens * k_width }];
        let group = nh / nkv;
        let scale = 1.0 / (hd as f64).sqrt();
        for (li, layer) in self.weights.layers.iter().enumerate() {
            let normed: Vec<Vec<f64>> = x.iter().map(|row| rms_norm(row, &layer.attn_norm, cfg.rms_norm_eps)).collect();
            let mut q = matmul(&layer.wq, &normed);
            let mut k = matmul(&layer.wk, &normed);
            let mut vv = matmul(&layer.wv, &normed);
            // MODEL-17: Qwen2's projection biases, then Qwen3's per-head norms, before RoPE.
            for (rows, bias) in [(&mut q, &layer.attn.q_bias), (&mut k, &layer.attn.k_bias), (&mut vv, &layer.attn.v_bias)] {
                if let Some(b) = bias {
                    for row in rows.iter_mut() {
                        row.iter_mut().zip(&b.data).for_each(|(x, &w)| *x += f64::from(w));
                    }
                }
            }
            for (rows, norm) in [(&mut q, &layer.attn.q_norm), (&mut k, &layer.attn.k_norm)] {
                if let Some(w) = norm {
                    for row in rows.iter_mut() {
                        let normed: Vec<f64> = row.chunks_exact(hd).flat_map(|head| rms_norm(head, w, cfg.rms_norm_eps)).collect();
                        *row = normed;
                    }
                }
            }
            for (t, (cos, sin)) in angles.iter().enumerate() {
                forward::rope(&mut q[t], hd, cos, sin);
                forward::rope(&mut k[t], hd, cos, sin);
            }
            for (t, &(seq, _)) in slots.iter().enumerate() {
                cache.keys[li][seq].extend_from_slice(&k[t]);
                cache.values[li][seq].extend_from_slice(&vv[t]);
            }
            let attended: Vec<Vec<f64>> = slots
                .iter()
                .enumerate()
                .map(|(t, &(seq, pos))| {
                    let (keys, values) = (&cache.keys[li][seq], &cache.values[li][seq]);
                    let mut out = vec![0.0; nh * hd];
                    for head in 0..nh {
                        // Causal: positions 0..=pos of this sequence only.
                        attend(&q[t][head * hd..(head + 1) * hd], keys, values, pos + 1, nkv, head / group, scale, &mut out[head * hd..(head + 1) * hd]);
                    }
                    out
                })
                .collect();
            let o = matmul(&layer.wo, &attended);
            add_in_place(&mut x, &o);
            let normed: Vec<Vec<f64>> = x.iter().map(|row| rms_norm(row, &layer.mlp_norm, cfg.rms_norm_eps)).collect();
            let gate = matmul(&layer.w_gate, &normed);
            let up = matmul(&layer.w_up, &normed);
            let act: Vec<Vec<f64>> = gate.iter().zip(&up).map(|(g, u)| g.iter().zip(u).map(|(g, u)| silu(*g) * u).collect()).collect();
            let down = matmul(&layer.w_down, &act);
            add_in_place(&mut x, &down);
            if let Some(slot) = req.hidden_layers.iter().position(|&l| l == li) {
                for (t, row) in x.iter().enumerate() {
                    hidden[t * k_width + slot * h..t * k_width + (slot + 1) * h].copy_from_slice(row);
                }
            }
        }
        for &(seq, _) in &slots {
            cache.lens[seq] += 1;
        }
        let logit_inputs: Vec<Vec<f64>> = match req.logits {
            LogitRows::None => Vec::new(),
            LogitRows::All => x.iter().map(|row| rms_norm(row, &self.weights.final_norm, cfg.rms_norm_eps)).collect(),
            LogitRows::Last => plan.rows.iter().map(|r| rms_norm(&x[r.token_row + r.count - 1], &self.weights.final_norm, cfg.rms_norm_eps)).collect(),
        };
        let logits = matmul(self.weights.output_matrix(), &logit_inputs).into_iter().flatten().collect::<Vec<f64>>();
        debug_assert_eq!(logits.len(), plan.logit_rows * v);
        Ok(RefOutput { plan, logits, hidden })
    }
}

/// The fixed-order f64 dot product of the reference: eight interleaved
/// partial sums, combined left to right, then the tail in order.
pub fn dot(a: &[f64], b: &[f64]) -> f64 {
    let mut acc = [0.0f64; 8];
    let chunks = a.len() / 8;
    for c in 0..chunks {
        for l in 0..8 {
            acc[l] += a[c * 8 + l] * b[c * 8 + l];
        }
    }
    let mut s = acc.iter().sum::<f64>();
    for i in chunks * 8..a.len() {
        s += a[i] * b[i];
    }
    s
}

/// Softmax attention of one query head `qh` (`[head_dim]`) over the first
/// `count` positions of `keys`/`values` (`[pos, kv_heads, head_dim]`, KV head
/// `kvh`), added into `out`: scores in position order, max-shifted
/// exponentials summed in position order, values accumulated in position
/// order. Shared with the DFlash drafter so both attend in one fixed order.
#[allow(clippy::too_many_arguments)]
pub(crate) fn attend(qh: &[f64], keys: &[f64], values: &[f64], count: usize, nkv: usize, kvh: usize, scale: f64, out: &mut [f64]) {
    let hd = qh.len();
    let scores: Vec<f64> = (0..count).map(|j| dot(qh, &keys[(j * nkv + kvh) * hd..(j * nkv + kvh + 1) * hd]) * scale).collect();
    let max = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let exps: Vec<f64> = scores.iter().map(|s| (s - max).exp()).collect();
    let total: f64 = exps.iter().sum();
    for (j, e) in exps.iter().enumerate() {
        let w = e / total;
        let vj = &values[(j * nkv + kvh) * hd..(j * nkv + kvh + 1) * hd];
        for (od, vd) in out.iter_mut().zip(vj) {
            *od += w * vd;
        }
    }
}

/// `dot` with an f32 weight row widened exactly.
fn dot_w(w: &[f32], x: &[f64]) -> f64 {
    let mut acc = [0.0f64; 8];
    let chunks = w.len() / 8;
    for c in 0..chunks {
        for l in 0..8 {
            acc[l] += f64::from(w[c * 8 + l]) * x[c * 8 + l];
        }
    }
    let mut s = acc.iter().sum::<f64>();
    for i in chunks * 8..w.len() {
        s += f64::from(w[i]) * x[i];
    }
    s
}

/// `y[t] = W · x[t]` for every token; weights stream once per call, and the
/// output rows are split across threads (each row's sum is independent of
/// the split, so the result is too).
pub(crate) fn matmul(w: &Matrix, xs: &[Vec<f64>]) -> Vec<Vec<f64>> {
    let (rows, n) = (w.rows(), xs.len());
    if n == 0 {
        return Vec::new();
    }
    let mut y = vec![0.0; rows * n]; // row-major [rows, n]
    let threads = crate::parallel::threads_for(rows * w.cols() * n, 1 << 19);
    crate::parallel::split_rows(&mut y, n, threads, |first, chunk| {
        for (i, out) in chunk.chunks_mut(n).enumerate() {
            let wr = w.row(first + i);
            for (t, o) in out.iter_mut().enumerate() {
                *o = dot_w(wr, &xs[t]);
            }
        }
    });
    (0..n).map(|t| (0..rows).map(|r| y[r * n + t]).collect()).collect()
}

/// RMSNorm: `x / sqrt(mean(x²) + eps) · w`.
pub fn rms_norm(x: &[f64], w: &Matrix, eps: f64) -> Vec<f64> {
    let ms = dot(x, x) / x.len() as f64;
    let inv = 1.0 / (ms + eps).sqrt();
    x.iter().zip(&w.data).map(|(v, w)| v * inv * f64::from(*w)).collect()
}

pub(crate) fn silu(x: f64) -> f64 {
    x / (1.0 + (-x).exp())
}

pub(crate) fn add_in_place(x: &mut [Vec<f64>], y: &[Vec<f64>]) {
    for (a, b) in x.iter_mut().zip(y) {
        for (a, b) in a.iter_mut().zip(b) {
            *a += b;
        }
    }
}
