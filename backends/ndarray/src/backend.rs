//! [`NdarrayBackend`]'s constructor and the [`Backend`] methods: each checks
//! its inputs in one pass (`check`, `verify`, `sampling`) and calls a kernel.

use ndarray::{ArrayD, ArrayView, Dimension};
use specdec_backend::processors::{self, ProcessorKernels};
use specdec_backend::{
    Backend, BackendError, Comparator, DflashAccepted, DrawMethod, DrawNoiseArg, HostTensor, LogitsParams, NgramConfig, Penalties, Precision, RefTensor, ReferenceBackend, RejectionArgs,
    RejectionNoise, Result, TrimMode, Verified,
};

use crate::check::{d1, d2, d3};
use crate::kernels::Float;
use crate::tensor::{NAME, device, host, upload};
use crate::verify::{Checks, Noise, RejectionIn};
use crate::{NdKvCache, NdTensor, NdarrayBackend, Softmax, WeightFormat, glue, kv, ngram, sampling, softmax_f32, verify};

impl NdarrayBackend {
    /// f32 model weights, f64 verify kernels.
    pub fn new() -> Self {
        NdarrayBackend { weights: WeightFormat::F32, softmax: Softmax::F64 }
    }

    /// Q8_0 model weights (`ndarray-q8_0`); the verify kernels are the same.
    pub fn q8_0() -> Self {
        NdarrayBackend { weights: WeightFormat::Q8_0, softmax: Softmax::F64 }
    }

    /// f32 model weights and the vectorised f32 softmax (`ndarray-f32`).
    pub fn f32_softmax() -> Self {
        NdarrayBackend { weights: WeightFormat::F32, softmax: Softmax::F32 }
    }
}

fn ints<D: Dimension>(a: ndarray::Array<i64, D>) -> NdTensor {
    NdTensor::I64(a.into_dyn())
}

fn floats<D: Dimension>(a: ndarray::Array<f64, D>) -> NdTensor {
    NdTensor::F64(a.into_dyn())
}

fn verified((tokens, n): verify::Emitted) -> Verified<NdTensor> {
    Verified { tokens: ints(tokens), num_accepted: ints(n) }
}

/// The reference's verdict on a rejection verify, used only to name a defect.
fn reference_rejection(args: &RejectionArgs<'_, NdTensor>, u: &ArrayD<f64>, noise: Noise<'_>, cmp: Comparator) -> Result<Verified<RefTensor>> {
    let (p, d, l) = (args.target_probs.to_ref(), args.draft_tokens.to_ref(), args.proposal_lens.to_ref());
    let q = args.draft_probs.map(NdTensor::to_ref);
    let u = RefTensor::F64(host(u));
    let draw_tensor = match noise {
        Noise::Uniforms(a) | Noise::Exponentials(a) => RefTensor::F64(host(a)),
    };
    let draw = match noise {
        Noise::Uniforms(_) => DrawNoiseArg::InverseCdf(&draw_tensor),
        Noise::Exponentials(_) => DrawNoiseArg::ExponentialRace(&draw_tensor),
    };
    let rargs = RejectionArgs { target_probs: &p, draft_probs: q.as_ref(), draft_tokens: &d, proposal_lens: &l };
    ReferenceBackend.rejection_verify(rargs, RejectionNoise { accept_uniforms: &u, draw }, cmp)
}

impl NdarrayBackend {
    pub(crate) fn greedy(&self, scores: &NdTensor, drafts: &NdTensor, lens: &NdTensor, checks: Checks) -> Result<Verified<NdTensor>> {
        let (d, l) = (drafts.ints("draft_tokens")?, lens.ints("proposal_lens")?);
        // The reference names the defect (a layout-only failure is one too).
        let named = || BackendError::named_by_reference(NAME, ReferenceBackend.greedy_verify(&scores.to_ref(), &drafts.to_ref(), &lens.to_ref()));
        fn run<F: Float>(s: &ArrayD<F>, d: &ArrayD<i64>, l: &ArrayD<i64>, checks: Checks, named: impl Fn() -> BackendError) -> Result<Verified<NdTensor>> {
            let layout = verify::greedy_ok(s, d, l).ok_or_else(&named)?;
            verify::greedy(view(d3(s), "target_scores")?, view(d2(d), "draft_tokens")?, &layout, checks).map(verified).ok_or_else(named)
        }
        // f32 scores (`ndarray-f32`'s uploads and logits) are read as they are.
        match scores {
            NdTensor::F32(s) => run(s, d, l, checks, named),
            _ => run(&*scores.floats("target_scores")?, d, l, checks, named),
        }
    }

