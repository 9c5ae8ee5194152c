//! [`TchBackend`]'s constructors, device selection, transfers, and the [`Backend`] methods, each of which
//! checks shapes on the host, runs the fused device check, and then calls a kernel.

use std::sync::{Mutex, PoisonError};

use specdec_backend::processors::{self, ProcessorKernels};
use specdec_backend::{
    Backend, BackendError, Comparator, DflashAccepted, DrawMethod, DrawNoiseArg, HostTensor, LogitsParams, NgramConfig, Penalties, Precision, RefTensor, ReferenceBackend, RejectionArgs,
    RejectionNoise, Result, TrimMode, Verified,
};
use specdec_reference::ngram::NgramPolicy;
use tch::{Device, Kind, TchError, Tensor};

use crate::check::{self, verdict, where_read};
use crate::kernels::{self, Noise, Params, Rejection, TResult, readable};
use crate::kv::{self, TchKvCache};
use crate::{TchBackend, TchTensor};

/// Serialises the seeded verify: libtorch's default generators are process-global, so
/// seeding and drawing must not interleave with another seeded call.
static SEED_LOCK: Mutex<()> = Mutex::new(());

/// How often zero exponentials are redrawn before giving up (each round has probability
/// about `numel * 2^-24` of being needed at all).
const MAX_NOISE_REDRAWS: usize = 64;

impl TchBackend {
    /// The CPU backend (`"tch-cpu"`).
    pub fn cpu() -> Self {
        TchBackend { device: Device::Cpu }
    }

    /// [`TchBackend::cpu`] in the fallible form the conformance adapter takes.
    pub fn try_cpu() -> std::result::Result<Self, String> {
        Ok(Self::cpu())
    }

    /// The first CUDA device (`"tch-cuda"`), or `Err` if libtorch sees none.
    pub fn cuda_if_available() -> std::result::Result<Self, String> {
        if tch::Cuda::is_available() { Ok(TchBackend { device: Device::Cuda(0) }) } else { Err("no CUDA device: tch::Cuda::is_available() is false for this libtorch and machine".to_string()) }
    }

    /// The libtorch device every tensor of this backend lives on.
    pub fn tch_device(&self) -> Device {
        self.device
    }

    pub(crate) fn dev<T>(&self, r: TResult<T>) -> Result<T> {
        r.map_err(|e| BackendError::device(&self.name(), e))
    }

    /// Runs a fused device check; `false` means the reference must name the defect.
    pub(crate) fn passes(&self, checks: TResult<Vec<Tensor>>) -> Result<bool> {
        self.dev(checks.and_then(|c| verdict(&c)))
    }

    /// A float argument as f32 (other kinds are a caller bug, as in the reference backend).
    pub(crate) fn float(&self, t: &TchTensor, arg: &str) -> Result<Tensor> {
        match t.0.f_kind() {
            Ok(Kind::Float) => Ok(t.0.shallow_clone()),
            Ok(Kind::Double | Kind::Half | Kind::BFloat16) => self.dev(t.0.f_to_kind(Kind::Float)),
            _ => Err(BackendError::device(&self.name(), format!("`{arg}` must be a float tensor"))),
        }
    }

    /// An id argument as i64.
    pub(crate) fn int(&self, t: &TchTensor, arg: &str) -> Result<Tensor> {
        match t.0.f_kind() {
            Ok(Kind::Int64) => Ok(t.0.shallow_clone()),
            Ok(Kind::Int | Kind::Int16 | Kind::Int8 | Kind::Uint8) => self.dev(t.0.f_to_kind(Kind::Int64)),
            _ => Err(BackendError::device(&self.name(), format!("`{arg}` must be an i64 tensor"))),
        }
    }

    /// Downloads a tensor for the reference, by kind.
    pub(crate) fn ref_tensor(&self, t: &TchTensor) -> Result<RefTensor> {
        match t.0.f_kind() {
            Ok(Kind::Int64 | Kind::Int | Kind::Int16 | Kind::Int8 | Kind::Uint8) => self.download_i64(t).map(RefTensor::I64),
            _ => self.download_f64(t).map(RefTensor::F64),
        }
    }

    fn ref_opt(&self, t: Option<&TchTensor>) -> Result<Option<RefTensor>> {
        t.map(|t| self.ref_tensor(t)).transpose()
    }

    fn ref_noise(&self, n: DrawNoiseArg<'_, TchTensor>) -> Result<(RefTensor, bool)> {
        Ok(match n {
            DrawNoiseArg::InverseCdf(u) => (self.ref_tensor(u)?, true),
            DrawNoiseArg::ExponentialRace(e) => (self.ref_tensor(e)?, false),
        })
    }

