//! SmolLM2 forward speed next to the weight-bandwidth roofline: a one-token
//! decode step at a 32-token context, verify windows of 5 and 9 tokens
//! (k = 4 and 8) at the same context, and a 64-token prefill, under criterion. A decode step
//! must read every weight once, so its limit is the weight bytes over the
//! machine's bandwidth, given both over the copy bandwidth and over the
//! measured read bandwidth (the embedding table counts once when it is tied
//! to the head, and not at all otherwise: a lookup reads one row). Each
//! timing ends by downloading the forward's last logit row: the verify ops
//! read the rest on the device, so a window and a decode pay the same sync.
//! A prefill is compute-bound instead: its limit is its operations
//! ([`prefill_flops`]) over the machine's measured FMA throughput.

use criterion::Criterion;
use serde::Serialize;
use specdec_backend::model::{ForwardRequest, LlamaWeights, ModelBackend};
use specdec_backend::{ForwardOutput, HostTensor};

use crate::kernels::dtype_bytes;

/// Bytes a stored weight takes in `dtype`: Q8_0 keeps 32 weights in 34
/// bytes (32 signed bytes and an f16 scale).
fn bytes_per_weight(dtype: &str) -> f64 {
    if dtype == "q8_0" { 34.0 / 32.0 } else { dtype_bytes(dtype) as f64 }
}
use crate::machine::Machine;

pub const CONTEXT: usize = 32;
pub const WINDOW: usize = 9;
/// A window at the decoder's default k = 4.
pub const SHORT_WINDOW: usize = 5;
pub const PREFILL: usize = 64;

/// One backend's forward timings.
#[derive(Debug, Clone, Serialize)]
pub struct ForwardTime {
    pub backend: String,
    pub weight_dtype: String,
    pub decode_s: f64,
    pub verify5_s: f64,
    pub verify9_s: f64,
    pub prefill64_s: f64,
    /// f32 operations of the 64-token prefill ([`prefill_flops`]).
    pub prefill64_flops: f64,
    /// `prefill64_s` over those operations' time at the measured FMA
    /// throughput (1 is the limit); `None` on an accelerator.
    pub prefill64_times_fma_roofline: Option<f64>,
    /// Bytes of weights a decode step reads once.
    pub weight_bytes: f64,
    /// `decode_s` over the host weight-bandwidth roofline at the copy
    /// bandwidth (1 is the limit); `None` on an accelerator.
    pub decode_times_roofline: Option<f64>,
    /// `decode_s` over the weights' time at the measured read-only
    /// bandwidth; `None` on an accelerator.
    pub decode_times_read_roofline: Option<f64>,
    /// `verify5_s / decode_s`: what drafting k = 4 costs the target.
    pub verify5_over_decode: f64,
    /// `verify9_s / decode_s`: what drafting k = 8 costs the target.
    pub verify9_over_decode: f64,
}

/// Parameters a decode step reads (embedding once when tied, else not at all).
pub fn weights_read_per_step(w: &LlamaWeights) -> usize {
    let c = &w.config;
    let all: usize = c.tensor_shapes().iter().map(|(_, s)| s.iter().product::<usize>()).sum();
    if c.tie_word_embeddings { all } else { all - c.vocab_size * c.hidden_size }
}

/// The f32 operations (a multiply-add counts two) of a `t`-token prefill into
/// an empty cache that keeps the last logit row: every layer's products on
/// every token, causal attention's scores and weighted sums (token `i` sees
/// `i + 1` positions), and the head on one row. Norms, rotations and
/// activations are left out (a few per weight-row element, not per weight).
pub fn prefill_flops(w: &LlamaWeights, t: usize) -> f64 {
    let c = &w.config;
    let layer_weights: usize = c.tensor_shapes().iter().filter(|(n, s)| n.contains(".layers.") && s.len() == 2).map(|(_, s)| s.iter().product::<usize>()).sum();
    let attention = 2 * 2 * c.num_hidden_layers * c.num_attention_heads * c.head_dim() * (t * (t + 1) / 2);
    let head = 2 * c.vocab_size * c.hidden_size;
    (2 * layer_weights * t + attention + head) as f64
}

