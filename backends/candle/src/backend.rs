//! [`CandleBackend`]'s constructors, transfers and the [`Backend`] methods:
//! each checks shapes on the host, reduces the device-side value checks to one
//! flag, and calls a kernel (`verify`, `sampling`, `kv`, `ngram`, `noise`).

use candle_core::{DType, Device, Tensor};
use specdec_backend::processors::{self, ProcessorKernels};
use specdec_backend::{
    Backend, BackendError, Comparator, DflashAccepted, DrawMethod, DrawNoiseArg, HostTensor, LogitsParams, NgramConfig, Penalties, Precision, RefTensor, ReferenceBackend, RejectionArgs,
    RejectionNoise, Result, TrimMode, Verified,
};
use specdec_reference::kvcache::BatchKvCache;
use specdec_reference::{MAX_EXPONENTIAL, MIN_EXPONENTIAL};

use crate::kernels::{any_of, read_flags};
use crate::verify::{Draw, RejectInputs};
use crate::{CandleBackend, CandleKvCache, WeightFormat, check, glue, kernels, kv, ngram, noise, sampling, verify};

/// See the crate documentation for the numbers.
const PRECISION: Precision = Precision { float_dtype: "f32", accumulate_dtype: "f64", margin_epsilon: 1e-6, value_tolerance: 1e-5 };

/// The device tensors of an explicit-noise rejection verify.
struct RejectionOperands {
    p: Tensor,
    q: Option<Tensor>,
    d: Tensor,
    l: Tensor,
    u: Tensor,
    /// Uniforms `[B, k+1]` or exponentials `[B, k+1, V]`.
    n: Tensor,
    uniform: bool,
    dims_ok: bool,
}

impl CandleBackend {
    /// The CPU device (`"candle-cpu"`).
    pub fn cpu() -> Self {
        CandleBackend { device: Device::Cpu, name: "candle-cpu", weights: WeightFormat::F32 }
    }

    /// The CPU device with f16 model weights (`"candle-cpu-f16"`).
    pub fn cpu_f16() -> Self {
        CandleBackend { device: Device::Cpu, name: "candle-cpu-f16", weights: WeightFormat::F16 }
    }

    /// The CPU device with Q8_0 model weights (`"candle-cpu-q8_0"`).
    pub fn cpu_q8_0() -> Self {
        CandleBackend { device: Device::Cpu, name: "candle-cpu-q8_0", weights: WeightFormat::Q8_0 }
    }

    /// How this backend holds model weights.
    pub fn weight_format(&self) -> WeightFormat {
        self.weights
    }

    /// CUDA device `ordinal` (`"candle-cuda"`): an error in a build without
    /// the `cuda` feature, or without a usable GPU. One body for both builds
    /// (candle's `new_cuda` exists either way), so this code is compiled and
    /// checked even where the CUDA toolkit is absent.
    pub fn cuda(ordinal: usize) -> Result<Self, String> {
        if !cfg!(feature = "cuda") {
            return Err("built without the `cuda` feature".to_string());
        }
        // A driver that fails inside cudarc must read as "no GPU", not abort the caller.
        let device = std::panic::catch_unwind(|| Device::new_cuda(ordinal)).map_err(|_| format!("opening CUDA device {ordinal} panicked"))?.map_err(|e| format!("no CUDA device {ordinal}: {e}"))?;
        #[cfg(feature = "cuda")]
        if let Device::Cuda(d) = &device {
            // cudarc creates and destroys two CUDA events with every buffer,
            // to order its uses across streams; candle runs every op of a
            // device on its one stream, so the events are never waited on,
            // and with ~1,700 small ops per SmolLM2 step they cost milliseconds.
            // SAFETY: only buffers allocated after this call skip the events,
            // and all of them are used on this device's single stream.
            unsafe { d.disable_event_tracking() };
        }
        Ok(CandleBackend { device, name: "candle-cuda", weights: WeightFormat::F32 })
    }

    /// The candle device the tensors live on.
    pub fn candle_device(&self) -> &Device {
        &self.device
    }

    pub(crate) fn dev<T>(&self, r: candle_core::Result<T>) -> Result<T> {
        r.map_err(|e| BackendError::device(self.name, e))
    }

    /// A float argument as f32 (a wrong dtype is a caller bug, as in the reference backend).
    pub(crate) fn float(&self, t: &Tensor, arg: &str) -> Result<Tensor> {
        if !t.dtype().is_float() {
            return Err(BackendError::device(self.name, format!("`{arg}` must be a float tensor")));
        }
        self.dev(t.to_dtype(DType::F32))
    }

