//! Judging a backend's observed outputs against a case's expectation
//! (CASE-5): exact for ids, within tolerance for floats, and excused only
//! where the reference's decision margin is below the backend's epsilon.

use serde_json::{Map, Value};
use specdec_backend::{BackendError, ErrorKind, HostTensor, Precision, SamplingParams};
use specdec_reference as r;

use crate::execute::{Observed, OutValue};
use crate::format::{Case, CaseError, ExpectedBy, decode_f64, decode_i64};

/// The outcome of one check.
#[derive(Debug, Clone, PartialEq)]
pub enum Verdict {
    /// Matched; `excused` rows differed only within their margin.
    Pass {
        excused: usize,
        max_abs_err: f64,
    },
    Fail(String),
    NotSupported(String),
}

/// Per-row decision margins of the reference on this case (SAMPLE-3), for
/// the ops whose integer or kept-set outputs can flip under rounding.
pub fn reference_margins(case: &Case) -> Result<Option<Vec<f64>>, CaseError> {
    let margins = match case.op.as_str() {
        "greedy_verify" => {
            let out = r::greedy_verify(&case.input_f("target_scores")?, &case.input_i("draft_tokens")?, &case.input_i("proposal_lens")?);
            out.ok().map(|o| o.margins)
        }
        "rejection_verify" => {
            let (p, q) = (case.input_f("target_probs")?, case.opt_input_f("draft_probs")?);
            let (d, l, u) = (case.input_i("draft_tokens")?, case.input_i("proposal_lens")?, case.input_f("accept_uniforms")?);
            let draw = match case.opt_input_f("draw_uniforms")? {
                Some(v) => r::DrawNoise::InverseCdf(v),
                None => r::DrawNoise::ExponentialRace(case.input_f("draw_exponentials")?),
            };
            let cmp = case.param("comparator", Some(r::Comparator::Strict))?;
            let inputs = r::RejectionInputs { target_probs: &p, draft_probs: q.as_ref(), draft_tokens: &d, proposal_lens: &l, accept_uniforms: &u, draw: &draw };
            r::rejection_verify(&inputs, cmp).ok().map(|o| o.margins)
        }
        "draw" => {
            let w = case.input_f("weights")?;
            let noise = match case.opt_input_f("draw_uniforms")? {
                Some(v) => r::DrawNoise::InverseCdf(v),
                None => r::DrawNoise::ExponentialRace(case.input_f("draw_exponentials")?),
            };
            r::sampling::draw_rows(&w, &noise).ok().map(|d| d.iter().map(|x| x.margin).collect())
        }
        "process_logits" => {
            let (z, t, k, p) = (case.input_f("logits")?, case.input_f("temperature")?, case.input_i("top_k")?, case.input_f("top_p")?);
            let extra = crate::execute::ProcessorInputs::of(case, t.shape())?;
            logits_margins(&z, &t, &k, &p, &extra)
        }
        _ => None,
    };
    Ok(margins)
}

