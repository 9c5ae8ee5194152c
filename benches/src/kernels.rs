//! Kernel timings as the decoder calls them, each next to its memory-bound
//! limit: "verify from logits" (`process_logits` on the target's `[B, k+1, V]`
//! and the draft's `[B, k, V]` logits at temperature 1, then the unchecked
//! `rejection_verify` with explicit noise) and greedy verify (the unchecked
//! `greedy_verify` on the target's logits), accepted tokens and counts
//! downloaded. The limit is the bytes of logits the kernel must read once,
//! in the backend's float dtype, over the machine's copy bandwidth.

use criterion::Criterion;
use rand::{RngExt, SeedableRng};
use rand_pcg::Pcg64;
use serde::{Deserialize, Serialize};
use specdec_backend::model::ModelBackend;
use specdec_backend::{Comparator, DrawNoiseArg, HostTensor, LogitsParams, Penalties, RejectionArgs, RejectionNoise};

use crate::machine::Machine;

/// A verify shape: `batch` sequences of `k` drafts over `vocab` ids.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
pub struct Shape {
    pub batch: usize,
    pub k: usize,
    pub vocab: usize,
}

impl Shape {
    pub fn label(&self) -> String {
        format!("B={}, k={}, V={}", self.batch, self.k, self.vocab)
    }
    fn id(&self) -> String {
        format!("B{}_k{}_V{}", self.batch, self.k, self.vocab)
    }
    /// Logit values a verify from logits reads: target rows then draft rows.
    pub fn verify_values(&self) -> usize {
        self.batch * (2 * self.k + 1) * self.vocab
    }
    /// Logit values a greedy verify reads: the target rows.
    pub fn greedy_values(&self) -> usize {
        self.batch * (self.k + 1) * self.vocab
    }
}

/// The shapes: one long-vocabulary sequence (Qwen-size V), and
/// batches at a Llama-size V.
pub const SHAPES: [Shape; 3] = [Shape { batch: 1, k: 8, vocab: 151_936 }, Shape { batch: 8, k: 4, vocab: 32_768 }, Shape { batch: 32, k: 4, vocab: 32_768 }];

/// The kernels timed: verify from logits without and with every sampling
/// processor (LOGITS-7 .. LOGITS-13, as the decoder feeds them), and greedy.
pub const OPS: [&str; 3] = ["verify_from_logits", "verify_from_logits_processed", "greedy_verify"];

/// Context tokens whose counts the processed verify's penalties read.
pub const PENALTY_CONTEXT: usize = 512;

/// Host inputs of one shape, generated once from a fixed seed so every
/// backend (and the peer script) times the same work.
pub struct Inputs {
    pub shape: Shape,
    /// `[B*(k+1), V]` f32, as a model's head returns them.
    pub target_logits: HostTensor<f32>,
    /// `[B*k, V]` f32.
    pub draft_logits: HostTensor<f32>,
    pub draft_tokens: HostTensor<i64>,
    pub proposal_lens: HostTensor<i64>,
    pub accept_uniforms: HostTensor<f64>,
    pub draw_uniforms: HostTensor<f64>,
}

impl Inputs {
    pub fn new(shape: Shape, seed: u64) -> Inputs {
        let Shape { batch, k, vocab } = shape;
        let mut rng = Pcg64::seed_from_u64(seed);
        let mut logits = |rows: usize| {
            let data: Vec<f32> = (0..rows * vocab).map(|_| 8.0 * rng.random::<f32>()).collect();
            HostTensor::new(vec![rows, vocab], data).expect("bench shapes")
        };
        let (target_logits, draft_logits) = (logits(batch * (k + 1)), logits(batch * k));
        let mut rng = Pcg64::seed_from_u64(seed ^ 0x5eed);
        let ids = (0..batch * k).map(|_| rng.random_range(0..vocab as i64)).collect();
        let uniforms = |n: usize, rng: &mut Pcg64| HostTensor::new(vec![batch, n], (0..batch * n).map(|_| rng.random::<f64>()).collect()).expect("bench shapes");
        Inputs {
            shape,
            target_logits,
            draft_logits,
            draft_tokens: HostTensor::new(vec![batch, k], ids).expect("bench shapes"),
            proposal_lens: HostTensor::from_vec(vec![k as i64; batch]),
            accept_uniforms: uniforms(k, &mut rng),
            draw_uniforms: uniforms(k + 1, &mut rng),
        }
    }
}

