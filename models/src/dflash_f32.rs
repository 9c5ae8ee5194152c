//! The DFlash drafter's fast host forward: the same computation as
//! [`crate::dflash`] (DRAFT-7, DRAFT-8) in f32. Matrix products of many rows
//! go through `matrixmultiply`'s sgemm; those of a few rows (a block, or the
//! head over the rows a step verifies) stream each weight once through
//! `specdec_rowmat`'s vectorised tiles, split across the cores when the
//! weight is large.
//!
//! Role: the drafter the decoder runs. A drafter only proposes: whatever it
//! drafts, verification keeps the output lossless (DECODE-1), so its forward
//! need not be the reference's bit for bit; it must be cheap next to a target
//! step. The f64 forward of [`crate::dflash`] stays the oracle: tests bound
//! the distance between the two forwards' logits.
//!
//! Invariants: the argument checks are the f64 forward's (one function); the
//! weights are the validated [`DflashDraft`]'s, owned, not converted; a
//! context's keys and values depend only on its own rows and positions.

use crate::config::LlamaConfig;
use crate::dflash::{DflashConfig, DflashDraft};
use crate::error::{ModelError, Result};
use crate::forward::rope;
use crate::forward::rope_angles;
use crate::weights::{LlamaWeights, Matrix};
use specdec_rowmat::Weights;

/// Up to this many rows a product streams the weight once, row by row
/// (sgemm would first pack all of `wᵀ`, which for the target's head costs
/// more than the product itself when only a few rows are asked for).
const FEW_ROWS: usize = 8;

/// A weight at least this large is split across threads in the few-row path.
const PARALLEL_ELEMENTS: usize = 1 << 20;

/// `y[rows, out] = x[rows, in] · wᵀ` for `w` `[out, in]` row-major.
fn linear(x: &[f32], w: &Matrix) -> Vec<f32> {
    let (out, inp) = (w.rows(), w.cols());
    let rows = x.len() / inp;
    debug_assert_eq!(rows * inp, x.len(), "x holds whole rows");
    if rows == 0 {
        return Vec::new();
    }
    if rows <= FEW_ROWS {
        // Each weight row streamed once for all the rows, in `specdec_rowmat`'s
        // vectorised tiles (split across the cores when the weight is large).
        return if out * inp >= PARALLEL_ELEMENTS { specdec_rowmat::matmul_f32(x, rows, &w.data, inp) } else { specdec_rowmat::matmul_serial(x, rows, &w.data, inp) };
    }
    let mut y = vec![0.0f32; rows * out];
    // SAFETY: a is rows×inp (row stride inp), b = wᵀ is inp×out read from w
    // (b[k][n] = w[n·inp + k]: row stride 1, column stride inp), c is
    // rows×out; all three slices hold exactly those many elements.
    unsafe {
        matrixmultiply::sgemm(rows, inp, out, 1.0, x.as_ptr(), inp as isize, 1, w.data.as_ptr(), 1, inp as isize, 0.0, y.as_mut_ptr(), out as isize, 1);
    }
    y
}

fn rms_norm(x: &mut [f32], gain: &[f32], eps: f64) {
    for row in x.chunks_mut(gain.len()) {
        let ms = row.iter().map(|v| f64::from(*v) * f64::from(*v)).sum::<f64>() / row.len() as f64;
        let inv = (1.0 / (ms + eps).sqrt()) as f32;
        row.iter_mut().zip(gain).for_each(|(v, g)| *v = *v * inv * g);
    }
}

fn angles(pos: usize, head_dim: usize, theta: f64) -> (Vec<f32>, Vec<f32>) {
    let (c, s) = rope_angles(pos, head_dim, theta);
    (c.into_iter().map(|v| v as f32).collect(), s.into_iter().map(|v| v as f32).collect())
}

/// Per-sequence context of [`DflashF32`]: per draft layer, keys (RoPE at
/// their position) and values `[len, kv_heads·head_dim]`.
#[derive(Debug, Clone, PartialEq)]
pub struct ContextF32 {
    len: usize,
    keys: Vec<Vec<f32>>,
    values: Vec<Vec<f32>>,
}

impl ContextF32 {
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Draft layer `layer`'s keys, `[len, kv_heads·head_dim]`.
    pub fn keys(&self, layer: usize) -> &[f32] {
        &self.keys[layer]
    }