    /// REJECT-1 .. REJECT-5 with the given noise (explicit or seeded). With
    /// `Checks::LayoutOnly` (GLUE-6) an input that fails even the layout
    /// check is still named by the reference, which checks everything.
    pub(crate) fn rejection(&self, args: &RejectionArgs<'_, NdTensor>, u: &ArrayD<f64>, noise: Noise<'_>, cmp: Comparator, checks: Checks) -> Result<Verified<NdTensor>> {
        let (drafts, lens) = (args.draft_tokens.ints("draft_tokens")?, args.proposal_lens.ints("proposal_lens")?);
        let named = || BackendError::named_by_reference(NAME, reference_rejection(args, u, noise, cmp));
        // f32 probabilities (`ndarray-f32`'s) are read as they are; a mix
        // of f32 and f64 is widened to f64.
        match (args.target_probs, args.draft_probs) {
            (NdTensor::F32(p), None) => judged(&RejectionIn { p, q: None, drafts, lens, u, noise }, checks, cmp, named),
            (NdTensor::F32(p), Some(NdTensor::F32(q))) => judged(&RejectionIn { p, q: Some(q), drafts, lens, u, noise }, checks, cmp, named),
            _ => {
                let p = args.target_probs.floats("target_probs")?;
                let q = args.draft_probs.map(|q| q.floats("draft_probs")).transpose()?;
                judged(&RejectionIn { p: &p, q: q.as_deref(), drafts, lens, u, noise }, checks, cmp, named)
            }
        }
    }
}

/// The checks, then the verify; `named` names a defect the checks found.
fn judged<F: Float>(input: &RejectionIn<'_, F>, checks: Checks, cmp: Comparator, named: impl FnOnce() -> BackendError) -> Result<Verified<NdTensor>> {
    let Some(layout) = verify::rejection_ok(input, checks) else { return Err(named()) };
    verify::rejection(input, &layout, cmp).map(verified).ok_or_else(|| device("rejection inputs changed rank after validation"))
}

impl NdarrayBackend {
    /// [`NdarrayBackend::rejection`] with the caller's noise tensors.
    fn rejection_explicit(&self, args: &RejectionArgs<'_, NdTensor>, noise: RejectionNoise<'_, NdTensor>, cmp: Comparator, checks: Checks) -> Result<Verified<NdTensor>> {
        let u = noise.accept_uniforms.floats("accept_uniforms")?;
        let (draw, uniforms) = match noise.draw {
            DrawNoiseArg::InverseCdf(t) => (t.floats("draw_uniforms")?, true),
            DrawNoiseArg::ExponentialRace(t) => (t.floats("draw_exponentials")?, false),
        };
        let draw = if uniforms { Noise::Uniforms(&draw) } else { Noise::Exponentials(&draw) };
        self.rejection(args, &u, draw, cmp, checks)
    }
}

/// A view the fast check has already proven to exist.
fn view<'a, T, D: Dimension>(a: Option<ArrayView<'a, T, D>>, what: &str) -> Result<ArrayView<'a, T, D>> {
    a.ok_or_else(|| device(format!("`{what}` changed rank after validation")))
}

impl Backend for NdarrayBackend {
    type Tensor = NdTensor;
    type KvCache = NdKvCache;

    fn name(&self) -> String {
        match (self.weights, self.softmax) {
            (WeightFormat::F32, Softmax::F64) => NAME.to_string(),
            (WeightFormat::Q8_0, Softmax::F64) => format!("{NAME}-q8_0"),
            (WeightFormat::F32, Softmax::F32) => format!("{NAME}-f32"),
            (WeightFormat::Q8_0, Softmax::F32) => format!("{NAME}-q8_0-f32"),
        }
    }

    fn device(&self) -> String {
        "cpu".to_string()
    }

