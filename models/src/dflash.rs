//! The DFlash block drafter (DRAFT-6 .. DRAFT-9): its checkpoint, and its
//! f64 forward next to the target's reference forward.
//!
//! Role: a DFlash drafter proposes a whole block of `B - 1` tokens in one
//! forward (seed 000, SGLang's DFlash v1). It owns no embedding and no output
//! head: the block's tokens are embedded by the target's embedding and its
//! final states are read out by the target's head, so a drafter only makes
//! sense with the target it was trained against, and everything it takes
//! from that target (hidden width, vocabulary, the target layers it reads) is
//! checked against the target's config at load (DRAFT-6). What the drafter
//! does own is the fc contract (DRAFT-7): `fc` maps the `K` target hidden
//! states of one position (MODEL-9, `K = target_layer_ids.len()`) to one
//! context feature, so `fc.weight` is `[hidden, K·hidden]` or the checkpoint
//! is refused.
//!
//! Invariants: as in the reference forward, weights stay f32 and are widened
//! exactly, activations are f64, every dot product and every attention uses
//! the reference's fixed summation order (`reference::dot`,
//! `reference::attend`). A context position's keys and values depend only on
//! its own features and position, so a context extended in pieces is
//! bit-identical to one extended at once (DRAFT-7). Block attention is
//! deliberately not causal (DRAFT-8): every block position sees the whole
//! context and every other block position, which is what lets one forward
//! fill all the mask positions. Drafting is deterministic: argmax with
//! lowest-id ties, and for the iterative variant confidence selection with
//! lower-position ties (DRAFT-4, DRAFT-9); no draft here carries a proposal
//! law `q`, so these drafts are verified greedily or as deterministic drafts
//! (DRAFT-5, erratum E12).

use std::collections::{BTreeSet, HashMap, HashSet};
use std::path::Path;

use rand::{RngExt, SeedableRng};
use rand_pcg::Pcg64;
use serde_json::{Map, Value};

pub use specdec_reference::dflash::Schedule;
use specdec_reference::dflash::{block_input, select_unmask, unmask_order};

use crate::config::LlamaConfig;
use crate::error::{ModelError, Result};
use crate::forward::rope;
use crate::forward::rope_angles;
use crate::hf::{CONFIG_FILE, SINGLE_FILE, SafetensorsFile, SaveDtype, write_safetensors};
use crate::reference::{add_in_place, attend, matmul, rms_norm, silu};
use crate::weights::{LayerWeights, LlamaWeights, Matrix};

/// The `architectures` entry of a DFlash draft checkpoint.
pub const DFLASH_ARCHITECTURE: &str = "DFlashDraftModel";

/// Largest accepted block size (DRAFT-6); DFlash checkpoints use 8 or 16.
pub const MAX_BLOCK_SIZE: usize = 64;

/// The draft checkpoint's `config.json` (DRAFT-6): the Llama fields of the
/// drafter's own decoder layers plus its `dflash_config` section.
#[derive(Debug, Clone, PartialEq)]
pub struct DflashConfig {
    /// The draft's decoder layers as a Llama config. `architectures` holds
    /// the Llama default in memory (the file names [`DFLASH_ARCHITECTURE`]);
    /// `vocab_size` and `hidden_size` must equal the target's; the head-related
    /// and `tie_word_embeddings` fields are unused (the head is the target's).
    pub layers: LlamaConfig,
    /// `B`: the verified token plus `B - 1` drafted positions.
    pub block_size: usize,
    /// Target layers whose hidden states feed `fc`, concatenated in this order.
    pub target_layer_ids: Vec<usize>,
    /// The id fed at masked block positions; a row of the target's embedding.
    pub mask_token_id: u32,
}

/// The mask token as the file gives it.
enum MaskToken {
    Id(u64),
    Name(String),
}

impl DflashConfig {
    /// Parses `config.json` text (DRAFT-6). The mask token must be an integer
    /// (`dflash_config.mask_token_id`, or `dflash_config.mask_token` given as
    /// an id); a token string must be resolved by the caller with the target
    /// tokenizer and passed to [`DflashConfig::from_json_with_mask_id`].
    /// Checks everything that does not need the target; [`DflashConfig::validate`]
    /// checks the rest.
    pub fn from_json(text: &str, file: &str) -> Result<Self> {
        let (layers, block_size, target_layer_ids, mask) = parse(text, file)?;
        let mask_token_id = match mask {
            Some(MaskToken::Id(id)) => mask_id(id, file, "dflash_config.mask_token_id")?,
            Some(MaskToken::Name(name)) => {
                return Err(ModelError::invalid(
                    file,
                    "dflash_config.mask_token",
                    format!("`{name}` is a token string: resolve it with the target's tokenizer and load with the resolved id (DflashConfig::from_json_with_mask_id)"),
                ));
            }
            None => return Err(ModelError::MissingField { file: file.to_string(), field: "dflash_config.mask_token_id".into() }),
        };
        let cfg = DflashConfig { layers, block_size, target_layer_ids, mask_token_id };
        cfg.check_own(file)?;
        Ok(cfg)
    }