    fn download(&self, t: &Tensor, kind: Kind) -> TResult<(Vec<usize>, Tensor)> {
        let shape = t.size().iter().map(|&d| d as usize).collect();
        Ok((shape, t.f_to_kind(kind)?.f_to_device(Device::Cpu)?.f_contiguous()?))
    }

    /// Builds the host tensor on the CPU, converts it there (`convert`), then moves it.
    pub(crate) fn upload<T: tch::kind::Element>(&self, t: &HostTensor<T>, convert: fn(Tensor) -> TResult<Tensor>) -> Result<TchTensor> {
        let shape = t.shape().iter().map(|&d| i64::try_from(d)).collect::<std::result::Result<Vec<_>, _>>();
        let shape = shape.map_err(|e| BackendError::device(&self.name(), e))?;
        let t = self.dev(Tensor::f_from_slice(t.data()).and_then(|x| x.f_reshape(shape.as_slice())))?;
        self.dev(convert(t).and_then(|x| x.f_to_device(self.device))).map(TchTensor)
    }

    fn verified(&self, (tokens, n): (Tensor, Tensor)) -> Verified<TchTensor> {
        Verified { tokens: TchTensor(tokens), num_accepted: TchTensor(n) }
    }

    /// Seeded noise for the whole batch at once: `[B, k]` accept uniforms and `[B, k+1]`
    /// uniforms or `[B, k+1, V]` exponentials, i.i.d. across rows, from libtorch's default
    /// generator after `tch::manual_seed(seed)` (seeds the CPU and every CUDA generator).
    fn seeded_noise(&self, (b, k, v): (i64, i64, i64), method: DrawMethod, seed: u64) -> TResult<(Tensor, Tensor)> {
        let _guard = SEED_LOCK.lock().unwrap_or_else(PoisonError::into_inner);
        // Same 64 bits: libtorch reinterprets the seed as u64.
        tch::manual_seed(seed as i64);
        // Uniforms in f64: [B, k] and [B, k+1] are small, and the accept test runs in f64.
        let u = Tensor::f_rand([b, k], (Kind::Double, self.device))?;
        let draw = match method {
            DrawMethod::InverseCdf => Tensor::f_rand([b, k + 1], (Kind::Double, self.device))?,
            DrawMethod::ExponentialRace => positive_exponentials([b, k + 1, v], self.device)?,
        };
        Ok((u, draw))
    }

    fn rejection_dims(&self, a: &RejectionArgs<'_, TchTensor>) -> Result<RejTensors> {
        let p = self.float(a.target_probs, "target_probs")?;
        let q = a.draft_probs.map(|q| self.float(q, "draft_probs")).transpose()?;
        let d = self.int(a.draft_tokens, "draft_tokens")?;
        let l = self.int(a.proposal_lens, "proposal_lens")?;
        let dims = match (p.size().as_slice(), draft_dims(&d, &l)) {
            (&[_, _, v], Some((b, k))) if v >= 1 && p.size() == [b, k + 1, v] => {
                let q_ok = q.as_ref().is_none_or(|q| q.size() == [b, k, v]);
                q_ok.then_some((b, k, v))
            }
            _ => None,
        };
        Ok(RejTensors { p, q, d, l, dims })
    }

    /// The fused CONV-2/5/7 checks of a rejection verify (noise excluded).
    fn rejection_checks(r: &RejTensors, k: i64, vocab: i64) -> TResult<Vec<Tensor>> {
        let mut c = check::draft_layout(&r.d, &r.l, vocab)?;
        c.push(where_read(&check::prob_rows(&r.p)?, &readable(&r.l, k + 1, true)?)?);
        if let Some(q) = &r.q {
            c.push(where_read(&check::prob_rows(q)?, &readable(&r.l, k, false)?)?);
        }
        Ok(c)
    }

    /// The rejection arguments downloaded for the reference: `(p, q, drafts, lens)`.
    fn reference_rejection_args(&self, a: &RejectionArgs<'_, TchTensor>) -> Result<(RefTensor, Option<RefTensor>, RefTensor, RefTensor)> {
        Ok((self.ref_tensor(a.target_probs)?, self.ref_opt(a.draft_probs)?, self.ref_tensor(a.draft_tokens)?, self.ref_tensor(a.proposal_lens)?))
    }
}

/// The tensors of a rejection verify, converted, with `(B, k, V)` when the shapes agree.
struct RejTensors {
    p: Tensor,
    q: Option<Tensor>,
    d: Tensor,
    l: Tensor,
    dims: Option<(i64, i64, i64)>,
}

