//! The reference as a backend: every operation delegates to
//! `specdec-reference`, so the conformance suite runs it through the same
//! interface as any port. Its "device" is the host and its dtype f64.

use rand::{RngExt, SeedableRng};
use rand_pcg::Pcg64;
use specdec_reference as r;
use specdec_reference::kvcache::BatchKvCache;
use specdec_reference::{DrawNoise, Tensor};

use crate::glue;
use crate::{
    Backend, BackendError, Comparator, DflashAccepted, DrawMethod, DrawNoiseArg, LogitsParams, NgramConfig, Precision, RejectionArgs, RejectionNoise, Result, SamplingParams, TrimMode, Verified,
};

/// A host tensor of either dtype.
#[derive(Debug, Clone, PartialEq)]
pub enum RefTensor {
    F64(Tensor<f64>),
    I64(Tensor<i64>),
}

/// The reference implementation behind the [`Backend`] trait.
#[derive(Debug, Clone, Copy, Default)]
pub struct ReferenceBackend;

const NAME: &str = "reference";

fn float<'a>(t: &'a RefTensor, arg: &str) -> Result<&'a Tensor<f64>> {
    match t {
        RefTensor::F64(t) => Ok(t),
        RefTensor::I64(_) => Err(BackendError::device(NAME, format!("`{arg}` must be a float tensor"))),
    }
}

fn int<'a>(t: &'a RefTensor, arg: &str) -> Result<&'a Tensor<i64>> {
    match t {
        RefTensor::I64(t) => Ok(t),
        RefTensor::F64(_) => Err(BackendError::device(NAME, format!("`{arg}` must be an i64 tensor"))),
    }
}

fn ids(values: impl IntoIterator<Item = usize>) -> RefTensor {
    RefTensor::I64(Tensor::from_vec(values.into_iter().map(|v| v as i64).collect()))
}

fn verified(out: r::VerifyOutput) -> Verified<RefTensor> {
    Verified { tokens: RefTensor::I64(out.tokens), num_accepted: ids(out.num_accepted) }
}

fn noise(arg: DrawNoiseArg<'_, RefTensor>) -> Result<DrawNoise> {
    Ok(match arg {
        DrawNoiseArg::InverseCdf(u) => DrawNoise::InverseCdf(float(u, "draw_uniforms")?.clone()),
        DrawNoiseArg::ExponentialRace(e) => DrawNoise::ExponentialRace(float(e, "draw_exponentials")?.clone()),
    })
}

impl ReferenceBackend {
    fn rejection(&self, args: RejectionArgs<'_, RefTensor>, u: &Tensor<f64>, draw: &DrawNoise, cmp: Comparator) -> Result<Verified<RefTensor>> {
        let inputs = r::RejectionInputs {
            target_probs: float(args.target_probs, "target_probs")?,
            draft_probs: args.draft_probs.map(|q| float(q, "draft_probs")).transpose()?,
            draft_tokens: int(args.draft_tokens, "draft_tokens")?,
            proposal_lens: int(args.proposal_lens, "proposal_lens")?,
            accept_uniforms: u,
            draw,
        };
        Ok(verified(r::rejection_verify(&inputs, cmp)?))
    }
}

/// Seeded noise for [`Backend::rejection_verify_seeded`]: one PCG64 stream,
/// consumed row by row, so sequences get independent noise.
pub fn seeded_noise(seed: u64, batch: usize, k: usize, vocab: usize, method: DrawMethod) -> (Tensor<f64>, DrawNoise) {
    let mut rng = Pcg64::seed_from_u64(seed);
    let u: Vec<f64> = (0..batch * k).map(|_| rng.random::<f64>()).collect();
    let accept = Tensor::new(vec![batch, k], u).expect("shape matches");
    let draw = match method {
        DrawMethod::InverseCdf => {
            let v = (0..batch * (k + 1)).map(|_| rng.random::<f64>()).collect();
            DrawNoise::InverseCdf(Tensor::new(vec![batch, k + 1], v).expect("shape matches"))
        }
        DrawMethod::ExponentialRace => {
            // -ln(1 - u) is Exp(1); u = 0 would give 0, which SAMPLE-2 forbids.
            let e = (0..batch * (k + 1) * vocab)
                .map(|_| {
                    loop {
                        let u: f64 = rng.random();
                        if u > 0.0 {
                            break -(-u).ln_1p();
                        }
                    }
                })
                .collect();
            DrawNoise::ExponentialRace(Tensor::new(vec![batch, k + 1, vocab], e).expect("shape matches"))
        }
    };
    (accept, draw)
}

