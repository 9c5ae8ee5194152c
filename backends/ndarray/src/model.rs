//! The Llama forward pass on the CPU (MODEL-8 .. MODEL-11), f32 or Q8_0
//! weights, batch-invariant.
//!
//! Every value a token's row gets is computed by arithmetic that depends
//! only on that row and the cache before it, never on how many rows share
//! the call: projections are `specdec_rowmat::matmul` (one fixed dot
//! product per output, weights streamed once per call for a whole verify
//! window); RMSNorm sums squares with the same dot product; attention
//! scores are that dot product of a query and each cached key (one product
//! per sequence and KV head for every window row and query head of the
//! group), then per row a softmax over exactly the positions it sees (a max,
//! exponentials and their sum in position order) and the weighted values
//! added in position order; RoPE, SwiGLU and the residual adds are per
//! element. So a `(k+1)`-token verify window's logits
//! equal `k+1` one-token decodes' bit for bit, and the stated
//! `window_margin_epsilon` is 0 (the model section checks windows against
//! decodes exactly). The KV cache is one preallocated `[batch, kv_heads,
//! capacity, head_dim]` array per layer and kind (a head's keys contiguous,
//! so they are the rows of one product); appending writes the new positions
//! in place, trimming only moves a sequence's length.
//! Precision against the f64 reference: f32 rounding (f32 weights), or the
//! Q8_0 quantization of every projection whose input width is a multiple
//! of 32 (see [`NdarrayBackend::model_precision`]).

use ndarray::{Array2, Array4, s};
use specdec_backend::Result;
use specdec_backend::model::{ForwardOutput, ForwardRequest, LlamaConfig, LlamaWeights, LogitRows, ModelBackend, ModelPrecision, check_cache_index};
use specdec_models::forward;
use specdec_models::weights::Matrix;
use specdec_rowmat::{Weights, dot, matmul, matmul_serial};

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
    wq: Weights,
    wk: Weights,
    wv: Weights,
    wo: Weights,
    mlp_norm: Vec<f32>,
    w_gate: Weights,
    w_up: Weights,
    w_down: Weights,
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
    fn weights(self, m: &Matrix) -> Weights {
        match self {
            WeightFormat::F32 => Weights::f32(m.rows(), m.cols(), m.data.clone()),
            WeightFormat::Q8_0 => Weights::q8_0(m.rows(), m.cols(), &m.data).unwrap_or_else(|| Weights::f32(m.rows(), m.cols(), m.data.clone())),
        }
    }
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

/// Rotate-half RoPE in place on one row of `heads · hd` values (MODEL-10).
fn rope_row(row: &mut [f32], hd: usize, cos: &[f32], sin: &[f32]) {
    let half = hd / 2;
    for head in row.chunks_exact_mut(hd) {
        for i in 0..half {
            let (a, b) = (head[i], head[i + half]);
            head[i] = a * cos[i] - b * sin[i];
            head[i + half] = b * cos[i] + a * sin[i];
        }
    }
}

fn silu(x: f32) -> f32 {
    x / (1.0 + (-x).exp())
}

/// Softmax of one row's scores over the positions it sees, in position
/// order, then the probability-weighted value rows (`[seen, hd]`) added in
/// position order into `out` (`hd` values).
fn attend(scores: &[f32], values: &[f32], hd: usize, out: &mut [f32]) {
    let max = scores.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v));
    let exps: Vec<f32> = scores.iter().map(|&v| (v - max).exp()).collect();
    let total = exps.iter().fold(0.0f32, |s, &e| s + e);
    out.fill(0.0);
    for (e, v) in exps.iter().zip(values.chunks_exact(hd)) {
        let p = e / total;
        for (o, &x) in out.iter_mut().zip(v) {
            *o += p * x;
        }
    }
}

/// The forward's f32 outputs: kept f32 by `ndarray-f32` (its softmax reads
/// them as they are), widened exactly to f64 by the f64 port.
fn floats(softmax: Softmax, rows: usize, cols: usize, v: Vec<f32>) -> NdTensor {
    let a = Array2::from_shape_vec((rows, cols), v).expect("rows · cols values");
    match softmax {
        Softmax::F32 => NdTensor::F32(a.into_dyn()),
        Softmax::F64 => NdTensor::F64(a.mapv(f64::from).into_dyn()),
    }
}

impl ModelBackend for NdarrayBackend {
    type Model = NdModel;
    type ModelCache = NdModelCache;