    /// [`DflashConfig::from_json`] with the mask id resolved by the caller
    /// (from a string `mask_token`, or a fallback such as `<|MASK|>` when the
    /// file names none). An integer id in the file must agree with it.
    pub fn from_json_with_mask_id(text: &str, file: &str, mask_token_id: u32) -> Result<Self> {
        let (layers, block_size, target_layer_ids, mask) = parse(text, file)?;
        if let Some(MaskToken::Id(id)) = mask
            && id != u64::from(mask_token_id)
        {
            return Err(ModelError::invalid(file, "dflash_config.mask_token_id", format!("the file says {id}, the caller resolved {mask_token_id}")));
        }
        let cfg = DflashConfig { layers, block_size, target_layer_ids, mask_token_id };
        cfg.check_own(file)?;
        Ok(cfg)
    }

    /// `K`: how many target layers feed one context feature.
    pub fn num_target_layers(&self) -> usize {
        self.target_layer_ids.len()
    }

    /// `K·hidden`: the width of one context row (DRAFT-7).
    pub fn feature_width(&self) -> usize {
        self.target_layer_ids.len() * self.layers.hidden_size
    }

    /// Checks the config against the TARGET's (DRAFT-6): block size, target
    /// layer ids, hidden width, vocabulary and mask id. `file` names the
    /// draft's config in errors.
    pub fn validate(&self, target: &LlamaConfig, file: &str) -> Result<()> {
        self.check_own(file)?;
        let bad = |field: &str, reason: String| Err(ModelError::invalid(file, field, reason));
        if let Some(&l) = self.target_layer_ids.iter().find(|&&l| l >= target.num_hidden_layers) {
            return bad("dflash_config.target_layer_ids", format!("layer {l} is outside the target's {} layers", target.num_hidden_layers));
        }
        if self.layers.hidden_size != target.hidden_size {
            return bad("hidden_size", format!("{} differs from the target's hidden_size {}", self.layers.hidden_size, target.hidden_size));
        }
        if self.layers.vocab_size != target.vocab_size {
            return bad("vocab_size", format!("{} differs from the target's vocab_size {}", self.layers.vocab_size, target.vocab_size));
        }
        if self.mask_token_id as usize >= target.vocab_size {
            return bad("dflash_config.mask_token_id", format!("{} is outside the target vocabulary of {} (the drafter embeds it with the target's embedding)", self.mask_token_id, target.vocab_size));
        }
        Ok(())
    }

    /// The checks that need no target.
    fn check_own(&self, file: &str) -> Result<()> {
        self.layers.validate(file)?;
        let bad = |field: &str, reason: String| Err(ModelError::invalid(file, field, reason));
        if !(2..=MAX_BLOCK_SIZE).contains(&self.block_size) {
            return bad("dflash_config.block_size", format!("{} is outside [2, {MAX_BLOCK_SIZE}] (the verified token and at least one draft)", self.block_size));
        }
        if self.target_layer_ids.is_empty() {
            return bad("dflash_config.target_layer_ids", "is empty: fc needs at least one target layer".into());
        }
        let mut seen = HashSet::new();
        if let Some(l) = self.target_layer_ids.iter().find(|l| !seen.insert(**l)) {
            return bad("dflash_config.target_layer_ids", format!("layer {l} is listed twice"));
        }
        if self.mask_token_id as usize >= self.layers.vocab_size {
            return bad("dflash_config.mask_token_id", format!("{} is outside the vocabulary of {}", self.mask_token_id, self.layers.vocab_size));
        }
        Ok(())
    }

    /// `config.json` text: the Llama fields, `architectures` naming
    /// [`DFLASH_ARCHITECTURE`], and `dflash_config` with an integer mask id.
    pub fn to_json(&self) -> Result<String> {
        let err = |e: serde_json::Error| ModelError::InvalidInput { arg: "config", reason: e.to_string() };
        let mut map = match serde_json::to_value(&self.layers).map_err(err)? {
            Value::Object(m) => m,
            _ => unreachable!("a struct serialises to an object"),
        };
        map.insert("architectures".into(), serde_json::json!([DFLASH_ARCHITECTURE]));
        map.insert("dflash_config".into(), serde_json::json!({"block_size": self.block_size, "target_layer_ids": self.target_layer_ids, "mask_token_id": self.mask_token_id}));
        serde_json::to_string_pretty(&Value::Object(map)).map_err(err)
    }