impl Backend for ReferenceBackend {
    type Tensor = RefTensor;
    type KvCache = BatchKvCache;

    fn name(&self) -> String {
        NAME.to_string()
    }

    fn device(&self) -> String {
        "host".to_string()
    }

    fn precision(&self) -> Precision {
        Precision { float_dtype: "f64", accumulate_dtype: "f64", margin_epsilon: 0.0, value_tolerance: 0.0 }
    }

    fn upload_f64(&self, t: &Tensor<f64>) -> Result<RefTensor> {
        Ok(RefTensor::F64(t.clone()))
    }

    fn upload_i64(&self, t: &Tensor<i64>) -> Result<RefTensor> {
        Ok(RefTensor::I64(t.clone()))
    }

    fn download_f64(&self, t: &RefTensor) -> Result<Tensor<f64>> {
        float(t, "tensor").cloned()
    }

    fn download_i64(&self, t: &RefTensor) -> Result<Tensor<i64>> {
        int(t, "tensor").cloned()
    }

    fn greedy_verify(&self, scores: &RefTensor, drafts: &RefTensor, lens: &RefTensor) -> Result<Verified<RefTensor>> {
        let out = r::greedy_verify(float(scores, "target_scores")?, int(drafts, "draft_tokens")?, int(lens, "proposal_lens")?)?;
        Ok(verified(out))
    }

    fn dflash_accept(&self, candidates: &RefTensor, predict: &RefTensor, vocab: usize) -> Result<DflashAccepted<RefTensor>> {
        let out = r::dflash_accept(int(candidates, "candidates")?, int(predict, "target_predict")?, vocab)?;
        Ok(DflashAccepted { accept_len: ids(out.accept_len), bonus: RefTensor::I64(Tensor::from_vec(out.bonus)) })
    }

    fn rejection_verify(&self, args: RejectionArgs<'_, RefTensor>, n: RejectionNoise<'_, RefTensor>, cmp: Comparator) -> Result<Verified<RefTensor>> {
        let draw = noise(n.draw)?;
        self.rejection(args, float(n.accept_uniforms, "accept_uniforms")?, &draw, cmp)
    }

    fn rejection_verify_seeded(&self, args: RejectionArgs<'_, RefTensor>, method: DrawMethod, cmp: Comparator, seed: u64) -> Result<Verified<RefTensor>> {
        // Noise is allocated only for consistent shapes (it is no larger than
        // the inputs then); otherwise the verify call names the defect, with
        // noise too small to matter.
        let drafts = int(args.draft_tokens, "draft_tokens")?;
        let target = float(args.target_probs, "target_probs")?;
        let (batch, k) = match drafts.shape() {
            [b, k] => (*b, *k),
            _ => (0, 0),
        };
        let vocab = target.shape().last().copied().unwrap_or(0);
        let (b, k, v) = if target.shape() == [batch, k + 1, vocab] { (batch, k, vocab) } else { (0, 0, 0) };
        let (u, draw) = seeded_noise(seed, b, k, v, method);
        self.rejection(args, &u, &draw, cmp)
    }