/// f64 to f32, rounding to nearest except where that would carry a value across a
/// boundary the validators test: a nonzero value never becomes 0 (it becomes the smallest
/// subnormal of its sign) and one below 1 never reaches 1 (it becomes `1 - 2^-24`), so
/// signs, zero weights and uniform ranges are judged as the reference judges the f64
/// input; likewise a value just outside SAMPLE-2's noise range `[2^-126, 2^126]` stays
/// outside it. Magnitudes beyond `f32::MAX` become infinite as IEEE rounding has it: no f32
/// stands for them, and saturating would silently equate different values, so this
/// backend rejects them as `NonFinite` wherever finiteness is checked.
fn to_f32_same_side(x: Tensor) -> TResult<Tensor> {
    let back = x.f_to_kind(Kind::Float)?.f_to_kind(Kind::Double)?;
    let vanished = back.f_eq(0.0)?.f_logical_and(&x.f_ne(0.0)?)?;
    let reached_one = back.f_ge(1.0)?.f_logical_and(&x.f_lt(1.0)?)?;
    let y = x.f_sign()?.f_mul_scalar(f64::from(f32::from_bits(1)))?.f_where_self(&vanished, &x)?;
    let y = y.f_where_scalarother(&reached_one.f_logical_not()?, f64::from(1.0 - f32::EPSILON / 2.0))?;
    // SAMPLE-2's noise bounds: a value just outside stays outside.
    let (lo, hi) = (specdec_reference::MIN_EXPONENTIAL, specdec_reference::MAX_EXPONENTIAL);
    let rose_to_lo = back.f_ge(lo)?.f_logical_and(&x.f_lt(lo)?)?;
    let fell_to_hi = back.f_le(hi)?.f_logical_and(&x.f_gt(hi)?)?;
    let y = y.f_where_scalarother(&rose_to_lo.f_logical_not()?, f64::from(f32::from_bits(f32::MIN_POSITIVE.to_bits() - 1)))?;
    let y = y.f_where_scalarother(&fell_to_hi.f_logical_not()?, f64::from(f32::from_bits((hi as f32).to_bits() + 1)))?;
    y.f_to_kind(Kind::Float)
}

/// `(B, k)` of a draft batch when `drafts [B, k]` and `lens [B]` have `B, k >= 1`.
fn draft_dims(drafts: &Tensor, lens: &Tensor) -> Option<(i64, i64)> {
    match drafts.size()[..] {
        [b, k] if b >= 1 && k >= 1 && lens.size() == [b] => Some((b, k)),
        _ => None,
    }
}

/// `usize` vocabulary sizes as i64 (every id is below a vocabulary beyond i64).
fn vocab_i64(v: usize) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

/// Exp(1) noise, redrawing the (probability ~2^-24) exact zeros that SAMPLE-2 forbids:
/// a redraw conditions each value on being positive, which keeps it Exp(1)-distributed.
fn positive_exponentials(shape: [i64; 3], device: Device) -> TResult<Tensor> {
    let mut e = Tensor::f_empty(shape, (Kind::Float, device))?.f_exponential_(1.0)?;
    for _ in 0..MAX_NOISE_REDRAWS {
        let zero = e.f_le(0.0)?;
        if !bool::try_from(&zero.f_any()?)? {
            return Ok(e);
        }
        let fresh = e.f_empty_like()?.f_exponential_(1.0)?;
        e = fresh.f_where_self(&zero, &e)?;
    }
    Err(TchError::Kind("exponential_ kept returning zeros".into()))
}

impl Backend for TchBackend {
    type Tensor = TchTensor;
    type KvCache = TchKvCache;

    fn name(&self) -> String {
        match self.device {
            Device::Cpu => "tch-cpu".to_string(),
            Device::Cuda(_) => "tch-cuda".to_string(),
            other => format!("tch-{other:?}").to_lowercase(),
        }
    }

    fn device(&self) -> String {
        match self.device {
            Device::Cpu => "cpu".to_string(),
            Device::Cuda(i) => format!("cuda:{i}"),
            other => format!("{other:?}").to_lowercase(),
        }
    }

    fn precision(&self) -> Precision {
        // See the crate doc: f32 storage bounds every decision error by ~2.4e-7.
        Precision { float_dtype: "f32", accumulate_dtype: "f64", margin_epsilon: 1e-6, value_tolerance: 1e-6 }
    }

    fn upload_f64(&self, t: &HostTensor<f64>) -> Result<TchTensor> {
        self.upload(t, to_f32_same_side)
    }

    fn upload_f32(&self, t: &HostTensor<f32>) -> Result<TchTensor> {
        self.glue_upload_f32(t)
    }