    fn precision(&self) -> Precision {
        match self.softmax {
            Softmax::F64 => Precision { float_dtype: "f64", accumulate_dtype: "f64", margin_epsilon: 0.0, value_tolerance: 0.0 },
            // A probability is within about 2.2e-7 of the reference's,
            // relative (`softmax_f32.rs`), and a ratio p / q that decides an
            // acceptance within 4.4e-7; the statements leave a factor of 2.
            Softmax::F32 => Precision { float_dtype: "f32", accumulate_dtype: "f64", margin_epsilon: 1e-6, value_tolerance: 1e-6 },
        }
    }

    fn upload_f64(&self, t: &HostTensor<f64>) -> Result<NdTensor> {
        upload(t).map(NdTensor::F64)
    }

    fn upload_i64(&self, t: &HostTensor<i64>) -> Result<NdTensor> {
        upload(t).map(NdTensor::I64)
    }

    /// `ndarray-f32` keeps f32 data (a model's logits) as f32; the f64
    /// port widens it, as the contract's default does.
    fn upload_f32(&self, t: &HostTensor<f32>) -> Result<NdTensor> {
        match self.softmax {
            Softmax::F32 => upload(t).map(NdTensor::F32),
            Softmax::F64 => self.upload_f64(&t.map(|&x| f64::from(x))),
        }
    }

    fn download_f64(&self, t: &NdTensor) -> Result<HostTensor<f64>> {
        t.floats("tensor").map(|a| host(&a))
    }

    fn download_i64(&self, t: &NdTensor) -> Result<HostTensor<i64>> {
        t.ints("tensor").map(host)
    }

    fn greedy_verify(&self, scores: &NdTensor, drafts: &NdTensor, lens: &NdTensor) -> Result<Verified<NdTensor>> {
        self.greedy(scores, drafts, lens, Checks::All)
    }

    /// GLUE-6: shapes and the O(B k) draft layout are still checked (they
    /// keep every index in range); the score rows are not.
    fn greedy_verify_unchecked(&self, scores: &NdTensor, drafts: &NdTensor, lens: &NdTensor) -> Result<Verified<NdTensor>> {
        self.greedy(scores, drafts, lens, Checks::LayoutOnly)
    }

    fn dflash_accept(&self, candidates: &NdTensor, predict: &NdTensor, vocab: usize) -> Result<DflashAccepted<NdTensor>> {
        let (c, p) = (candidates.ints("candidates")?, predict.ints("target_predict")?);
        if !verify::dflash_ok(c, p, vocab) {
            return Err(BackendError::named_by_reference(NAME, ReferenceBackend.dflash_accept(&candidates.to_ref(), &predict.to_ref(), vocab)));
        }
        let (accept_len, bonus) = verify::dflash(view(d2(c), "candidates")?, view(d2(p), "target_predict")?);
        Ok(DflashAccepted { accept_len: ints(accept_len), bonus: ints(bonus) })
    }

    fn rejection_verify(&self, args: RejectionArgs<'_, NdTensor>, noise: RejectionNoise<'_, NdTensor>, cmp: Comparator) -> Result<Verified<NdTensor>> {
        self.rejection_explicit(&args, noise, cmp, Checks::All)
    }

    /// GLUE-6: as [`NdarrayBackend::greedy_verify_unchecked`]; probability
    /// and noise rows are not checked.
    fn rejection_verify_unchecked(&self, args: RejectionArgs<'_, NdTensor>, noise: RejectionNoise<'_, NdTensor>, cmp: Comparator) -> Result<Verified<NdTensor>> {
        self.rejection_explicit(&args, noise, cmp, Checks::LayoutOnly)
    }

