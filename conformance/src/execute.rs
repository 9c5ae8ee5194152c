//! Runs one case on one backend and collects its named outputs (CASE-4).
//!
//! The same code serves golden runs, `specdec check` on external files, and
//! `specdec bless` (which executes cases on the reference to write their
//! expected outputs), so there is one definition of what each op reads and
//! returns.

use serde_json::Value;
use specdec_backend::{Backend, BackendError, Comparator, DrawNoiseArg, HostTensor, LogitsParams, NgramConfig, Op, Penalties, RejectionArgs, RejectionNoise, TrimMode};

use crate::format::{Case, CaseError};
use crate::ops::case_op;

/// One output value, downloaded to the host.
#[derive(Debug, Clone, PartialEq)]
pub enum OutValue {
    Ints(HostTensor<i64>),
    Floats(HostTensor<f64>),
}

/// What a backend produced for a case: the outputs it returned (possibly
/// partial, e.g. the cache state after a failed step) and the error, if any.
#[derive(Debug, Clone, Default)]
pub struct Observed {
    pub outputs: Vec<(String, OutValue)>,
    pub error: Option<BackendError>,
}

impl Observed {
    pub fn get(&self, name: &str) -> Option<&OutValue> {
        self.outputs.iter().find(|(n, _)| n == name).map(|(_, v)| v)
    }
}

/// Executes `case` on `backend`. `Err` means the case itself is malformed.
pub fn execute<B: Backend>(backend: &B, case: &Case) -> Result<Observed, CaseError> {
    execute_with(backend, case, Checked::Yes)
}

/// Whether the verify ops run checked, or through their unchecked variants
/// (GLUE-6; every other op is the same either way).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Checked {
    Yes,
    No,
}