    /// Draft layer `layer`'s values, `[len, kv_heads·head_dim]`.
    pub fn values(&self, layer: usize) -> &[f32] {
        &self.values[layer]
    }
}

/// The f32 drafter.
#[derive(Debug, Clone)]
pub struct DflashF32 {
    draft: DflashDraft,
    /// The target's head in Q8_0 for the drafter's own readout, when asked
    /// for ([`DflashF32::with_q8_0_head`]); else the target's f32 head.
    head: Option<Weights>,
}

impl DflashF32 {
    pub fn new(draft: DflashDraft) -> Self {
        DflashF32 { draft, head: None }
    }

    /// A drafter that reads its block out through a Q8_0 copy of `target`'s
    /// head (GGUF's blocks of 32, `specdec_rowmat`), a quarter of the f32
    /// head's bytes. The head was most of a block's cost (SmolLM2's is 113
    /// MB in f32, a full pass over it for every draft step); the drafts and
    /// their rows change by the quantization, and verification keeps the
    /// output lossless whatever the drafter proposes (DECODE-1). Greedy
    /// drafts and the sampled path's rows `q` both come from this head, so a
    /// sampled draft's law is still the row it is passed with (DRAFT-5).
    /// The f32 head when the hidden width is not a multiple of 32. Use the
    /// drafter with `target` only: its readouts ignore the head of whatever
    /// target is passed later.
    pub fn with_q8_0_head(draft: DflashDraft, target: &LlamaWeights) -> Self {
        let m = target.output_matrix();
        DflashF32 { draft, head: Weights::q8_0(m.rows(), m.cols(), &m.data) }
    }

    /// `states [rows, hidden]` through the readout head.
    fn head_logits(&self, target: &LlamaWeights, states: &[f32]) -> Vec<f32> {
        match &self.head {
            Some(head) => {
                let m = target.output_matrix();
                debug_assert_eq!((head.rows(), head.cols()), (m.rows(), m.cols()), "the Q8_0 head has the shape of the target it was made from, which it must be");
                specdec_rowmat::matmul(states, states.len() / head.cols(), head)
            }
            None => linear(states, target.output_matrix()),
        }
    }

    pub fn config(&self) -> &DflashConfig {
        self.draft.config()
    }

    pub fn draft(&self) -> &DflashDraft {
        &self.draft
    }

    pub fn new_context(&self) -> ContextF32 {
        let layers = self.config().layers.num_hidden_layers;
        ContextF32 { len: 0, keys: vec![Vec::new(); layers], values: vec![Vec::new(); layers] }
    }

    fn layers_config(&self) -> &LlamaConfig {
        &self.config().layers
    }

    /// Appends context positions (DRAFT-7): `rows` holds one `K·hidden`
    /// row per position, the target's hidden states at `target_layer_ids`.
    pub fn extend(&self, ctx: &mut ContextF32, rows: &[f64]) -> Result<()> {
        if ctx.keys.len() != self.layers_config().num_hidden_layers {
            return Err(ModelError::InvalidInput { arg: "ctx", reason: "the context belongs to a drafter of another shape".into() });
        }
        let count = self.draft.check_rows(ctx.len, rows)?;
        let c = self.layers_config();
        let w = self.draft.weights();
        let rows: Vec<f32> = rows.iter().map(|&v| v as f32).collect();
        let mut features = linear(&rows, &w.fc);
        rms_norm(&mut features, &w.hidden_norm.data, c.rms_norm_eps);
        let (hd, kv) = (c.head_dim(), c.num_key_value_heads * c.head_dim());
        let tables: Vec<(Vec<f32>, Vec<f32>)> = (0..count).map(|i| angles(ctx.len + i, hd, c.rope_theta)).collect();
        for (li, layer) in w.layers.iter().enumerate() {
            let mut k = linear(&features, &layer.wk);
            for (row, (cos, sin)) in k.chunks_mut(kv).zip(&tables) {
                rope(row, hd, cos, sin);
            }
            ctx.keys[li].extend_from_slice(&k);
            ctx.values[li].extend(linear(&features, &layer.wv));
        }
        ctx.len += count;
        Ok(())
    }

    /// The block forward (DRAFT-8) in f32: logits `[B, V]`; row `i >= 1`
    /// drafts block position `i`. Same arguments and checks as
    /// [`DflashDraft::block_logits`].
    pub fn block_logits(&self, target: &LlamaWeights, ctx: &ContextF32, block_tokens: &[u32]) -> Result<Vec<f32>> {
        let states = self.block_states(target, ctx, block_tokens)?;
        Ok(self.head_logits(target, &states))
    }

