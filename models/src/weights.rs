//! Host-resident Llama weights in one convention, whatever file they came from.
//!
//! Invariants (MODEL-2): every matrix is row-major `[out, in]` as HF's
//! `nn.Linear` stores it; `wq`/`wk` rows are in HF order, so RoPE is the
//! rotate-half form (a GGUF file's interleaved permutation is undone on load,
//! MODEL-4); values are f32 whatever the file's dtype (f16/bf16/quantized
//! are widened or dequantized exactly on load). Shapes agree with the config:
//! [`LlamaWeights::new`] checks every tensor. A matrix a GGUF stored in
//! Q8_0 or Q4_1 also keeps those blocks ([`Matrix::stored`]), for a backend
//! that multiplies them as stored. Its values are the blocks' decoding
//! unless `data` is edited afterwards: only [`Matrix::from_blocks`]
//! attaches blocks (and decodes them itself), and only row moves and
//! stacking (which move the blocks with the rows) carry them on; every
//! other way of building a matrix drops them. Because `data` is public, a
//! backend that multiplies the blocks checks that they decode to the values.

use crate::config::{EXTRA_LAYER_TENSORS, LAYER_TENSORS, LlamaConfig};
use crate::error::{ModelError, Result};
use specdec_rowmat::BlockFormat;

/// A dense f32 matrix or vector with its shape.
#[derive(Debug, Clone)]
pub struct Matrix {
    pub shape: Vec<usize>,
    pub data: Vec<f32>,
    /// The GGUF blocks `data` was decoded from, row-major (module doc).
    stored: Option<(BlockFormat, Vec<u8>)>,
}

/// `rows` rows of `width` items with row `r` moved to row `dst(r)` (a permutation).
fn moved_rows<T: Copy + Default>(items: &[T], rows: usize, width: usize, dst: impl Fn(usize) -> usize) -> Vec<T> {
    let mut out = vec![T::default(); items.len()];
    for r in 0..rows {
        let d = dst(r);
        out[d * width..(d + 1) * width].copy_from_slice(&items[r * width..(r + 1) * width]);
    }
    out
}

/// Two matrices are equal when their shapes and values are: the blocks a
/// matrix was read from are a form of its values, not more.
impl PartialEq for Matrix {
    fn eq(&self, other: &Self) -> bool {
        self.shape == other.shape && self.data == other.data
    }
}

impl Matrix {
    /// Checks that `data` fills `shape` exactly.
    pub fn new(shape: Vec<usize>, data: Vec<f32>, name: &str) -> Result<Self> {
        let want = shape.iter().try_fold(1usize, |n, &d| n.checked_mul(d));
        if want != Some(data.len()) {
            return Err(ModelError::InvalidInput { arg: "matrix", reason: format!("`{name}`: {} values cannot fill shape {shape:?}", data.len()) });
        }
        Ok(Matrix { shape, data, stored: None })
    }

    /// A 2-D matrix `[rows, cols]` read from GGUF blocks: its values are
    /// their decoding ([`BlockFormat::decode`]), and it keeps the blocks.
    /// `None` when the bytes are not exactly `rows · cols / 32` blocks of
    /// rows a whole number of blocks long.
    pub fn from_blocks(rows: usize, cols: usize, format: BlockFormat, blocks: Vec<u8>) -> Option<Matrix> {
        if format.bytes_for(rows, cols)? != blocks.len() {
            return None;
        }
        let mut data = Vec::with_capacity(rows * cols);
        format.decode_all(&blocks, &mut data);
        Some(Matrix { shape: vec![rows, cols], data, stored: Some((format, blocks)) })
    }

    /// The GGUF blocks this matrix's values decode from, when it was read
    /// from Q8_0 or Q4_1 blocks (module doc).
    pub fn stored(&self) -> Option<(BlockFormat, &[u8])> {
        self.stored.as_ref().map(|(f, b)| (*f, b.as_slice()))
    }

    /// Output row `dst(r)` takes input row `r`, for the `rows` rows of a
    /// 2-D matrix (a permutation of them), its blocks moving with it.
    pub(crate) fn move_rows(&self, dst: impl Fn(usize) -> usize) -> Matrix {
        let (rows, cols) = (self.rows(), self.cols());
        let stored = self.stored.as_ref().map(|(format, blocks)| (*format, moved_rows(blocks, rows, blocks.len() / rows.max(1), &dst)));
        Matrix { shape: self.shape.clone(), data: moved_rows(&self.data, rows, cols, &dst), stored }
    }

    pub fn rows(&self) -> usize {
        self.shape[0]
    }

    pub fn cols(&self) -> usize {
        self.shape.get(1).copied().unwrap_or(1)
    }