    fn upload_i64(&self, t: &HostTensor<i64>) -> Result<TchTensor> {
        self.upload(t, Ok)
    }

    fn download_f64(&self, t: &TchTensor) -> Result<HostTensor<f64>> {
        let host = self.float(t, "tensor")?;
        let (shape, host) = self.dev(self.download(&host, Kind::Double))?;
        let numel = host.numel();
        let mut data = vec![0.0; numel];
        self.dev(host.f_copy_data(&mut data, numel))?;
        Ok(HostTensor::new(shape, data)?)
    }

    fn download_i64(&self, t: &TchTensor) -> Result<HostTensor<i64>> {
        let host = self.int(t, "tensor")?;
        let (shape, host) = self.dev(self.download(&host, Kind::Int64))?;
        let numel = host.numel();
        let mut data = vec![0; numel];
        self.dev(host.f_copy_data(&mut data, numel))?;
        Ok(HostTensor::new(shape, data)?)
    }

    fn greedy_verify(&self, scores: &TchTensor, drafts: &TchTensor, lens: &TchTensor) -> Result<Verified<TchTensor>> {
        let (s, d, l) = (self.float(scores, "target_scores")?, self.int(drafts, "draft_tokens")?, self.int(lens, "proposal_lens")?);
        let dims = match (s.size().as_slice(), draft_dims(&d, &l)) {
            (&[_, _, v], Some((b, k))) if v >= 1 && s.size() == [b, k + 1, v] => Some((k, v)),
            _ => None,
        };
        let ok = match dims {
            Some((k, v)) => self.passes((|| {
                let mut c = check::draft_layout(&d, &l, v)?;
                c.push(where_read(&check::score_rows(&s)?, &readable(&l, k + 1, true)?)?);
                Ok(c)
            })())?,
            None => false,
        };
        if !ok {
            let r = (|| ReferenceBackend.greedy_verify(&self.ref_tensor(scores)?, &self.ref_tensor(drafts)?, &self.ref_tensor(lens)?))();
            return Err(BackendError::named_by_reference(&self.name(), r));
        }
        self.dev(kernels::greedy(&s, &d, &l)).map(|v| self.verified(v))
    }

    /// GLUE-6: the shapes are checked on the host; the fused device check and
    /// its read-back are skipped. A shape error still goes through the checked
    /// op, which names it.
    fn greedy_verify_unchecked(&self, scores: &TchTensor, drafts: &TchTensor, lens: &TchTensor) -> Result<Verified<TchTensor>> {
        let (s, d, l) = (self.float(scores, "target_scores")?, self.int(drafts, "draft_tokens")?, self.int(lens, "proposal_lens")?);
        let dims_ok = match (s.size().as_slice(), draft_dims(&d, &l)) {
            (&[_, _, v], Some((b, k))) => v >= 1 && s.size() == [b, k + 1, v],
            _ => false,
        };
        if !dims_ok {
            return self.greedy_verify(scores, drafts, lens);
        }
        self.dev(kernels::greedy(&s, &d, &l)).map(|v| self.verified(v))
    }

    fn dflash_accept(&self, candidates: &TchTensor, predict: &TchTensor, vocab: usize) -> Result<DflashAccepted<TchTensor>> {
        let (c, t) = (self.int(candidates, "candidates")?, self.int(predict, "target_predict")?);
        let shapes_ok = matches!(c.size()[..], [bs, block] if bs >= 1 && block >= 2) && vocab >= 1 && t.size() == c.size();
        let v = vocab_i64(vocab);
        if !(shapes_ok && self.passes((|| Ok(vec![check::ids(&c, v)?, check::ids(&t, v)?]))())?) {
            let r = (|| ReferenceBackend.dflash_accept(&self.ref_tensor(candidates)?, &self.ref_tensor(predict)?, vocab))();
            return Err(BackendError::named_by_reference(&self.name(), r));
        }
        let (len, bonus) = self.dev(kernels::dflash(&c, &t))?;
        Ok(DflashAccepted { accept_len: TchTensor(len), bonus: TchTensor(bonus) })
    }

