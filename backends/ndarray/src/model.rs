//! The Llama forward pass on the CPU (MODEL-8 .. MODEL-11), f32 or Q8_0
//! weights, batch-invariant.
//!
//! Every value a token's row gets is computed by arithmetic that depends
//! only on that row and the cache before it, never on how many rows share
//! the call: projections are `specdec_rowmat::matmul` (one fixed dot
//! product per output, weights streamed once per call for a whole verify
//! window; q, k and v stacked into one product, gate and up into another);
//! RMSNorm sums squares with the same dot product; attention scores are
//! that dot product of a query and each key its row sees (one product per
//! window row and KV head, for the group's query heads), then per row a
//! softmax over exactly those positions (a max, exponentials and their sum
//! in a fixed order for the row's length) and the weighted values added in
//! position order;
//! RoPE, SwiGLU and the residual adds are per element (the exponentials
//! of SwiGLU and the attention softmax are `ndarray-f32`'s vectorised one,
//! about 1.6e-7 relative in f32). So a `(k+1)`-token verify window's logits
//! equal `k+1` one-token decodes' bit for bit, and the stated
//! `window_margin_epsilon` is 0 (the model section checks windows against
//! decodes exactly). The KV cache is one preallocated `[batch, kv_heads,
//! capacity, head_dim]` array per layer and kind (a head's keys contiguous,
//! so they are the rows of one product); appending writes the new positions
//! in place, trimming only moves a sequence's length.
//! Precision against the f64 reference: f32 rounding (f32 weights) and
//! those exponentials, or the
//! Q8_0 quantization of every projection whose input width is a multiple
//! of 32 (see [`NdarrayBackend::model_precision`]).

use ndarray::{Array2, Array4, s};
use specdec_backend::model::ModelError;
use specdec_backend::model::{ForwardOutput, ForwardRequest, LlamaConfig, LlamaWeights, LogitRows, ModelBackend, ModelPrecision, check_cache_index};
use specdec_backend::{BackendError, Result};
use specdec_models::forward;
use specdec_models::weights::Matrix;
use specdec_rowmat::{Weights, dot, matmul, matmul_into, matmul_serial};

use crate::pool;
use crate::softmax_f32::exp_f32_poly;
use crate::widest::widest;
use crate::{NdTensor, NdarrayBackend, Softmax, WeightFormat};

/// Weights resident for the forward.
#[derive(Debug, Clone)]
pub struct NdModel {
    config: LlamaConfig,
    /// f32 `[vocab, hidden]`, for the token lookup.
    embed: Vec<f32>,
    layers: Vec<NdLayer>,
    final_norm: Vec<f32>,
    /// The output projection (the embedding again when tied).
    head: Weights,
}

#[derive(Debug, Clone)]
struct NdLayer {
    attn_norm: Vec<f32>,
    /// The q, k and v projections stacked (rows in that order): one
    /// product, so one pass of the threads over the three.
    wqkv: Weights,
    wo: Weights,
    mlp_norm: Vec<f32>,
    /// The gate and up projections stacked, likewise.
    w_gate_up: Weights,
    w_down: Weights,
    /// Qwen2's q, k and v biases, concatenated as the stacked product's columns.
    qkv_bias: Option<Vec<f32>>,
    /// Qwen3's per-head RMSNorm weights of q and of k.
    qk_norm: Option<(Vec<f32>, Vec<f32>)>,
}

impl NdModel {
    /// Bytes of projection weights one forward step reads (every layer's
    /// and the output head's, in the format each is held in): what a decode
    /// streams from memory, for a roofline.
    pub fn projection_bytes(&self) -> usize {
        self.head.bytes() + self.layers.iter().map(|l| l.wqkv.bytes() + l.wo.bytes() + l.w_gate_up.bytes() + l.w_down.bytes()).sum::<usize>()
    }
}

/// Every layer's keys and values for a batch of sequences.
#[derive(Debug, Clone)]
pub struct NdModelCache {
    capacity: usize,
    lens: Vec<usize>,
    /// Per layer `[batch, kv_heads, capacity, head_dim]`.
    keys: Vec<Array4<f32>>,
    values: Vec<Array4<f32>>,
}

impl WeightFormat {
    /// A projection's weights in this format. Q8_0 needs the input width to
    /// be a multiple of its 32-value block; a matrix whose width is not (some
    /// tiny models') stays f32, as llama.cpp's quantizer leaves such tensors.
    fn weights(self, m: &Matrix) -> Result<Weights> {
        self.stacked(&[m])
    }

