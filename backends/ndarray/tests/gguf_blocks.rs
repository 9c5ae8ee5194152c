//! The f32 forward on a GGUF's own blocks: a model read from Q4_1 and Q8_0
//! blocks is multiplied as stored, and computes what the same values as an
//! f32 matrix compute, bit for bit (prefill, window and decode), from far
//! fewer bytes; a matrix whose values no longer decode from its blocks is
//! refused rather than multiplied as the file stored it.

use specdec_backend::Backend;
use specdec_backend::model::{ForwardRequest, LlamaWeights, ModelBackend};
use specdec_models::tiny::TinySpec;
use specdec_models::weights::Matrix;
use specdec_ndarray::NdarrayBackend;
use specdec_rowmat::{BLOCK, BlockFormat};

/// A small deterministic generator (xorshift).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn unit(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
    }
}

/// Blocks of `format` for `[rows, cols]`: scales about 0.02, minimums
/// about -0.1, random quants.
fn blocks(format: BlockFormat, rows: usize, cols: usize, rng: &mut Rng) -> Vec<u8> {
    let mut out = Vec::new();
    for _ in 0..rows * cols / BLOCK {
        out.extend(half::f16::from_f32(0.02 * (1.0 + 0.5 * rng.unit())).to_bits().to_le_bytes());
        if format == BlockFormat::Q4_1 {
            out.extend(half::f16::from_f32(-0.1 * (1.0 + 0.5 * rng.unit())).to_bits().to_le_bytes());
        }
        let quants = format.block_bytes() - if format == BlockFormat::Q4_1 { 4 } else { 2 };
        out.extend((0..quants).map(|_| rng.next() as u8));
    }
    out
}

/// A 2-layer model whose widths are multiples of 32: its projections read
/// from Q4_1 blocks, its output head from Q8_0 (as SmolLM2's GGUF stores
/// them), its norms f32; and the same values with no blocks.
fn weights() -> (LlamaWeights, LlamaWeights) {
    let mut cfg = TinySpec::PRESETS[0].1.config();
    (cfg.hidden_size, cfg.intermediate_size, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim) = (64, 96, 2, 1, Some(32));
    (cfg.num_hidden_layers, cfg.vocab_size, cfg.tie_word_embeddings) = (2, 48, false);
    let mut rng = Rng(0x5EED);
    let mut stored = std::collections::HashMap::new();
    for (name, shape) in cfg.tensor_shapes() {
        let m = match shape.as_slice() {
            [rows, cols] => {
                let format = if name.contains("embed") || name.contains("lm_head") { BlockFormat::Q8_0 } else { BlockFormat::Q4_1 };
                Matrix::from_blocks(*rows, *cols, format, blocks(format, *rows, *cols, &mut rng)).expect("whole blocks")
            }
            _ => Matrix::new(shape.clone(), (0..shape.iter().product()).map(|_| 1.0 + 0.1 * rng.unit()).collect(), &name).unwrap(),
        };
        stored.insert(name, m);
    }
    let plain = |m: &Matrix| Matrix::new(m.shape.clone(), m.data.clone(), "plain").unwrap();
    let as_plain: std::collections::HashMap<_, _> = stored.iter().map(|(n, m)| (n.clone(), plain(m))).collect();
    let with_blocks = LlamaWeights::from_named(cfg.clone(), "blocks", |n| Ok(stored.get(n).cloned())).expect("weights fit");
    let without = LlamaWeights::from_named(cfg, "plain", |n| Ok(as_plain.get(n).cloned())).expect("weights fit");
    assert!(with_blocks.layers[0].wq.stored().is_some() && without.layers[0].wq.stored().is_none());
    (with_blocks, without)
}

/// Logits of a 7-token prefill, a 4-token window and a one-token decode, as bits.
fn logits(b: &NdarrayBackend, w: &LlamaWeights) -> Vec<u64> {
    let model = b.load_model(w).expect("loads");
    let mut cache = b.new_model_cache(&model, 1, 16).expect("cache");
    let mut out = Vec::new();
    for step in [vec![1u32, 5, 9, 13, 2, 40, 7], vec![3, 3, 47, 0], vec![11]] {
        let y = b.forward(&model, &mut cache, &ForwardRequest::all_logits(&[step])).expect("forward");
        out.extend(b.download_f64(&y.logits.expect("logits")).expect("host").data().iter().map(|v| v.to_bits()));
    }
    out
}

#[test]
fn blocks_are_multiplied_as_stored_and_compute_the_f32_values_bits() {
    let (with_blocks, without) = weights();
    let b = NdarrayBackend::new();
    let (stored, plain) = (b.load_model(&with_blocks).unwrap(), b.load_model(&without).unwrap());
    // Q4_1 is 20 bytes per 32 weights against f32's 128.
    assert!(stored.projection_bytes() * 5 < plain.projection_bytes(), "{} against {} bytes", stored.projection_bytes(), plain.projection_bytes());
    assert_eq!(logits(&b, &with_blocks), logits(&b, &without));
}

/// Negative control: values changed after the read no longer decode from
/// the blocks, and the load says so rather than multiply the file's blocks.
#[test]
fn values_that_left_their_blocks_are_refused() {
    let (mut with_blocks, _) = weights();
    with_blocks.layers[1].w_down.data[5] += 1.0;
    let err = NdarrayBackend::new().load_model(&with_blocks).unwrap_err().to_string();
    assert!(err.contains("q4_1 blocks do not decode to its values"), "{err}");
}