    /// Every tensor of the checkpoint with its shape, in [`DflashWeights::named`] order.
    pub fn tensor_shapes(&self) -> Vec<(String, Vec<usize>)> {
        let h = self.layers.hidden_size;
        let mut out = vec![("fc.weight".to_string(), vec![h, self.feature_width()]), ("hidden_norm.weight".to_string(), vec![h])];
        // The draft layers are Llama layers named without the `model.` prefix.
        out.extend(self.layers.tensor_shapes().into_iter().filter_map(|(n, s)| n.strip_prefix("model.").filter(|n| n.starts_with("layers.")).map(|n| (n.to_string(), s))));
        out.push(("norm.weight".to_string(), vec![h]));
        out
    }
}

fn mask_id(id: u64, file: &str, field: &str) -> Result<u32> {
    u32::try_from(id).map_err(|_| ModelError::invalid(file, field, format!("{id} is not a token id")))
}

type Parsed = (LlamaConfig, usize, Vec<usize>, Option<MaskToken>);

/// Splits `config.json` into the Llama fields (parsed and validated by
/// [`LlamaConfig`], so a typo or an unsupported feature is refused the same
/// way) and the `dflash_config` section.
fn parse(text: &str, file: &str) -> Result<Parsed> {
    let mut map: Map<String, Value> = serde_json::from_str(text).map_err(|e| ModelError::invalid(file, "config.json", e.to_string()))?;
    let section = map.remove("dflash_config").ok_or_else(|| ModelError::MissingField { file: file.to_string(), field: "dflash_config".into() })?;
    let Value::Object(section) = section else {
        return Err(ModelError::invalid(file, "dflash_config", "is not an object"));
    };
    if let Some(arch) = map.remove("architectures")
        && !arch.as_array().is_some_and(|a| a.iter().any(|v| v.as_str() == Some(DFLASH_ARCHITECTURE)))
    {
        return Err(ModelError::invalid(file, "architectures", format!("{arch} does not name {DFLASH_ARCHITECTURE}")));
    }
    let layers: LlamaConfig = serde_json::from_value(Value::Object(map)).map_err(|e| ModelError::invalid(file, "config.json", e.to_string()))?;
    layers.validate(file)?;

    let uint = |field: &str, v: &Value| v.as_u64().ok_or_else(|| ModelError::invalid(file, &format!("dflash_config.{field}"), format!("{v} is not a non-negative integer")));
    let mut block_size = None;
    let mut ids = None;
    let mut mask = None;
    for (key, v) in &section {
        match key.as_str() {
            "block_size" => block_size = Some(uint(key, v)?),
            "target_layer_ids" => {
                let arr = v.as_array().ok_or_else(|| ModelError::invalid(file, "dflash_config.target_layer_ids", format!("{v} is not an array")))?;
                ids = Some(arr.iter().map(|x| uint(key, x)).collect::<Result<Vec<u64>>>()?);
            }
            "mask_token_id" | "mask_token" => {
                let m = match v {
                    Value::String(s) if key == "mask_token" => MaskToken::Name(s.clone()),
                    _ => MaskToken::Id(uint(key, v)?),
                };
                mask = match (mask, m) {
                    (Some(MaskToken::Id(a)), MaskToken::Id(b)) if a != b => {
                        return Err(ModelError::invalid(file, "dflash_config.mask_token", format!("mask_token and mask_token_id disagree ({a} vs {b})")));
                    }
                    // An integer id wins over a name for the same token.
                    (Some(MaskToken::Id(a)), _) | (_, MaskToken::Id(a)) => Some(MaskToken::Id(a)),
                    (_, name) => Some(name),
                };
            }
            other => return Err(ModelError::invalid(file, &format!("dflash_config.{other}"), "unknown field")),
        }
    }
    let field = |name: &str| ModelError::MissingField { file: file.to_string(), field: format!("dflash_config.{name}") };
    let block_size = block_size.ok_or_else(|| field("block_size"))?;
    let ids = ids.ok_or_else(|| field("target_layer_ids"))?;
    // Bounded before conversion so a huge number cannot wrap on any target.
    let size = |v: u64, f: &str| usize::try_from(v).ok().filter(|&v| v <= crate::config::MAX_DIM).ok_or_else(|| ModelError::invalid(file, f, format!("{v} is beyond {}", crate::config::MAX_DIM)));
    let block_size = size(block_size, "dflash_config.block_size")?;
    let ids = ids.into_iter().map(|v| size(v, "dflash_config.target_layer_ids")).collect::<Result<Vec<usize>>>()?;
    Ok((layers, block_size, ids, mask))
}

/// The drafter's tensors (DRAFT-6): no embedding and no head.
#[derive(Debug, Clone, PartialEq)]
pub struct DflashWeights {
    /// `[hidden, K·hidden]`: the fc contract (DRAFT-7).
    pub fc: Matrix,
    /// `[hidden]`: RMSNorm gain of the context features.
    pub hidden_norm: Matrix,
    /// The draft's decoder layers (shapes from `DflashConfig::layers`).
    pub layers: Vec<LayerWeights>,
    /// `[hidden]`: the final norm before the target's head.
    pub norm: Matrix,
}