    /// Projections of the same input stacked into one matrix, rows in the
    /// order given. Each output is still the dot product of the input row
    /// and one weight row (and Q8_0 quantizes row by row), so the stacked
    /// product's values are the separate products' bit for bit.
    ///
    /// f32 keeps a GGUF's Q8_0 or Q4_1 blocks as stored where the matrix
    /// has them ([`Matrix::stored`]): a block product is the f32 product of
    /// the blocks' values bit for bit (`specdec_rowmat`), and those values
    /// are the matrix's, so the forward computes what it computes on the
    /// f32 matrix, reading a sixth (Q4_1) or a quarter (Q8_0) of the bytes.
    fn stacked(self, parts: &[&Matrix]) -> Result<Weights> {
        let m = Matrix::stacked_rows(parts)?;
        let (rows, cols) = (m.rows(), m.cols());
        Ok(match (self, m.stored()) {
            (WeightFormat::F32, Some((format, blocks))) => {
                let w = Weights::blocks(format, rows, cols, blocks.to_vec()).filter(|w| decodes_to(w, &m.data));
                w.ok_or_else(|| BackendError::from(ModelError::InvalidInput { arg: "weights", reason: format!("a [{rows}, {cols}] matrix's {} blocks do not decode to its values", format.name()) }))?
            }
            (WeightFormat::F32, None) => Weights::f32(rows, cols, m.data),
            (WeightFormat::Q8_0, _) => Weights::q8_0(rows, cols, &m.data).unwrap_or_else(|| Weights::f32(rows, cols, m.data)),
        })
    }
}

/// Whether block weights decode to `values` bit for bit: a matrix whose
/// values were changed after it was read would otherwise be multiplied as
/// the file stored it, a different model.
fn decodes_to(w: &Weights, values: &[f32]) -> bool {
    let cols = w.cols();
    (0..w.rows()).all(|r| w.row(r).iter().zip(&values[r * cols..(r + 1) * cols]).all(|(a, b)| a.to_bits() == b.to_bits()))
}

/// RMSNorm of each `width`-wide row: `x · (1 / sqrt(dot(x, x) / width + eps)) · w`.
fn rms_norm(x: &[f32], width: usize, w: &[f32], eps: f64) -> Vec<f32> {
    let mut out = Vec::with_capacity(x.len());
    for row in x.chunks_exact(width) {
        let inv = 1.0 / (dot(row, row) / width as f32 + eps as f32).sqrt();
        out.extend(row.iter().zip(w).map(|(&v, &g)| v * inv * g));
    }
    out
}

/// The rows of a stacked product `[n, Σ widths]` as one `[n, width]`
/// matrix per part.
fn split_columns<const P: usize>(y: &[f32], widths: [usize; P]) -> [Vec<f32>; P] {
    let total: usize = widths.iter().sum();
    let rows = y.len() / total;
    let mut parts: [Vec<f32>; P] = widths.map(|w| Vec::with_capacity(rows * w));
    for row in y.chunks_exact(total) {
        let mut at = 0;
        for (part, w) in parts.iter_mut().zip(widths) {
            part.extend_from_slice(&row[at..at + w]);
            at += w;
        }
    }
    parts
}

/// `e^x` for `x <= 0` in f32: `ndarray-f32`'s vectorisable exponential
/// (`softmax_f32.rs`: within 1e-7 relative before the f32 rounding, so about
/// 1.6e-7 after it; results below f32's normal range lose relative
/// precision), which the compiler vectorises where the C library's `expf`
/// is a call per value. NaN stays NaN (the polynomial alone would clamp it
/// to the underflow bound), so a NaN score still poisons its row as the
/// reference's does.
#[inline(always)]
fn exp_nonpositive(x: f32) -> f32 {
    let e = exp_f32_poly(f64::from(x)) as f32;
    if x.is_nan() { x } else { e }
}

