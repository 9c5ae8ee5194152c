//! Fused projections (MODEL-17): Phi-3 stores q, k and v as one matrix
//! (`qkv_proj`, llama.cpp's `attn_qkv`) and gate and up as another
//! (`gate_up_proj`, llama.cpp's `ffn_up`), the parts stacked by rows in that
//! order. The forward is Llama's on the parts.
//!
//! Role: the one place that knows the stored layout. Loading splits at the
//! file boundary ([`split_reader`]), so [`LlamaWeights`] always holds the
//! parts and no backend sees a fused matrix; export and the GGUF writer fuse
//! back ([`stored_named`]), so what is written loads in HF and llama.cpp.
//!
//! Invariants: a fused tensor's shape is checked against the sum of its
//! parts' before any row is sliced (a wrong one is a `TensorShape` error
//! naming the fused tensor); split then fused is the identity.

use std::borrow::Cow;

use crate::config::LlamaConfig;
use crate::error::{ModelError, Result};
use crate::weights::{LlamaWeights, Matrix};

/// A fused tensor of a layer: its HF name below `model.layers.{i}.`, its
/// GGUF name below `blk.{i}.`, and its parts (HF names, stacked in order).
pub struct FusedTensor {
    pub hf: &'static str,
    pub gguf: &'static str,
    pub parts: &'static [&'static str],
}

/// Phi-3's fused tensors.
pub const FUSED_LAYER_TENSORS: [FusedTensor; 2] = [
    FusedTensor { hf: "self_attn.qkv_proj.weight", gguf: "attn_qkv.weight", parts: &["self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight"] },
    FusedTensor { hf: "mlp.gate_up_proj.weight", gguf: "ffn_up.weight", parts: &["mlp.gate_proj.weight", "mlp.up_proj.weight"] },
];

/// For a part's full HF name (`model.layers.3.self_attn.k_proj.weight`):
/// the fused tensor's full HF name and the part's index in it.
fn fused_home(hf: &str) -> Option<(String, &'static FusedTensor, usize)> {
    let rest = hf.strip_prefix("model.layers.")?;
    let (layer, name) = rest.split_once('.')?;
    FUSED_LAYER_TENSORS.iter().find_map(|f| f.parts.iter().position(|p| *p == name).map(|i| (format!("model.layers.{layer}.{}", f.hf), f, i)))
}

/// Wraps a reader of stored tensors (`take(name)`, `None` when absent) into
/// one of [`LlamaWeights`]' names: for a fused architecture, a part is cut
/// from its fused tensor (read once per fused tensor); any other name, and
/// every name of an unfused architecture, passes through.
pub fn split_reader<'a>(config: &LlamaConfig, mut take: impl FnMut(&str) -> Result<Option<Matrix>> + 'a, file: &'a str) -> impl FnMut(&str) -> Result<Option<Matrix>> + 'a {
    let fused = config.architecture().fused_projections();
    let shapes: std::collections::HashMap<String, Vec<usize>> = config.tensor_shapes().into_iter().collect();
    let mut last: Option<(String, Matrix)> = None;
    move |hf: &str| {
        let Some((whole, tensor, index)) = fused.then(|| fused_home(hf)).flatten() else { return take(hf) };
        if last.as_ref().is_none_or(|(name, _)| *name != whole) {
            let Some(m) = take(&whole)? else { return Err(ModelError::MissingTensor { file: file.to_string(), tensor: whole }) };
            last = Some((whole.clone(), m));
        }
        let (_, m) = last.as_ref().expect("just read");
        let prefix = hf.rsplit_once(tensor.parts[index]).map_or("", |(p, _)| p);
        let rows: Vec<usize> = tensor.parts.iter().map(|p| shapes.get(&format!("{prefix}{p}")).map_or(0, |s| s[0])).collect();
        let cols = shapes.get(hf).map_or(0, |s| s[1]);
        let expected = vec![rows.iter().sum::<usize>(), cols];
        if m.shape != expected {
            return Err(ModelError::TensorShape { file: file.to_string(), tensor: whole, expected, actual: m.shape.clone() });
        }
        let start = rows[..index].iter().sum::<usize>() * cols;
        Matrix::new(vec![rows[index], cols], m.data[start..start + rows[index] * cols].to_vec(), hf).map(Some)
    }
}

/// The names a file of `config`'s architecture stores, with their shapes:
/// [`LlamaConfig::tensor_shapes`] with each group of parts replaced by its
/// fused tensor where the architecture fuses.
pub fn stored_shapes(config: &LlamaConfig) -> Vec<(String, Vec<usize>)> {
    let shapes = config.tensor_shapes();
    if !config.architecture().fused_projections() {
        return shapes;
    }
    let mut out: Vec<(String, Vec<usize>)> = Vec::with_capacity(shapes.len());
    for (name, shape) in shapes {
        match fused_home(&name) {
            Some((whole, _, 0)) => out.push((whole, shape)),
            Some((whole, _, _)) => {
                let fused = out.iter_mut().find(|(n, _)| *n == whole).expect("the first part comes first");
                fused.1[0] += shape[0];
            }
            None => out.push((name, shape)),
        }
    }
    out
}

/// Every tensor of `weights` as its architecture stores it, in
/// [`LlamaWeights::named`] order: parts fused where the architecture fuses.
pub fn stored_named(weights: &LlamaWeights) -> Result<Vec<(String, Cow<'_, Matrix>)>> {
    let named = weights.named();
    if !weights.config.architecture().fused_projections() {
        return Ok(named.into_iter().map(|(n, m)| (n, Cow::Borrowed(m))).collect());
    }
    let mut out = Vec::with_capacity(named.len());
    for (name, m) in &named {
        match fused_home(name) {
            Some((whole, tensor, 0)) => {
                let prefix = name.rsplit_once(tensor.parts[0]).map_or("", |(p, _)| p);
                let parts: Vec<&Matrix> = tensor.parts.iter().map(|p| named.iter().find(|(n, _)| *n == format!("{prefix}{p}")).map(|(_, m)| *m).expect("every part is named")).collect();
                out.push((whole, Cow::Owned(Matrix::stacked_rows(&parts)?)));
            }
            Some(_) => {}
            None => out.push((name.clone(), Cow::Borrowed(*m))),
        }
    }
    Ok(out)
}