impl DflashWeights {
    /// Every tensor with its checkpoint name, in a fixed order.
    pub fn named(&self) -> Vec<(String, &Matrix)> {
        let mut out = vec![("fc.weight".to_string(), &self.fc), ("hidden_norm.weight".to_string(), &self.hidden_norm)];
        for (l, w) in self.layers.iter().enumerate() {
            out.extend(w.named(&format!("layers.{l}")));
        }
        out.push(("norm.weight".to_string(), &self.norm));
        out
    }

    /// Takes every tensor by name; an absent one is `MissingTensor`. Shapes
    /// are checked afterwards, by [`DflashDraft::new`].
    fn from_named(config: &DflashConfig, file: &str, mut take: impl FnMut(&str) -> Result<Option<Matrix>>) -> Result<Self> {
        let mut get = |name: String| -> Result<Matrix> { take(&name)?.ok_or_else(|| ModelError::MissingTensor { file: file.to_string(), tensor: name }) };
        let fc = get("fc.weight".into())?;
        let hidden_norm = get("hidden_norm.weight".into())?;
        let mut layers = Vec::with_capacity(config.layers.num_hidden_layers);
        for l in 0..config.layers.num_hidden_layers {
            layers.push(LayerWeights::from_hf(&format!("layers.{l}"), &mut get)?);
        }
        let norm = get("norm.weight".into())?;
        Ok(DflashWeights { fc, hidden_norm, layers, norm })
    }
}

/// A validated drafter: its config checked against the target's, every
/// tensor's shape against the config, every value finite.
#[derive(Debug, Clone, PartialEq)]
pub struct DflashDraft {
    config: DflashConfig,
    weights: DflashWeights,
}

/// Per-sequence context of a drafter (DRAFT-7): for each draft layer, the
/// keys (RoPE at their position) and values of every context position,
/// `[len, kv_heads, head_dim]` row-major.
#[derive(Debug, Clone, PartialEq)]
pub struct DflashContext {
    len: usize,
    kv_width: usize,
    keys: Vec<Vec<f64>>,
    values: Vec<Vec<f64>>,
}

impl DflashContext {
    /// Context positions held (`n`: the next block starts at position `n`).
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Keys of draft layer `layer`: `[len, kv_heads, head_dim]`.
    pub fn keys(&self, layer: usize) -> &[f64] {
        &self.keys[layer]
    }

    pub fn values(&self, layer: usize) -> &[f64] {
        &self.values[layer]
    }

    /// Keeps the first `n` positions (after a rejection, say); strict like
    /// KV-4: `n` beyond the length is an error, never a silent no-op.
    pub fn truncate(&mut self, n: usize) -> Result<()> {
        if n > self.len {
            return Err(ModelError::InvalidInput { arg: "n", reason: format!("cannot keep {n} positions of a context holding {}", self.len) });
        }
        for (k, v) in self.keys.iter_mut().zip(&mut self.values) {
            k.truncate(n * self.kv_width);
            v.truncate(n * self.kv_width);
        }
        self.len = n;
        Ok(())
    }
}

/// An iterative draft (DRAFT-9): the tokens, and which block positions were
/// fixed at each step.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IterativeDraft {
    /// The `B - 1` drafted tokens (block positions `1 .. B`).
    pub tokens: Vec<u32>,
    /// `unmasked[s]`: block positions (in `1 .. B`) fixed at step `s`, in
    /// selection order; `unmasked[s].len()` is `unmask_order(B - 1, T, schedule)[s]`.
    pub unmasked: Vec<Vec<usize>>,
}

fn input_err(arg: &'static str) -> impl Fn(specdec_reference::SpecError) -> ModelError {
    move |e| ModelError::InvalidInput { arg, reason: e.to_string() }
}

impl DflashDraft {
    /// Checks `config` against the target's (DRAFT-6), the fc contract
    /// (DRAFT-7), every other tensor's shape, and that every value is finite.
    pub fn new(config: DflashConfig, weights: DflashWeights, target: &LlamaConfig) -> Result<Self> {
        Self::checked(config, weights, target, "dflash")
    }