    /// The block's final states `[B, hidden]` (after the draft's norm), before the head.
    fn block_states(&self, target: &LlamaWeights, ctx: &ContextF32, block_tokens: &[u32]) -> Result<Vec<f32>> {
        self.draft.check_block(target, ctx.len, block_tokens)?;
        let c = self.layers_config();
        let w = self.draft.weights();
        let (b, n, h) = (block_tokens.len(), ctx.len, c.hidden_size);
        let (hd, nh, nkv, eps) = (c.head_dim(), c.num_attention_heads, c.num_key_value_heads, c.rms_norm_eps);
        let (group, kv) = (nh / nkv, nkv * hd);
        let scale = 1.0 / (hd as f32).sqrt();
        let mut x: Vec<f32> = block_tokens.iter().flat_map(|&t| target.embed.row(t as usize).iter().copied()).collect();
        let tables: Vec<(Vec<f32>, Vec<f32>)> = (0..b).map(|i| angles(n + i, hd, c.rope_theta)).collect();
        let mut scores = vec![0.0f32; n + b];
        for (li, layer) in w.layers.iter().enumerate() {
            let mut normed = x.clone();
            rms_norm(&mut normed, &layer.attn_norm.data, eps);
            let mut q = linear(&normed, &layer.wq);
            let mut k = linear(&normed, &layer.wk);
            let v = linear(&normed, &layer.wv);
            for (i, (cos, sin)) in tables.iter().enumerate() {
                rope(&mut q[i * nh * hd..(i + 1) * nh * hd], hd, cos, sin);
                rope(&mut k[i * kv..(i + 1) * kv], hd, cos, sin);
            }
            // Key j: the context's first, then the block's (not causal).
            let key = |j: usize, g: usize| if j < n { &ctx.keys[li][j * kv + g * hd..j * kv + (g + 1) * hd] } else { &k[(j - n) * kv + g * hd..(j - n) * kv + (g + 1) * hd] };
            let value = |j: usize, g: usize| if j < n { &ctx.values[li][j * kv + g * hd..j * kv + (g + 1) * hd] } else { &v[(j - n) * kv + g * hd..(j - n) * kv + (g + 1) * hd] };
            let mut attended = vec![0.0f32; b * nh * hd];
            for i in 0..b {
                for head in 0..nh {
                    let g = head / group;
                    let qh = &q[(i * nh + head) * hd..(i * nh + head + 1) * hd];
                    for (j, s) in scores.iter_mut().enumerate() {
                        *s = qh.iter().zip(key(j, g)).map(|(a, b)| a * b).sum::<f32>() * scale;
                    }
                    let max = scores.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                    let mut total = 0.0f32;
                    scores.iter_mut().for_each(|s| {
                        *s = (*s - max).exp();
                        total += *s;
                    });
                    let out = &mut attended[(i * nh + head) * hd..(i * nh + head + 1) * hd];
                    let inv = 1.0 / total;
                    for (j, &p) in scores.iter().enumerate() {
                        out.iter_mut().zip(value(j, g)).for_each(|(o, v)| *o += p * inv * v);
                    }
                }
            }
            linear(&attended, &layer.wo).iter().zip(x.iter_mut()).for_each(|(o, x)| *x += o);
            let mut normed = x.clone();
            rms_norm(&mut normed, &layer.mlp_norm.data, eps);
            let gate = linear(&normed, &layer.w_gate);
            let up = linear(&normed, &layer.w_up);
            let act: Vec<f32> = gate.iter().zip(&up).map(|(g, u)| g / (1.0 + (-g).exp()) * u).collect();
            linear(&act, &layer.w_down).iter().zip(x.iter_mut()).for_each(|(d, x)| *x += d);
        }
        rms_norm(&mut x, &w.norm.data, eps);
        debug_assert_eq!(x.len(), b * h);
        Ok(x)
    }