/// SAMPLE-3 margins of LOGITS decisions, on the logits after bias and
/// penalties (LOGITS-7 .. LOGITS-9): for top-k, the gap between the k-th
/// logit and the largest logit below it; for top-p, the distance of every
/// survivor's preceding mass from `top_p`; for min-p, the distance of every
/// survivor's ratio to the largest probability from `min_p` (LOGITS-10); for
/// T = 0, the argmax gap.
fn logits_margins(z: &HostTensor<f64>, t: &HostTensor<f64>, k: &HostTensor<i64>, p: &HostTensor<f64>, extra: &crate::execute::ProcessorInputs) -> Option<Vec<f64>> {
    let [rows, vocab] = z.shape() else { return None };
    if *vocab == 0 {
        return None; // an error case: no decision to protect
    }
    let at = |x: &Option<HostTensor<f64>>, row: usize| x.as_ref().map(|x| x.get(&[row]).copied()).unwrap_or(Some(0.0));
    fn lane(x: Option<&HostTensor<f64>>, row: usize) -> Option<&[f64]> {
        x.and_then(|x| x.lane(&[row]))
    }
    let mut out = Vec::with_capacity(*rows);
    for row in 0..*rows {
        let mut params = SamplingParams::new(*t.get(&[row])?, usize::try_from(*k.get(&[row])?).ok()?, *p.get(&[row])?);
        params.min_p = at(&extra.min_p, row)?;
        let pen = extra.penalties.as_ref();
        if let Some([_, rep, pres, freq]) = pen {
            (params.repetition_penalty, params.presence_penalty, params.frequency_penalty) = (*rep.get(&[row])?, *pres.get(&[row])?, *freq.get(&[row])?);
        }
        let inputs = r::RowInputs { counts: lane(pen.map(|x| &x[0]), row), bias: lane(extra.logit_bias.as_ref(), row) };
        // Invalid input is an error case: no decision to protect.
        r::process_logits_with(z.lane(&[row])?, params, inputs).ok()?;
        let logits = &r::logits::pre_process(z.lane(&[row])?, &params, inputs);
        let mut sorted = logits.to_vec();
        sorted.sort_by(|a, b| b.total_cmp(a));
        let scale = sorted[0].abs().max(1.0);
        let mut margin = f64::INFINITY;
        if params.temperature == 0.0 {
            let second = sorted.get(1).copied().unwrap_or(f64::NEG_INFINITY);
            margin = if sorted[0] == second { f64::INFINITY } else { (sorted[0] - second) / scale };
        } else {
            if params.top_k > 0 && params.top_k < *vocab {
                let kth = sorted[params.top_k - 1];
                if let Some(below) = sorted.iter().find(|&&x| x < kth) {
                    margin = margin.min((kth - below) / scale);
                }
            }
            let basic = SamplingParams::new(params.temperature, params.top_k, params.top_p);
            if params.top_p < 1.0 {
                // Survivors of top-k in descending probability order.
                let full = r::process_logits(logits, SamplingParams { top_p: 1.0, ..basic }).ok()?;
                let mut order: Vec<usize> = (0..*vocab).filter(|&i| full[i] > 0.0).collect();
                order.sort_by(|&a, &b| full[b].total_cmp(&full[a]).then(a.cmp(&b)));
                let mut before = 0.0;
                for &i in &order {
                    margin = margin.min((before - params.top_p).abs());
                    before += full[i];
                }
            }
            if params.min_p > 0.0 {
                // Survivors of top-k and top-p: each one's ratio to the largest.
                let cut = r::process_logits(logits, basic).ok()?;
                let largest = cut.iter().fold(0.0f64, |m, &x| m.max(x));
                for &x in cut.iter().filter(|&&x| x > 0.0) {
                    margin = margin.min((x / largest - params.min_p).abs());
                }
            }
        }
        out.push(margin);
    }
    Some(out)
}

/// `d <= bound`, false when either is NaN: a NaN difference must fail a
/// tolerance check, never pass it as a negated `>` would.
pub fn within(d: f64, bound: f64) -> bool {
    d <= bound
}

/// The scale a relative tolerance multiplies: the largest magnitude in
/// `row`, at least the smallest positive f64 (so an all-zero row still
/// gives a positive bound).
pub fn row_scale(row: &[f64]) -> f64 {
    row.iter().fold(0.0f64, |m, v| m.max(v.abs())).max(f64::MIN_POSITIVE)
}

/// Relative tolerance of a backend's float outputs by value dtype (CASE-10):
/// rounding error scales with magnitude, so an absolute tolerance alone
/// fails correct f32 values above ~100 (one binary32 ulp there is 7.6e-6).
/// A backend stating value tolerance 0 claims bit-exactness and gets none.
pub fn relative_tolerance(precision: &Precision) -> f64 {
    if precision.value_tolerance == 0.0 {
        return 0.0;
    }
    match precision.float_dtype {
        // ~8 ulps of binary32 (2^-23 = 1.2e-7): a few roundings of the port's arithmetic.
        "f32" => 1e-6,
        "f16" => 4e-3,
        "bf16" => 3e-2,
        // ~45 ulps of binary64 (2^-52 = 2.2e-16).
        _ => 1e-14,
    }
}

/// The relative floor of hand-written expectations (decimals, CASE-5).
pub const HAND_RTOL: f64 = 1e-12;

/// Judges `observed` against the case's `expect` block.
pub fn judge(case: &Case, observed: &Observed, precision: &Precision, margins: Option<&[f64]>) -> Verdict {
    judge_measured(case, observed, precision, margins).0
}

/// [`judge`], also returning the largest absolute float difference seen,
/// whether the case passed or failed (the report's "max abs err").
pub fn judge_measured(case: &Case, observed: &Observed, precision: &Precision, margins: Option<&[f64]>) -> (Verdict, f64) {
    let mut max_abs_err = 0.0;
    match judge_inner(case, observed, precision, margins, &mut max_abs_err) {
        Ok(v) => (v, max_abs_err),
        Err(e) => (Verdict::Fail(format!("malformed expectation: {e}")), max_abs_err),
    }
}