    /// The backend's own generator: `rand_pcg::Pcg64::seed_from_u64(seed)`
    /// fills, in row-major order, the accept uniforms `[B, k]` and then the
    /// draw noise (`[B, k+1]` uniforms or `[B, k+1, V]` Exp(1) values
    /// `-ln(1 - u)`, redrawing `u = 0`), each as one whole array; every row
    /// owns its own stretch of the stream, so rows get independent noise.
    /// This is the layout of the reference backend's seeded noise, so the
    /// two agree for equal seeds.
    fn rejection_verify_seeded(&self, args: RejectionArgs<'_, NdTensor>, method: DrawMethod, cmp: Comparator, seed: u64) -> Result<Verified<NdTensor>> {
        let drafts = args.draft_tokens.ints("draft_tokens")?;
        let vocab = args.target_probs.shape().last().copied().unwrap_or(0);
        let (batch, k) = match drafts.shape() {
            [b, k] => (*b, *k),
            _ => (0, 0),
        };
        let (u, draw) = verify::seeded_noise(seed, batch, k, vocab, method);
        let noise = match method {
            DrawMethod::InverseCdf => Noise::Uniforms(&draw),
            DrawMethod::ExponentialRace => Noise::Exponentials(&draw),
        };
        self.rejection(&args, &u, noise, cmp, Checks::All)
    }

    fn residual(&self, target: &NdTensor, draft: Option<&NdTensor>, drafted: &NdTensor) -> Result<NdTensor> {
        let p = target.floats("target_probs")?;
        let q = draft.map(|q| q.floats("draft_probs")).transpose()?;
        let (p, q, x) = (&*p, q.as_deref(), drafted.ints("drafted")?);
        if !verify::residual_ok(p, q, x) {
            let q_ref = draft.map(NdTensor::to_ref);
            return Err(BackendError::named_by_reference(NAME, ReferenceBackend.residual(&target.to_ref(), q_ref.as_ref(), &drafted.to_ref())));
        }
        let q = q.map(|q| view(d2(q), "draft_probs")).transpose()?;
        Ok(floats(verify::residual(view(d2(p), "target_probs")?, q, view(d1(x), "drafted")?)))
    }

    fn process_logits(&self, logits: &NdTensor, params: LogitsParams<'_, NdTensor>) -> Result<NdTensor> {
        processors::process_with_processors(self, logits, params)
    }

    fn draw(&self, weights: &NdTensor, noise: DrawNoiseArg<'_, NdTensor>) -> Result<NdTensor> {
        let w = weights.floats("weights")?;
        let (n, uniforms) = match noise {
            DrawNoiseArg::InverseCdf(t) => (t.floats("draw_uniforms")?, true),
            DrawNoiseArg::ExponentialRace(t) => (t.floats("draw_exponentials")?, false),
        };
        let (w, n) = (&*w, &*n);
        if !sampling::draw_ok(w, n, uniforms) {
            let n_ref = RefTensor::F64(host(n));
            let arg = if uniforms { DrawNoiseArg::InverseCdf(&n_ref) } else { DrawNoiseArg::ExponentialRace(&n_ref) };
            return Err(BackendError::named_by_reference(NAME, ReferenceBackend.draw(&weights.to_ref(), arg)));
        }
        let w = view(d2(w), "weights")?;
        let ids = if uniforms { sampling::inverse_cdf(w, view(d1(n), "draw_uniforms")?) } else { sampling::exponential_race(w, view(d2(n), "draw_exponentials")?) };
        Ok(ints(ids.mapv(|i| i as i64)))
    }

    fn ngram_propose(&self, contexts: &NdTensor, lens: &NdTensor, vocab: usize, cfg: &NgramConfig) -> Result<(NdTensor, NdTensor)> {
        let (c, l) = (contexts.ints("contexts")?, lens.ints("context_lens")?);
        let Some(lens_ok) = ngram::ngram_ok(c, l, vocab, cfg) else {
            return Err(BackendError::named_by_reference(NAME, ReferenceBackend.ngram_propose(&contexts.to_ref(), &lens.to_ref(), vocab, cfg)));
        };
        let (drafts, plen) = ngram::propose(view(d2(c), "contexts")?, lens_ok.view(), cfg);
        Ok((ints(drafts), ints(plen)))
    }

    fn kv_new(&self, batch: usize, heads: usize, head_dim: usize, capacity: usize) -> Result<NdKvCache> {
        NdKvCache::new(batch, heads, head_dim, capacity)
    }

    fn kv_append(&self, cache: &mut NdKvCache, keys: &NdTensor, values: &NdTensor, counts: &NdTensor) -> Result<()> {
        cache.append(&*keys.floats("new_keys")?, &*values.floats("new_values")?, counts.ints("counts")?)
    }