    /// Single-step parallel drafting (DRAFT-8): the argmax (lowest id on
    /// ties) of rows `1 ..= count` of one block forward on
    /// `[verified, mask..]`, `count <= B - 1`. The block runs whole (its
    /// attention is not causal); only the head, most of the cost, is
    /// limited to the rows asked for.
    pub fn draft_parallel(&self, target: &LlamaWeights, ctx: &ContextF32, verified: u32, count: usize) -> Result<Vec<u32>> {
        let b = self.config().block_size;
        if count == 0 || count >= b {
            return Err(ModelError::InvalidInput { arg: "count", reason: format!("{count} drafts are outside [1, block_size - 1 = {}]", b - 1) });
        }
        let block = self.draft.block_input(verified)?;
        let states = self.block_states(target, ctx, &block)?;
        let h = self.layers_config().hidden_size;
        let logits = self.head_logits(target, &states[h..(count + 1) * h]);
        let v = self.layers_config().vocab_size;
        Ok(logits.chunks(v).map(|row| specdec_reference::greedy::lowest_argmax(row) as u32).collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Both product paths, the few-row one split across threads (a weight
    /// of more than `PARALLEL_ELEMENTS`, an output not divisible by the thread
    /// count), equal an f64 dot product to f32 accuracy.
    #[test]
    fn linear_paths_match_a_plain_dot_product() {
        let (out, inp) = (1501, 701);
        assert!(out * inp >= PARALLEL_ELEMENTS);
        let value = |i: usize, m: usize| ((i * 2_654_435_761 % m) as f32 / m as f32) - 0.5;
        let w = Matrix::new(vec![out, inp], (0..out * inp).map(|i| value(i, 1009)).collect(), "w").unwrap();
        for rows in [1, 3, FEW_ROWS, FEW_ROWS + 1] {
            let x: Vec<f32> = (0..rows * inp).map(|i| value(i, 997)).collect();
            let y = linear(&x, &w);
            assert_eq!(y.len(), rows * out);
            for r in 0..rows {
                for o in [0, 1, out / 2, out - 1] {
                    let want: f64 = (0..inp).map(|k| f64::from(x[r * inp + k]) * f64::from(w.data[o * inp + k])).sum();
                    assert!((f64::from(y[r * out + o]) - want).abs() < 1e-3, "rows {rows}: y[{r}, {o}] = {} vs {want}", y[r * out + o]);
                }
            }
        }
    }

    /// The Q8_0 head reads a block out within the quantization's error of
    /// the f32 head (a few thousandths of the logits' range, bounded here
    /// at 5 %), and is really used (the logits differ); a hidden width that
    /// is not a multiple of 32 keeps the f32 head, bit for bit.
    #[test]
    fn a_q8_0_head_reads_out_close_to_the_f32_head() {
        use crate::dflash::{DflashSpec, seeded_dflash};
        use crate::tiny::TinySpec;
        for (preset, quantized) in [("tiny-v32-l2", true), ("tiny-v16-l1", false)] {
            let target = TinySpec::preset(preset).unwrap().weights().unwrap();
            let cfg = &target.config;
            let ids: Vec<usize> = (0..cfg.num_hidden_layers).rev().collect();
            let spec = DflashSpec { layers: 1, heads: 2, kv_heads: 1, intermediate: 2 * cfg.hidden_size, block_size: 4, target_layer_ids: ids, mask_token_id: (cfg.vocab_size - 1) as u32 };
            let draft = seeded_dflash(cfg, spec, 7).unwrap();
            let (plain, q8) = (DflashF32::new(draft.clone()), DflashF32::with_q8_0_head(draft, &target));
            let mut ctx = plain.new_context();
            let width = plain.config().feature_width();
            let rows: Vec<f64> = (0..3 * width).map(|i| (i * 37 % 101) as f64 / 101.0 - 0.5).collect();
            plain.extend(&mut ctx, &rows).unwrap();
            let block = plain.draft().block_input(5).unwrap();
            let (a, b) = (plain.block_logits(&target, &ctx, &block).unwrap(), q8.block_logits(&target, &ctx, &block).unwrap());
            let range = a.iter().fold(0f32, |m, v| m.max(v.abs()));
            let diff = a.iter().zip(&b).fold(0f32, |m, (x, y)| m.max((x - y).abs()));
            if quantized {
                assert!(diff > 0.0, "{preset}: the Q8_0 head is the one used");
                assert!(diff <= 0.05 * range, "{preset}: {diff} against logits up to {range}");
            } else {
                assert_eq!(a, b, "{preset}: hidden {} keeps the f32 head", cfg.hidden_size);
            }
        }
    }
}
