//! The DFlash training loop on libtorch (the CPU, or a CUDA device where the
//! libtorch build has one): batches of anchored blocks, the drafter's forward
//! with autograd, AdamW, a held-out estimate of the accepted length, and the
//! export to [`DflashDraft`].

use rand::{RngExt, SeedableRng};
use rand_pcg::Pcg64;
use serde::Serialize;
use specdec_models::dflash::{DflashConfig, DflashWeights};
use specdec_models::{DflashDraft, DflashSpec, DraftData, LayerWeights, LlamaWeights, Matrix};
use tch::nn::{self, OptimizerConfig};
use tch::{Device, Kind, Tensor};

/// What to train and for how long.
#[derive(Debug, Clone, Serialize)]
pub struct TrainConfig {
    /// `B`: the verified token and `B - 1` drafts.
    pub block_size: usize,
    pub draft_layers: usize,
    pub mask_token_id: u32,
    /// Optimizer steps (the budget: never a wall-clock time, so a run is reproducible).
    pub steps: usize,
    /// Sequences per step, and anchored blocks per sequence.
    pub seqs_per_step: usize,
    pub anchors_per_seq: usize,
    /// Peak learning rate (AdamW), after a linear warmup; cosine decay to a tenth.
    pub lr: f64,
    pub warmup: usize,
    /// Block position `i >= 1` weighs `exp(-(i - 1) / gamma)` in the loss
    /// (DFlash's decay: an early miss ends the block, so early positions matter more).
    pub gamma: f64,
    pub seed: u64,
    /// libtorch intra-op threads (fixed: results may depend on it).
    pub threads: usize,
    /// Held-out evaluation every this many steps (and at the end).
    pub eval_every: usize,
    /// Where the tensors live: `cpu`, `cuda` or `cuda:N`. A run is
    /// reproducible on one device; the CPU and a GPU round differently.
    pub device: String,
}

impl Default for TrainConfig {
    fn default() -> Self {
        TrainConfig {
            block_size: 8,
            draft_layers: 1,
            mask_token_id: 0,
            steps: 1000,
            seqs_per_step: 8,
            anchors_per_seq: 16,
            lr: 1e-3,
            warmup: 50,
            gamma: 4.0,
            seed: 0,
            threads: 2,
            eval_every: 100,
            device: "cpu".into(),
        }
    }
}

/// One held-out evaluation.
#[derive(Debug, Clone, Serialize)]
pub struct Eval {
    pub step: usize,
    pub loss: f64,
    /// Mean number of leading drafts that equal the target's greedy tokens:
    /// the drafts greedy verification accepts per block.
    pub accepted_per_block: f64,
    /// `tau`: accepted drafts plus the target's own token, per block.
    pub tau: f64,
    /// Fraction of blocks whose first `i + 1` drafts all match, `i = 0 .. B - 2`.
    pub acceptance_per_position: Vec<f64>,
    pub blocks: usize,
}

/// The outcome of a run.
#[derive(Debug, Clone, Serialize)]
pub struct TrainLog {
    pub config: TrainConfig,
    pub target_layer_ids: Vec<usize>,
    pub train_sequences: usize,
    pub train_anchors: usize,
    pub heldout_sequences: usize,
    /// Weighted loss of every step.
    pub loss: Vec<f64>,
    pub evals: Vec<Eval>,
    pub seconds: f64,
}

/// Reports progress (a progress bar in the binary).
pub trait Progress {
    fn step(&mut self, step: usize, loss: f64);
    fn eval(&mut self, eval: &Eval);
}

/// Ignores progress.
pub struct Quiet;

impl Progress for Quiet {
    fn step(&mut self, _: usize, _: f64) {}
    fn eval(&mut self, _: &Eval) {}
}

/// One sequence, its hidden rows on the training device (gathered there
/// into batches: a GPU holds millions of rows, and copying each batch's
/// features over would cost more than its step).
struct Seq {
    tokens: Vec<u32>,
    prompt_len: usize,
    /// `[tokens - 1, K·hidden]`.
    hidden: Tensor,
}

impl Seq {
    /// Anchors `n` whose labels `x[n+1 .. n+B]` all lie in the continuation.
    fn anchors(&self, b: usize) -> std::ops::RangeInclusive<usize> {
        (self.prompt_len - 1)..=(self.tokens.len() - b)
    }

    fn has_anchor(&self, b: usize) -> bool {
        self.tokens.len() >= b && self.tokens.len() - b >= self.prompt_len - 1
    }
}