    pub(crate) fn int(&self, t: &Tensor, arg: &str) -> Result<Tensor> {
        if !t.dtype().is_int() {
            return Err(BackendError::device(self.name, format!("`{arg}` must be an i64 tensor")));
        }
        self.dev(t.to_dtype(DType::I64))
    }

    pub(crate) fn opt_float(&self, t: Option<&Tensor>, arg: &str) -> Result<Option<Tensor>> {
        t.map(|t| self.float(t, arg)).transpose()
    }

    /// A device tensor as the reference's host tensor (only on the error path).
    pub(crate) fn host(&self, t: &Tensor) -> Result<RefTensor> {
        if t.dtype().is_float() { Ok(RefTensor::F64(self.download_f64(t)?)) } else { Ok(RefTensor::I64(self.download_i64(t)?)) }
    }

    /// Reduces the masks to one flag on the device and reads it back.
    pub(crate) fn invalid(&self, masks: candle_core::Result<Vec<Tensor>>) -> Result<bool> {
        let flag = self.dev(masks.and_then(|m| any_of(&m)))?;
        Ok(self.dev(read_flags(&[flag]))?[0])
    }

    /// The reference cache with this cache's lengths (`full`: its H and D
    /// too), for naming append and trim errors.
    pub(crate) fn reference_cache(&self, cache: &CandleKvCache, full: bool) -> Result<BatchKvCache> {
        let (b, h, d, c) = cache.dims();
        let (h, d) = if full { (h, d) } else { (1, 1) };
        let lens = self.download_i64(cache.lens())?;
        let mut out = BatchKvCache::new(b, h, d, c)?;
        let zeros = HostTensor::new(vec![b, h, c, d], vec![0.0; b * h * c * d])?;
        out.append(&zeros, &zeros, &lens)?;
        Ok(out)
    }

    pub(crate) fn rejection_dims(&self, p: &Tensor, q: Option<&Tensor>, d: &Tensor, l: &Tensor) -> Option<(usize, usize, usize)> {
        let (b, k, v) = check::verify_dims(p.dims(), d.dims(), l.dims())?;
        q.is_none_or(|q| q.dims() == [b, k, v]).then_some((b, k, v))
    }

    /// The operands of an explicit-noise rejection verify, checked and
    /// unchecked alike, and whether every shape agrees.
    fn rejection_operands(&self, args: &RejectionArgs<'_, Tensor>, noise: &RejectionNoise<'_, Tensor>) -> Result<RejectionOperands> {
        let (p, d, l) = (self.float(args.target_probs, "target_probs")?, self.int(args.draft_tokens, "draft_tokens")?, self.int(args.proposal_lens, "proposal_lens")?);
        let q = self.opt_float(args.draft_probs, "draft_probs")?;
        let u = self.float(noise.accept_uniforms, "accept_uniforms")?;
        let (n, uniform) = match noise.draw {
            DrawNoiseArg::InverseCdf(v) => (self.float(v, "draw_uniforms")?, true),
            DrawNoiseArg::ExponentialRace(e) => (self.float(e, "draw_exponentials")?, false),
        };
        let dims_ok = self.rejection_dims(&p, q.as_ref(), &d, &l).is_some_and(|(b, k, v)| {
            let noise_dims: &[usize] = if uniform { &[b, k + 1] } else { &[b, k + 1, v] };
            u.dims() == [b, k] && n.dims() == noise_dims
        });
        Ok(RejectionOperands { p, q, d, l, u, n, uniform, dims_ok })
    }
}

/// f64 -> f32 rounding to nearest, except that it never crosses 0 or 1: a
/// nonzero value below the f32 range becomes the smallest subnormal (so
/// `1e-300` stays positive and `-1e-300` a negative probability), a value
/// below 1 that would round up to 1 becomes the largest f32 below 1 (so a
/// valid uniform such as `1 - 2^-53` stays valid), and a value just outside
/// SAMPLE-2's noise range `[2^-126, 2^126]` stays outside it. A finite
/// value beyond the f32 range becomes infinite (as in the tch port): this
/// backend cannot represent it, the device check flags it, and the
/// reference then names the defect (or, for a value the reference accepts,
/// the op reports a device error: a stated limit of f32).
fn to_f32(x: f64) -> f32 {
    let y = x as f32;
    if y == 0.0 && x != 0.0 {
        f32::from_bits(1).copysign(y)
    } else if x < 1.0 && y >= 1.0 {
        f32::from_bits(1f32.to_bits() - 1)
    } else if x < MIN_EXPONENTIAL && f64::from(y) >= MIN_EXPONENTIAL {
        // SAMPLE-2's noise bounds: a value outside stays outside.
        f32::from_bits(f32::MIN_POSITIVE.to_bits() - 1)
    } else if x > MAX_EXPONENTIAL && f64::from(y) <= MAX_EXPONENTIAL {
        f32::from_bits((MAX_EXPONENTIAL as f32).to_bits() + 1)
    } else {
        y
    }
}