/// SwiGLU, `silu(g) · u` per element, with `silu(g) = g · σ(g)` and `σ`
/// from `e^-|g|` (an argument never above 0): `1 / (1 + e)` for `g >= 0`,
/// `e / (1 + e)` below. Per element, so a row's values do not depend on
/// the rows beside it.
/// `gate_up` holds each row's gate values, then its up values (the
/// stacked product `[n, 2 · ff]`); the result is `[n, ff]`.
fn swiglu(gate_up: &[f32], ff: usize) -> Vec<f32> {
    let mut out = vec![0.0f32; gate_up.len() / 2];
    // Plain loops (no `collect`, whose loop would be compiled outside `widest`).
    widest(
        #[inline(always)]
        || {
            for (o, row) in out.chunks_exact_mut(ff).zip(gate_up.chunks_exact(2 * ff)) {
                let (gate, up) = row.split_at(ff);
                for ((o, &g), &u) in o.iter_mut().zip(gate).zip(up) {
                    let e = exp_nonpositive(-g.abs());
                    let sigma = if g >= 0.0 { 1.0 / (1.0 + e) } else { e / (1.0 + e) };
                    *o = g * sigma * u;
                }
            }
        },
    );
    out
}

/// Softmax of one row's scores times `scale` over the positions it sees,
/// then the probability-weighted value rows (`[seen, hd]`) added in
/// position order into `out` (`hd` values). `weights` is scratch
/// space of at least `scores.len()` values.
fn attend(scores: &[f32], scale: f32, values: &[f32], hd: usize, weights: &mut [f32], out: &mut [f32]) {
    widest(
        #[inline(always)]
        || attend_rows(scores, scale, values, hd, weights, out),
    )
}

#[inline(always)]
fn attend_rows(scores: &[f32], scale: f32, values: &[f32], hd: usize, weights: &mut [f32], out: &mut [f32]) {
    // The max and the sum in sixteen lanes (position i in lane i mod 16,
    // lanes then taken in order): a fixed order for a row of a given length,
    // vectorised, where one chain of dependent adds cost more than the
    // weighted values.
    let mut lanes = [f32::NEG_INFINITY; 16];
    for (i, &v) in scores.iter().enumerate() {
        lanes[i % 16] = lanes[i % 16].max(v * scale);
    }
    let max = lanes.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v));
    let weights = &mut weights[..scores.len()];
    for (e, &v) in weights.iter_mut().zip(scores) {
        *e = exp_nonpositive(v * scale - max);
    }
    let mut lanes = [0.0f32; 16];
    for (i, &e) in weights.iter().enumerate() {
        lanes[i % 16] += e;
    }
    let total = lanes.iter().fold(0.0f32, |s, &e| s + e);
    out.fill(0.0);
    for (e, v) in weights.iter().zip(values.chunks_exact(hd)) {
        let p = e / total;
        for (o, &x) in out.iter_mut().zip(v) {
            *o += p * x;
        }
    }
}

/// Causal attention over one layer's cache, after the window's keys and
/// values went in: every window row's query heads of one KV head attend to
/// the positions that row sees.
struct Attention<'a> {
    /// The rotated queries, `[rows, nh · hd]`.
    q: &'a [f32],
    /// `[batch, kv_heads, capacity, hd]`.
    keys: &'a Array4<f32>,
    values: &'a Array4<f32>,
    nh: usize,
    group: usize,
    hd: usize,
    scale: f32,
}

impl Attention<'_> {
    /// The attended values `[rows, nh · hd]`, one (window row, KV head) at a
    /// time: its group's scores are the canonical dot products of its
    /// queries and the keys that row sees, then [`attend`] per query head.
    /// On the calling thread: a 9-row window's attention is about 30 µs a
    /// layer, and splitting it across rayon's threads measured no faster.
    fn rows(&self, rows: &[forward::SeqRows]) -> Vec<f32> {
        let (width, span) = (self.nh * self.hd, self.group * self.hd);
        let mut attended = vec![0.0f32; rows.iter().map(|r| r.count).sum::<usize>() * width];
        let mut weights = vec![0.0f32; rows.iter().map(|r| r.start_pos + r.count).max().unwrap_or(0)];
        for r in rows {
            for i in 0..r.count {
                for kvh in 0..self.nh / self.group {
                    let at = (r.token_row + i) * width + kvh * span;
                    self.one(r, i, kvh, &mut weights, &mut attended[at..at + span]);
                }
            }
        }
        attended
    }

    /// Window row `i` of `r` (at position `start_pos + i`, seeing every
    /// position up to its own), the query heads of KV head `kvh`, into `out`.
    fn one(&self, r: &forward::SeqRows, i: usize, kvh: usize, weights: &mut [f32], out: &mut [f32]) {
        let (hd, group) = (self.hd, self.group);
        let seen = r.start_pos + i + 1;
        let keys = self.keys.slice(s![r.seq, kvh, ..seen, ..]);
        let values = self.values.slice(s![r.seq, kvh, ..seen, ..]);
        let (keys, values) = (keys.to_slice().expect("a standard-layout cache"), values.to_slice().expect("a standard-layout cache"));
        let at = ((r.token_row + i) * self.nh + kvh * group) * hd;
        let scores = matmul_serial(&self.q[at..at + group * hd], group, keys, hd);
        for (g, out) in out.chunks_exact_mut(hd).enumerate() {
            attend(&scores[g * seen..(g + 1) * seen], self.scale, values, hd, weights, out);
        }
    }
}