    fn checked(config: DflashConfig, weights: DflashWeights, target: &LlamaConfig, file: &str) -> Result<Self> {
        config.validate(target, file)?;
        if weights.layers.len() != config.layers.num_hidden_layers {
            return Err(ModelError::invalid(file, "num_hidden_layers", format!("{} layers of weights for {} in the config", weights.layers.len(), config.layers.num_hidden_layers)));
        }
        let (h, k) = (config.layers.hidden_size, config.num_target_layers());
        if weights.fc.shape != [h, k * h] {
            return Err(ModelError::invalid(
                file,
                "fc.weight",
                format!(
                    "fc contract violated: shape {:?}, expected [hidden, K·hidden] = [{h}, {}] with K = {k} target layers {:?} (fc.in_features must equal K·hidden)",
                    weights.fc.shape,
                    k * h,
                    config.target_layer_ids
                ),
            ));
        }
        let shapes: HashMap<String, Vec<usize>> = config.tensor_shapes().into_iter().collect();
        for (name, m) in weights.named() {
            let expected = &shapes[&name];
            if &m.shape != expected {
                return Err(ModelError::TensorShape { file: file.to_string(), tensor: name, expected: expected.clone(), actual: m.shape.clone() });
            }
            if m.shape.iter().product::<usize>() != m.data.len() {
                return Err(ModelError::invalid(file, &name, format!("{} values cannot fill shape {:?}", m.data.len(), m.shape)));
            }
            if let Some(i) = m.data.iter().position(|v| !v.is_finite()) {
                return Err(ModelError::invalid(file, &name, format!("non-finite value {} at flat index {i}", m.data[i])));
            }
        }
        Ok(DflashDraft { config, weights })
    }

    pub fn config(&self) -> &DflashConfig {
        &self.config
    }

    pub fn weights(&self) -> &DflashWeights {
        &self.weights
    }

    /// An empty context for one sequence.
    pub fn new_context(&self) -> DflashContext {
        let c = &self.config.layers;
        let layers = c.num_hidden_layers;
        DflashContext { len: 0, kv_width: c.num_key_value_heads * c.head_dim(), keys: vec![Vec::new(); layers], values: vec![Vec::new(); layers] }
    }

    /// Appends context positions `len ..` (DRAFT-7). `rows` holds one
    /// `K·hidden` row per position: the target's hidden states at
    /// `target_layer_ids`, in that order (exactly a target forward's `hidden`
    /// output with `hidden_layers = target_layer_ids`). Each row becomes
    /// `c = RMSNorm_hidden_norm(fc · row)`, and each draft layer stores
    /// `RoPE(k_proj c)` at the row's position and `v_proj c`. No input norm is
    /// applied to `c`: the context enters every layer's attention as is.
    pub fn extend(&self, ctx: &mut DflashContext, rows: &[f64]) -> Result<()> {
        self.check_context(ctx)?;
        let c = &self.config.layers;
        let width = self.config.feature_width();
        let count = self.check_rows(ctx.len, rows)?;
        let feats: Vec<Vec<f64>> = rows.chunks(width).map(<[f64]>::to_vec).collect();
        let features: Vec<Vec<f64>> = matmul(&self.weights.fc, &feats).iter().map(|r| rms_norm(r, &self.weights.hidden_norm, c.rms_norm_eps)).collect();
        let hd = c.head_dim();
        let angles: Vec<(Vec<f64>, Vec<f64>)> = (0..count).map(|i| rope_angles(ctx.len + i, hd, c.rope_theta)).collect();
        for (li, layer) in self.weights.layers.iter().enumerate() {
            let mut k = matmul(&layer.wk, &features);
            let v = matmul(&layer.wv, &features);
            for (i, (cos, sin)) in angles.iter().enumerate() {
                rope(&mut k[i], hd, cos, sin);
                ctx.keys[li].extend_from_slice(&k[i]);
                ctx.values[li].extend_from_slice(&v[i]);
            }
        }
        ctx.len += count;
        Ok(())
    }

    /// Checks context rows to append after `len` positions (DRAFT-7); returns how many.
    pub(crate) fn check_rows(&self, len: usize, rows: &[f64]) -> Result<usize> {
        let c = &self.config.layers;
        let width = self.config.feature_width();
        let bad = |reason: String| Err(ModelError::InvalidInput { arg: "rows", reason });
        if rows.is_empty() || !rows.len().is_multiple_of(width) {
            return bad(format!("{} values are not a positive number of K·hidden = {width} rows", rows.len()));
        }
        if let Some(i) = rows.iter().position(|v| !v.is_finite()) {
            return bad(format!("non-finite value {} at row {}, column {}", rows[i], i / width, i % width));
        }
        let count = rows.len() / width;
        if len + count > c.max_position_embeddings {
            return bad(format!("{count} positions after {len} exceed the draft's max_position_embeddings {}", c.max_position_embeddings));
        }
        Ok(count)
    }

    /// Checks a block forward's arguments (DRAFT-6, DRAFT-8): the target,
    /// `B` in-vocabulary tokens, a non-empty context of `n` positions, and
    /// room for the block.
    pub(crate) fn check_block(&self, target: &LlamaWeights, n: usize, block_tokens: &[u32]) -> Result<()> {
        self.check_target(target)?;
        let c = &self.config.layers;
        let b = self.config.block_size;
        let bad = |arg: &'static str, reason: String| Err(ModelError::InvalidInput { arg, reason });
        if block_tokens.len() != b {
            return bad("block_tokens", format!("{} tokens, the block size is {b}", block_tokens.len()));
        }
        if let Some((i, t)) = block_tokens.iter().enumerate().find(|(_, t)| **t as usize >= c.vocab_size) {
            return bad("block_tokens", format!("token {i} is id {t}, outside the vocabulary of {}", c.vocab_size));
        }
        if n == 0 {
            return bad("ctx", "the context is empty: a block is drafted after at least one verified position".into());
        }
        let max_pos = c.max_position_embeddings.min(target.config.max_position_embeddings);
        if n + b > max_pos {
            return bad("ctx", format!("a block at positions {n}..{} exceeds max_position_embeddings {max_pos}", n + b));
        }
        Ok(())
    }

