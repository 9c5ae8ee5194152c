//! [`NdarrayBackend`]'s constructor and the [`Backend`] methods: each checks
//! its inputs in one pass (`check`, `verify`, `sampling`) and calls a kernel.

use ndarray::{ArrayD, ArrayView, Dimension};
use specdec_backend::{
    Backend, BackendError, Comparator, DflashAccepted, DrawMethod, DrawNoiseArg, HostTensor, LogitsParams, NgramConfig, Precision, RefTensor, ReferenceBackend, RejectionArgs, RejectionNoise, Result,
    TrimMode, Verified,
};

use crate::check::{d1, d2, d3};
use crate::tensor::{NAME, device, host, upload};
use crate::verify::{Checks, Noise, RejectionIn};
use crate::{NdKvCache, NdTensor, NdarrayBackend, glue, kv, ngram, sampling, verify};

impl NdarrayBackend {
    pub fn new() -> Self {
        NdarrayBackend
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
        let (s, d, l) = (scores.floats("target_scores")?, drafts.ints("draft_tokens")?, lens.ints("proposal_lens")?);
        // The reference names the defect (a layout-only failure is one too).
        let named = || BackendError::named_by_reference(NAME, ReferenceBackend.greedy_verify(&scores.to_ref(), &drafts.to_ref(), &lens.to_ref()));
        let layout = verify::greedy_ok(s, d, l).ok_or_else(named)?;
        verify::greedy(view(d3(s), "target_scores")?, view(d2(d), "draft_tokens")?, &layout, checks).map(verified).ok_or_else(named)
    }

    /// REJECT-1 .. REJECT-5 with the given noise (explicit or seeded). With
    /// `Checks::LayoutOnly` (GLUE-6) an input that fails even the layout
    /// check is still named by the reference, which checks everything.
    pub(crate) fn rejection(&self, args: &RejectionArgs<'_, NdTensor>, u: &ArrayD<f64>, noise: Noise<'_>, cmp: Comparator, checks: Checks) -> Result<Verified<NdTensor>> {
        let input = RejectionIn {
            p: args.target_probs.floats("target_probs")?,
            q: args.draft_probs.map(|q| q.floats("draft_probs")).transpose()?,
            drafts: args.draft_tokens.ints("draft_tokens")?,
            lens: args.proposal_lens.ints("proposal_lens")?,
            u,
            noise,
        };
        let Some(layout) = verify::rejection_ok(&input, checks) else {
            return Err(BackendError::named_by_reference(NAME, reference_rejection(args, u, noise, cmp)));
        };
        verify::rejection(&input, &layout, cmp).map(verified).ok_or_else(|| device("rejection inputs changed rank after validation"))
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
        NAME.to_string()
    }

    fn device(&self) -> String {
        "cpu".to_string()
    }

    fn precision(&self) -> Precision {
        Precision { float_dtype: "f64", accumulate_dtype: "f64", margin_epsilon: 0.0, value_tolerance: 0.0 }
    }

    fn upload_f64(&self, t: &HostTensor<f64>) -> Result<NdTensor> {
        upload(t).map(NdTensor::F64)
    }

    fn upload_i64(&self, t: &HostTensor<i64>) -> Result<NdTensor> {
        upload(t).map(NdTensor::I64)
    }

    fn download_f64(&self, t: &NdTensor) -> Result<HostTensor<f64>> {
        t.floats("tensor").map(host)
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
        let u = noise.accept_uniforms.floats("accept_uniforms")?;
        let draw = match noise.draw {
            DrawNoiseArg::InverseCdf(t) => Noise::Uniforms(t.floats("draw_uniforms")?),
            DrawNoiseArg::ExponentialRace(t) => Noise::Exponentials(t.floats("draw_exponentials")?),
        };
        self.rejection(&args, u, draw, cmp, Checks::All)
    }

    /// GLUE-6: as [`NdarrayBackend::greedy_verify_unchecked`]; probability
    /// and noise rows are not checked.
    fn rejection_verify_unchecked(&self, args: RejectionArgs<'_, NdTensor>, noise: RejectionNoise<'_, NdTensor>, cmp: Comparator) -> Result<Verified<NdTensor>> {
        let u = noise.accept_uniforms.floats("accept_uniforms")?;
        let draw = match noise.draw {
            DrawNoiseArg::InverseCdf(t) => Noise::Uniforms(t.floats("draw_uniforms")?),
            DrawNoiseArg::ExponentialRace(t) => Noise::Exponentials(t.floats("draw_exponentials")?),
        };
        self.rejection(&args, u, draw, cmp, Checks::LayoutOnly)
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
        let vocab = args.target_probs.floats("target_probs")?.shape().last().copied().unwrap_or(0);
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
        let x = drafted.ints("drafted")?;
        if !verify::residual_ok(p, q, x) {
            let q_ref = draft.map(NdTensor::to_ref);
            return Err(BackendError::named_by_reference(NAME, ReferenceBackend.residual(&target.to_ref(), q_ref.as_ref(), &drafted.to_ref())));
        }
        let q = q.map(|q| view(d2(q), "draft_probs")).transpose()?;
        Ok(floats(verify::residual(view(d2(p), "target_probs")?, q, view(d1(x), "drafted")?)))
    }

    fn process_logits(&self, logits: &NdTensor, params: LogitsParams<'_, NdTensor>) -> Result<NdTensor> {
        let input =
            sampling::LogitsIn { logits: logits.floats("logits")?, temperature: params.temperature.floats("temperature")?, top_k: params.top_k.ints("top_k")?, top_p: params.top_p.floats("top_p")? };
        let named = || {
            let (t, k, p) = (params.temperature.to_ref(), params.top_k.to_ref(), params.top_p.to_ref());
            BackendError::named_by_reference(NAME, ReferenceBackend.process_logits(&logits.to_ref(), LogitsParams { temperature: &t, top_k: &k, top_p: &p }))
        };
        if !sampling::logits_ok(&input) {
            return Err(named());
        }
        let processed = sampling::process_logits(view(d2(input.logits), "logits")?, view(d1(input.temperature), "temperature")?, view(d1(input.top_k), "top_k")?, view(d1(input.top_p), "top_p")?);
        processed.map(floats).ok_or_else(named)
    }

    fn draw(&self, weights: &NdTensor, noise: DrawNoiseArg<'_, NdTensor>) -> Result<NdTensor> {
        let w = weights.floats("weights")?;
        let (n, uniforms) = match noise {
            DrawNoiseArg::InverseCdf(t) => (t.floats("draw_uniforms")?, true),
            DrawNoiseArg::ExponentialRace(t) => (t.floats("draw_exponentials")?, false),
        };
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
        cache.append(keys.floats("new_keys")?, values.floats("new_values")?, counts.ints("counts")?)
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