    fn rejection_verify(&self, args: RejectionArgs<'_, TchTensor>, noise: RejectionNoise<'_, TchTensor>, cmp: Comparator) -> Result<Verified<TchTensor>> {
        let r = self.rejection_dims(&args)?;
        let u = self.float(noise.accept_uniforms, "accept_uniforms")?;
        let (draw, uniform) = match noise.draw {
            DrawNoiseArg::InverseCdf(t) => (self.float(t, "draw_uniforms")?, true),
            DrawNoiseArg::ExponentialRace(t) => (self.float(t, "draw_exponentials")?, false),
        };
        let dims = r.dims.filter(|&(b, k, v)| {
            let want: &[i64] = if uniform { &[b, k + 1] } else { &[b, k + 1, v] };
            u.size() == [b, k] && draw.size() == want
        });
        let ok = match dims {
            Some((_, k, v)) => self.passes((|| {
                let mut c = Self::rejection_checks(&r, k, v)?;
                c.push(check::uniforms(&u)?);
                c.push(if uniform { check::uniforms(&draw)? } else { check::exponentials(&draw)? });
                Ok(c)
            })())?,
            None => false,
        };
        if !ok {
            let reference = (|| {
                let (p, q, d, l) = self.reference_rejection_args(&args)?;
                let u = self.ref_tensor(noise.accept_uniforms)?;
                let (n, inverse) = self.ref_noise(noise.draw)?;
                let draw = if inverse { DrawNoiseArg::InverseCdf(&n) } else { DrawNoiseArg::ExponentialRace(&n) };
                let args = RejectionArgs { target_probs: &p, draft_probs: q.as_ref(), draft_tokens: &d, proposal_lens: &l };
                ReferenceBackend.rejection_verify(args, RejectionNoise { accept_uniforms: &u, draw }, cmp)
            })();
            return Err(BackendError::named_by_reference(&self.name(), reference));
        }
        let noise = if uniform { Noise::Uniform(&draw) } else { Noise::Exponential(&draw) };
        let job = Rejection { p: &r.p, q: r.q.as_ref(), drafts: &r.d, lens: &r.l, u: &u, noise };
        self.dev(kernels::rejection(&job, cmp)).map(|v| self.verified(v))
    }

    /// GLUE-6: as [`TchBackend::greedy_verify_unchecked`].
    fn rejection_verify_unchecked(&self, args: RejectionArgs<'_, TchTensor>, noise: RejectionNoise<'_, TchTensor>, cmp: Comparator) -> Result<Verified<TchTensor>> {
        let r = self.rejection_dims(&args)?;
        let u = self.float(noise.accept_uniforms, "accept_uniforms")?;
        let (draw, uniform) = match noise.draw {
            DrawNoiseArg::InverseCdf(t) => (self.float(t, "draw_uniforms")?, true),
            DrawNoiseArg::ExponentialRace(t) => (self.float(t, "draw_exponentials")?, false),
        };
        let dims_ok = r.dims.is_some_and(|(b, k, v)| {
            let want: &[i64] = if uniform { &[b, k + 1] } else { &[b, k + 1, v] };
            u.size() == [b, k] && draw.size() == want
        });
        if !dims_ok {
            return self.rejection_verify(args, noise, cmp);
        }
        let noise = if uniform { Noise::Uniform(&draw) } else { Noise::Exponential(&draw) };
        let job = Rejection { p: &r.p, q: r.q.as_ref(), drafts: &r.d, lens: &r.l, u: &u, noise };
        self.dev(kernels::rejection(&job, cmp)).map(|v| self.verified(v))
    }

    fn rejection_verify_seeded(&self, args: RejectionArgs<'_, TchTensor>, method: DrawMethod, cmp: Comparator, seed: u64) -> Result<Verified<TchTensor>> {
        let r = self.rejection_dims(&args)?;
        let ok = match r.dims {
            Some((_, k, v)) => self.passes(Self::rejection_checks(&r, k, v))?,
            None => false,
        };
        let Some(dims) = r.dims.filter(|_| ok) else {
            let reference = (|| {
                let (p, q, d, l) = self.reference_rejection_args(&args)?;
                let args = RejectionArgs { target_probs: &p, draft_probs: q.as_ref(), draft_tokens: &d, proposal_lens: &l };
                ReferenceBackend.rejection_verify_seeded(args, method, cmp, seed)
            })();
            return Err(BackendError::named_by_reference(&self.name(), reference));
        };
        let (u, draw) = self.dev(self.seeded_noise(dims, method, seed))?;
        let noise = match method {
            DrawMethod::InverseCdf => Noise::Uniform(&draw),
            DrawMethod::ExponentialRace => Noise::Exponential(&draw),
        };
        let job = Rejection { p: &r.p, q: r.q.as_ref(), drafts: &r.d, lens: &r.l, u: &u, noise };
        self.dev(kernels::rejection(&job, cmp)).map(|v| self.verified(v))
    }

