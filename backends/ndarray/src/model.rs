//! The Llama forward pass on ndarray (MODEL-8 .. MODEL-11), f32.
//!
//! Plain forward code with ndarray's array operations: every projection is
//! one `dot` of the batch's new tokens `[N, in]` against a weight's transpose
//! (matrixmultiply's sgemm, so the weights stream once per call whatever N
//! is); RMSNorm, RoPE and SwiGLU are whole-array maps; attention runs per
//! sequence and head as two `dot`s over that sequence's cached window with a
//! causal mask, so a `(k+1)`-token verify window and a one-token decode are
//! the same code. The KV cache is one preallocated `[batch, capacity,
//! kv_heads, head_dim]` array per layer and kind; appending writes the new
//! positions in place, trimming only moves a sequence's length.
//! Precision: f32 weights and activations; sgemm sums in blocked order, so
//! results differ from the f64 reference by f32 rounding (see
//! [`NdarrayBackend::model_precision`]).

use ndarray::{Array1, Array2, Array4, ArrayD, Axis, s};
use specdec_backend::Result;
use specdec_backend::model::{ForwardOutput, ForwardRequest, LlamaConfig, LlamaWeights, LogitRows, ModelBackend, ModelPrecision, check_cache_index};
use specdec_models::forward;
use specdec_models::weights::Matrix;

use crate::{NdTensor, NdarrayBackend};

/// Weights resident for the ndarray forward.
#[derive(Debug, Clone)]
pub struct NdModel {
    config: LlamaConfig,
    embed: Array2<f32>,
    layers: Vec<NdLayer>,
    final_norm: Array1<f32>,
    /// `None` when tied to `embed`.
    head: Option<Array2<f32>>,
}

#[derive(Debug, Clone)]
struct NdLayer {
    attn_norm: Array1<f32>,
    wq: Array2<f32>,
    wk: Array2<f32>,
    wv: Array2<f32>,
    wo: Array2<f32>,
    mlp_norm: Array1<f32>,
    w_gate: Array2<f32>,
    w_up: Array2<f32>,
    w_down: Array2<f32>,
}

/// Every layer's keys and values for a batch of sequences.
#[derive(Debug, Clone)]
pub struct NdModelCache {
    capacity: usize,
    lens: Vec<usize>,
    /// Per layer `[batch, capacity, kv_heads, head_dim]`.
    keys: Vec<Array4<f32>>,
    values: Vec<Array4<f32>>,
}

fn matrix(m: &Matrix) -> Array2<f32> {
    Array2::from_shape_vec((m.rows(), m.cols()), m.data.clone()).expect("LlamaWeights checked every shape")
}

fn vector(m: &Matrix) -> Array1<f32> {
    Array1::from_vec(m.data.clone())
}

/// `x · wᵀ` for `x [N, in]`, `w [out, in]`.
fn linear(x: &Array2<f32>, w: &Array2<f32>) -> Array2<f32> {
    x.dot(&w.t())
}

/// RMSNorm over each row: `x / sqrt(mean(x²) + eps) · w`.
fn rms_norm(x: &Array2<f32>, w: &Array1<f32>, eps: f64) -> Array2<f32> {
    let ms = x.mapv(|v| v * v).mean_axis(Axis(1)).expect("rows are non-empty");
    let inv = ms.mapv(|m| 1.0 / (m + eps as f32).sqrt()).insert_axis(Axis(1));
    x * &inv * w
}

/// Rotate-half RoPE of `x [N, heads·hd]` with per-row `cos`/`sin` `[N, hd/2]` (MODEL-10).
fn rope(x: &Array2<f32>, heads: usize, hd: usize, cos: &Array2<f32>, sin: &Array2<f32>) -> Array2<f32> {
    let n = x.nrows();
    let half = hd / 2;
    let x3 = x.view().into_shape_with_order((n, heads, hd)).expect("a row holds heads · hd values");
    let (x1, x2) = (x3.slice(s![.., .., ..half]), x3.slice(s![.., .., half..]));
    let (c, sn) = (cos.view().insert_axis(Axis(1)), sin.view().insert_axis(Axis(1)));
    let mut out = ndarray::Array3::<f32>::zeros((n, heads, hd));
    out.slice_mut(s![.., .., ..half]).assign(&(&x1 * &c - &x2 * &sn));
    out.slice_mut(s![.., .., half..]).assign(&(&x2 * &c + &x1 * &sn));
    out.into_shape_with_order((n, heads * hd)).expect("same element count")
}