    /// Row `r` of a 2-D matrix.
    pub fn row(&self, r: usize) -> &[f32] {
        let c = self.cols();
        &self.data[r * c..(r + 1) * c]
    }

    /// 2-D matrices of the same width stacked row-wise, in the order given:
    /// projections of one input made one product (q/k/v, gate/up), whose
    /// outputs are the parts' outputs side by side. A typed error for no
    /// parts or parts of other widths (a hand-built `LlamaWeights` may hold
    /// them).
    pub fn stacked_rows(parts: &[&Matrix]) -> Result<Matrix> {
        let widths: Vec<Vec<usize>> = parts.iter().map(|m| m.shape.clone()).collect();
        let cols = parts.first().map(|m| m.cols());
        match cols {
            Some(cols) if parts.iter().all(|m| m.shape.len() == 2 && m.cols() == cols) => {
                let rows = parts.iter().map(|m| m.rows()).sum();
                // Blocks stack when every part has them, in one format.
                let blocks: Option<Vec<(BlockFormat, &[u8])>> = parts.iter().map(|m| m.stored()).collect();
                let stored = blocks.filter(|b| b.iter().all(|(f, _)| *f == b[0].0)).map(|b| (b[0].0, b.iter().flat_map(|(_, bytes)| bytes.iter().copied()).collect()));
                Ok(Matrix { shape: vec![rows, cols], data: parts.iter().flat_map(|m| m.data.iter().copied()).collect(), stored })
            }
            _ => Err(ModelError::InvalidInput { arg: "weights", reason: format!("projections of one input must be 2-D of one width to be stacked, got shapes {widths:?}") }),
        }
    }
}

/// One decoder layer.
#[derive(Debug, Clone, PartialEq)]
pub struct LayerWeights {
    /// `[hidden]`.
    pub attn_norm: Matrix,
    /// `[heads·head_dim, hidden]`, HF row order.
    pub wq: Matrix,
    /// `[kv_heads·head_dim, hidden]`, HF row order.
    pub wk: Matrix,
    /// `[kv_heads·head_dim, hidden]`.
    pub wv: Matrix,
    /// `[hidden, heads·head_dim]`.
    pub wo: Matrix,
    /// `[hidden]`.
    pub mlp_norm: Matrix,
    /// `[intermediate, hidden]`.
    pub w_gate: Matrix,
    /// `[intermediate, hidden]`.
    pub w_up: Matrix,
    /// `[hidden, intermediate]`.
    pub w_down: Matrix,
    /// What the architecture adds to the attention (none for Llama).
    pub attn: AttnExtras,
}

/// A layer's attention tensors beyond Llama's (MODEL-17), each present
/// exactly where the config's architecture has it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct AttnExtras {
    /// Qwen2: `[heads·head_dim]`, added to q before RoPE.
    pub q_bias: Option<Matrix>,
    /// Qwen2: `[kv_heads·head_dim]`.
    pub k_bias: Option<Matrix>,
    /// Qwen2: `[kv_heads·head_dim]`.
    pub v_bias: Option<Matrix>,
    /// Qwen3: `[head_dim]`, an RMSNorm over each head of q, before RoPE.
    pub q_norm: Option<Matrix>,
    /// Qwen3: `[head_dim]`, the same over each head of k.
    pub k_norm: Option<Matrix>,
}

impl AttnExtras {
    /// The tensors in [`EXTRA_LAYER_TENSORS`] order.
    pub fn slots(&self) -> [&Option<Matrix>; 5] {
        [&self.q_bias, &self.k_bias, &self.v_bias, &self.q_norm, &self.k_norm]
    }

    /// Each present tensor with its HF name below `p`.
    pub fn named(&self, p: &str) -> Vec<(String, &Matrix)> {
        EXTRA_LAYER_TENSORS.iter().zip(self.slots()).filter_map(|((hf, _), m)| m.as_ref().map(|m| (format!("{p}.{hf}"), m))).collect()
    }
}

impl LayerWeights {
    /// One layer's tensors under their HF names below `p` (e.g.
    /// `model.layers.3`), through the loader's `get`, which names a missing
    /// tensor in its error.
    pub(crate) fn from_hf(p: &str, get: &mut impl FnMut(String) -> Result<Matrix>) -> Result<Self> {
        let mut m = LAYER_TENSORS.map(|(hf, _)| format!("{p}.{hf}")).into_iter().map(&mut *get);
        let mut next = || m.next().expect("nine names");
        Ok(LayerWeights { attn_norm: next()?, wq: next()?, wk: next()?, wv: next()?, wo: next()?, mlp_norm: next()?, w_gate: next()?, w_up: next()?, w_down: next()?, attn: AttnExtras::default() })
    }