    fn residual(&self, target: &TchTensor, draft: Option<&TchTensor>, drafted: &TchTensor) -> Result<TchTensor> {
        let p = self.float(target, "target_probs")?;
        let q = draft.map(|q| self.float(q, "draft_probs")).transpose()?;
        let x = self.int(drafted, "drafted")?;
        let shapes_ok = match p.size()[..] {
            [rows, v] => rows >= 1 && v >= 1 && x.size() == [rows] && q.as_ref().is_none_or(|q| q.size() == p.size()),
            _ => false,
        };
        let ok = shapes_ok
            && self.passes((|| {
                let mut c = vec![check::ids(&x, p.size()[1])?, check::prob_rows(&p)?];
                if let Some(q) = &q {
                    c.push(check::prob_rows(q)?);
                }
                Ok(c)
            })())?;
        if !ok {
            let r = (|| ReferenceBackend.residual(&self.ref_tensor(target)?, self.ref_opt(draft)?.as_ref(), &self.ref_tensor(drafted)?))();
            return Err(BackendError::named_by_reference(&self.name(), r));
        }
        self.dev(kernels::residual(&p, q.as_ref(), &x)).map(TchTensor)
    }

    fn process_logits(&self, logits: &TchTensor, params: LogitsParams<'_, TchTensor>) -> Result<TchTensor> {
        processors::process_with_processors(self, logits, params)
    }

    fn draw(&self, weights: &TchTensor, noise: DrawNoiseArg<'_, TchTensor>) -> Result<TchTensor> {
        let w = self.float(weights, "weights")?;
        let (n, uniform) = match noise {
            DrawNoiseArg::InverseCdf(t) => (self.float(t, "draw_uniforms")?, true),
            DrawNoiseArg::ExponentialRace(t) => (self.float(t, "draw_exponentials")?, false),
        };
        let shapes_ok = match w.size()[..] {
            [rows, v] if rows >= 1 && v >= 1 => n.size() == if uniform { vec![rows] } else { vec![rows, v] },
            _ => false,
        };
        let ok = shapes_ok
            && self.passes((|| {
                let noise_ok = if uniform { check::uniforms(&n)? } else { check::exponentials(&n)? };
                Ok(vec![noise_ok, check::weight_rows(&w)?])
            })())?;
        if !ok {
            let r = (|| {
                let (n, inverse) = self.ref_noise(noise)?;
                let arg = if inverse { DrawNoiseArg::InverseCdf(&n) } else { DrawNoiseArg::ExponentialRace(&n) };
                ReferenceBackend.draw(&self.ref_tensor(weights)?, arg)
            })();
            return Err(BackendError::named_by_reference(&self.name(), r));
        }
        let noise = if uniform { Noise::Uniform(&n) } else { Noise::Exponential(&n) };
        self.dev(kernels::draw(&w, noise)).map(TchTensor)
    }

    fn ngram_propose(&self, contexts: &TchTensor, context_lens: &TchTensor, vocab: usize, cfg: &NgramConfig) -> Result<(TchTensor, TchTensor)> {
        cfg.validate()?;
        let (c, l) = (self.int(contexts, "contexts")?, self.int(context_lens, "context_lens")?);
        let width = match c.size()[..] {
            [b, width] if b >= 1 && l.size() == [b] => Some(width),
            _ => None,
        };
        let config = ngram_config(cfg);
        let ok = match (width, &config) {
            (Some(width), Some(cfg)) => self.passes((|| {
                let mut checks = vec![check::in_range(&l, 1, width)?, check::padded_ids(&c, &l, vocab_i64(vocab))?];
                if let Some(max) = cfg.max_model_len {
                    checks.push(l.f_le(max)?); // NGRAM-5: ContextTooLong
                }
                Ok(checks)
            })())?,
            _ => false,
        };
        let Some(config) = config.filter(|_| ok) else {
            let r = (|| ReferenceBackend.ngram_propose(&self.ref_tensor(contexts)?, &self.ref_tensor(context_lens)?, vocab, cfg))();
            return Err(BackendError::named_by_reference(&self.name(), r));
        };
        let (drafts, lens) = self.dev(kernels::ngram(&c, &l, &config))?;
        Ok((TchTensor(drafts), TchTensor(lens)))
    }

    fn kv_new(&self, batch: usize, heads: usize, head_dim: usize, capacity: usize) -> Result<TchKvCache> {
        kv::new(self, [batch, heads, head_dim, capacity])
    }

    fn kv_append(&self, cache: &mut TchKvCache, keys: &TchTensor, values: &TchTensor, counts: &TchTensor) -> Result<()> {
        kv::append(self, cache, keys, values, counts)
    }

    fn kv_trim(&self, cache: &mut TchKvCache, amounts: &TchTensor, mode: TrimMode) -> Result<TchTensor> {
        kv::trim(self, cache, amounts, mode)
    }