fn tokens(n: usize, salt: u32) -> Vec<u32> {
    (0..n as u32).map(|i| (i * 7919 + salt * 104_729) % 49_000 + 100).collect()
}

/// Times the four forwards of `b` and reads criterion's estimates back.
pub fn bench<B: ModelBackend>(c: &mut Criterion, name: &str, b: &B, w: &LlamaWeights, machine: &Machine, criterion_dir: &std::path::Path) -> Option<ForwardTime> {
    let model = b.load_model(w).expect("load");
    let mut cache = b.new_model_cache(&model, 1, CONTEXT + PREFILL + WINDOW).expect("cache");
    b.forward(&model, &mut cache, &ForwardRequest::last_logits(&[tokens(CONTEXT, 1)])).expect("prefill");
    let (one, short, window, prompt) = ([tokens(1, 2)], [tokens(SHORT_WINDOW, 5)], [tokens(WINDOW, 3)], [tokens(PREFILL, 4)]);
    // A step's logits stay on the device for the verify ops that read them;
    // the timing waits for the forward by downloading its last logit row
    // (one row, so a window and a decode pay the same small transfer).
    let download = |out: ForwardOutput<B::Tensor>| {
        let logits = out.logits.as_ref().expect("logits");
        let last = b.upload_i64(&HostTensor::new(vec![1], vec![out.plan.logit_rows as i64 - 1]).expect("one index")).expect("upload");
        b.download_f64(&b.gather_rows(logits, &last).expect("gather")).expect("download")
    };
    c.benchmark_group("forward/decode").bench_function(name, |bench| {
        bench.iter(|| {
            let out = download(b.forward(&model, &mut cache, &ForwardRequest::last_logits(&one)).expect("decode"));
            b.cache_trim(&mut cache, &[1]).expect("trim");
            out
        })
    });
    for (group, rows, len) in [("forward/verify5", &short, SHORT_WINDOW), ("forward/verify9", &window, WINDOW)] {
        c.benchmark_group(group).bench_function(name, |bench| {
            bench.iter(|| {
                let out = download(b.forward(&model, &mut cache, &ForwardRequest::all_logits(rows)).expect("window"));
                b.cache_trim(&mut cache, &[len]).expect("trim");
                out
            })
        });
    }
    c.benchmark_group("forward/prefill64").bench_function(name, |bench| {
        bench.iter(|| {
            let mut fresh = b.new_model_cache(&model, 1, PREFILL).expect("cache");
            download(b.forward(&model, &mut fresh, &ForwardRequest::last_logits(&prompt)).expect("prefill"))
        })
    });
    let mean = |g: &str| crate::mean_ns(criterion_dir, g, name).map(|t| t / 1e9);
    let (decode_s, verify5_s, verify9_s, prefill64_s) = (mean("forward/decode")?, mean("forward/verify5")?, mean("forward/verify9")?, mean("forward/prefill64")?);
    let weight_dtype = b.model_precision().weight_dtype;
    let prefill64_flops = prefill_flops(w, PREFILL);
    // The backend's own count where it has one (a GGUF's Q4_1 blocks read as stored).
    let weight_bytes = b.weight_bytes(&model).map_or_else(|| weights_read_per_step(w) as f64 * bytes_per_weight(weight_dtype), |n| n as f64);
    Some(ForwardTime {
        backend: name.into(),
        weight_dtype: weight_dtype.into(),
        decode_s,
        verify5_s,
        verify9_s,
        prefill64_s,
        prefill64_flops,
        prefill64_times_fma_roofline: crate::on_host(&b.device()).then(|| prefill64_s / machine.fma_limit_s(prefill64_flops)),
        weight_bytes,
        decode_times_roofline: crate::on_host(&b.device()).then(|| decode_s / machine.read_limit_s(weight_bytes)),
        decode_times_read_roofline: crate::on_host(&b.device()).then(|| decode_s / machine.read_only_limit_s(weight_bytes)),
        verify5_over_decode: verify5_s / decode_s,
        verify9_over_decode: verify9_s / decode_s,
    })
}