fn silu(x: f32) -> f32 {
    x / (1.0 + (-x).exp())
}

/// Row-wise softmax in place (rows of `-inf` beyond the causal window give 0).
fn softmax_rows(scores: &mut Array2<f32>) {
    for mut row in scores.rows_mut() {
        let max = row.fold(f32::NEG_INFINITY, |m, &v| m.max(v));
        row.mapv_inplace(|v| (v - max).exp());
        let total = row.sum();
        row.mapv_inplace(|v| v / total);
    }
}

fn floats(a: ArrayD<f32>) -> NdTensor {
    NdTensor::F64(a.mapv(f64::from))
}

impl ModelBackend for NdarrayBackend {
    type Model = NdModel;
    type ModelCache = NdModelCache;

    /// Measured against the f64 reference by the model section (MODEL-11,
    /// 2026-11-22): largest absolute logit error 1.1e-6 on the tiny models
    /// and 5.7e-5 on SmolLM2-135M (logits up to about 31, so about 2e-6
    /// relative); hidden states within the same relative bound. The stated
    /// 2e-5 leaves a margin of about 10x; the argmax epsilon covers a flip
    /// of two logits of magnitude 50 each off by the tolerance.
    fn model_precision(&self) -> ModelPrecision {
        ModelPrecision { weight_dtype: "f32", compute_dtype: "f32", logit_rel_tolerance: 2e-5, hidden_rel_tolerance: 2e-5, argmax_margin_epsilon: 2e-3, window_margin_epsilon: 2e-3 }
    }

    fn load_model(&self, w: &LlamaWeights) -> Result<NdModel> {
        w.config.validate("weights")?;
        let layers = w
            .layers
            .iter()
            .map(|l| NdLayer {
                attn_norm: vector(&l.attn_norm),
                wq: matrix(&l.wq),
                wk: matrix(&l.wk),
                wv: matrix(&l.wv),
                wo: matrix(&l.wo),
                mlp_norm: vector(&l.mlp_norm),
                w_gate: matrix(&l.w_gate),
                w_up: matrix(&l.w_up),
                w_down: matrix(&l.w_down),
            })
            .collect();
        Ok(NdModel { config: w.config.clone(), embed: matrix(&w.embed), layers, final_norm: vector(&w.final_norm), head: w.lm_head.as_ref().map(matrix) })
    }

    fn new_model_cache(&self, model: &NdModel, batch: usize, capacity: usize) -> Result<NdModelCache> {
        let cfg = &model.config;
        forward::check_cache_shape(cfg, batch, capacity)?;
        let shape = (batch, capacity, cfg.num_key_value_heads, cfg.head_dim());
        let n = cfg.num_hidden_layers;
        Ok(NdModelCache { capacity, lens: vec![0; batch], keys: vec![Array4::zeros(shape); n], values: vec![Array4::zeros(shape); n] })
    }