/// [`execute`], choosing the verify variant: the unchecked check of the
/// suite runs each valid verify case both ways and compares the outputs.
pub fn execute_with<B: Backend>(backend: &B, case: &Case, checked: Checked) -> Result<Observed, CaseError> {
    let unchecked = checked == Checked::No;
    let mut obs = Observed::default();
    let result = match case_op(case)? {
        Op::GreedyVerify => {
            let (s, d, l) = (case.input_f("target_scores")?, case.input_i("draft_tokens")?, case.input_i("proposal_lens")?);
            run(&mut obs, || {
                let (s, d, l) = (backend.upload_f64(&s)?, backend.upload_i64(&d)?, backend.upload_i64(&l)?);
                let v = if unchecked { backend.greedy_verify_unchecked(&s, &d, &l)? } else { backend.greedy_verify(&s, &d, &l)? };
                Ok(vec![("tokens", ints(backend, &v.tokens)?), ("num_accepted", ints(backend, &v.num_accepted)?)])
            })
        }
        Op::DflashAccept => {
            let (c, t) = (case.input_i("candidates")?, case.input_i("target_predict")?);
            let vocab: usize = case.param("vocab", None)?;
            run(&mut obs, || {
                let v = backend.dflash_accept(&backend.upload_i64(&c)?, &backend.upload_i64(&t)?, vocab)?;
                Ok(vec![("accept_len", ints(backend, &v.accept_len)?), ("bonus", ints(backend, &v.bonus)?)])
            })
        }
        Op::RejectionVerify => {
            let p = case.input_f("target_probs")?;
            let q = case.opt_input_f("draft_probs")?;
            let (d, l, u) = (case.input_i("draft_tokens")?, case.input_i("proposal_lens")?, case.input_f("accept_uniforms")?);
            let noise = draw_noise(case)?;
            let cmp: Comparator = case.param("comparator", Some(Comparator::Strict))?;
            run(&mut obs, || {
                let (p, d, l, u) = (backend.upload_f64(&p)?, backend.upload_i64(&d)?, backend.upload_i64(&l)?, backend.upload_f64(&u)?);
                let q = q.as_ref().map(|q| backend.upload_f64(q)).transpose()?;
                let n = backend.upload_f64(noise.tensor())?;
                let args = RejectionArgs { target_probs: &p, draft_probs: q.as_ref(), draft_tokens: &d, proposal_lens: &l };
                let noise = RejectionNoise { accept_uniforms: &u, draw: noise.arg(&n) };
                let v = if unchecked { backend.rejection_verify_unchecked(args, noise, cmp)? } else { backend.rejection_verify(args, noise, cmp)? };
                Ok(vec![("tokens", ints(backend, &v.tokens)?), ("num_accepted", ints(backend, &v.num_accepted)?)])
            })
        }
        Op::Residual => {
            let (p, q, x) = (case.input_f("target_probs")?, case.opt_input_f("draft_probs")?, case.input_i("drafted")?);
            run(&mut obs, || {
                let q = q.as_ref().map(|q| backend.upload_f64(q)).transpose()?;
                let r = backend.residual(&backend.upload_f64(&p)?, q.as_ref(), &backend.upload_i64(&x)?)?;
                Ok(vec![("residual", floats(backend, &r)?)])
            })
        }
        Op::ProcessLogits => {
            let (z, t, k, p) = (case.input_f("logits")?, case.input_f("temperature")?, case.input_i("top_k")?, case.input_f("top_p")?);
            let extra = ProcessorInputs::of(case, t.shape())?;
            run(&mut obs, || {
                let (t, k, p) = (backend.upload_f64(&t)?, backend.upload_i64(&k)?, backend.upload_f64(&p)?);
                let up = |x: &Option<HostTensor<f64>>| x.as_ref().map(|x| backend.upload_f64(x)).transpose();
                let (min_p, bias) = (up(&extra.min_p)?, up(&extra.logit_bias)?);
                let pen = extra.penalties.as_ref().map(|ps| ps.iter().map(|x| backend.upload_f64(x)).collect::<Result<Vec<_>, _>>()).transpose()?;
                let mut params = LogitsParams::new(&t, &k, &p);
                params.min_p = min_p.as_ref();
                params.logit_bias = bias.as_ref();
                params.penalties = pen.as_ref().map(|x| Penalties { counts: &x[0], repetition: &x[1], presence: &x[2], frequency: &x[3] });
                let probs = backend.process_logits(&backend.upload_f64(&z)?, params)?;
                Ok(vec![("probs", floats(backend, &probs)?)])
            })
        }
        Op::Draw => {
            let w = case.input_f("weights")?;
            let noise = draw_noise(case)?;
            run(&mut obs, || {
                let n = backend.upload_f64(noise.tensor())?;
                let t = backend.draw(&backend.upload_f64(&w)?, noise.arg(&n))?;
                Ok(vec![("tokens", ints(backend, &t)?)])
            })
        }
        Op::NgramPropose => {
            let (c, l) = (case.input_i("contexts")?, case.input_i("context_lens")?);
            let vocab: usize = case.param("vocab", None)?;
            let cfg: NgramConfig = case.param("config", None)?;
            run(&mut obs, || {
                let (d, n) = backend.ngram_propose(&backend.upload_i64(&c)?, &backend.upload_i64(&l)?, vocab, &cfg)?;
                Ok(vec![("drafts", ints(backend, &d)?), ("proposal_lens", ints(backend, &n)?)])
            })
        }
        Op::PagedGather => {
            let (p, t, l) = (case.input_f("pages")?, case.input_i("block_table")?, case.input_i("context_lens")?);
            run(&mut obs, || {
                let g = backend.paged_gather(&backend.upload_f64(&p)?, &backend.upload_i64(&t)?, &backend.upload_i64(&l)?)?;
                Ok(vec![("gathered", floats(backend, &g)?)])
            })
        }
        Op::KvCache => return kv_cache(backend, case),
        Op::Reshape => {
            let t = glue_input(case, "t")?;
            let shape: Vec<usize> = case.param("shape", None)?;
            run(&mut obs, || {
                let out = backend.reshape(&t.upload(backend)?, &shape)?;
                Ok(vec![("out", t.download(backend, &out)?)])
            })
        }
        Op::GatherRows => {
            let (t, rows) = (glue_input(case, "t")?, case.input_i("rows")?);
            run(&mut obs, || {
                let out = backend.gather_rows(&t.upload(backend)?, &backend.upload_i64(&rows)?)?;
                Ok(vec![("out", t.download(backend, &out)?)])
            })
        }
        Op::ConcatRows => {
            let parts = glue_parts(case)?;
            run(&mut obs, || {
                let uploaded = parts.iter().map(|p| p.upload(backend)).collect::<Result<Vec<_>, _>>()?;
                let out = backend.concat_rows(&uploaded.iter().collect::<Vec<_>>())?;
                // An empty list has no dtype: the params name it (f64 by default).
                let like = parts.first().cloned().unwrap_or_else(|| GlueIn::empty(case));
                Ok(vec![("out", like.download(backend, &out)?)])
            })
        }
        Op::AddI64 | Op::SubI64 => {
            let (a, b) = (case.input_i("a")?, case.input_i("b")?);
            let add = case.op == Op::AddI64.name();
            run(&mut obs, || {
                let (a, b) = (backend.upload_i64(&a)?, backend.upload_i64(&b)?);
                let out = if add { backend.add_i64(&a, &b)? } else { backend.sub_i64(&a, &b)? };
                Ok(vec![("out", ints(backend, &out)?)])
            })
        }
        Op::RejectionVerifySeeded => unreachable!("rejected by case_op"),
    };
    if let Err(e) = result {
        obs.error = Some(e);
    }
    Ok(obs)
}