    /// [`LayerWeights::from_hf`], with the extra tensors `config`'s
    /// architecture has (MODEL-17).
    pub(crate) fn from_hf_for(config: &LlamaConfig, p: &str, get: &mut impl FnMut(String) -> Result<Matrix>) -> Result<Self> {
        let mut layer = Self::from_hf(p, get)?;
        let wanted: Vec<&str> = config.extra_layer_tensors().into_iter().map(|(hf, _)| hf).collect();
        let mut take = |i: usize| -> Result<Option<Matrix>> {
            let hf = EXTRA_LAYER_TENSORS[i].0;
            if wanted.contains(&hf) { get(format!("{p}.{hf}")).map(Some) } else { Ok(None) }
        };
        layer.attn = AttnExtras { q_bias: take(0)?, k_bias: take(1)?, v_bias: take(2)?, q_norm: take(3)?, k_norm: take(4)? };
        Ok(layer)
    }

    /// The tensors in [`LAYER_TENSORS`] order.
    pub fn matrices(&self) -> [&Matrix; 9] {
        [&self.attn_norm, &self.wq, &self.wk, &self.wv, &self.wo, &self.mlp_norm, &self.w_gate, &self.w_up, &self.w_down]
    }

    /// Each tensor with its HF name below `p`, in [`LAYER_TENSORS`] order.
    pub fn named(&self, p: &str) -> impl Iterator<Item = (String, &Matrix)> {
        LAYER_TENSORS.iter().zip(self.matrices()).map(move |((hf, _), m)| (format!("{p}.{hf}"), m))
    }
}

/// A whole `LlamaForCausalLM`.
#[derive(Debug, Clone, PartialEq)]
pub struct LlamaWeights {
    pub config: LlamaConfig,
    /// `[vocab, hidden]`.
    pub embed: Matrix,
    pub layers: Vec<LayerWeights>,
    /// `[hidden]`.
    pub final_norm: Matrix,
    /// `[vocab, hidden]`, or `None` when tied to `embed`.
    pub lm_head: Option<Matrix>,
}

impl LlamaWeights {
    /// Assembles weights from HF-named tensors, checking every shape against
    /// the config. `take(name)` returns the tensor or `None` when absent;
    /// `file` names the source in errors.
    pub fn from_named(config: LlamaConfig, file: &str, mut take: impl FnMut(&str) -> Result<Option<Matrix>>) -> Result<Self> {
        config.validate(file)?;
        let shapes: std::collections::HashMap<String, Vec<usize>> = config.tensor_shapes().into_iter().collect();
        let mut get = |name: String| -> Result<Matrix> {
            let m = take(&name)?.ok_or_else(|| ModelError::MissingTensor { file: file.to_string(), tensor: name.clone() })?;
            let expected = &shapes[&name];
            if &m.shape != expected {
                return Err(ModelError::TensorShape { file: file.to_string(), tensor: name, expected: expected.clone(), actual: m.shape });
            }
            Ok(m)
        };
        let embed = get("model.embed_tokens.weight".into())?;
        let mut layers = Vec::with_capacity(config.num_hidden_layers);
        for l in 0..config.num_hidden_layers {
            layers.push(LayerWeights::from_hf_for(&config, &format!("model.layers.{l}"), &mut get)?);
        }
        let final_norm = get("model.norm.weight".into())?;
        let lm_head = if config.tie_word_embeddings { None } else { Some(get("lm_head.weight".into())?) };
        let weights = LlamaWeights { config, embed, layers, final_norm, lm_head };
        weights.check_finite(file)?;
        Ok(weights)
    }

    /// Every tensor with its HF name, in a fixed order (for export and comparison).
    pub fn named(&self) -> Vec<(String, &Matrix)> {
        let mut out = vec![("model.embed_tokens.weight".to_string(), &self.embed)];
        for (l, w) in self.layers.iter().enumerate() {
            let p = format!("model.layers.{l}");
            out.push((format!("{p}.input_layernorm.weight"), &w.attn_norm));
            out.push((format!("{p}.self_attn.q_proj.weight"), &w.wq));
            out.push((format!("{p}.self_attn.k_proj.weight"), &w.wk));
            out.push((format!("{p}.self_attn.v_proj.weight"), &w.wv));
            out.push((format!("{p}.self_attn.o_proj.weight"), &w.wo));
            out.push((format!("{p}.post_attention_layernorm.weight"), &w.mlp_norm));
            out.push((format!("{p}.mlp.gate_proj.weight"), &w.w_gate));
            out.push((format!("{p}.mlp.up_proj.weight"), &w.w_up));
            out.push((format!("{p}.mlp.down_proj.weight"), &w.w_down));
            out.extend(w.attn.named(&p));
        }
        out.push(("model.norm.weight".to_string(), &self.final_norm));
        if let Some(head) = &self.lm_head {
            out.push(("lm_head.weight".to_string(), head));
        }
        out
    }