    fn residual(&self, target: &RefTensor, draft: Option<&RefTensor>, drafted: &RefTensor) -> Result<RefTensor> {
        let q = draft.map(|q| float(q, "draft_probs")).transpose()?;
        Ok(RefTensor::F64(r::residual_distribution(float(target, "target_probs")?, q, int(drafted, "drafted")?)?))
    }

    fn process_logits(&self, logits: &RefTensor, p: LogitsParams<'_, RefTensor>) -> Result<RefTensor> {
        let logits = float(logits, "logits")?;
        let (t, k, tp) = (float(p.temperature, "temperature")?, int(p.top_k, "top_k")?, float(p.top_p, "top_p")?);
        let min_p = p.min_p.map(|m| float(m, "min_p")).transpose()?;
        let pen =
            p.penalties.map(|x| Ok::<_, BackendError>([float(x.repetition, "repetition_penalty")?, float(x.presence, "presence_penalty")?, float(x.frequency, "frequency_penalty")?])).transpose()?;
        let rows = logits.shape().first().copied().unwrap_or(0);
        let mut per_row = vec![("temperature", t.shape()), ("top_k", k.shape()), ("top_p", tp.shape())];
        per_row.extend(min_p.map(|m| ("min_p", m.shape())));
        if let Some([r, pr, f]) = pen {
            per_row.extend([("repetition_penalty", r.shape()), ("presence_penalty", pr.shape()), ("frequency_penalty", f.shape())]);
        }
        for (arg, shape) in per_row {
            if shape != [rows] {
                let expected = format!("[R] = [{rows}]");
                return Err(r::SpecError::ShapeMismatch { arg, expected, actual: shape.to_vec() }.into());
            }
        }
        let mut params = Vec::with_capacity(rows);
        for i in 0..rows {
            let top_k = k.data()[i];
            if top_k < 0 {
                return Err(r::SpecError::InvalidParameter { name: "top_k", value: top_k.to_string(), reason: "must be >= 0" }.into());
            }
            let mut row = SamplingParams::new(t.data()[i], top_k as usize, tp.data()[i]);
            if let Some(m) = min_p {
                row.min_p = m.data()[i];
            }
            if let Some([r, pr, f]) = pen {
                (row.repetition_penalty, row.presence_penalty, row.frequency_penalty) = (r.data()[i], pr.data()[i], f.data()[i]);
            }
            params.push(row);
        }
        let counts = p.penalties.map(|x| float(x.counts, "penalty_counts")).transpose()?;
        let bias = p.logit_bias.map(|b| float(b, "logit_bias")).transpose()?;
        Ok(RefTensor::F64(r::process_logits_batch_with(logits, &params, r::BatchInputs { counts, bias })?))
    }

    fn draw(&self, weights: &RefTensor, n: DrawNoiseArg<'_, RefTensor>) -> Result<RefTensor> {
        let drawn = r::sampling::draw_rows(float(weights, "weights")?, &noise(n)?)?;
        Ok(ids(drawn.into_iter().map(|d| d.token)))
    }

    fn ngram_propose(&self, contexts: &RefTensor, lens: &RefTensor, vocab: usize, cfg: &NgramConfig) -> Result<(RefTensor, RefTensor)> {
        let (drafts, lens) = r::ngram::propose_batch(int(contexts, "contexts")?, int(lens, "context_lens")?, vocab, cfg)?;
        Ok((RefTensor::I64(drafts), ids(lens)))
    }

    fn kv_new(&self, batch: usize, heads: usize, head_dim: usize, capacity: usize) -> Result<BatchKvCache> {
        Ok(BatchKvCache::new(batch, heads, head_dim, capacity)?)
    }

    fn kv_append(&self, cache: &mut BatchKvCache, keys: &RefTensor, values: &RefTensor, counts: &RefTensor) -> Result<()> {
        Ok(cache.append(float(keys, "new_keys")?, float(values, "new_values")?, int(counts, "counts")?)?)
    }