type Named = Vec<(&'static str, OutValue)>;

fn run(obs: &mut Observed, f: impl FnOnce() -> Result<Named, BackendError>) -> Result<(), BackendError> {
    let outputs = f()?;
    obs.outputs.extend(outputs.into_iter().map(|(n, v)| (n.to_string(), v)));
    Ok(())
}

fn ints<B: Backend>(b: &B, t: &B::Tensor) -> Result<OutValue, BackendError> {
    Ok(OutValue::Ints(b.download_i64(t)?))
}

fn floats<B: Backend>(b: &B, t: &B::Tensor) -> Result<OutValue, BackendError> {
    Ok(OutValue::Floats(b.download_f64(t)?))
}

/// A glue op's tensor input, in the dtype `params.dtype` names: `"f64"`
/// (the default, uploaded with `upload_f64`), `"f32"` (values that must be
/// exact in f32, uploaded with `upload_f32`, GLUE-5) or `"i64"`.
#[derive(Clone)]
enum GlueIn {
    F64(HostTensor<f64>),
    F32(HostTensor<f32>),
    I64(HostTensor<i64>),
}

#[derive(Clone, Copy, PartialEq, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
enum GlueDtype {
    F64,
    F32,
    I64,
}

impl GlueIn {
    fn decode(case: &Case, dtype: GlueDtype, field: &str, v: &Value) -> Result<GlueIn, CaseError> {
        let err = |m: String| case.error("inputs", field, m);
        Ok(match dtype {
            GlueDtype::I64 => GlueIn::I64(crate::format::decode_i64(v).map_err(err)?),
            GlueDtype::F64 => GlueIn::F64(crate::format::decode_f64(v).map_err(err)?),
            GlueDtype::F32 => {
                let t = crate::format::decode_f64(v).map_err(err)?;
                // NaN is exact in f32 too; any other value must round-trip.
                if let Some(x) = t.data().iter().find(|&&x| !x.is_nan() && f64::from(x as f32) != x) {
                    return Err(case.error("inputs", field, format!("{x} is not exact in f32 (params.dtype is \"f32\")")));
                }
                GlueIn::F32(t.map(|&x| x as f32))
            }
        })
    }

    /// The zero-part stand-in of an empty `parts` list, for the output dtype.
    fn empty(case: &Case) -> GlueIn {
        match case.param("dtype", Some(GlueDtype::F64)) {
            Ok(GlueDtype::I64) => GlueIn::I64(HostTensor::from_vec(Vec::new())),
            _ => GlueIn::F64(HostTensor::from_vec(Vec::new())),
        }
    }

    fn upload<B: Backend>(&self, b: &B) -> Result<B::Tensor, BackendError> {
        match self {
            GlueIn::F64(t) => b.upload_f64(t),
            GlueIn::F32(t) => b.upload_f32(t),
            GlueIn::I64(t) => b.upload_i64(t),
        }
    }

    /// Downloads an output of this input's dtype family.
    fn download<B: Backend>(&self, b: &B, t: &B::Tensor) -> Result<OutValue, BackendError> {
        match self {
            GlueIn::I64(_) => ints(b, t),
            GlueIn::F64(_) | GlueIn::F32(_) => floats(b, t),
        }
    }
}

fn glue_input(case: &Case, name: &str) -> Result<GlueIn, CaseError> {
    let dtype = case.param("dtype", Some(GlueDtype::F64))?;
    let v = case.inputs.get(name).ok_or_else(|| case.error("inputs", name, "is missing"))?;
    GlueIn::decode(case, dtype, name, v)
}

/// `concat_rows` inputs: `parts`, a list of tensors of `params.dtype`.
fn glue_parts(case: &Case) -> Result<Vec<GlueIn>, CaseError> {
    let dtype = case.param("dtype", Some(GlueDtype::F64))?;
    let list = case.inputs.get("parts").and_then(Value::as_array).ok_or_else(|| case.error("inputs", "parts", "must be an array of tensors"))?;
    list.iter().enumerate().map(|(i, v)| GlueIn::decode(case, dtype, &format!("parts[{i}]"), v)).collect()
}

/// Draw noise named in a case: `draw_uniforms` or `draw_exponentials`.
enum Noise {
    Uniforms(HostTensor<f64>),
    Exponentials(HostTensor<f64>),
}

impl Noise {
    fn tensor(&self) -> &HostTensor<f64> {
        match self {
            Noise::Uniforms(t) | Noise::Exponentials(t) => t,
        }
    }

    fn arg<'a, T>(&self, t: &'a T) -> DrawNoiseArg<'a, T> {
        match self {
            Noise::Uniforms(_) => DrawNoiseArg::InverseCdf(t),
            Noise::Exponentials(_) => DrawNoiseArg::ExponentialRace(t),
        }
    }
}