    /// A context made by another drafter's geometry is refused.
    fn check_context(&self, ctx: &DflashContext) -> Result<()> {
        let fresh = self.new_context();
        if ctx.keys.len() != fresh.keys.len() || ctx.kv_width != fresh.kv_width {
            return Err(ModelError::InvalidInput { arg: "ctx", reason: "the context belongs to a drafter of another shape".into() });
        }
        Ok(())
    }

    /// The target must be the one the drafter was validated against (DRAFT-6).
    fn check_target(&self, target: &LlamaWeights) -> Result<()> {
        self.config.validate(&target.config, "target").map_err(|e| ModelError::InvalidInput { arg: "target", reason: e.to_string() })
    }

    /// The block forward (DRAFT-8): logits `[B, V]` row-major of
    /// `block_tokens` (`B` ids, `[v, m, .., m]` or partly unmasked) at
    /// positions `n .. n+B` after a context of `n >= 1` positions. Tokens are
    /// embedded with the target's embedding; each draft layer attends from
    /// every block query to all `n + B` keys (context, then the block's own),
    /// with no causal mask inside the block; the final norm is followed by
    /// the target's head (its `lm_head`, or its embedding when tied). Row `i
    /// >= 1` is the draft for block position `i`; row 0 is unused.
    pub fn block_logits(&self, target: &LlamaWeights, ctx: &DflashContext, block_tokens: &[u32]) -> Result<Vec<f64>> {
        self.check_context(ctx)?;
        self.check_block(target, ctx.len, block_tokens)?;
        let c = &self.config.layers;
        let b = self.config.block_size;
        let n = ctx.len;
        let (hd, nh, nkv, eps) = (c.head_dim(), c.num_attention_heads, c.num_key_value_heads, c.rms_norm_eps);
        let group = nh / nkv;
        let scale = 1.0 / (hd as f64).sqrt();
        let mut x: Vec<Vec<f64>> = block_tokens.iter().map(|&t| target.embed.row(t as usize).iter().map(|&w| f64::from(w)).collect()).collect();
        // Absolute positions: the block continues the context.
        let angles: Vec<(Vec<f64>, Vec<f64>)> = (0..b).map(|i| rope_angles(n + i, hd, c.rope_theta)).collect();
        for (li, layer) in self.weights.layers.iter().enumerate() {
            let normed: Vec<Vec<f64>> = x.iter().map(|row| rms_norm(row, &layer.attn_norm, eps)).collect();
            let mut q = matmul(&layer.wq, &normed);
            let mut k = matmul(&layer.wk, &normed);
            let v = matmul(&layer.wv, &normed);
            for (i, (cos, sin)) in angles.iter().enumerate() {
                rope(&mut q[i], hd, cos, sin);
                rope(&mut k[i], hd, cos, sin);
            }
            // Positions 0 .. n+B in order: the context, then the block.
            let mut keys = ctx.keys[li].clone();
            let mut values = ctx.values[li].clone();
            for i in 0..b {
                keys.extend_from_slice(&k[i]);
                values.extend_from_slice(&v[i]);
            }
            let attended: Vec<Vec<f64>> = q
                .iter()
                .map(|qi| {
                    let mut out = vec![0.0; nh * hd];
                    for head in 0..nh {
                        // Not causal: every block query reads all n + B positions.
                        attend(&qi[head * hd..(head + 1) * hd], &keys, &values, n + b, nkv, head / group, scale, &mut out[head * hd..(head + 1) * hd]);
                    }
                    out
                })
                .collect();
            let o = matmul(&layer.wo, &attended);
            add_in_place(&mut x, &o);
            let normed: Vec<Vec<f64>> = x.iter().map(|row| rms_norm(row, &layer.mlp_norm, eps)).collect();
            let gate = matmul(&layer.w_gate, &normed);
            let up = matmul(&layer.w_up, &normed);
            let act: Vec<Vec<f64>> = gate.iter().zip(&up).map(|(g, u)| g.iter().zip(u).map(|(g, u)| silu(*g) * u).collect()).collect();
            let down = matmul(&layer.w_down, &act);
            add_in_place(&mut x, &down);
        }
        let normed: Vec<Vec<f64>> = x.iter().map(|row| rms_norm(row, &self.weights.norm, eps)).collect();
        Ok(matmul(target.output_matrix(), &normed).into_iter().flatten().collect())
    }