/// The forward's f32 outputs `[rows, cols]`, written by `fill` into a
/// pooled buffer: kept f32 by `ndarray-f32` (its softmax reads them as they
/// are), widened exactly to f64 (into a pooled buffer too) by the f64 port.
fn floats(softmax: Softmax, rows: usize, cols: usize, fill: impl FnOnce(&mut [f32])) -> NdTensor {
    let mut v = pool::take::<f32>(rows * cols);
    fill(&mut v);
    let v = match softmax {
        Softmax::F32 => return NdTensor::F32(Array2::from_shape_vec((rows, cols), v).expect("rows · cols values").into_dyn()),
        Softmax::F64 => {
            let mut wide = pool::take::<f64>(rows * cols);
            wide.iter_mut().zip(&v).for_each(|(w, &x)| *w = f64::from(x));
            pool::give(v);
            wide
        }
    };
    NdTensor::F64(Array2::from_shape_vec((rows, cols), v).expect("rows · cols values").into_dyn())
}

impl ModelBackend for NdarrayBackend {
    type Model = NdModel;
    type ModelCache = NdModelCache;

    /// f32 weights, measured against the f64 reference by the model section
    /// (MODEL-11): largest absolute logit error 1.1e-6 on the tiny models
    /// and 5.7e-5 on SmolLM2-135M (logits up to about 31, so about 2e-6
    /// relative); hidden states within the same relative bound. The stated
    /// 2e-5 leaves a margin of about 10x; the argmax epsilon covers a flip
    /// of two logits of magnitude 50 each off by the tolerance. A GGUF's
    /// Q8_0 and Q4_1 matrices are multiplied as their blocks (see
    /// [`WeightFormat::stacked`]), which computes the f32 values' bits: the
    /// reference dequantizes the same blocks, so the bound is the same.
    ///
    /// Q8_0 weights ([`WeightFormat::Q8_0`]): every projection whose input
    /// width is a multiple of 32, the tied output head included, in GGUF's
    /// Q8_0 (the token lookup stays f32). Against the f64 reference on the f32 weights
    /// the quantization costs what it costs (see the constants below); within
    /// the backend a window and one-token decodes agree bit for bit, as for
    /// f32, because a Q8_0 product is the f32 product of the dequantized
    /// weights (`specdec_rowmat`). So speculation on it is lossless against
    /// its own plain decoding, and it runs in `all`.
    ///
    /// Both formats state `window_margin_epsilon = 0`: windows equal decodes
    /// exactly, and the model section holds them to that.
    fn model_precision(&self) -> ModelPrecision {
        match self.weights {
            WeightFormat::F32 => ModelPrecision {
                weight_dtype: "f32 (q8_0/q4_1 blocks as stored, where a GGUF stores them)",
                compute_dtype: "f32",
                logit_rel_tolerance: 2e-5,
                hidden_rel_tolerance: 2e-5,
                argmax_margin_epsilon: 2e-3,
                window_margin_epsilon: 0.0,
            },
            WeightFormat::Q8_0 => ModelPrecision {
                weight_dtype: "q8_0",
                compute_dtype: "f32 (products of the dequantized q8_0 weights)",
                logit_rel_tolerance: Q8_0_LOGIT_REL_TOLERANCE,
                hidden_rel_tolerance: Q8_0_HIDDEN_REL_TOLERANCE,
                argmax_margin_epsilon: 2.0 * Q8_0_LOGIT_REL_TOLERANCE * 50.0,
                window_margin_epsilon: 0.0,
            },
        }
    }