fn verified((tokens, num_accepted): (Tensor, Tensor)) -> Verified<Tensor> {
    Verified { tokens, num_accepted }
}

impl Backend for CandleBackend {
    type Tensor = Tensor;
    type KvCache = CandleKvCache;

    fn name(&self) -> String {
        self.name.to_string()
    }

    fn device(&self) -> String {
        match self.device.location() {
            candle_core::DeviceLocation::Cpu => "cpu".to_string(),
            candle_core::DeviceLocation::Cuda { gpu_id } => format!("cuda:{gpu_id}"),
            candle_core::DeviceLocation::Metal { gpu_id } => format!("metal:{gpu_id}"),
        }
    }

    fn precision(&self) -> Precision {
        PRECISION
    }

    fn upload_f64(&self, t: &HostTensor<f64>) -> Result<Tensor> {
        let data: Vec<f32> = t.data().iter().map(|&x| to_f32(x)).collect();
        self.dev(Tensor::from_vec(data, t.shape().to_vec(), &kernels::home(t.data().len(), &self.device)))
    }

    fn upload_f32(&self, t: &HostTensor<f32>) -> Result<Tensor> {
        self.glue_upload_f32(t)
    }

    fn upload_i64(&self, t: &HostTensor<i64>) -> Result<Tensor> {
        self.dev(Tensor::from_vec(t.data().to_vec(), t.shape().to_vec(), &kernels::home(t.data().len(), &self.device)))
    }

    fn download_f64(&self, t: &Tensor) -> Result<HostTensor<f64>> {
        let data = self.dev(self.float(t, "tensor")?.to_dtype(DType::F64).and_then(|x| x.flatten_all()?.to_vec1::<f64>()))?;
        HostTensor::new(t.dims().to_vec(), data).map_err(|e| BackendError::device(self.name, e))
    }

    fn download_i64(&self, t: &Tensor) -> Result<HostTensor<i64>> {
        let data = self.dev(self.int(t, "tensor")?.flatten_all().and_then(|x| x.to_vec1::<i64>()))?;
        HostTensor::new(t.dims().to_vec(), data).map_err(|e| BackendError::device(self.name, e))
    }

    fn greedy_verify(&self, scores: &Tensor, drafts: &Tensor, lens: &Tensor) -> Result<Verified<Tensor>> {
        let (s, d, l) = (self.float(scores, "target_scores")?, self.int(drafts, "draft_tokens")?, self.int(lens, "proposal_lens")?);
        if check::verify_dims(s.dims(), d.dims(), l.dims()).is_none() || self.invalid(check::greedy_masks(&s, &d, &l))? {
            return Err(BackendError::named_by_reference(self.name, ReferenceBackend.greedy_verify(&self.host(&s)?, &self.host(&d)?, &self.host(&l)?)));
        }
        self.dev(verify::greedy(&s, &d, &l)).map(verified)
    }

    /// GLUE-6: the shapes are checked on the host; the device masks and
    /// their read-back are skipped. A shape error still goes through the
    /// checked op, which names it.
    fn greedy_verify_unchecked(&self, scores: &Tensor, drafts: &Tensor, lens: &Tensor) -> Result<Verified<Tensor>> {
        let (s, d, l) = (self.float(scores, "target_scores")?, self.int(drafts, "draft_tokens")?, self.int(lens, "proposal_lens")?);
        if check::verify_dims(s.dims(), d.dims(), l.dims()).is_none() {
            return self.greedy_verify(scores, drafts, lens);
        }
        self.dev(verify::greedy(&s, &d, &l)).map(verified)
    }

    fn dflash_accept(&self, candidates: &Tensor, predict: &Tensor, vocab: usize) -> Result<DflashAccepted<Tensor>> {
        let (c, t) = (self.int(candidates, "candidates")?, self.int(predict, "target_predict")?);
        let shapes_ok = matches!(*c.dims(), [bs, block] if bs >= 1 && block >= 2) && vocab >= 1 && t.dims() == c.dims();
        let masks = || Ok(vec![kernels::bad_id(&c, vocab)?, kernels::bad_id(&t, vocab)?]);
        if !shapes_ok || self.invalid(masks())? {
            return Err(BackendError::named_by_reference(self.name, ReferenceBackend.dflash_accept(&self.host(&c)?, &self.host(&t)?, vocab)));
        }
        let (accept_len, bonus) = self.dev(verify::dflash(&c, &t))?;
        Ok(DflashAccepted { accept_len, bonus })
    }