    fn kv_lens(&self, cache: &TchKvCache) -> Result<TchTensor> {
        Ok(TchTensor(cache.lens().shallow_clone()))
    }

    fn kv_contents(&self, cache: &TchKvCache) -> Result<(TchTensor, TchTensor)> {
        let (k, v) = self.dev(cache.contents())?;
        Ok((TchTensor(k), TchTensor(v)))
    }

    fn paged_gather(&self, pages: &TchTensor, block_table: &TchTensor, context_lens: &TchTensor) -> Result<TchTensor> {
        let (p, t, l) = (self.float(pages, "pages")?, self.int(block_table, "block_table")?, self.int(context_lens, "context_lens")?);
        let dims = match (p.size().as_slice(), t.size().as_slice()) {
            (&[num_pages, s, h, d], &[b, m]) if s >= 1 && h >= 1 && d >= 1 && b >= 1 && l.size() == [b] => Some((num_pages, s, m)),
            _ => None,
        };
        let ok = match dims {
            Some((num_pages, s, m)) => self.passes((|| {
                // KV-8/9: lengths in [1, M S]; the first ceil(len / S) slots name pages.
                let used = readable(&l.f_add_scalar(s - 1)?.f_floor_divide_scalar(s)?, m, false)?;
                let blocks = where_read(&check::ids(&t, num_pages)?, &used)?;
                Ok(vec![check::in_range(&l, 1, m * s)?, blocks, p.f_isfinite()?])
            })())?,
            None => false,
        };
        if !ok {
            let r = (|| ReferenceBackend.paged_gather(&self.ref_tensor(pages)?, &self.ref_tensor(block_table)?, &self.ref_tensor(context_lens)?))();
            return Err(BackendError::named_by_reference(&self.name(), r));
        }
        let max_len = self.dev(l.f_max().and_then(|m| i64::try_from(&m)))?;
        self.dev(kernels::paged_gather(&p, &t, &l, max_len)).map(TchTensor)
    }

    fn reshape(&self, t: &TchTensor, shape: &[usize]) -> Result<TchTensor> {
        self.glue_reshape(t, shape)
    }

    fn gather_rows(&self, t: &TchTensor, rows: &TchTensor) -> Result<TchTensor> {
        self.glue_gather_rows(t, rows)
    }

    fn concat_rows(&self, parts: &[&TchTensor]) -> Result<TchTensor> {
        self.glue_concat_rows(parts)
    }

    fn add_i64(&self, a: &TchTensor, b: &TchTensor) -> Result<TchTensor> {
        self.glue_int_op(crate::glue::IntOp::Add, a, b)
    }

    fn sub_i64(&self, a: &TchTensor, b: &TchTensor) -> Result<TchTensor> {
        self.glue_int_op(crate::glue::IntOp::Sub, a, b)
    }
}

/// NGRAM-1 in device form; `None` if a size does not fit i64 (the reference then decides).
fn ngram_config(cfg: &NgramConfig) -> Option<kernels::Ngram> {
    Some(kernels::Ngram {
        ngram_min: i64::try_from(cfg.ngram_min).ok()?,
        ngram_max: i64::try_from(cfg.ngram_max).ok()?,
        k: i64::try_from(cfg.k).ok()?,
        most_recent: cfg.policy == NgramPolicy::LargestNMostRecent,
        max_model_len: match cfg.max_model_len {
            Some(m) => Some(i64::try_from(m).ok()?),
            None => None,
        },
    })
}

/// LOGITS-7 .. LOGITS-10 as f32 libtorch ops on the tensors' device; one fused check.
impl ProcessorKernels for TchBackend {
    fn processor_inputs_ok(&self, logits: &TchTensor, p: &LogitsParams<'_, TchTensor>) -> Result<bool> {
        let z = self.float(logits, "logits")?;
        let [rows, vocab] = z.size()[..] else { return Ok(false) };
        let mut checks = Vec::new();
        let mut shapes_ok = true;
        let mut per = |t: &TchTensor, arg: &str, dims: &[i64], ok: &dyn Fn(&Tensor) -> TResult<Tensor>| -> Result<()> {
            let t = self.float(t, arg)?;
            shapes_ok &= t.size() == dims;
            if shapes_ok {
                checks.push(self.dev(ok(&t))?);
            }
            Ok(())
        };
        if let Some(m) = p.min_p {
            per(m, "min_p", &[rows], &|m| m.f_ge(0.0)?.f_logical_and(&m.f_le(1.0)?))?;
        }
        if let Some(x) = p.penalties {
            per(x.counts, "penalty_counts", &[rows, vocab], &|c| c.f_isfinite()?.f_logical_and(&c.f_ge(0.0)?)?.f_logical_and(&c.f_eq_tensor(&c.f_floor()?)?))?;
            per(x.repetition, "repetition_penalty", &[rows], &|r| r.f_isfinite()?.f_logical_and(&r.f_gt(0.0)?))?;
            per(x.presence, "presence_penalty", &[rows], &|t| t.f_isfinite())?;
            per(x.frequency, "frequency_penalty", &[rows], &|t| t.f_isfinite())?;
        }
        if let Some(b) = p.logit_bias {
            per(b, "logit_bias", &[rows, vocab], &|t| t.f_isfinite())?;
        }
        Ok(shapes_ok && (checks.is_empty() || self.passes(Ok(checks))?))
    }

