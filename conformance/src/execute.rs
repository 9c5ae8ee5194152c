//! Runs one case on one backend and collects its named outputs (CASE-4).
//!
//! The same code serves golden runs, `specdec check` on external files, and
//! `specdec bless` (which executes cases on the reference to write their
//! expected outputs), so there is one definition of what each op reads and
//! returns.

use serde_json::Value;
use specdec_backend::{
    Backend, BackendError, Comparator, DrawNoiseArg, HostTensor, LogitsParams, NgramConfig, Op, RejectionArgs,
    RejectionNoise, TrimMode,
};

use crate::case::{Case, CaseError, OpFields};

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

/// The ops case files may use: every contract op with deterministic output.
pub fn case_op(case: &Case) -> Result<Op, CaseError> {
    match Op::from_name(&case.op) {
        Some(Op::RejectionVerifySeeded) => Err(CaseError::new(
            format!("case {} field op", case.id),
            "rejection_verify_seeded is checked statistically, not by golden cases",
        )),
        Some(op) => Ok(op),
        None => Err(CaseError::new(
            format!("case {} field op", case.id),
            format!(
                "unknown op \"{}\"; backend ops: {}; host ops (run on the reference): {}",
                case.op,
                Op::ALL.into_iter().filter(|op| *op != Op::RejectionVerifySeeded).map(Op::name).collect::<Vec<_>>().join(", "),
                crate::host::HOST_OPS.join(", ")
            ),
        )),
    }
}

/// What a case of `op` may hold (CASE-9); kept beside [`execute`], which reads exactly these.
pub fn op_fields(op: Op) -> OpFields {
    const VERIFY_OUT: &[&str] = &["tokens", "num_accepted"];
    let f = |params, inputs, outputs| OpFields { params, inputs, outputs, error_outputs: &[] };
    match op {
        Op::GreedyVerify => f(&[], &["target_scores", "draft_tokens", "proposal_lens"], VERIFY_OUT),
        Op::DflashAccept => f(&["vocab"], &["candidates", "target_predict"], &["accept_len", "bonus"]),
        Op::RejectionVerify => f(
            &["comparator"],
            &["target_probs", "draft_probs", "draft_tokens", "proposal_lens", "accept_uniforms", "draw_uniforms", "draw_exponentials"],
            VERIFY_OUT,
        ),
        Op::Residual => f(&[], &["target_probs", "draft_probs", "drafted"], &["residual"]),
        Op::ProcessLogits => f(&[], &["logits", "temperature", "top_k", "top_p"], &["probs"]),
        Op::Draw => f(&[], &["weights", "draw_uniforms", "draw_exponentials"], &["tokens"]),
        Op::NgramPropose => f(&["vocab", "config"], &["contexts", "context_lens"], &["drafts", "proposal_lens"]),
        Op::PagedGather => f(&[], &["pages", "block_table", "context_lens"], &["gathered"]),
        Op::KvCache => OpFields {
            params: &["batch", "heads", "head_dim", "capacity"],
            inputs: &["steps"],
            outputs: &["lens", "keys", "values", "trimmed"],
            error_outputs: &["failed_step"],
        },
        // Not a case op (`case_op` rejects it before its fields are asked for).
        Op::RejectionVerifySeeded => f(&[], &[], &[]),
    }
}

/// Executes `case` on `backend`. `Err` means the case itself is malformed.
pub fn execute<B: Backend>(backend: &B, case: &Case) -> Result<Observed, CaseError> {
    let mut obs = Observed::default();
    let result = match case_op(case)? {
        Op::GreedyVerify => {
            let (s, d, l) = (case.input_f("target_scores")?, case.input_i("draft_tokens")?, case.input_i("proposal_lens")?);
            run(&mut obs, || {
                let v = backend.greedy_verify(&backend.upload_f64(&s)?, &backend.upload_i64(&d)?, &backend.upload_i64(&l)?)?;
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
                let v = backend.rejection_verify(args, RejectionNoise { accept_uniforms: &u, draw: noise.arg(&n) }, cmp)?;
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
            run(&mut obs, || {
                let (t, k, p) = (backend.upload_f64(&t)?, backend.upload_i64(&k)?, backend.upload_f64(&p)?);
                let probs = backend.process_logits(&backend.upload_f64(&z)?, LogitsParams { temperature: &t, top_k: &k, top_p: &p })?;
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
                let f = |n: &str| get(n).and_then(|v| crate::case::decode_f64(v).map_err(|m| case.error("inputs", &field, m)));
                let counts = get("counts").and_then(|v| crate::case::decode_i64(v).map_err(|m| case.error("inputs", &field, m)))?;
                Step::Append(f("keys")?, f("values")?, counts)
            }
            Some((1, None, Some(t))) => {
                only(t, "trim", &["amounts", "mode"])?;
                let amounts = t.get("amounts").ok_or_else(|| case.error("inputs", &field, "trim needs `amounts`"))?;
                let amounts = crate::case::decode_i64(amounts).map_err(|m| case.error("inputs", &field, m))?;
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
            Step::Append(k, v, c) => (|| {
                backend.kv_append(&mut cache, &backend.upload_f64(k)?, &backend.upload_f64(v)?, &backend.upload_i64(c)?)
            })(),
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