    fn kv_trim(&self, cache: &mut NdKvCache, amounts: &NdTensor, mode: TrimMode) -> Result<NdTensor> {
        cache.trim(amounts.ints("amounts")?, mode).map(ints)
    }

    fn kv_lens(&self, cache: &NdKvCache) -> Result<NdTensor> {
        Ok(ints(cache.lens()))
    }

    fn kv_contents(&self, cache: &NdKvCache) -> Result<(NdTensor, NdTensor)> {
        let (k, v) = cache.contents();
        Ok((floats(k), floats(v)))
    }

    fn paged_gather(&self, pages: &NdTensor, table: &NdTensor, lens: &NdTensor) -> Result<NdTensor> {
        let (p, t, l) = (pages.floats("pages")?, table.ints("block_table")?, lens.ints("context_lens")?);
        let p = &*p;
        let Some(lens_ok) = kv::paged_ok(p, t, l) else {
            return Err(BackendError::named_by_reference(NAME, ReferenceBackend.paged_gather(&pages.to_ref(), &table.to_ref(), &lens.to_ref())));
        };
        let pages4 = view(p.view().into_dimensionality::<ndarray::Ix4>().ok(), "pages")?;
        Ok(floats(kv::paged_gather(pages4, view(d2(t), "block_table")?, lens_ok.view())))
    }

    fn reshape(&self, t: &NdTensor, shape: &[usize]) -> Result<NdTensor> {
        self.glue_reshape(t, shape)
    }

    fn gather_rows(&self, t: &NdTensor, rows: &NdTensor) -> Result<NdTensor> {
        self.glue_gather_rows(t, rows)
    }

    fn concat_rows(&self, parts: &[&NdTensor]) -> Result<NdTensor> {
        self.glue_concat_rows(parts)
    }

    fn add_i64(&self, a: &NdTensor, b: &NdTensor) -> Result<NdTensor> {
        self.glue_int_op(glue::IntOp::Add, a, b)
    }

    fn sub_i64(&self, a: &NdTensor, b: &NdTensor) -> Result<NdTensor> {
        self.glue_int_op(glue::IntOp::Sub, a, b)
    }
}

/// LOGITS-7 .. LOGITS-10 as loops over the f64 arrays.
impl ProcessorKernels for NdarrayBackend {
    fn processor_inputs_ok(&self, logits: &NdTensor, p: &LogitsParams<'_, NdTensor>) -> Result<bool> {
        let &[rows, vocab] = logits.shape() else { return Ok(false) };
        let per_row = |t: &NdTensor, arg: &str, ok: &dyn Fn(f64) -> bool| -> Result<bool> {
            let a = t.floats(arg)?;
            Ok(a.shape() == [rows] && a.iter().all(|&x| ok(x)))
        };
        let per_id = |t: &NdTensor, arg: &str, ok: &dyn Fn(f64) -> bool| -> Result<bool> {
            let a = t.floats(arg)?;
            Ok(a.shape() == [rows, vocab] && a.iter().all(|&x| ok(x)))
        };
        let mut ok = true;
        if let Some(m) = p.min_p {
            ok &= per_row(m, "min_p", &|x| (0.0..=1.0).contains(&x))?;
        }
        if let Some(x) = p.penalties {
            ok &= per_id(x.counts, "penalty_counts", &|c| c.is_finite() && c >= 0.0 && c.fract() == 0.0)?;
            ok &= per_row(x.repetition, "repetition_penalty", &|r| r.is_finite() && r > 0.0)?;
            ok &= per_row(x.presence, "presence_penalty", &f64::is_finite)?;
            ok &= per_row(x.frequency, "frequency_penalty", &f64::is_finite)?;
        }
        if let Some(b) = p.logit_bias {
            ok &= per_id(b, "logit_bias", &f64::is_finite)?;
        }
        Ok(ok)
    }