    fn load_model(&self, w: &LlamaWeights) -> Result<NdModel> {
        w.config.validate("weights")?;
        let f = self.weights;
        let layers = w
            .layers
            .iter()
            .map(|l| {
                Ok(NdLayer {
                    attn_norm: l.attn_norm.data.clone(),
                    wqkv: f.stacked(&[&l.wq, &l.wk, &l.wv])?,
                    wo: f.weights(&l.wo)?,
                    mlp_norm: l.mlp_norm.data.clone(),
                    w_gate_up: f.stacked(&[&l.w_gate, &l.w_up])?,
                    w_down: f.weights(&l.w_down)?,
                    qkv_bias: match (&l.attn.q_bias, &l.attn.k_bias, &l.attn.v_bias) {
                        (Some(q), Some(k), Some(v)) => Some([q, k, v].iter().flat_map(|b| b.data.iter().copied()).collect()),
                        _ => None,
                    },
                    qk_norm: l.attn.q_norm.as_ref().zip(l.attn.k_norm.as_ref()).map(|(q, k)| (q.data.clone(), k.data.clone())),
                })
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(NdModel { config: w.config.clone(), embed: w.embed.data.clone(), layers, final_norm: w.final_norm.data.clone(), head: f.weights(w.output_matrix())? })
    }

    /// Every projection's and the head's bytes as held (a GGUF's blocks as
    /// stored, f32 otherwise): [`NdModel::projection_bytes`].
    fn weight_bytes(&self, model: &NdModel) -> Option<usize> {
        Some(model.projection_bytes())
    }

    fn new_model_cache(&self, model: &NdModel, batch: usize, capacity: usize) -> Result<NdModelCache> {
        let cfg = &model.config;
        forward::check_cache_shape(cfg, batch, capacity)?;
        let shape = (batch, cfg.num_key_value_heads, capacity, cfg.head_dim());
        let n = cfg.num_hidden_layers;
        Ok(NdModelCache { capacity, lens: vec![0; batch], keys: vec![Array4::zeros(shape); n], values: vec![Array4::zeros(shape); n] })
    }

    fn forward(&self, model: &NdModel, cache: &mut NdModelCache, req: &ForwardRequest<'_>) -> Result<ForwardOutput<NdTensor>> {
        let cfg = &model.config;
        let plan = forward::plan(cfg, &cache.lens, cache.capacity, req)?;
        let (h, hd, nh, nkv) = (cfg.hidden_size, cfg.head_dim(), cfg.num_attention_heads, cfg.num_key_value_heads);
        let n = plan.total_tokens;
        let mut x: Vec<f32> = plan.rows.iter().flat_map(|r| req.tokens[r.seq].iter()).flat_map(|&t| model.embed[t as usize * h..(t as usize + 1) * h].iter().copied()).collect();
        // Per-row rotary tables at each token's own position, built in f64.
        let (mut cos, mut sin) = (vec![0.0f32; n * hd / 2], vec![0.0f32; n * hd / 2]);
        let rotary = forward::config_rope(cfg);
        for r in &plan.rows {
            for i in 0..r.count {
                let (c, sn) = forward::rope_angles_of(r.start_pos + i, hd, &rotary);
                let row = (r.token_row + i) * hd / 2;
                cos[row..row + hd / 2].iter_mut().zip(&c).for_each(|(o, &v)| *o = v as f32);
                sin[row..row + hd / 2].iter_mut().zip(&sn).for_each(|(o, &v)| *o = v as f32);
            }
        }
        let k_width = req.hidden_layers.len() * h;
        let mut hidden = vec![0.0f32; if k_width == 0 { 0 } else { n * k_width }];
        let group = nh / nkv;
        let scale = 1.0 / (hd as f32).sqrt();
        for (li, layer) in model.layers.iter().enumerate() {
            let normed = rms_norm(&x, h, &layer.attn_norm, cfg.rms_norm_eps);
            let mut qkv = matmul(&normed, n, &layer.wqkv);
            // MODEL-17: Qwen2's biases, then Qwen3's per-head norms, before RoPE.
            if let Some(bias) = &layer.qkv_bias {
                qkv.chunks_exact_mut(bias.len()).for_each(|row| row.iter_mut().zip(bias).for_each(|(x, b)| *x += b));
            }
            let [mut q, mut k, v] = split_columns(&qkv, [nh * hd, nkv * hd, nkv * hd]);
            if let Some((q_norm, k_norm)) = &layer.qk_norm {
                q = rms_norm(&q, hd, q_norm, cfg.rms_norm_eps);
                k = rms_norm(&k, hd, k_norm, cfg.rms_norm_eps);
            }
            for row in 0..n {
                let t = row * hd / 2..(row + 1) * hd / 2;
                forward::rope(&mut q[row * nh * hd..(row + 1) * nh * hd], hd, &cos[t.clone()], &sin[t.clone()]);
                forward::rope(&mut k[row * nkv * hd..(row + 1) * nkv * hd], hd, &cos[t.clone()], &sin[t]);
            }
            for r in &plan.rows {
                for kvh in 0..nkv {
                    let mut keys = cache.keys[li].slice_mut(s![r.seq, kvh, .., ..]);
                    let mut values = cache.values[li].slice_mut(s![r.seq, kvh, .., ..]);
                    let (keys, values) = (keys.as_slice_mut().expect("a standard-layout cache"), values.as_slice_mut().expect("a standard-layout cache"));
                    for i in 0..r.count {
                        let (from, to) = ((r.token_row + i) * nkv * hd + kvh * hd, (r.start_pos + i) * hd);
                        keys[to..to + hd].copy_from_slice(&k[from..from + hd]);
                        values[to..to + hd].copy_from_slice(&v[from..from + hd]);
                    }
                }
            }
            let attention = Attention { q: &q, keys: &cache.keys[li], values: &cache.values[li], nh, group, hd, scale };
            let attended = attention.rows(&plan.rows);
            let o = matmul(&attended, n, &layer.wo);
            x.iter_mut().zip(&o).for_each(|(a, b)| *a += b);
            let normed = rms_norm(&x, h, &layer.mlp_norm, cfg.rms_norm_eps);
            let act = swiglu(&matmul(&normed, n, &layer.w_gate_up), layer.w_gate_up.rows() / 2);
            let down = matmul(&act, n, &layer.w_down);
            x.iter_mut().zip(&down).for_each(|(a, b)| *a += b);
            if let Some(slot) = req.hidden_layers.iter().position(|&l| l == li) {
                for row in 0..n {
                    hidden[row * k_width + slot * h..row * k_width + (slot + 1) * h].copy_from_slice(&x[row * h..(row + 1) * h]);
                }
            }
        }
        for r in &plan.rows {
            cache.lens[r.seq] += r.count;
        }
        let logits = match req.logits {
            LogitRows::None => None,
            LogitRows::All | LogitRows::Last => {
                let rows: Vec<usize> = match req.logits {
                    LogitRows::Last => plan.rows.iter().map(|r| r.token_row + r.count - 1).collect(),
                    _ => (0..n).collect(),
                };
                let picked: Vec<f32> = rows.iter().flat_map(|&r| x[r * h..(r + 1) * h].iter().copied()).collect();
                let normed = rms_norm(&picked, h, &model.final_norm, cfg.rms_norm_eps);
                let vocab = model.head.rows();
                Some(floats(self.softmax, rows.len(), vocab, |y| matmul_into(&normed, rows.len(), &model.head, y)))
            }
        };
        let hidden = (k_width > 0).then(|| floats(self.softmax, n, k_width, |y| y.copy_from_slice(&hidden)));
        Ok(ForwardOutput { plan, logits, hidden })
    }

    fn cache_lens(&self, cache: &NdModelCache) -> Vec<usize> {
        cache.lens.clone()
    }

    fn cache_trim(&self, cache: &mut NdModelCache, amounts: &[usize]) -> Result<()> {
        Ok(forward::trim_lens(&mut cache.lens, amounts)?)
    }

    fn cache_contents(&self, cache: &NdModelCache, layer: usize, seq: usize) -> Result<(Vec<f64>, Vec<f64>)> {
        check_cache_index(cache.lens.len(), cache.keys.len(), layer, seq)?;
        let len = cache.lens[seq];
        // The contract's order is position, head, value; the cache holds head, position, value.
        let take = |a: &Array4<f32>| a.slice(s![seq, .., ..len, ..]).permuted_axes([1, 0, 2]).iter().map(|&v| f64::from(v)).collect();
        Ok((take(&cache.keys[layer]), take(&cache.values[layer])))
    }
}

/// Q8_0's logit bound against the f64 reference on the f32 weights
/// (measured in the model section; see [`NdarrayBackend::model_precision`]).
const Q8_0_LOGIT_REL_TOLERANCE: f64 = 0.15;
const Q8_0_HIDDEN_REL_TOLERANCE: f64 = 0.6;