    fn rejection_verify(&self, args: RejectionArgs<'_, Tensor>, noise: RejectionNoise<'_, Tensor>, cmp: Comparator) -> Result<Verified<Tensor>> {
        let RejectionOperands { p, q, d, l, u, n, uniform, dims_ok } = self.rejection_operands(&args, &noise)?;
        let masks = || {
            let mut m = check::rejection_masks(&p, q.as_ref(), &d, &l)?;
            m.extend([kernels::bad_uniform(&u)?, check::noise_mask(&n, uniform)?]);
            Ok(m)
        };
        if !dims_ok || self.invalid(masks())? {
            let (hp, hd, hl, hu, hn) = (self.host(&p)?, self.host(&d)?, self.host(&l)?, self.host(&u)?, self.host(&n)?);
            let hq = q.as_ref().map(|q| self.host(q)).transpose()?;
            let args = RejectionArgs { target_probs: &hp, draft_probs: hq.as_ref(), draft_tokens: &hd, proposal_lens: &hl };
            let draw = if uniform { DrawNoiseArg::InverseCdf(&hn) } else { DrawNoiseArg::ExponentialRace(&hn) };
            return Err(BackendError::named_by_reference(self.name, ReferenceBackend.rejection_verify(args, RejectionNoise { accept_uniforms: &hu, draw }, cmp)));
        }
        let draw = if uniform { Draw::InverseCdf(&n) } else { Draw::Race(&n) };
        let inputs = RejectInputs { p: &p, q: q.as_ref(), drafts: &d, lens: &l };
        self.dev(verify::rejection(&inputs, &u, draw, cmp)).map(verified)
    }

    /// GLUE-6: as [`CandleBackend::greedy_verify_unchecked`].
    fn rejection_verify_unchecked(&self, args: RejectionArgs<'_, Tensor>, noise: RejectionNoise<'_, Tensor>, cmp: Comparator) -> Result<Verified<Tensor>> {
        let RejectionOperands { p, q, d, l, u, n, uniform, dims_ok } = self.rejection_operands(&args, &noise)?;
        if !dims_ok {
            return self.rejection_verify(args, noise, cmp);
        }
        let draw = if uniform { Draw::InverseCdf(&n) } else { Draw::Race(&n) };
        let inputs = RejectInputs { p: &p, q: q.as_ref(), drafts: &d, lens: &l };
        self.dev(verify::rejection(&inputs, &u, draw, cmp)).map(verified)
    }

    fn rejection_verify_seeded(&self, args: RejectionArgs<'_, Tensor>, method: DrawMethod, cmp: Comparator, seed: u64) -> Result<Verified<Tensor>> {
        let (p, d, l) = (self.float(args.target_probs, "target_probs")?, self.int(args.draft_tokens, "draft_tokens")?, self.int(args.proposal_lens, "proposal_lens")?);
        let q = self.opt_float(args.draft_probs, "draft_probs")?;
        let valid = match self.rejection_dims(&p, q.as_ref(), &d, &l) {
            Some(dims) if !self.invalid(check::rejection_masks(&p, q.as_ref(), &d, &l))? => Some(dims),
            _ => None,
        };
        let Some(dims) = valid else {
            // The generated noise is valid by construction: only the
            // arguments can be wrong, and the reference names them.
            let (hp, hd, hl) = (self.host(&p)?, self.host(&d)?, self.host(&l)?);
            let hq = q.as_ref().map(|q| self.host(q)).transpose()?;
            let args = RejectionArgs { target_probs: &hp, draft_probs: hq.as_ref(), draft_tokens: &hd, proposal_lens: &hl };
            return Err(BackendError::named_by_reference(self.name, ReferenceBackend.rejection_verify_seeded(args, method, cmp, seed)));
        };
        let (u, draw) = self.dev(noise::rejection_noise(&self.device, seed, dims, method))?;
        let inputs = RejectInputs { p: &p, q: q.as_ref(), drafts: &d, lens: &l };
        self.dev(verify::rejection(&inputs, &u, draw.as_draw(), cmp)).map(verified)
    }