fn draw_noise(case: &Case) -> Result<Noise, CaseError> {
    match (case.opt_input_f("draw_uniforms")?, case.opt_input_f("draw_exponentials")?) {
        (Some(u), None) => Ok(Noise::Uniforms(u)),
        (None, Some(e)) => Ok(Noise::Exponentials(e)),
        _ => Err(case.error("inputs", "draw_uniforms", "exactly one of draw_uniforms and draw_exponentials is required")),
    }
}

/// `kv_cache` cases: a script of appends and trims on a fresh cache. The
/// outputs are the final lengths and contents and the amounts each trim
/// removed; after a failing step they are the state the failure left.
fn kv_cache<B: Backend>(backend: &B, case: &Case) -> Result<Observed, CaseError> {
    let dims: [usize; 4] = ["batch", "heads", "head_dim", "capacity"].map(|n| case.param(n, None)).try_map_compat()?;
    let steps = case.inputs.get("steps").and_then(Value::as_array).ok_or_else(|| case.error("inputs", "steps", "must be an array"))?;
    // Parse the whole script before touching the backend.
    enum Step {
        Append(HostTensor<f64>, HostTensor<f64>, HostTensor<i64>),
        Trim(HostTensor<i64>, TrimMode),
    }
    let mut script = Vec::new();
    for (i, step) in steps.iter().enumerate() {
        let field = format!("steps[{i}]");
        // Exactly one action per step, and only the fields it reads (CASE-9).
        let only = |obj: &Value, what: &str, allowed: &[&str]| match obj.as_object() {
            None => Err(case.error("inputs", &field, format!("{what} must be an object"))),
            Some(o) => match o.keys().find(|k| !allowed.contains(&k.as_str())) {
                Some(k) => Err(case.error("inputs", &field, format!("unknown field `{k}` in {what} (it has {})", allowed.join(", ")))),
                None => Ok(()),
            },
        };
        let parsed = match step.as_object().map(|o| (o.len(), o.get("append"), o.get("trim"))) {
            Some((1, Some(a), None)) => {
                only(a, "append", &["keys", "values", "counts"])?;
                let get = |n: &str| a.get(n).ok_or_else(|| case.error("inputs", &field, format!("append needs `{n}`")));
                let f = |n: &str| get(n).and_then(|v| crate::format::decode_f64(v).map_err(|m| case.error("inputs", &field, m)));
                let counts = get("counts").and_then(|v| crate::format::decode_i64(v).map_err(|m| case.error("inputs", &field, m)))?;
                Step::Append(f("keys")?, f("values")?, counts)
            }
            Some((1, None, Some(t))) => {
                only(t, "trim", &["amounts", "mode"])?;
                let amounts = t.get("amounts").ok_or_else(|| case.error("inputs", &field, "trim needs `amounts`"))?;
                let amounts = crate::format::decode_i64(amounts).map_err(|m| case.error("inputs", &field, m))?;
                let mode = match t.get("mode") {
                    None => TrimMode::Strict,
                    Some(m) => serde_json::from_value(m.clone()).map_err(|e| case.error("inputs", &field, e))?,
                };
                Step::Trim(amounts, mode)
            }
            _ => return Err(case.error("inputs", &field, "must be an object with exactly one key, `append` or `trim`")),
        };
        script.push(parsed);
    }

    let mut obs = Observed::default();
    let mut cache = match backend.kv_new(dims[0], dims[1], dims[2], dims[3]) {
        Ok(c) => c,
        Err(e) => {
            obs.error = Some(e);
            return Ok(obs);
        }
    };
    let mut trimmed = Vec::new();
    let mut failed = None;
    for (i, step) in script.iter().enumerate() {
        let r = match step {
            Step::Append(k, v, c) => (|| backend.kv_append(&mut cache, &backend.upload_f64(k)?, &backend.upload_f64(v)?, &backend.upload_i64(c)?))(),
            Step::Trim(a, mode) => (|| {
                let t = backend.kv_trim(&mut cache, &backend.upload_i64(a)?, *mode)?;
                trimmed.extend(backend.download_i64(&t)?.into_data());
                Ok(())
            })(),
        };
        if let Err(e) = r {
            failed = Some((i, e));
            break;
        }
    }
    let state = (|| {
        let lens = backend.download_i64(&backend.kv_lens(&cache)?)?;
        let (k, v) = backend.kv_contents(&cache)?;
        Ok::<_, BackendError>((lens, backend.download_f64(&k)?, backend.download_f64(&v)?))
    })();
    match state {
        Ok((lens, k, v)) => {
            // A backend returning the wrong number of amounts gets a mis-shaped
            // output, which the judge reports; it must not stop the run.
            let trims = trimmed.len() / dims[0].max(1);
            let trimmed = HostTensor::new(vec![trims, dims[0]], trimmed).unwrap_or_else(|e| {
                let len = match e {
                    specdec_backend::SpecError::DataLength { len, .. } => len,
                    _ => 0,
                };
                HostTensor::new(vec![len], vec![-1; len]).expect("1-D")
            });
            obs.outputs.push(("lens".into(), OutValue::Ints(lens)));
            obs.outputs.push(("keys".into(), OutValue::Floats(k)));
            obs.outputs.push(("values".into(), OutValue::Floats(v)));
            obs.outputs.push(("trimmed".into(), OutValue::Ints(trimmed)));
        }
        Err(e) if failed.is_none() => failed = Some((script.len(), e)),
        Err(_) => {}
    }
    if let Some((step, e)) = failed {
        obs.outputs.push(("failed_step".into(), OutValue::Ints(HostTensor::from_vec(vec![step as i64]))));
        obs.error = Some(e);
    }
    Ok(obs)
}