/// The trainable tensors, in checkpoint order.
struct Params {
    fc: Tensor,
    hidden_norm: Tensor,
    layers: Vec<[Tensor; 9]>,
    norm: Tensor,
}

/// `m` on the host (the data stays there; batches move to the device).
fn tensor(m: &Matrix) -> Tensor {
    let shape: Vec<i64> = m.shape.iter().map(|&d| d as i64).collect();
    Tensor::from_slice(&m.data).view(shape.as_slice())
}

/// The sequences of `data` with an anchor for blocks of `b`, on `device`.
fn device_seqs(data: &DraftData, b: usize, device: Device) -> Vec<Seq> {
    data.sequences.iter().map(|s| Seq { tokens: s.tokens.clone(), prompt_len: s.prompt_len, hidden: tensor(&s.hidden).to_device(device) }).filter(|s| s.has_anchor(b)).collect()
}

/// `cpu`, `cuda` or `cuda:N`, checked against what this libtorch sees.
fn parse_device(name: &str) -> Result<Device, String> {
    let cuda = |i: usize| {
        let n = tch::Cuda::device_count();
        if (i as i64) < n { Ok(Device::Cuda(i)) } else { Err(format!("device `{name}`: this libtorch sees {n} CUDA device(s)")) }
    };
    match name {
        "cpu" => Ok(Device::Cpu),
        "cuda" => cuda(0),
        _ => match name.strip_prefix("cuda:").map(str::parse::<usize>) {
            Some(Ok(i)) => cuda(i),
            _ => Err(format!("device `{name}` is not `cpu`, `cuda` or `cuda:N`")),
        },
    }
}

fn matrix(t: &Tensor, name: &str) -> Result<Matrix, String> {
    let shape: Vec<usize> = t.size().iter().map(|&d| d as usize).collect();
    let data = Vec::<f32>::try_from(&t.detach().to_kind(Kind::Float).to_device(Device::Cpu).contiguous().view(-1)).map_err(|e| format!("{name}: {e}"))?;
    Matrix::new(shape, data, name).map_err(|e| e.to_string())
}

/// Geometry of the forward.
struct Geometry {
    heads: i64,
    kv_heads: i64,
    head_dim: i64,
    eps: f64,
    theta: f64,
    block: i64,
}

fn rms_norm(x: &Tensor, gain: &Tensor, eps: f64) -> Tensor {
    x * (x.square().mean_dim(-1, true, Kind::Float) + eps).rsqrt() * gain
}

/// `cos`, `sin` of `[positions.., head_dim]`, halves repeated (rotate-half, MODEL-10).
fn rope_tables(positions: &Tensor, head_dim: i64, theta: f64) -> (Tensor, Tensor) {
    let half = head_dim / 2;
    let inv: Vec<f32> = (0..half).map(|i| theta.powf(-(2.0 * i as f64) / head_dim as f64) as f32).collect();
    let inv = Tensor::from_slice(&inv).to_device(positions.device());
    let angles = positions.to_kind(Kind::Float).unsqueeze(-1) * inv;
    let angles = Tensor::cat(&[&angles, &angles], -1);
    (angles.cos(), angles.sin())
}

/// `x` is `[.., T, head_dim]`; `cos`/`sin` broadcast to it.
fn rope(x: &Tensor, cos: &Tensor, sin: &Tensor) -> Tensor {
    let half = x.size()[x.dim() - 1] / 2;
    let x1 = x.narrow(-1, 0, half);
    let x2 = x.narrow(-1, half, half);
    let rotated = Tensor::cat(&[&(-&x2), &x1], -1);
    x * cos + rotated * sin
}

/// What training reads but never changes, on the training device: the
/// target's embedding and head (no gradient flows into them; a tied head is
/// the embedding itself, not a copy), the forward's geometry, and the
/// per-position loss weights.
struct Frozen {
    embed: Tensor,
    head: Tensor,
    g: Geometry,
    /// `[B - 1]`: position `i >= 1` weighs `exp(-(i - 1) / gamma)`.
    weights: Tensor,
}