    fn bias_and_penalties(&self, logits: &TchTensor, penalties: Option<Penalties<'_, TchTensor>>, bias: Option<&TchTensor>) -> Result<TchTensor> {
        let mut z = self.float(logits, "logits")?;
        if let Some(b) = bias {
            z = self.dev(z.f_add(&self.float(b, "logit_bias")?))?;
        }
        if let Some(x) = penalties {
            let c = self.float(x.counts, "penalty_counts")?;
            let col = |t: &TchTensor, arg: &str| self.float(t, arg).and_then(|t| self.dev(t.f_unsqueeze(1)));
            let (rep, pres, freq) = (col(x.repetition, "repetition_penalty")?, col(x.presence, "presence_penalty")?, col(x.frequency, "frequency_penalty")?);
            z = self.dev((|| {
                // LOGITS-8 then LOGITS-9, only where the id was counted.
                let repeated = z.f_div(&rep)?.f_where_self(&z.f_gt(0.0)?, &z.f_mul(&rep)?)?;
                let penalised = repeated.f_sub(&c.f_mul(&freq)?.f_add(&pres)?)?;
                penalised.f_where_self(&c.f_gt(0.0)?, &z)
            })())?;
        }
        Ok(TchTensor(z))
    }

    fn min_p_cut(&self, _logits: &TchTensor, _params: LogitsParams<'_, TchTensor>, probs: &TchTensor, min_p: &TchTensor) -> Result<TchTensor> {
        let (p, m) = (self.float(probs, "probs")?, self.float(min_p, "min_p")?);
        self.dev((|| {
            let m = m.f_unsqueeze(1)?;
            let (largest, _) = p.f_max_dim(1, true)?;
            let threshold = largest.f_mul(&m)?;
            let kept = p.f_where_self(&p.f_ge_tensor(&threshold)?, &p.f_zeros_like()?)?;
            // A row with min-p off keeps its values bit for bit: a request's
            // output must not depend on whether another row of its batch uses min-p.
            kept.f_div(&kept.f_sum_dim_intlist(1, true, Kind::Float)?)?.f_where_self(&m.f_gt(0.0)?, &p)
        })())
        .map(TchTensor)
    }

    fn basic_process_logits(&self, logits: &TchTensor, params: LogitsParams<'_, TchTensor>) -> Result<TchTensor> {
        let z = self.float(logits, "logits")?;
        let t = self.float(params.temperature, "temperature")?;
        let k = self.int(params.top_k, "top_k")?;
        let p = self.float(params.top_p, "top_p")?;
        let shapes_ok = match z.size()[..] {
            [rows, v] => rows >= 1 && v >= 1 && [&t, &k, &p].iter().all(|x| x.size() == [rows]),
            _ => false,
        };
        let ok = shapes_ok
            && self.passes((|| {
                // LOGITS-1: T finite and >= 0, top_k >= 0, top_p in (0, 1]; CONV-8 rows.
                let t_ok = t.f_isfinite()?.f_logical_and(&t.f_ge(0.0)?)?;
                let p_ok = p.f_gt(0.0)?.f_logical_and(&p.f_le(1.0)?)?;
                Ok(vec![t_ok, k.f_ge(0)?, p_ok, check::score_rows(&z)?])
            })())?;
        if !ok {
            let r = (|| {
                let (t, k, p) = (self.ref_tensor(params.temperature)?, self.ref_tensor(params.top_k)?, self.ref_tensor(params.top_p)?);
                ReferenceBackend.process_logits(&self.ref_tensor(logits)?, LogitsParams::new(&t, &k, &p))
            })();
            return Err(BackendError::named_by_reference(&self.name(), r));
        }
        self.dev(kernels::process_logits(&z, &Params { temperature: &t, top_k: &k, top_p: &p })).map(TchTensor)
    }
}