trait TryMapCompat<T, const N: usize> {
    fn try_map_compat(self) -> Result<[T; N], CaseError>;
}

impl<T: Default + Copy, const N: usize> TryMapCompat<T, N> for [Result<T, CaseError>; N] {
    fn try_map_compat(self) -> Result<[T; N], CaseError> {
        let mut out = [T::default(); N];
        for (slot, r) in out.iter_mut().zip(self) {
            *slot = r?;
        }
        Ok(out)
    }
}

/// A `process_logits` case's optional processor inputs (LOGITS-7 .. LOGITS-10).
/// Penalties are present iff `penalty_counts` is; a penalty parameter a case
/// omits is off (repetition 1, presence and frequency 0), one given without
/// counts is a case-file error rather than silently unused.
pub(crate) struct ProcessorInputs {
    pub min_p: Option<HostTensor<f64>>,
    pub logit_bias: Option<HostTensor<f64>>,
    /// counts, repetition, presence, frequency.
    pub penalties: Option<[HostTensor<f64>; 4]>,
}

impl ProcessorInputs {
    pub(crate) fn of(case: &Case, rows: &[usize]) -> Result<Self, CaseError> {
        let neutral = |v: f64| HostTensor::new(rows.to_vec(), vec![v; rows.iter().product()]).map_err(|e| case.error("inputs", "temperature", e.to_string()));
        let param = |name: &str, off: f64| -> Result<HostTensor<f64>, CaseError> { case.opt_input_f(name)?.map_or_else(|| neutral(off), Ok) };
        let penalties = match case.opt_input_f("penalty_counts")? {
            Some(c) => Some([c, param("repetition_penalty", 1.0)?, param("presence_penalty", 0.0)?, param("frequency_penalty", 0.0)?]),
            None => {
                if let Some(name) = ["repetition_penalty", "presence_penalty", "frequency_penalty"].into_iter().find(|n| case.inputs.contains_key(*n)) {
                    return Err(case.error("inputs", name, "is given without `penalty_counts`".to_string()));
                }
                None
            }
        };
        Ok(ProcessorInputs { min_p: case.opt_input_f("min_p")?, logit_bias: case.opt_input_f("logit_bias")?, penalties })
    }
}