    fn residual(&self, target: &Tensor, draft: Option<&Tensor>, drafted: &Tensor) -> Result<Tensor> {
        let (p, x) = (self.float(target, "target_probs")?, self.int(drafted, "drafted")?);
        let q = self.opt_float(draft, "draft_probs")?;
        let dims_ok = match *p.dims() {
            [r, v] => r >= 1 && v >= 1 && q.as_ref().is_none_or(|q| q.dims() == [r, v]) && x.dims() == [r],
            _ => false,
        };
        let masks = || {
            let mut m = vec![kernels::bad_id(&x, p.dim(1)?)?, check::bad_prob_rows(&p)?];
            if let Some(q) = &q {
                m.push(check::bad_prob_rows(q)?);
            }
            Ok(m)
        };
        if !dims_ok || self.invalid(masks())? {
            let hq = q.as_ref().map(|q| self.host(q)).transpose()?;
            return Err(BackendError::named_by_reference(self.name, ReferenceBackend.residual(&self.host(&p)?, hq.as_ref(), &self.host(&x)?)));
        }
        self.dev(verify::residual(&p, q.as_ref(), &x))
    }

    fn process_logits(&self, logits: &Tensor, params: LogitsParams<'_, Tensor>) -> Result<Tensor> {
        processors::process_with_processors(self, logits, params)
    }

    fn draw(&self, weights: &Tensor, noise: DrawNoiseArg<'_, Tensor>) -> Result<Tensor> {
        let w = self.float(weights, "weights")?;
        let (n, uniform) = match noise {
            DrawNoiseArg::InverseCdf(v) => (self.float(v, "draw_uniforms")?, true),
            DrawNoiseArg::ExponentialRace(e) => (self.float(e, "draw_exponentials")?, false),
        };
        let dims_ok = match *w.dims() {
            [r, v] if r >= 1 && v >= 1 => {
                if uniform {
                    n.dims() == [r]
                } else {
                    n.dims() == [r, v]
                }
            }
            _ => false,
        };
        let masks = || {
            let mut m = vec![check::noise_mask(&n, uniform)?];
            m.extend(check::weight_masks(&w)?);
            Ok(m)
        };
        if !dims_ok || self.invalid(masks())? {
            let hn = self.host(&n)?;
            let arg = if uniform { DrawNoiseArg::InverseCdf(&hn) } else { DrawNoiseArg::ExponentialRace(&hn) };
            return Err(BackendError::named_by_reference(self.name, ReferenceBackend.draw(&self.host(&w)?, arg)));
        }
        self.dev(if uniform { sampling::inverse_cdf(&w, &n) } else { sampling::race(&w, &n) })
    }

    fn ngram_propose(&self, contexts: &Tensor, lens: &Tensor, vocab: usize, cfg: &NgramConfig) -> Result<(Tensor, Tensor)> {
        let (c, l) = (self.int(contexts, "contexts")?, self.int(lens, "context_lens")?);
        let dims_ok = cfg.validate().is_ok() && matches!(*c.dims(), [b, width] if b >= 1 && width >= 1 && l.dims() == [b]);
        if !dims_ok || self.invalid(check::ngram_masks(&c, &l, vocab, cfg))? {
            return Err(BackendError::named_by_reference(self.name, ReferenceBackend.ngram_propose(&self.host(&c)?, &self.host(&l)?, vocab, cfg)));
        }
        self.dev(ngram::propose(&c, &l, cfg))
    }

    fn kv_new(&self, batch: usize, heads: usize, head_dim: usize, capacity: usize) -> Result<CandleKvCache> {
        if [batch, heads, head_dim, capacity].contains(&0) {
            return Err(BackendError::named_by_reference(self.name, ReferenceBackend.kv_new(batch, heads, head_dim, capacity)));
        }
        // The storage has a write-sink slot (`capacity + 1`); a shape whose
        // element count or byte size overflows is the caller's defect, named
        // as the reference names it, never a panic inside candle (ERR-1, KV-1).
        let elements = capacity.checked_add(1).and_then(|c| [heads, c, head_dim].iter().try_fold(batch, |n, &d| n.checked_mul(d)));
        if elements.and_then(|n| n.checked_mul(2 * size_of::<f32>())).is_none_or(|b| b > isize::MAX as usize) {
            let value = capacity.to_string();
            return Err(specdec_reference::SpecError::InvalidParameter { name: "capacity", value, reason: "the cache size overflows" }.into());
        }
        self.dev(CandleKvCache::new(&self.device, batch, heads, head_dim, capacity))
    }