    fn kv_trim(&self, cache: &mut BatchKvCache, amounts: &RefTensor, mode: TrimMode) -> Result<RefTensor> {
        let amounts = int(amounts, "amounts")?;
        match mode {
            TrimMode::Strict => {
                cache.trim_variable(amounts)?;
                Ok(RefTensor::I64(amounts.clone()))
            }
            TrimMode::Clamped => Ok(ids(cache.trim_clamped(amounts)?)),
        }
    }

    fn kv_lens(&self, cache: &BatchKvCache) -> Result<RefTensor> {
        Ok(ids(cache.lens().iter().copied()))
    }

    fn kv_contents(&self, cache: &BatchKvCache) -> Result<(RefTensor, RefTensor)> {
        let (batch, heads, dim) = cache.dims();
        let max = cache.lens().iter().copied().max().unwrap_or(0);
        let mut keys = vec![0.0; batch * heads * max * dim];
        let mut values = keys.clone();
        for b in 0..batch {
            let (k, v) = cache.sequence(b).expect("b < batch");
            let len = cache.lens()[b];
            for h in 0..heads {
                let dst = (b * heads + h) * max * dim;
                let src = h * len * dim;
                keys[dst..dst + len * dim].copy_from_slice(&k.data()[src..src + len * dim]);
                values[dst..dst + len * dim].copy_from_slice(&v.data()[src..src + len * dim]);
            }
        }
        let shape = vec![batch, heads, max, dim];
        Ok((RefTensor::F64(Tensor::new(shape.clone(), keys)?), RefTensor::F64(Tensor::new(shape, values)?)))
    }

    fn paged_gather(&self, pages: &RefTensor, table: &RefTensor, lens: &RefTensor) -> Result<RefTensor> {
        let out = r::kvcache::gather_paged(float(pages, "pages")?, int(table, "block_table")?, int(lens, "context_lens")?)?;
        Ok(RefTensor::F64(out))
    }

    // GLUE-1 .. GLUE-4: the host semantics in `crate::glue`, on either dtype.

    fn reshape(&self, t: &RefTensor, shape: &[usize]) -> Result<RefTensor> {
        Ok(match t {
            RefTensor::F64(t) => RefTensor::F64(glue::reshape(t, shape)?),
            RefTensor::I64(t) => RefTensor::I64(glue::reshape(t, shape)?),
        })
    }

    fn gather_rows(&self, t: &RefTensor, rows: &RefTensor) -> Result<RefTensor> {
        let rows = int(rows, "rows")?;
        Ok(match t {
            RefTensor::F64(t) => RefTensor::F64(glue::gather_rows(t, rows)?),
            RefTensor::I64(t) => RefTensor::I64(glue::gather_rows(t, rows)?),
        })
    }

    fn concat_rows(&self, parts: &[&RefTensor]) -> Result<RefTensor> {
        // The dtype of the first part decides; a part of the other dtype is a
        // caller bug, reported like any wrong-dtype argument.
        match parts.first() {
            Some(RefTensor::I64(_)) => {
                let ints = parts.iter().map(|p| int(p, "parts")).collect::<Result<Vec<_>>>()?;
                Ok(RefTensor::I64(glue::concat_rows(&ints)?))
            }
            _ => {
                let floats = parts.iter().map(|p| float(p, "parts")).collect::<Result<Vec<_>>>()?;
                Ok(RefTensor::F64(glue::concat_rows(&floats)?))
            }
        }
    }

    fn add_i64(&self, a: &RefTensor, b: &RefTensor) -> Result<RefTensor> {
        Ok(RefTensor::I64(glue::int_op(glue::IntOp::Add, int(a, "a")?, int(b, "b")?)?))
    }

    fn sub_i64(&self, a: &RefTensor, b: &RefTensor) -> Result<RefTensor> {
        Ok(RefTensor::I64(glue::int_op(glue::IntOp::Sub, int(a, "a")?, int(b, "b")?)?))
    }
}