impl Frozen {
    fn new(target: &LlamaWeights, block: usize, gamma: f64, device: Device) -> Self {
        let tc = &target.config;
        let embed = tensor(&target.embed).to_device(device);
        let head = if std::ptr::eq(target.output_matrix(), &target.embed) { embed.shallow_clone() } else { tensor(target.output_matrix()).to_device(device) };
        let g =
            Geometry { heads: tc.num_attention_heads as i64, kv_heads: tc.num_key_value_heads as i64, head_dim: tc.head_dim() as i64, eps: tc.rms_norm_eps, theta: tc.rope_theta, block: block as i64 };
        let weights: Vec<f32> = (1..block).map(|i| (-((i - 1) as f64) / gamma).exp() as f32).collect();
        Frozen { embed, head, g, weights: Tensor::from_slice(&weights).to_device(device) }
    }
}

/// A batch of anchored blocks over `S` sequences.
struct Batch {
    /// `[S, L, K·hidden]`, zero-padded.
    features: Tensor,
    /// `[S, A·B]` token ids of the blocks.
    block_tokens: Tensor,
    /// `[S, A·B]` positions of the block tokens; `[S, L]` of the context.
    block_pos: Tensor,
    ctx_pos: Tensor,
    /// `[S, 1, A·B, L + A·B]`: which keys each block query reads.
    mask: Tensor,
    /// `[S·A·(B-1)]` the target's greedy tokens at block positions `1 .. B`.
    labels: Tensor,
    anchors: usize,
}

fn make_batch(seqs: &[&Seq], anchors: &[Vec<usize>], b: usize, mask_id: u32, device: Device) -> Batch {
    let s = seqs.len();
    let a = anchors[0].len();
    let ctx_len = anchors.iter().flatten().copied().max().unwrap_or(1).max(1);
    let width = seqs[0].hidden.size()[1];
    let feats: Vec<Tensor> = seqs
        .iter()
        .map(|q| {
            let have = (q.hidden.size()[0] as usize).min(ctx_len);
            let part = q.hidden.narrow(0, 0, have as i64);
            if have < ctx_len { Tensor::cat(&[&part, &Tensor::zeros([(ctx_len - have) as i64, width], (Kind::Float, part.device()))], 0) } else { part }
        })
        .collect();
    let features = Tensor::stack(&feats, 0);
    let (mut tokens, mut pos, mut labels) = (Vec::with_capacity(s * a * b), Vec::with_capacity(s * a * b), Vec::with_capacity(s * a * (b - 1)));
    let total = ctx_len + a * b;
    let mut mask = vec![false; s * a * b * total];
    for (si, (q, ns)) in seqs.iter().zip(anchors).enumerate() {
        for (ai, &n) in ns.iter().enumerate() {
            for i in 0..b {
                tokens.push(if i == 0 { i64::from(q.tokens[n]) } else { i64::from(mask_id) });
                pos.push((n + i) as i64);
                if i > 0 {
                    labels.push(i64::from(q.tokens[n + i]));
                }
                let row = ((si * a + ai) * b + i) * total;
                // The context before the anchor (positions < n) ...
                mask[row..row + n].iter_mut().for_each(|m| *m = true);
                // ... and the whole block, not causally (DRAFT-8).
                let start = row + ctx_len + ai * b;
                mask[start..start + b].iter_mut().for_each(|m| *m = true);
            }
        }
    }
    let (s64, ab) = (s as i64, (a * b) as i64);
    Batch {
        features,
        block_tokens: Tensor::from_slice(&tokens).view([s64, ab]).to_device(device),
        block_pos: Tensor::from_slice(&pos).view([s64, ab]).to_device(device),
        ctx_pos: Tensor::arange(ctx_len as i64, (Kind::Int64, device)).unsqueeze(0).expand([s64, ctx_len as i64], false),
        mask: Tensor::from_slice(&mask).view([s64, 1, ab, total as i64]).to_device(device),
        labels: Tensor::from_slice(&labels).to_device(device),
        anchors: a,
    }
}