    /// The output projection: `lm_head`, or the embedding when tied.
    pub fn output_matrix(&self) -> &Matrix {
        self.lm_head.as_ref().unwrap_or(&self.embed)
    }

    /// The first `layers` decoder layers with the same embedding, final norm
    /// and head: the early-exit self-draft (MODEL-7).
    pub fn truncated(&self, layers: usize) -> Result<Self> {
        if layers == 0 || layers > self.layers.len() {
            return Err(ModelError::InvalidInput { arg: "layers", reason: format!("{layers} is outside [1, {}]", self.layers.len()) });
        }
        let mut w = self.clone();
        w.layers.truncate(layers);
        w.config.num_hidden_layers = layers;
        Ok(w)
    }

    /// A NaN or infinite weight is a file defect, not something to compute with.
    fn check_finite(&self, file: &str) -> Result<()> {
        for (name, m) in self.named() {
            if let Some(i) = m.data.iter().position(|v| !v.is_finite()) {
                return Err(ModelError::invalid(file, &name, format!("non-finite value {} at flat index {i}", m.data[i])));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stacked_rows_put_the_parts_one_under_another() {
        let a = Matrix::new(vec![1, 2], vec![1.0, 2.0], "a").unwrap();
        let b = Matrix::new(vec![2, 2], vec![3.0, 4.0, 5.0, 6.0], "b").unwrap();
        let s = Matrix::stacked_rows(&[&a, &b]).unwrap();
        assert_eq!((s.shape.clone(), s.data.clone()), (vec![3, 2], vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0]));
        assert_eq!(s.row(2), b.row(1));
    }

    #[test]
    fn stacking_other_widths_or_nothing_is_a_typed_error() {
        let a = Matrix::new(vec![1, 2], vec![1.0, 2.0], "a").unwrap();
        let c = Matrix::new(vec![1, 3], vec![1.0, 2.0, 3.0], "c").unwrap();
        let err = Matrix::stacked_rows(&[&a, &c]).unwrap_err().to_string();
        assert!(err.contains("[1, 2]") && err.contains("[1, 3]"), "{err}");
        assert!(Matrix::stacked_rows(&[]).is_err());
    }

    /// Blocks whose values are their decoding: checked after every
    /// operation that carries blocks on.
    fn decodes_to_its_values(m: &Matrix) -> bool {
        let (format, blocks) = m.stored().expect("blocks");
        let mut values = Vec::new();
        format.decode_all(blocks, &mut values);
        values == m.data
    }

    #[test]
    fn blocks_move_and_stack_with_their_rows() {
        // Q4_1 blocks: d = 1, m = row index, nibbles counting up.
        let q4 = |rows: usize| -> Vec<u8> { (0..rows).flat_map(|r| [half_bits(1.0), half_bits(r as f32)].concat().into_iter().chain((0..16u8).map(|k| k | (15 - k) << 4))).collect() };
        let a = Matrix::from_blocks(4, 32, BlockFormat::Q4_1, q4(4)).unwrap();
        let b = Matrix::from_blocks(2, 32, BlockFormat::Q4_1, q4(2)).unwrap();
        assert!(decodes_to_its_values(&a) && a.data[32] == 1.0, "row 1 starts at m = 1");
        let moved = a.move_rows(|r| 3 - r);
        assert!(decodes_to_its_values(&moved) && moved.row(0) == a.row(3));
        let stacked = Matrix::stacked_rows(&[&a, &b]).unwrap();
        assert!(decodes_to_its_values(&stacked) && stacked.rows() == 6);
        // Parts of other formats, or without blocks, stack as values only.
        let q8 = Matrix::from_blocks(1, 32, BlockFormat::Q8_0, [half_bits(1.0).to_vec(), vec![1u8; 32]].concat()).unwrap();
        assert!(Matrix::stacked_rows(&[&a, &q8]).unwrap().stored().is_none());
        let plain = Matrix::new(vec![1, 32], vec![0.0; 32], "plain").unwrap();
        assert!(Matrix::stacked_rows(&[&plain, &a]).unwrap().stored().is_none());
        // Bytes that are not whole blocks of the shape are refused.
        assert!(Matrix::from_blocks(4, 32, BlockFormat::Q4_1, q4(3)).is_none());
        assert!(Matrix::from_blocks(1, 16, BlockFormat::Q4_1, q4(1)).is_none());
    }

    fn half_bits(v: f32) -> [u8; 2] {
        half::f16::from_f32(v).to_bits().to_le_bytes()
    }
}