    /// f32 weights, measured against the f64 reference by the model section
    /// (MODEL-11): largest absolute logit error 1.1e-6 on the tiny models
    /// and 5.7e-5 on SmolLM2-135M (logits up to about 31, so about 2e-6
    /// relative); hidden states within the same relative bound. The stated
    /// 2e-5 leaves a margin of about 10x; the argmax epsilon covers a flip
    /// of two logits of magnitude 50 each off by the tolerance.
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
            WeightFormat::F32 => {
                ModelPrecision { weight_dtype: "f32", compute_dtype: "f32", logit_rel_tolerance: 2e-5, hidden_rel_tolerance: 2e-5, argmax_margin_epsilon: 2e-3, window_margin_epsilon: 0.0 }
            }
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
            .map(|l| NdLayer {
                attn_norm: l.attn_norm.data.clone(),
                wq: f.weights(&l.wq),
                wk: f.weights(&l.wk),
                wv: f.weights(&l.wv),
                wo: f.weights(&l.wo),
                mlp_norm: l.mlp_norm.data.clone(),
                w_gate: f.weights(&l.w_gate),
                w_up: f.weights(&l.w_up),
                w_down: f.weights(&l.w_down),
            })
            .collect();
        Ok(NdModel { config: w.config.clone(), embed: w.embed.data.clone(), layers, final_norm: w.final_norm.data.clone(), head: f.weights(w.output_matrix()) })
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
        for r in &plan.rows {
            for i in 0..r.count {
                let (c, sn) = forward::rope_angles(r.start_pos + i, hd, cfg.rope_theta);
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
            let mut q = matmul(&normed, n, &layer.wq);
            let mut k = matmul(&normed, n, &layer.wk);
            let v = matmul(&normed, n, &layer.wv);
            for row in 0..n {
                let t = row * hd / 2..(row + 1) * hd / 2;
                rope_row(&mut q[row * nh * hd..(row + 1) * nh * hd], hd, &cos[t.clone()], &sin[t.clone()]);
                rope_row(&mut k[row * nkv * hd..(row + 1) * nkv * hd], hd, &cos[t.clone()], &sin[t]);
            }
            let mut attended = vec![0.0f32; n * nh * hd];
            for r in &plan.rows {
                let end = r.start_pos + r.count;
                for kvh in 0..nkv {
                    let mut keys = cache.keys[li].slice_mut(s![r.seq, kvh, .., ..]);
                    let mut values = cache.values[li].slice_mut(s![r.seq, kvh, .., ..]);
                    let (keys, values) = (keys.as_slice_mut().expect("a standard-layout cache"), values.as_slice_mut().expect("a standard-layout cache"));
                    for i in 0..r.count {
                        let (from, to) = ((r.token_row + i) * nkv * hd + kvh * hd, (r.start_pos + i) * hd);
                        keys[to..to + hd].copy_from_slice(&k[from..from + hd]);
                        values[to..to + hd].copy_from_slice(&v[from..from + hd]);
                    }
                    // Every window row's queries of this KV head's group, against every key up to
                    // the window's end: each score is the dot product alone, whatever else is computed.
                    let mut queries = Vec::with_capacity(r.count * group * hd);
                    for i in 0..r.count {
                        let at = ((r.token_row + i) * nh + kvh * group) * hd;
                        queries.extend_from_slice(&q[at..at + group * hd]);
                    }
                    let scores = matmul_serial(&queries, r.count * group, &keys[..end * hd], hd);
                    for i in 0..r.count {
                        // Token i sits at start_pos + i and sees every position up to its own.
                        let seen = r.start_pos + i + 1;
                        for g in 0..group {
                            let row = (i * group + g) * end;
                            let at = ((r.token_row + i) * nh + kvh * group + g) * hd;
                            let scaled: Vec<f32> = scores[row..row + seen].iter().map(|&s| s * scale).collect();
                            attend(&scaled, &values[..seen * hd], hd, &mut attended[at..at + hd]);
                        }
                    }
                }
            }
            let o = matmul(&attended, n, &layer.wo);
            x.iter_mut().zip(&o).for_each(|(a, b)| *a += b);
            let normed = rms_norm(&x, h, &layer.mlp_norm, cfg.rms_norm_eps);
            let gate = matmul(&normed, n, &layer.w_gate);
            let up = matmul(&normed, n, &layer.w_up);
            let act: Vec<f32> = gate.iter().zip(&up).map(|(&g, &u)| silu(g) * u).collect();
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
                Some(floats(self.softmax, rows.len(), vocab, matmul(&normed, rows.len(), &model.head)))
            }
        };
        let hidden = (k_width > 0).then(|| floats(self.softmax, n, k_width, hidden));
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