    fn bias_and_penalties(&self, logits: &NdTensor, penalties: Option<Penalties<'_, NdTensor>>, bias: Option<&NdTensor>) -> Result<NdTensor> {
        // One copy: f32 logits are widened into the array the processors edit.
        let mut z = logits.floats("logits")?.into_owned().into_dimensionality::<ndarray::Ix2>().map_err(device)?;
        if let Some(b) = bias {
            z += &view(d2(&*b.floats("logit_bias")?), "logit_bias")?;
        }
        if let Some(x) = penalties {
            let (counts, rep, pres, freq) =
                (x.counts.floats("penalty_counts")?, x.repetition.floats("repetition_penalty")?, x.presence.floats("presence_penalty")?, x.frequency.floats("frequency_penalty")?);
            let counts = view(d2(&counts), "penalty_counts")?;
            let (rep, pres, freq) = (view(d1(&rep), "repetition_penalty")?, view(d1(&pres), "presence_penalty")?, view(d1(&freq), "frequency_penalty")?);
            for (r, (mut row, c)) in z.outer_iter_mut().zip(counts.outer_iter()).enumerate() {
                for (l, &c) in row.iter_mut().zip(c) {
                    if c > 0.0 {
                        *l = if *l > 0.0 { *l / rep[r] } else { *l * rep[r] };
                        *l -= c * freq[r] + pres[r];
                    }
                }
            }
        }
        Ok(floats(z))
    }

    fn min_p_cut(&self, logits: &NdTensor, params: LogitsParams<'_, NdTensor>, probs: &NdTensor, min_p: &NdTensor) -> Result<NdTensor> {
        let mut p = view(d2(&*probs.floats("probs")?), "probs")?.to_owned();
        let (z, m, t) = (logits.floats("logits")?, min_p.floats("min_p")?, params.temperature.floats("temperature")?);
        let (z, m, t) = (view(d2(&z), "logits")?, view(d1(&m), "min_p")?, view(d1(&t), "temperature")?);
        for (r, mut row) in p.outer_iter_mut().enumerate() {
            if m[r] == 0.0 || t[r] == 0.0 {
                continue; // off, or greedy (LOGITS-2)
            }
            // The reference's arithmetic, for bit equality: the kept ids'
            // weights exp((l - max) / T), summed in index order.
            let threshold = m[r] * row.fold(0.0f64, |a, &x| a.max(x));
            let max = z.row(r).fold(f64::NEG_INFINITY, |a, &x| a.max(x));
            let weights: Vec<f64> = row.iter().zip(z.row(r)).map(|(&x, &l)| if x > 0.0 && x >= threshold { ((l - max) / t[r]).exp() } else { 0.0 }).collect();
            let total: f64 = weights.iter().sum();
            for (x, w) in row.iter_mut().zip(weights) {
                *x = w / total;
            }
        }
        Ok(floats(p))
    }

    fn basic_process_logits(&self, logits: &NdTensor, params: LogitsParams<'_, NdTensor>) -> Result<NdTensor> {
        let (t, k, p) = (params.temperature.floats("temperature")?, params.top_k.ints("top_k")?, params.top_p.floats("top_p")?);
        let named = || {
            let (t, k, p) = (params.temperature.to_ref(), params.top_k.to_ref(), params.top_p.to_ref());
            BackendError::named_by_reference(NAME, ReferenceBackend.process_logits(&logits.to_ref(), LogitsParams::new(&t, &k, &p)))
        };
        if matches!(logits, NdTensor::I64(_)) || !sampling::logits_ok(logits.shape(), &t, k, &p) {
            return Err(named());
        }
        let (t, k, p) = (view(d1(&t), "temperature")?, view(d1(k), "top_k")?, view(d1(&p), "top_p")?);
        let vocab = logits.shape()[1];
        let processed = match (self.softmax, logits) {
            // The vectorised f32 rows, reading f32 or f64 logits as they are.
            (Softmax::F32, NdTensor::F32(z)) if !sampling::sorts_needed(vocab, t, k, p) => softmax_f32::process(view(d2(z), "logits")?, t),
            (Softmax::F32, NdTensor::F64(z)) if !sampling::sorts_needed(vocab, t, k, p) => softmax_f32::process(view(d2(z), "logits")?, t),
            _ => sampling::process_logits(view(d2(&*logits.floats("logits")?), "logits")?, t, k, p).map(floats),
        };
        processed.ok_or_else(named)
    }
}