/// The drafter's forward: logits `[S·A·(B-1), V]` of block positions `1 .. B`.
fn forward(p: &Params, f: &Frozen, batch: &Batch) -> Tensor {
    let (embed, head, g) = (&f.embed, &f.head, &f.g);
    let s = batch.block_tokens.size()[0];
    let ab = batch.block_tokens.size()[1];
    let l = batch.features.size()[1];
    let hidden = embed.size()[1];
    let (nh, nkv, hd) = (g.heads, g.kv_heads, g.head_dim);
    let ctx = rms_norm(&batch.features.matmul(&p.fc.tr()), &p.hidden_norm, g.eps);
    let mut x = embed.index_select(0, &batch.block_tokens.view(-1)).view([s, ab, hidden]);
    let (bcos, bsin) = rope_tables(&batch.block_pos, hd, g.theta);
    let (bcos, bsin) = (bcos.unsqueeze(1), bsin.unsqueeze(1));
    let (ccos, csin) = rope_tables(&batch.ctx_pos, hd, g.theta);
    let (ccos, csin) = (ccos.unsqueeze(1), csin.unsqueeze(1));
    let heads = |t: Tensor, len: i64, n: i64| t.view([s, len, n, hd]).transpose(1, 2);
    let scale = 1.0 / (hd as f64).sqrt();
    for [attn_norm, wq, wk, wv, wo, mlp_norm, w_gate, w_up, w_down] in &p.layers {
        let h = rms_norm(&x, attn_norm, g.eps);
        let q = rope(&heads(h.matmul(&wq.tr()), ab, nh), &bcos, &bsin);
        let kb = rope(&heads(h.matmul(&wk.tr()), ab, nkv), &bcos, &bsin);
        let vb = heads(h.matmul(&wv.tr()), ab, nkv);
        // The context enters as keys and values with no input norm (DRAFT-7).
        let kc = rope(&heads(ctx.matmul(&wk.tr()), l, nkv), &ccos, &csin);
        let vc = heads(ctx.matmul(&wv.tr()), l, nkv);
        let group = nh / nkv;
        let k = Tensor::cat(&[&kc, &kb], 2).repeat_interleave_self_int(group, 1, None);
        let v = Tensor::cat(&[&vc, &vb], 2).repeat_interleave_self_int(group, 1, None);
        let scores = (q.matmul(&k.transpose(-1, -2)) * scale).masked_fill(&batch.mask.logical_not(), f64::NEG_INFINITY);
        let att = scores.softmax(-1, Kind::Float).matmul(&v).transpose(1, 2).reshape([s, ab, nh * hd]);
        // Not `+=`: from the second layer on, `x` is saved for the backward
        // pass (this layer's norm), and an in-place add breaks autograd.
        x = &x + att.matmul(&wo.tr());
        let h = rms_norm(&x, mlp_norm, g.eps);
        x = &x + (h.matmul(&w_gate.tr()).silu() * h.matmul(&w_up.tr())).matmul(&w_down.tr());
    }
    let out = rms_norm(&x, &p.norm, g.eps).view([s, batch.anchors as i64, g.block, hidden]).narrow(2, 1, g.block - 1).reshape([-1, hidden]);
    out.matmul(&head.tr())
}

/// Weighted cross-entropy of a batch: `sum_i w_i CE_i / sum_i w_i`.
fn weighted_loss(logits: &Tensor, labels: &Tensor, weights: &Tensor) -> Tensor {
    let ce = logits.cross_entropy_loss::<Tensor>(labels, None, tch::Reduction::None, -100, 0.0);
    let w = weights.repeat([ce.size()[0] / weights.size()[0]]);
    (ce * &w).sum(Kind::Float) / w.sum(Kind::Float)
}