/// One kernel timing of the report.
#[derive(Debug, Clone, Serialize)]
pub struct KernelTime {
    pub op: String,
    pub shape: Shape,
    pub backend: String,
    pub float_dtype: String,
    pub mean_s: f64,
    /// Bytes of logits the op must read once.
    pub bytes: f64,
    /// `mean_s` over the host memory-bound limit (1 is the limit); `None` on
    /// an accelerator, whose own bandwidth this run does not measure.
    pub times_limit: Option<f64>,
}

/// Bytes of one value of a backend's float dtype.
pub fn dtype_bytes(dtype: &str) -> usize {
    match dtype {
        "f64" => 8,
        "f16" | "bf16" => 2,
        _ => 4,
    }
}

fn group(op: &str, shape: &Shape) -> String {
    format!("{op}/{}", shape.id())
}

/// Times both kernels of `inputs` on `b` under criterion (inputs resident on
/// the device, outputs downloaded), then reads the estimates back.
pub fn bench<B: ModelBackend>(c: &mut Criterion, name: &str, b: &B, inputs: &Inputs, machine: &Machine, criterion_dir: &std::path::Path) -> Vec<KernelTime> {
    let Shape { batch, k, vocab } = inputs.shape;
    let up32 = |t: &HostTensor<f32>| b.upload_f32(t).expect("upload");
    let up_i = |t: &HostTensor<i64>| b.upload_i64(t).expect("upload");
    let up_f = |t: &HostTensor<f64>| b.upload_f64(t).expect("upload");
    let (zt, zd) = (up32(&inputs.target_logits), up32(&inputs.draft_logits));
    let (drafts, lens) = (up_i(&inputs.draft_tokens), up_i(&inputs.proposal_lens));
    let (u, v) = (up_f(&inputs.accept_uniforms), up_f(&inputs.draw_uniforms));
    // Temperature 1 and top-p 1 are the same per-row ones; top-k 0 is off.
    let (ones_t, ones_d) = (up_f(&HostTensor::from_vec(vec![1.0; batch * (k + 1)])), up_f(&HostTensor::from_vec(vec![1.0; batch * k])));
    let (kt, kd) = (up_i(&HostTensor::from_vec(vec![0; batch * (k + 1)])), up_i(&HostTensor::from_vec(vec![0; batch * k])));
    let target_3d = b.reshape(&zt, &[batch, k + 1, vocab]).expect("reshape");
    let verify_from_logits = || {
        let p = b.process_logits(&zt, LogitsParams::new(&ones_t, &kt, &ones_t)).expect("valid logits");
        let q = b.process_logits(&zd, LogitsParams::new(&ones_d, &kd, &ones_d)).expect("valid logits");
        let (p, q) = (b.reshape(&p, &[batch, k + 1, vocab]).expect("reshape"), b.reshape(&q, &[batch, k, vocab]).expect("reshape"));
        let args = RejectionArgs { target_probs: &p, draft_probs: Some(&q), draft_tokens: &drafts, proposal_lens: &lens };
        let out = b.rejection_verify_unchecked(args, RejectionNoise { accept_uniforms: &u, draw: DrawNoiseArg::InverseCdf(&v) }, Comparator::Strict).expect("valid batch");
        (b.download_i64(&out.tokens).expect("download"), b.download_i64(&out.num_accepted).expect("download"))
    };
    // Every processor on, as the decoder runs them: each row's penalty counts
    // (a context of PENALTY_CONTEXT tokens plus the drafts before the row) and
    // a sparse bias built on the host and uploaded per call, then min-p.
    let context: Vec<u32> = (0..PENALTY_CONTEXT).map(|i| ((i * 7919) % vocab) as u32).collect();
    let base = specdec_reference::penalty_counts(&context, vocab);
    let window_rows = |rows_per_seq: usize| -> Vec<f64> {
        (0..batch)
            .flat_map(|s| {
                let d: Vec<u32> = inputs.draft_tokens.data()[s * k..(s + 1) * k].iter().map(|&t| t.max(0) as u32).collect();
                specdec_reference::window_counts(&base, &d).into_iter().take(rows_per_seq).flatten().collect::<Vec<f64>>()
            })
            .collect()
    };
    let bias_rows = |rows: usize| -> Vec<f64> { (0..rows * vocab).map(|i| if i % 4099 == 0 { 1.5 } else { 0.0 }).collect() };
    let processed = |z: &B::Tensor, rows_per_seq: usize| {
        let rows = batch * rows_per_seq;
        let col = |x: f64| up_f(&HostTensor::from_vec(vec![x; rows]));
        let (t, kk, p, m, rep, pres, freq) = (col(1.0), up_i(&HostTensor::from_vec(vec![0; rows])), col(1.0), col(0.05), col(1.2), col(0.3), col(0.2));
        let counts = up_f(&HostTensor::new(vec![rows, vocab], window_rows(rows_per_seq)).expect("shape"));
        let bias = up_f(&HostTensor::new(vec![rows, vocab], bias_rows(rows)).expect("shape"));
        let mut params = LogitsParams::new(&t, &kk, &p);
        params.min_p = Some(&m);
        params.penalties = Some(Penalties { counts: &counts, repetition: &rep, presence: &pres, frequency: &freq });
        params.logit_bias = Some(&bias);
        b.process_logits(z, params).expect("valid logits")
    };
    let verify_processed = || {
        let (p, q) = (processed(&zt, k + 1), processed(&zd, k));
        let (p, q) = (b.reshape(&p, &[batch, k + 1, vocab]).expect("reshape"), b.reshape(&q, &[batch, k, vocab]).expect("reshape"));
        let args = RejectionArgs { target_probs: &p, draft_probs: Some(&q), draft_tokens: &drafts, proposal_lens: &lens };
        let out = b.rejection_verify_unchecked(args, RejectionNoise { accept_uniforms: &u, draw: DrawNoiseArg::InverseCdf(&v) }, Comparator::Strict).expect("valid batch");
        (b.download_i64(&out.tokens).expect("download"), b.download_i64(&out.num_accepted).expect("download"))
    };
    let greedy = || {
        let out = b.greedy_verify_unchecked(&target_3d, &drafts, &lens).expect("valid batch");
        (b.download_i64(&out.tokens).expect("download"), b.download_i64(&out.num_accepted).expect("download"))
    };
    c.benchmark_group(group(OPS[0], &inputs.shape)).bench_function(name, |bench| bench.iter(verify_from_logits));
    c.benchmark_group(group(OPS[1], &inputs.shape)).bench_function(name, |bench| bench.iter(verify_processed));
    c.benchmark_group(group(OPS[2], &inputs.shape)).bench_function(name, |bench| bench.iter(greedy));

    let dtype = b.precision().float_dtype;
    let host = crate::on_host(&b.device());
    let width = dtype_bytes(dtype) as f64;
    [(OPS[0], inputs.shape.verify_values()), (OPS[1], inputs.shape.verify_values()), (OPS[2], inputs.shape.greedy_values())]
        .into_iter()
        .filter_map(|(op, values)| {
            let mean_s = crate::mean_ns(criterion_dir, &group(op, &inputs.shape), name)? / 1e9;
            let bytes = values as f64 * width;
            Some(KernelTime { op: op.into(), shape: inputs.shape, backend: name.into(), float_dtype: dtype.into(), mean_s, bytes, times_limit: host.then(|| mean_s / machine.read_limit_s(bytes)) })
        })
        .collect()
}