    /// The block input `[verified, mask x (B - 1)]` (DRAFT-1); the mask is a
    /// row of the target's embedding, so `embed_rows = V`.
    pub fn block_input(&self, verified: u32) -> Result<Vec<u32>> {
        let v = self.config.layers.vocab_size;
        let t = block_input(&[i64::from(verified)], self.config.block_size, i64::from(self.config.mask_token_id), v, v).map_err(input_err("verified"))?;
        // Every id was checked to lie in [0, V), so it fits u32.
        Ok(t.data().iter().map(|&x| x as u32).collect())
    }

    /// Single-step parallel drafting (DRAFT-8; seed 000, SGLang v1): the
    /// `B - 1` drafts are the argmax (lowest-id ties) of rows `1 .. B` of
    /// one block forward on `[verified, mask, .., mask]`.
    pub fn draft_parallel(&self, target: &LlamaWeights, ctx: &DflashContext, verified: u32) -> Result<Vec<u32>> {
        let block = self.block_input(verified)?;
        let logits = self.block_logits(target, ctx, &block)?;
        let v = self.config.layers.vocab_size;
        Ok((1..self.config.block_size).map(|i| specdec_reference::greedy::lowest_argmax(&logits[i * v..(i + 1) * v]) as u32).collect())
    }

    /// Iterative unmasking (DRAFT-9; seed 002's loop made deterministic):
    /// all `B - 1` positions start masked; step `s` runs a block forward on
    /// the current block, scores each still-masked position by its largest
    /// softmax probability, and fixes the `unmask_order(B - 1, steps,
    /// schedule)[s]` most confident ones (DRAFT-4, ties to the lower position)
    /// to their argmax. After `steps` steps (`1 <= steps <= B - 1`) every
    /// position is fixed. A step that unmasks nothing runs no forward (it
    /// would change nothing). The drafts have no proposal law `q`: verify them
    /// greedily or as deterministic drafts (DRAFT-5, E12).
    pub fn draft_iterative(&self, target: &LlamaWeights, ctx: &DflashContext, verified: u32, steps: usize, schedule: Schedule) -> Result<IterativeDraft> {
        let b = self.config.block_size;
        if steps == 0 || steps > b - 1 {
            return Err(ModelError::InvalidInput { arg: "steps", reason: format!("{steps} is outside [1, block_size - 1 = {}]", b - 1) });
        }
        let counts = unmask_order(b - 1, steps, schedule).map_err(input_err("steps"))?;
        let mut block = self.block_input(verified)?;
        let v = self.config.layers.vocab_size;
        let mut masked = vec![true; b - 1];
        let mut unmasked = Vec::with_capacity(steps);
        for &count in &counts {
            if count == 0 {
                unmasked.push(Vec::new());
                continue;
            }
            let logits = self.block_logits(target, ctx, &block)?;
            let rows: Vec<&[f64]> = (1..b).map(|i| &logits[i * v..(i + 1) * v]).collect();
            // Max softmax probability = 1 / sum(exp(l - max)), summed in id order.
            let confidence: Vec<f64> = rows
                .iter()
                .map(|r| {
                    let max = r.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                    1.0 / r.iter().map(|l| (l - max).exp()).sum::<f64>()
                })
                .collect();
            let chosen = select_unmask(&confidence, &masked, count).map_err(input_err("confidence"))?;
            for &p in &chosen {
                block[p + 1] = specdec_reference::greedy::lowest_argmax(rows[p]) as u32;
                masked[p] = false;
            }
            unmasked.push(chosen.iter().map(|p| p + 1).collect());
        }
        debug_assert!(masked.iter().all(|m| !m), "unmask_order sums to B - 1");
        Ok(IterativeDraft { tokens: block[1..].to_vec(), unmasked })
    }
}

/// Loads a draft checkpoint (`config.json` + `model.safetensors`) and
/// validates it against the target's config (DRAFT-6, DRAFT-7, MODEL-16).
/// The mask token must be an integer in the file; see
/// [`load_dflash_with_mask_id`] for a string one.
pub fn load_dflash(dir: impl AsRef<Path>, target: &LlamaConfig) -> Result<DflashDraft> {
    load_inner(dir.as_ref(), target, None)
}

/// [`load_dflash`] with the mask id resolved by the caller.
pub fn load_dflash_with_mask_id(dir: impl AsRef<Path>, target: &LlamaConfig, mask_token_id: u32) -> Result<DflashDraft> {
    load_inner(dir.as_ref(), target, Some(mask_token_id))
}