fn judge_inner(case: &Case, obs: &Observed, precision: &Precision, margins: Option<&[f64]>, max_abs_err: &mut f64) -> Result<Verdict, CaseError> {
    let expect = &case.expect;
    if let Some(BackendError::NotSupported { op, .. }) = &obs.error {
        return Ok(Verdict::NotSupported(format!("`{op}` is not supported")));
    }
    let mut failures = Vec::new();
    match (expect.get("error"), &obs.error) {
        (Some(kind), Some(BackendError::Invalid(e))) => {
            let want: ErrorKind = serde_json::from_value(kind.clone()).map_err(|m| case.error("expect", "error", m))?;
            if e.kind() != want {
                failures.push(format!("expected error {want:?}, got {:?}: {e}", e.kind()));
            }
            if let Some(arg) = expect.get("arg").and_then(Value::as_str)
                && e.arg() != Some(arg)
            {
                failures.push(format!("expected the error to name `{arg}`, it names {:?}: {e}", e.arg()));
            }
        }
        (Some(kind), Some(other)) => failures.push(format!("expected error {kind}, got {other}")),
        (Some(kind), None) => failures.push(format!("expected error {kind}, but the operation succeeded")),
        (None, Some(e)) => failures.push(format!("unexpected error: {e}")),
        (None, None) => {}
    }

    // Hand-written expectations are decimals (0.375 for a computed
    // 0.37499999999999994): they get a 1e-12 floor. Reference-written ones
    // are exact, so a backend claiming tolerance 0 must match bit for bit.
    // Both scale with the magnitude of the expected value: |got - want| <= atol + rtol |want| (CASE-10).
    let (floor, rel_floor) = if case.expected_by == ExpectedBy::Hand { (1e-12, HAND_RTOL) } else { (0.0, 0.0) };
    let tolerance = case.param::<f64>("tolerance", Some(0.0))?.max(precision.value_tolerance).max(floor);
    let rtol = relative_tolerance(precision).max(rel_floor);
    let mut excused_rows = std::collections::BTreeSet::new();
    for (name, want) in expected_outputs(expect) {
        let Some(got) = obs.get(name) else {
            failures.push(format!("missing output `{name}`"));
            continue;
        };
        // A margin of exactly 0 is a decision the spec makes at its boundary
        // (u = 0 with p(x) = 0, an exact tie): never excused. NaN never is either.
        let row_ok = |row: usize| margins.and_then(|m| m.get(row)).is_some_and(|&m| m > 0.0 && m < precision.margin_epsilon);
        match got {
            OutValue::Ints(got) => {
                let want = decode_i64(want).map_err(|m| case.error("expect", name, m))?;
                compare(name, &want, got, |a, b| a == b, &row_ok, &mut excused_rows, &mut failures);
            }
            OutValue::Floats(got) => {
                let want = decode_f64(want).map_err(|m| case.error("expect", name, m))?;
                // `a` is the expected value, `b` the backend's.
                let close = |a: &f64, b: &f64| (a.is_nan() && b.is_nan()) || a == b || (a - b).abs() <= tolerance + rtol * a.abs();
                if want.shape() == got.shape() {
                    for (a, b) in want.data().iter().zip(got.data()) {
                        if a.is_finite() && b.is_finite() {
                            *max_abs_err = max_abs_err.max((a - b).abs());
                        }
                    }
                }
                compare(name, &want, got, close, &row_ok, &mut excused_rows, &mut failures);
            }
        }
    }
    Ok(if failures.is_empty() { Verdict::Pass { excused: excused_rows.len(), max_abs_err: *max_abs_err } } else { Verdict::Fail(failures.join("; ")) })
}

/// The output entries of an `expect` block (everything but error metadata).
pub fn expected_outputs(expect: &Map<String, Value>) -> impl Iterator<Item = (&str, &Value)> {
    expect.iter().filter(|(k, _)| !matches!(k.as_str(), "error" | "arg")).map(|(k, v)| (k.as_str(), v))
}

fn compare<T: PartialEq + std::fmt::Debug>(
    name: &str,
    want: &HostTensor<T>,
    got: &HostTensor<T>,
    same: impl Fn(&T, &T) -> bool,
    row_excusable: &dyn Fn(usize) -> bool,
    excused: &mut std::collections::BTreeSet<usize>,
    failures: &mut Vec<String>,
) {
    if want.shape() != got.shape() {
        failures.push(format!("`{name}`: expected shape {:?}, got {:?}", want.shape(), got.shape()));
        return;
    }
    let row_len = if want.shape().is_empty() { 1 } else { want.len() / want.shape()[0].max(1) };
    for (i, (a, b)) in want.data().iter().zip(got.data()).enumerate() {
        if same(a, b) {
            continue;
        }
        let row = i / row_len.max(1);
        if row_excusable(row) {
            excused.insert(row);
            continue;
        }
        let index = r::tensor::unravel(want.shape(), i);
        failures.push(format!("`{name}`{index:?}: expected {a:?}, got {b:?}"));
        return;
    }
}