    fn kv_append(&self, cache: &mut CandleKvCache, keys: &Tensor, values: &Tensor, counts: &Tensor) -> Result<()> {
        let (k, v, c) = (self.float(keys, "new_keys")?, self.float(values, "new_values")?, self.int(counts, "counts")?);
        let (b, h, d, cap) = cache.dims();
        let dims_ok = matches!(*k.dims(), [kb, kh, _, kd] if (kb, kh, kd) == (b, h, d)) && v.dims() == k.dims() && c.dims() == [b];
        if !dims_ok || self.invalid(check::append_masks(cache.lens(), cap, &k, &v, &c))? {
            let mut reference = self.reference_cache(cache, true)?;
            return Err(BackendError::named_by_reference(self.name, ReferenceBackend.kv_append(&mut reference, &self.host(&k)?, &self.host(&v)?, &self.host(&c)?)));
        }
        self.dev(cache.append(&k, &v, &c))
    }

    fn kv_trim(&self, cache: &mut CandleKvCache, amounts: &Tensor, mode: TrimMode) -> Result<Tensor> {
        let a = self.int(amounts, "amounts")?;
        let lens = cache.lens().clone();
        let masks = || {
            let mut m = vec![a.lt(0i64)?];
            if mode == TrimMode::Strict {
                m.push(a.gt(&lens)?);
            }
            Ok(m)
        };
        if a.dims() != [cache.dims().0] || self.invalid(masks())? {
            let mut reference = self.reference_cache(cache, false)?;
            return Err(BackendError::named_by_reference(self.name, ReferenceBackend.kv_trim(&mut reference, &self.host(&a)?, mode)));
        }
        // KV-5 trims what there is and says so; KV-4 trims exactly `a`.
        let cut = match mode {
            TrimMode::Strict => a,
            TrimMode::Clamped => self.dev(a.minimum(&lens))?,
        };
        self.dev(cache.trim(&cut))?;
        Ok(cut)
    }

    fn kv_lens(&self, cache: &CandleKvCache) -> Result<Tensor> {
        Ok(cache.lens().clone())
    }

    fn kv_contents(&self, cache: &CandleKvCache) -> Result<(Tensor, Tensor)> {
        self.dev(cache.contents())
    }

    fn paged_gather(&self, pages: &Tensor, table: &Tensor, lens: &Tensor) -> Result<Tensor> {
        let (p, t, l) = (self.float(pages, "pages")?, self.int(table, "block_table")?, self.int(lens, "context_lens")?);
        let dims_ok = matches!(*p.dims(), [_, s, h, d] if s >= 1 && h >= 1 && d >= 1) && matches!(*t.dims(), [b, m] if b >= 1 && m >= 1 && l.dims() == [b]);
        if !dims_ok || self.invalid(check::paged_masks(&p, &t, &l))? {
            return Err(BackendError::named_by_reference(self.name, ReferenceBackend.paged_gather(&self.host(&p)?, &self.host(&t)?, &self.host(&l)?)));
        }
        self.dev(kv::paged_gather(&p, &t, &l))
    }

    fn reshape(&self, t: &Tensor, shape: &[usize]) -> Result<Tensor> {
        self.glue_reshape(t, shape)
    }

    fn gather_rows(&self, t: &Tensor, rows: &Tensor) -> Result<Tensor> {
        self.glue_gather_rows(t, rows)
    }

    fn concat_rows(&self, parts: &[&Tensor]) -> Result<Tensor> {
        self.glue_concat_rows(parts)
    }

    fn add_i64(&self, a: &Tensor, b: &Tensor) -> Result<Tensor> {
        self.glue_int_op(glue::IntOp::Add, a, b)
    }

    fn sub_i64(&self, a: &Tensor, b: &Tensor) -> Result<Tensor> {
        self.glue_int_op(glue::IntOp::Sub, a, b)
    }
}

/// LOGITS-7 .. LOGITS-10 as f32 tensor ops on the device; one flag read for the checks.
impl ProcessorKernels for CandleBackend {
    fn processor_inputs_ok(&self, logits: &Tensor, p: &LogitsParams<'_, Tensor>) -> Result<bool> {
        let z = self.float(logits, "logits")?;
        let [rows, vocab] = *z.dims() else { return Ok(false) };
        let mut masks = Vec::new();
        let mut shapes_ok = true;
        let mut per = |t: &Tensor, arg: &str, dims: &[usize], bad: &dyn Fn(&Tensor) -> candle_core::Result<Tensor>| -> Result<()> {
            let t = self.float(t, arg)?;
            shapes_ok &= t.dims() == dims;
            if shapes_ok {
                masks.push(self.dev(bad(&t))?);
            }
            Ok(())
        };
        if let Some(m) = p.min_p {
            per(m, "min_p", &[rows], &|m| kernels::not(&kernels::and(&m.ge(0.0)?, &m.le(1.0)?)?))?;
        }
        if let Some(x) = p.penalties {
            per(x.counts, "penalty_counts", &[rows, vocab], &|c| kernels::or(&kernels::or(&kernels::non_finite(c)?, &c.lt(0.0)?)?, &c.ne(&c.floor()?)?))?;
            per(x.repetition, "repetition_penalty", &[rows], &|r| kernels::or(&kernels::non_finite(r)?, &r.le(0.0)?))?;
            per(x.presence, "presence_penalty", &[rows], &kernels::non_finite)?;
            per(x.frequency, "frequency_penalty", &[rows], &kernels::non_finite)?;
        }
        if let Some(b) = p.logit_bias {
            per(b, "logit_bias", &[rows, vocab], &kernels::non_finite)?;
        }
        Ok(shapes_ok && !self.invalid(Ok(masks))?)
    }