fn load_inner(dir: &Path, target: &LlamaConfig, mask: Option<u32>) -> Result<DflashDraft> {
    let config_path = dir.join(CONFIG_FILE);
    let file = config_path.display().to_string();
    let text = std::fs::read_to_string(&config_path).map_err(|e| ModelError::io(&config_path, e))?;
    let config = match mask {
        None => DflashConfig::from_json(&text, &file)?,
        Some(id) => DflashConfig::from_json_with_mask_id(&text, &file, id)?,
    };
    config.validate(target, &file)?;
    // The reader checks the header length against the file size and every
    // tensor's offsets against the data section before anything is read.
    let st = SafetensorsFile::open(&dir.join(SINGLE_FILE))?;
    let expected: BTreeSet<String> = config.tensor_shapes().into_iter().map(|(n, _)| n).collect();
    if let Some(extra) = st.tensors().into_keys().find(|n| !expected.contains(n)) {
        return Err(ModelError::invalid(st.file(), &extra, "tensor is not part of a DFlash drafter (it has no embedding and no lm_head: it uses the target's)"));
    }
    let weights = DflashWeights::from_named(&config, st.file(), |name| st.tensor_f32(name))?;
    DflashDraft::checked(config, weights, target, st.file())
}

/// Writes `draft` into `dir` as `config.json` + `model.safetensors`, tensors
/// in `dtype` (DRAFT-6); an F32 export loads back bit-identical.
pub fn export_dflash(draft: &DflashDraft, dir: impl AsRef<Path>, dtype: SaveDtype) -> Result<()> {
    let dir = dir.as_ref();
    std::fs::create_dir_all(dir).map_err(|e| ModelError::io(dir, e))?;
    let mut config = draft.config.clone();
    config.layers.torch_dtype = Some(dtype.torch_name().to_string());
    let config_path = dir.join(CONFIG_FILE);
    std::fs::write(&config_path, config.to_json()? + "\n").map_err(|e| ModelError::io(&config_path, e))?;
    write_safetensors(dir.join(SINGLE_FILE), &draft.weights.named(), dtype)
}

/// The shape of a seeded test drafter; hidden, vocabulary, norms' epsilon,
/// RoPE base and max positions come from the target.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DflashSpec {
    pub layers: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub intermediate: usize,
    pub block_size: usize,
    pub target_layer_ids: Vec<usize>,
    pub mask_token_id: u32,
}

impl DflashSpec {
    /// A one-layer drafter for `target` (its heads, an MLP twice its hidden
    /// width) reading every target layer as context, in order: the seeded
    /// drafters of the tests and the suite.
    pub fn one_layer(target: &LlamaConfig, block_size: usize, mask_token_id: u32) -> DflashSpec {
        DflashSpec {
            layers: 1,
            heads: target.num_attention_heads,
            kv_heads: target.num_key_value_heads,
            intermediate: 2 * target.hidden_size,
            block_size,
            target_layer_ids: (0..target.num_hidden_layers).collect(),
            mask_token_id,
        }
    }

    /// The drafter's config for `target`: its layers are Llama layers with
    /// the target's hidden width, vocabulary, norm epsilon, RoPE base and
    /// positions; validated against the target (DRAFT-6).
    pub fn config(&self, target: &LlamaConfig) -> Result<DflashConfig> {
        let mut layers = target.clone();
        layers.architectures = vec!["LlamaForCausalLM".into()];
        layers.num_hidden_layers = self.layers;
        layers.num_attention_heads = self.heads;
        layers.num_key_value_heads = self.kv_heads;
        layers.intermediate_size = self.intermediate;
        layers.head_dim = None;
        layers.tie_word_embeddings = false;
        layers.torch_dtype = Some("float32".into());
        let config = DflashConfig { layers, block_size: self.block_size, target_layer_ids: self.target_layer_ids.clone(), mask_token_id: self.mask_token_id };
        config.validate(target, "draft spec")?;
        Ok(config)
    }
}

/// A drafter with deterministic PCG64 weights (the scales of `tiny.rs`:
/// linear weights uniform in `±1/sqrt(in)`, norm gains `1 ± 0.25`), validated
/// against `target` like a loaded one.
pub fn seeded_dflash(target: &LlamaConfig, spec: DflashSpec, seed: u64) -> Result<DflashDraft> {
    let config = spec.config(target)?;
    let mut rng = Pcg64::seed_from_u64(seed);
    let mut tensors = HashMap::new();
    for (name, shape) in config.tensor_shapes() {
        let n: usize = shape.iter().product();
        let data: Vec<f32> = if name.ends_with("norm.weight") {
            (0..n).map(|_| 1.0 + 0.25 * (2.0 * rng.random::<f32>() - 1.0)).collect()
        } else {
            let scale = 1.0 / (shape[1] as f32).sqrt();
            (0..n).map(|_| scale * (2.0 * rng.random::<f32>() - 1.0)).collect()
        };
        tensors.insert(name.clone(), Matrix::new(shape, data, &name)?);
    }
    let weights = DflashWeights::from_named(&config, "seeded", |name| Ok(tensors.remove(name)))?;
    DflashDraft::checked(config, weights, target, "seeded")
}