/// Trains a drafter for `target` on `data`, evaluating on `heldout`.
pub fn train(target: &LlamaWeights, data: &DraftData, heldout: Option<&DraftData>, cfg: &TrainConfig, progress: &mut dyn Progress) -> Result<(DflashDraft, TrainLog), String> {
    let tc = &target.config;
    let b = cfg.block_size;
    if cfg.steps == 0 || cfg.seqs_per_step == 0 || cfg.anchors_per_seq == 0 || !(cfg.lr.is_finite() && cfg.lr > 0.0 && cfg.gamma.is_finite() && cfg.gamma > 0.0) {
        return Err(format!("steps, sequences and anchors per step, lr and gamma must be positive: {cfg:?}"));
    }
    for (name, d) in [("training data", Some(data)), ("held-out data", heldout)] {
        let Some(d) = d else { continue };
        if d.hidden_size != tc.hidden_size || d.vocab_size != tc.vocab_size {
            return Err(format!("the {name} was recorded from a target of hidden {} and vocabulary {}, not this one ({} and {})", d.hidden_size, d.vocab_size, tc.hidden_size, tc.vocab_size));
        }
        if d.target_layer_ids != data.target_layer_ids {
            return Err(format!("the {name} records layers {:?}, the training data {:?}", d.target_layer_ids, data.target_layer_ids));
        }
    }
    let spec = DflashSpec {
        layers: cfg.draft_layers,
        heads: tc.num_attention_heads,
        kv_heads: tc.num_key_value_heads,
        intermediate: tc.intermediate_size,
        block_size: b,
        target_layer_ids: data.target_layer_ids.clone(),
        mask_token_id: cfg.mask_token_id,
    };
    let config: DflashConfig = spec.config(tc).map_err(|e| e.to_string())?;
    let device = parse_device(&cfg.device)?;
    tch::set_num_threads(cfg.threads as i32);
    tch::manual_seed(cfg.seed as i64);
    let started = std::time::Instant::now();

    let train_seqs = device_seqs(data, b, device);
    let heldout_seqs = heldout.map(|h| device_seqs(h, b, device)).unwrap_or_default();
    if train_seqs.is_empty() {
        return Err(format!("no training sequence has a continuation of {} tokens", b - 1));
    }
    let frozen = Frozen::new(target, b, cfg.gamma, device);

    // Warm start: each draft layer from the target's last layers, the final
    // norm from the target's, hidden_norm from that layer's input norm (the
    // context plays the role of its normalised input), and fc reading the
    // last listed target layer, plus small PCG64 noise on every fc entry.
    let vs = nn::VarStore::new(device);
    let root = vs.root();
    let (h, width) = (tc.hidden_size, config.feature_width());
    let mut rng = Pcg64::seed_from_u64(cfg.seed);
    let k = data.target_layer_ids.len();
    let fc_init: Vec<f32> = (0..h * width)
        .map(|idx| {
            let (r, c) = (idx / width, idx % width);
            let identity = if c == (k - 1) * h + r { 1.0 } else { 0.0 };
            identity + 0.01 * (2.0 * rng.random::<f32>() - 1.0)
        })
        .collect();
    let first = tc.num_hidden_layers - cfg.draft_layers.min(tc.num_hidden_layers);
    let source = |i: usize| &target.layers[(first + i).min(tc.num_hidden_layers - 1)];
    let params = Params {
        fc: root.var_copy("fc", &Tensor::from_slice(&fc_init).view([h as i64, width as i64])),
        hidden_norm: root.var_copy("hidden_norm", &tensor(&source(0).attn_norm)),
        layers: (0..cfg.draft_layers).map(|i| source(i).matrices().map(|m| root.var_copy(&format!("layer{i}"), &tensor(m)))).collect(),
        norm: root.var_copy("norm", &tensor(&target.final_norm)),
    };
    let mut opt = nn::AdamW { wd: 0.0, ..nn::AdamW::default() }.build(&vs, cfg.lr).map_err(|e| e.to_string())?;

    let mut log = TrainLog {
        config: cfg.clone(),
        target_layer_ids: data.target_layer_ids.clone(),
        train_sequences: train_seqs.len(),
        train_anchors: train_seqs.iter().map(|s| s.anchors(b).count()).sum(),
        heldout_sequences: heldout_seqs.len(),
        loss: Vec::with_capacity(cfg.steps),
        evals: Vec::new(),
        seconds: 0.0,
    };
    for step in 0..cfg.steps {
        let lr = if step < cfg.warmup {
            cfg.lr * (step + 1) as f64 / cfg.warmup as f64
        } else {
            let t = (step - cfg.warmup) as f64 / (cfg.steps - cfg.warmup).max(1) as f64;
            cfg.lr * (0.1 + 0.9 * 0.5 * (1.0 + (std::f64::consts::PI * t).cos()))
        };
        opt.set_lr(lr);
        let picked: Vec<&Seq> = (0..cfg.seqs_per_step).map(|_| &train_seqs[rng.random_range(0..train_seqs.len())]).collect();
        let anchors: Vec<Vec<usize>> = picked.iter().map(|s| (0..cfg.anchors_per_seq).map(|_| rng.random_range(s.anchors(b))).collect()).collect();
        let batch = make_batch(&picked, &anchors, b, cfg.mask_token_id, device);
        let loss = weighted_loss(&forward(&params, &frozen, &batch), &batch.labels, &frozen.weights);
        opt.backward_step_clip_norm(&loss, 1.0);
        let value = loss.double_value(&[]);
        if !value.is_finite() {
            return Err(format!("the loss is {value} at step {step}"));
        }
        log.loss.push(value);
        progress.step(step, value);
        if !heldout_seqs.is_empty() && ((step + 1) % cfg.eval_every == 0 || step + 1 == cfg.steps) {
            let e = evaluate(&params, &frozen, &heldout_seqs, cfg.mask_token_id, step + 1);
            progress.eval(&e);
            log.evals.push(e);
        }
    }
    log.seconds = started.elapsed().as_secs_f64();

    let named = |t: &Tensor, name: &str| matrix(t, name);
    let layers = params
        .layers
        .iter()
        .enumerate()
        .map(|(i, ts)| -> Result<LayerWeights, String> {
            let m = |j: usize, n: &str| named(&ts[j], &format!("layers.{i}.{n}"));
            Ok(LayerWeights {
                attn_norm: m(0, "attn_norm")?,
                wq: m(1, "wq")?,
                wk: m(2, "wk")?,
                wv: m(3, "wv")?,
                wo: m(4, "wo")?,
                mlp_norm: m(5, "mlp_norm")?,
                w_gate: m(6, "w_gate")?,
                w_up: m(7, "w_up")?,
                w_down: m(8, "w_down")?,
                attn: Default::default(),
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    let weights = DflashWeights { fc: named(&params.fc, "fc")?, hidden_norm: named(&params.hidden_norm, "hidden_norm")?, layers, norm: named(&params.norm, "norm")? };
    let draft = DflashDraft::new(config, weights, tc).map_err(|e| e.to_string())?;
    Ok((draft, log))
}

/// The held-out estimate ([`evaluate`]) of an existing draft, such as the
/// shipped one, on `heldout`: what a newly trained draft is compared with,
/// on the same data and device.
pub fn evaluate_draft(target: &LlamaWeights, draft: &DflashDraft, heldout: &DraftData, device: &str) -> Result<Eval, String> {
    let tc = &target.config;
    let c = draft.config();
    if heldout.target_layer_ids != c.target_layer_ids || heldout.hidden_size != tc.hidden_size || heldout.vocab_size != tc.vocab_size {
        return Err(format!(
            "the held-out data (layers {:?}, hidden {}, vocabulary {}) does not fit the draft (layers {:?}) and target (hidden {}, vocabulary {})",
            heldout.target_layer_ids, heldout.hidden_size, heldout.vocab_size, c.target_layer_ids, tc.hidden_size, tc.vocab_size
        ));
    }
    let device = parse_device(device)?;
    let b = c.block_size;
    let seqs = device_seqs(heldout, b, device);
    let frozen = Frozen::new(target, b, TrainConfig::default().gamma, device);
    let w = draft.weights();
    let on = |m: &Matrix| tensor(m).to_device(device);
    let params = Params { fc: on(&w.fc), hidden_norm: on(&w.hidden_norm), layers: w.layers.iter().map(|l| l.matrices().map(on)).collect(), norm: on(&w.norm) };
    Ok(evaluate(&params, &frozen, &seqs, c.mask_token_id, 0))
}

/// Held-out loss and accepted length over every fourth anchor of every
/// held-out sequence, one sequence at a time, without gradients.
fn evaluate(p: &Params, f: &Frozen, seqs: &[Seq], mask_id: u32, step: usize) -> Eval {
    let b = f.g.block as usize;
    let _guard = tch::no_grad_guard();
    let (mut loss_sum, mut batches) = (0.0, 0usize);
    let mut matched_prefix = vec![0usize; b - 1];
    let mut blocks = 0usize;
    for s in seqs {
        // Every fourth anchor: the held-out estimate at a quarter of the cost.
        let anchors: Vec<usize> = s.anchors(b).step_by(4).collect();
        for chunk in anchors.chunks(64) {
            // One batch per chunk: a single sequence with these anchors.
            let batch = make_batch(&[s], &[chunk.to_vec()], b, mask_id, f.weights.device());
            let logits = forward(p, f, &batch);
            loss_sum += weighted_loss(&logits, &batch.labels, &f.weights).double_value(&[]);
            batches += 1;
            let hits = Vec::<i64>::try_from(logits.argmax(-1, false).eq_tensor(&batch.labels).to_kind(Kind::Int64).to_device(Device::Cpu)).unwrap_or_default();
            for block in hits.chunks(b - 1) {
                blocks += 1;
                for (i, _) in block.iter().enumerate().take_while(|(_, h)| **h == 1) {
                    matched_prefix[i] += 1;
                }
            }
        }
    }
    let accepted: usize = matched_prefix.iter().sum();
    let per_block = accepted as f64 / blocks.max(1) as f64;
    Eval {
        step,
        loss: loss_sum / batches.max(1) as f64,
        accepted_per_block: per_block,
        tau: per_block + 1.0,
        acceptance_per_position: matched_prefix.iter().map(|&m| m as f64 / blocks.max(1) as f64).collect(),
        blocks,
    }
}