    fn bias_and_penalties(&self, logits: &Tensor, penalties: Option<Penalties<'_, Tensor>>, bias: Option<&Tensor>) -> Result<Tensor> {
        let mut z = self.float(logits, "logits")?;
        if let Some(b) = bias {
            z = self.dev(z.add(&self.float(b, "logit_bias")?))?;
        }
        if let Some(x) = penalties {
            let c = self.float(x.counts, "penalty_counts")?;
            let col = |t: &Tensor, arg: &str| self.float(t, arg).and_then(|t| self.dev(t.unsqueeze(1)));
            let (rep, pres, freq) = (col(x.repetition, "repetition_penalty")?, col(x.presence, "presence_penalty")?, col(x.frequency, "frequency_penalty")?);
            z = self.dev((|| {
                // LOGITS-8 then LOGITS-9, only where the id was counted.
                let repeated = kernels::select(&z.gt(0.0)?, &z.broadcast_div(&rep)?, &z.broadcast_mul(&rep)?)?;
                let penalised = repeated.sub(&c.broadcast_mul(&freq)?.broadcast_add(&pres)?)?;
                kernels::select(&c.gt(0.0)?, &penalised, &z)
            })())?;
        }
        Ok(z)
    }

    fn min_p_cut(&self, _logits: &Tensor, _params: LogitsParams<'_, Tensor>, probs: &Tensor, min_p: &Tensor) -> Result<Tensor> {
        let (p, m) = (self.float(probs, "probs")?, self.float(min_p, "min_p")?);
        self.dev((|| {
            let m = m.unsqueeze(1)?;
            let threshold = p.max_keepdim(1)?.broadcast_mul(&m)?;
            let kept = kernels::select(&p.broadcast_ge(&threshold)?, &p, &p.zeros_like()?)?;
            // A row with min-p off keeps its values bit for bit: a request's
            // output must not depend on whether another row of its batch uses min-p.
            kernels::select(&m.gt(0.0)?, &kept.broadcast_div(&kept.sum_keepdim(1)?)?, &p)
        })())
    }