    fn forward(&self, model: &NdModel, cache: &mut NdModelCache, req: &ForwardRequest<'_>) -> Result<ForwardOutput<NdTensor>> {
        let cfg = &model.config;
        let plan = forward::plan(cfg, &cache.lens, cache.capacity, req)?;
        let (h, hd, nh, nkv) = (cfg.hidden_size, cfg.head_dim(), cfg.num_attention_heads, cfg.num_key_value_heads);
        let n = plan.total_tokens;
        let ids: Vec<usize> = plan.rows.iter().flat_map(|r| req.tokens[r.seq].iter().map(|&t| t as usize)).collect();
        let mut x = model.embed.select(Axis(0), &ids);
        // Per-row rotary tables at each token's own position, built in f64.
        let (mut cos, mut sin) = (Array2::<f32>::zeros((n, hd / 2)), Array2::<f32>::zeros((n, hd / 2)));
        for r in &plan.rows {
            for i in 0..r.count {
                let (c, sn) = forward::rope_angles(r.start_pos + i, hd, cfg.rope_theta);
                cos.row_mut(r.token_row + i).assign(&Array1::from_iter(c.iter().map(|&v| v as f32)));
                sin.row_mut(r.token_row + i).assign(&Array1::from_iter(sn.iter().map(|&v| v as f32)));
            }
        }
        let k_width = req.hidden_layers.len() * h;
        let mut hidden = Array2::<f32>::zeros((if k_width == 0 { 0 } else { n }, k_width));
        let group = nh / nkv;
        let scale = 1.0 / (hd as f32).sqrt();
        for (li, layer) in model.layers.iter().enumerate() {
            let normed = rms_norm(&x, &layer.attn_norm, cfg.rms_norm_eps);
            let q = rope(&linear(&normed, &layer.wq), nh, hd, &cos, &sin);
            let k = rope(&linear(&normed, &layer.wk), nkv, hd, &cos, &sin);
            let v = linear(&normed, &layer.wv);
            let mut attended = Array2::<f32>::zeros((n, nh * hd));
            for r in &plan.rows {
                let rows = r.token_row..r.token_row + r.count;
                let window = r.start_pos + r.count;
                let k_new = k.slice(s![rows.clone(), ..]).into_shape_with_order((r.count, nkv, hd)).expect("k rows hold kv_heads · hd");
                let v_new = v.slice(s![rows.clone(), ..]).into_shape_with_order((r.count, nkv, hd)).expect("v rows hold kv_heads · hd");
                cache.keys[li].slice_mut(s![r.seq, r.start_pos..window, .., ..]).assign(&k_new);
                cache.values[li].slice_mut(s![r.seq, r.start_pos..window, .., ..]).assign(&v_new);
                let keys = cache.keys[li].slice(s![r.seq, ..window, .., ..]);
                let values = cache.values[li].slice(s![r.seq, ..window, .., ..]);
                for head in 0..nh {
                    let kvh = head / group;
                    let qh = q.slice(s![rows.clone(), head * hd..(head + 1) * hd]);
                    let mut scores = qh.dot(&keys.slice(s![.., kvh, ..]).t()) * scale;
                    // Causal inside the window: token i sits at start_pos + i.
                    for (i, mut row) in scores.rows_mut().into_iter().enumerate() {
                        row.slice_mut(s![r.start_pos + i + 1..]).fill(f32::NEG_INFINITY);
                    }
                    softmax_rows(&mut scores);
                    let out = scores.dot(&values.slice(s![.., kvh, ..]));
                    attended.slice_mut(s![rows.clone(), head * hd..(head + 1) * hd]).assign(&out);
                }
            }
            x = x + linear(&attended, &layer.wo);
            let normed = rms_norm(&x, &layer.mlp_norm, cfg.rms_norm_eps);
            let act = linear(&normed, &layer.w_gate).mapv(silu) * linear(&normed, &layer.w_up);
            x = x + linear(&act, &layer.w_down);
            if let Some(slot) = req.hidden_layers.iter().position(|&l| l == li) {
                hidden.slice_mut(s![.., slot * h..(slot + 1) * h]).assign(&x);
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
                let normed = rms_norm(&x.select(Axis(0), &rows), &model.final_norm, cfg.rms_norm_eps);
                Some(floats(linear(&normed, model.head.as_ref().unwrap_or(&model.embed)).into_dyn()))
            }
        };
        let hidden = (k_width > 0).then(|| floats(hidden.into_dyn()));
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
        let take = |a: &Array4<f32>| a.slice(s![seq, ..len, .., ..]).iter().map(|&v| f64::from(v)).collect();
        Ok((take(&cache.keys[layer]), take(&cache.values[layer])))
    }
}