    fn basic_process_logits(&self, logits: &Tensor, params: LogitsParams<'_, Tensor>) -> Result<Tensor> {
        let z = self.float(logits, "logits")?;
        let (t, k, p) = (self.float(params.temperature, "temperature")?, self.int(params.top_k, "top_k")?, self.float(params.top_p, "top_p")?);
        let dims_ok = match *z.dims() {
            [r, v] => r >= 1 && v >= 1 && [&t, &k, &p].iter().all(|x| x.dims() == [r]),
            _ => false,
        };
        let params = sampling::Params { temperature: &t, top_k: &k, top_p: &p };
        // One read: [invalid, any row uses top-k, any row uses top-p].
        let flags = dims_ok
            .then(|| {
                let [need_k, need_p] = params.needs(z.dim(1)?)?;
                read_flags(&[any_of(&check::logits_masks(&z, &t, &k, &p)?)?, need_k, need_p])
            })
            .transpose();
        match self.dev(flags)? {
            Some(f) if !f[0] => self.dev(sampling::process_logits(&z, &params, f[1], f[2])),
            _ => {
                let (ht, hk, hp) = (self.host(&t)?, self.host(&k)?, self.host(&p)?);
                let host_params = LogitsParams::new(&ht, &hk, &hp);
                Err(BackendError::named_by_reference(self.name, ReferenceBackend.process_logits(&self.host(&z)?, host_params)))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn upload_keeps_the_validity_class_of_every_value() {
        assert_eq!(to_f32(1e-300), f32::from_bits(1));
        assert!(to_f32(-1e-300) < 0.0);
        assert_eq!(to_f32(1e300), f32::INFINITY);
        assert_eq!(to_f32(f64::NEG_INFINITY), f32::NEG_INFINITY);
        assert!(to_f32(f64::NAN).is_nan());
        assert_eq!(to_f32(0.25), 0.25);
        assert!(to_f32(1.0 - f64::EPSILON / 2.0) < 1.0, "a valid uniform must stay below 1");
        assert_eq!(to_f32(1.0), 1.0);
    }

    #[test]
    fn cuda_without_the_feature_or_a_gpu_is_an_error() {
        if !cfg!(feature = "cuda") {
            assert_eq!(CandleBackend::cuda(0).err().as_deref(), Some("built without the `cuda` feature"));
        }
    }

    fn host<T: Clone>(shape: &[usize], data: &[T]) -> HostTensor<T> {
        HostTensor::new(shape.to_vec(), data.to_vec()).expect("test shapes match")
    }

    #[test]
    fn top_p_breaks_probability_ties_by_id() -> Result<()> {
        let b = CandleBackend::cpu();
        let z = b.upload_f64(&host(&[1, 4], &[0.0, 0.0, 0.0, 0.0]))?;
        let (t, k, p) = (b.upload_f64(&host(&[1], &[1.0]))?, b.upload_i64(&host(&[1], &[0]))?, b.upload_f64(&host(&[1], &[0.5]))?);
        let probs = b.download_f64(&b.process_logits(&z, LogitsParams::new(&t, &k, &p))?)?;
        assert_eq!(probs.data(), [0.5, 0.5, 0.0, 0.0]);
        Ok(())
    }

    /// A row with min-p off is the same bit for bit whether or not another
    /// row of its call uses min-p (a request's output must not depend on its batch).
    #[test]
    fn a_row_without_min_p_is_untouched_by_a_min_p_row() -> Result<()> {
        let b = CandleBackend::cpu();
        // Rows of 64 whose f32 probabilities do not sum to exactly 1 (a
        // renormalisation would move them).
        let logits: Vec<f64> = (0..128).map(|i| ((i * 37) % 17) as f64 * 0.31 - 2.0).collect();
        let z = b.upload_f64(&host(&[2, 64], &logits))?;
        let (t, k, p) = (b.upload_f64(&host(&[2], &[0.7, 0.7]))?, b.upload_i64(&host(&[2], &[0, 0]))?, b.upload_f64(&host(&[2], &[1.0, 1.0]))?);
        let m = b.upload_f64(&host(&[2], &[0.0, 0.5]))?;
        let mut with_min_p = LogitsParams::new(&t, &k, &p);
        with_min_p.min_p = Some(&m);
        let mixed = b.download_f64(&b.process_logits(&z, with_min_p)?)?;
        let plain = b.download_f64(&b.process_logits(&z, LogitsParams::new(&t, &k, &p))?)?;
        assert_eq!(mixed.data()[..64], plain.data()[..64]);
        assert_ne!(mixed.data()[64..], plain.data()[64..], "min-p 0.5 cuts the second row");
        Ok(())
    }

    #[test]
    fn seeded_verify_emits_valid_tokens_and_ignores_nan_padding() -> Result<()> {
        let b = CandleBackend::cpu();
        let nan = f64::NAN;
        // Sequence 0 proposes one draft; its rows 2.. are padding full of NaN.
        let p = b.upload_f64(&host(&[1, 3, 2], &[0.5, 0.5, 0.25, 0.75, nan, nan]))?;
        let q = b.upload_f64(&host(&[1, 2, 2], &[1.0, 0.0, nan, nan]))?;
        let (d, l) = (b.upload_i64(&host(&[1, 2], &[0, -1]))?, b.upload_i64(&host(&[1], &[1]))?);
        let args = RejectionArgs { target_probs: &p, draft_probs: Some(&q), draft_tokens: &d, proposal_lens: &l };
        for method in [DrawMethod::InverseCdf, DrawMethod::ExponentialRace] {
            let out = b.rejection_verify_seeded(args, method, Comparator::Strict, 7)?;
            let (tokens, n) = (b.download_i64(&out.tokens)?, b.download_i64(&out.num_accepted)?);
            assert!(n.data()[0] <= 1);
            assert!(tokens.data()[..=n.data()[0] as usize].iter().all(|&t| t == 0 || t == 1));
            assert_eq!(tokens.data()[2], -1);
        }
        Ok(())
    }

    #[test]
    fn a_defect_is_named_by_the_reference() -> Result<()> {
        let b = CandleBackend::cpu();
        let w = b.upload_f64(&host(&[1, 2], &[0.5, -0.5]))?;
        let u = b.upload_f64(&host(&[1], &[0.5]))?;
        let err = b.draw(&w, DrawNoiseArg::InverseCdf(&u)).expect_err("negative weight");
        assert_eq!(err.kind(), Some(specdec_backend::ErrorKind::NegativeProbability));
        Ok(())
    }
}
