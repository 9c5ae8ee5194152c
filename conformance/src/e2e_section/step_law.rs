//! The `step-law` check: the exact law of one sampled engine step, with the
//! verify noise given explicitly (DECODE-3), so a decoder that shares one
//! accept uniform across a step's drafts, or draws the correction with
//! another position's uniform, fails deterministically rather than by the
//! power of a statistical test.
//!
//! For each setting (k = 2 at temperature 1; k = 3 at temperature 0.8 with
//! top-k 6) one request is drafted for once, seeded, and its first step's
//! drafts `d` recorded: on the first of the section's prompts (the sampled
//! check's, then the greedy ones) and 32 seeds whose step reaches two drafts
//! with an acceptance probability strictly between 0 and 1 (a shared accept
//! uniform leaves the law unchanged where fewer can go either way; the
//! target drafting for itself never rejects, and its check covers the
//! draws). The engine's law of that step's emitted tokens given
//! `d` is then integrated over its verify uniforms by bisecting each
//! boundary ([`crate::exact::step_law_of`]): every probe is a real engine
//! step, a fresh request of the same seed (so the same drafts) with its
//! uniforms given. The expected law is computed from the rules, on the
//! f64 reference forward's rows (the target's `p` and, for a draft model,
//! its own `q`, processed with the request's parameters): draft `j` is
//! accepted with `min(1, p_j(d_j) / q_j(d_j))` (ACCEPT-1), or `p_j(d_j)`
//! without `q` (RESID-2); the first rejection draws from the residual of
//! its row (RESID-1 .. RESID-3); all accepted draws the bonus from row
//! `len` (REJECT-4).
//!
//! Proposers: n-gram and iterative DFlash (no `q`: their drafts are a
//! function of the context), the draft models (a seeded one, the target
//! itself, early exit), whose `q` the reference computes on its own, and
//! parallel DFlash, whose `q` is the one the proposer reports with its
//! drafts (its host drafter's rows from the target's hidden states): the
//! check then holds the verify given `q` exactly, the shared or misindexed
//! uniform and the bonus row included; that `q` is the law the drafts were
//! drawn from is `sampled`'s to show.

use std::sync::Arc;

use specdec_backend::model::{LlamaWeights, ModelBackend, RefModel};
use specdec_backend::{PAD, SamplingParams};
use specdec_decoder::{EngineConfig, Request};

use super::fidelity::Recording;
use super::{PENALISED, Setting, build_proposer, engine, err_of, processed_rows, processed_rows_counting, sampled_setup, seeded_draft, tiny_prompts};
use crate::compare::Verdict;
use crate::exact::{Instance, Law, Probe, ProbeOut, max_abs_diff, step_law_of};
use crate::model_section::Subject;
use crate::stat;

/// The settings of the check: drafts per step and sampling parameters (the
/// third with every processor on: a window row that forgets the drafts
/// before it, or a `q` computed without the penalties, moves this law).
pub(super) const SETTINGS: [(usize, Setting); 3] = [(2, Setting::plain(SamplingParams::new(1.0, 0, 1.0))), (3, Setting::plain(SamplingParams::new(0.8, 6, 1.0))), (2, PENALISED)];

/// Whether the check runs for a proposer of the tiny model.
pub(super) fn applies(proposer: &str) -> bool {
    reference_q(proposer).is_some()
}

pub(super) fn rules(proposer: &str) -> &'static [&'static str] {
    match reference_q(proposer) {
        Some(QSource::None) => &["DECODE-3", "REJECT-2", "REJECT-4", "RESID-2"],
        _ => &["DECODE-3", "REJECT-2", "REJECT-3", "REJECT-4", "RESID-1"],
    }
}

/// Where the reference's `q` of a proposer comes from.
enum QSource {
    /// Drafts without probabilities (RESID-2).
    None,
    /// The target drafting for itself.
    Target,
    /// The section's seeded draft model.
    Seeded,
    /// The target's first `L` layers.
    EarlyExit(usize),
    /// The rows the proposer reports with its drafts (parallel DFlash).
    Reported,
}

/// `None` where the check does not apply.
fn reference_q(proposer: &str) -> Option<QSource> {
    match proposer {
        "ngram" => Some(QSource::None),
        p if p.starts_with("dflash-iter:") => Some(QSource::None),
        p if p.starts_with("dflash:") => Some(QSource::Reported),
        "draft:self" => Some(QSource::Target),
        "draft:seeded" => Some(QSource::Seeded),
        p => p.strip_prefix("early-exit:").and_then(|l| l.parse().ok()).map(QSource::EarlyExit),
    }
}

/// Runs the check for `proposer` on the tiny model.
pub(super) fn check<B: ModelBackend>(b: &B, s: &Subject, m: &B::Model, proposer: &str, config: &EngineConfig, seed: u64) -> Verdict {
    let mut worst = 0.0f64;
    for (i, (k, setting)) in SETTINGS.iter().enumerate() {
        // The first two settings keep the streams they always had.
        let stream = if i < 2 { format!("step-law/{proposer}/{k}") } else { format!("step-law/{proposer}/{k}/penalised") };
        match check_setting(b, s, m, proposer, config, stat::stream_seed(seed, &stream), *k, setting) {
            Ok(err) => worst = worst.max(err),
            Err(v) => return v,
        }
    }
    Verdict::Pass { excused: 0, max_abs_err: worst }
}

#[allow(clippy::too_many_arguments)]
fn check_setting<B: ModelBackend>(b: &B, s: &Subject, m: &B::Model, proposer: &str, config: &EngineConfig, seed: u64, k: usize, setting: &Setting) -> Result<f64, Verdict> {
    let params = setting.params;
    let fail = |msg: String| Verdict::Fail(format!("k = {k}, {setting:?}: {msg}"));
    let (sampled_prompt, _) = sampled_setup(&s.weights).map_err(fail)?;
    let prompts: Vec<Vec<u32>> = std::iter::once(sampled_prompt).chain(tiny_prompts()).collect();
    let config = EngineConfig { k, ..config.clone() };
    let eng = engine(b, &s.weights, m, &config).map_err(fail)?;
    let mut p = build_proposer(b, proposer, &s.weights).map_err(fail)?;
    // The first step's drafts, from the request's own draft stream: the first
    // of SEED_TRIES seeds whose step reaches two drafts that can go either
    // way (a shared accept uniform changes the law only then). The target drafting
    // for itself has every draft accepted: its first seed serves.
    let always_accepted = matches!(reference_q(proposer), Some(QSource::Target));
    let mut found = None;
    for (prompt, t) in prompts.iter().flat_map(|p| (0..SEED_TRIES).map(move |t| (p, t))) {
        let request = setting.request(prompt.clone(), k + 1, seed.wrapping_add(t));
        let mut rec = Recording::new(p.as_mut());
        eng.generate(std::slice::from_ref(&request), &mut rec, None, &mut specdec_decoder::NoSink).map_err(|e| fail(err_of(&e)))?;
        let drafts = rec.first_drafts().ok_or_else(|| fail("the proposer was never asked to draft".into()))?;
        if drafts.len() < 2 {
            continue;
        }
        let expected = expected_law(&s.weights, proposer, prompt, &drafts, setting, rec.first_q(), true).map_err(fail)?;
        // Drafts the step can reach (those before the first that is always
        // rejected) and that can go either way.
        let open = expected.accept.iter().take_while(|&&a| a > 0.0).filter(|&&a| a < 1.0).count();
        // With penalties, a step whose law the drafts' penalties move (a
        // min-p cut can hide them): else a window row that forgets the
        // drafts before it would go unseen.
        let sensitive = !setting.params.penalised() || {
            let forgetting = expected_law(&s.weights, proposer, prompt, &drafts, setting, rec.first_q(), false).map_err(fail)?;
            max_abs_diff(&expected.law, &forgetting.law) > 1e-9
        };
        if (always_accepted || open >= 2) && sensitive {
            found = Some((request, drafts, expected));
            break;
        }
    }
    let Some((request, drafts, Expected { law: want, p: rows, scale, .. })) = found else {
        return Err(fail(format!("no prompt and seed (of {} x {SEED_TRIES}) reaches two drafts that can go either way: a shared accept uniform would go unseen", prompts.len())));
    };
    let len = drafts.len();
    let mut padded: Vec<i64> = drafts.iter().map(|&t| i64::from(t)).collect();
    padded.resize(k, PAD);
    let instance = Instance { p: rows, q: None, drafts: padded, len, weight: 1.0 };

    // Every probe is a fresh request of the same seed with its uniforms given:
    // the step's `len` accept uniforms, its draw uniform, then filler for the
    // steps after the first (the run ends within `len + 1` steps).
    let filler = vec![0.5; (k + 1) * (k + 1)];
    let mut runner = |_: &[Instance], probes: &[Probe]| -> Result<Vec<ProbeOut>, String> {
        let clamp = |x: f64| x.min(1.0 - f64::EPSILON / 2.0);
        let requests: Vec<Request> = probes
            .iter()
            .map(|pr| {
                let given = pr.u[..len].iter().copied().chain([pr.draw]).map(clamp).chain(filler.iter().copied()).collect();
                Request { verify_uniforms: Some(given), ..request.clone() }
            })
            .collect();
        let mut first: Vec<Option<Vec<u32>>> = vec![None; requests.len()];
        let mut sink = |slot: usize, ids: &[u32]| {
            first[slot].get_or_insert_with(|| ids.to_vec());
        };
        eng.generate(&requests, p.as_mut(), None, &mut sink).map_err(|e| err_of(&e))?;
        first
            .into_iter()
            .enumerate()
            .map(|(i, step)| {
                let step = step.ok_or_else(|| format!("probe {i}: the engine emitted nothing"))?;
                let n = step.len().checked_sub(1).ok_or_else(|| format!("probe {i}: the first step emitted no token"))?;
                if n > len || step[..n] != drafts[..n] {
                    return Err(format!("probe {i}: the first step emitted {step:?}, which does not start with the accepted drafts of {drafts:?}"));
                }
                let mut tokens: Vec<i64> = step.iter().map(|&t| i64::from(t)).collect();
                tokens.resize(k + 1, PAD);
                Ok((tokens, n))
            })
            .collect()
    };
    let got = step_law_of(&mut runner, std::slice::from_ref(&instance)).map_err(fail)?;

    // A backend whose logits are within `delta` of the reference's moves each
    // processed probability by a factor within exp(±2 delta / T); the step
    // law is a sum of products of at most 2 (k + 1) such factors and ratios.
    let delta = b.model_precision().logit_rel_tolerance * scale;
    let tol = if b.name() == "reference" { 1e-12 } else { (16.0 * (k + 1) as f64 * delta / params.temperature).max(1e-12) };
    let err = max_abs_diff(&got, &want).max((got.values().sum::<f64>() - 1.0).abs());
    if err > tol {
        let show = |l: &Law| l.iter().map(|(seq, p)| format!("{seq:?}: {p:.6}")).collect::<Vec<_>>().join(", ");
        return Err(fail(format!("drafts {drafts:?}: the engine's step law is off by {err:.3e} > {tol:.1e}; engine {{{}}}, rules {{{}}}", show(&got), show(&want))));
    }
    Ok(err)
}

/// Seeds tried for a step with two drafts that can be rejected.
const SEED_TRIES: u64 = 32;

/// What the rules say of one step given its drafts.
struct Expected {
    /// The law of the step's emitted tokens.
    law: Law,
    /// The target's processed rows.
    p: Vec<Vec<f64>>,
    /// Each draft's acceptance probability.
    accept: Vec<f64>,
    /// The largest `|logit|` among the rows (the scale of a backend's logit tolerance).
    scale: f64,
}

/// The law of one step's emitted tokens given `drafts`, from the rules on
/// the reference forward's rows.
/// `count_drafts: false` gives the law of a window whose rows forget the
/// drafts before them in their penalties (what the check must tell apart).
#[allow(clippy::too_many_arguments)]
fn expected_law(w: &Arc<LlamaWeights>, proposer: &str, prompt: &[u32], drafts: &[u32], setting: &Setting, reported_q: Option<&[Vec<f64>]>, count_drafts: bool) -> Result<Expected, String> {
    let len = drafts.len();
    let contexts: Vec<Vec<u32>> = (0..=len).map(|j| prompt.iter().chain(&drafts[..j]).copied().collect()).collect();
    let target = RefModel::new((**w).clone());
    // Row j counts the prompt and the drafts before it (LOGITS-13), as the
    // draft's q for draft j does.
    let counted = if count_drafts { contexts.clone() } else { vec![prompt.to_vec(); len + 1] };
    let (p, mut scale) = processed_rows_counting(&target, &contexts, &counted, prompt.len(), setting)?;
    let draft = match reference_q(proposer).ok_or_else(|| format!("no reference q for `{proposer}`"))? {
        QSource::None | QSource::Reported => None,
        QSource::Target => Some((**w).clone()),
        QSource::Seeded => Some(seeded_draft(w)?),
        QSource::EarlyExit(l) => Some(w.truncated(l).map_err(|e| e.to_string())?),
    };
    let q = match (draft, reference_q(proposer)) {
        (Some(d), _) => {
            let (q, s) = processed_rows(&RefModel::new(d), &contexts[..len], prompt.len(), setting)?;
            scale = scale.max(s);
            Some(q)
        }
        (None, Some(QSource::Reported)) => Some(reported_q.filter(|q| q.len() >= len).ok_or_else(|| format!("`{proposer}` reported no q for its {len} drafts"))?.to_vec()),
        (None, _) => None,
    };

    let mut law = Law::new();
    let mut reach = 1.0;
    let mut accepts = Vec::with_capacity(len);
    for (j, &d) in drafts.iter().enumerate() {
        let (accept, residual) = match &q {
            Some(q) => {
                if q[j][d as usize] == 0.0 {
                    return Err(format!("draft {j} ({d}) has probability 0 under the reference's q"));
                }
                let r: Vec<f64> = p[j].iter().zip(&q[j]).map(|(a, b)| (a - b).max(0.0)).collect();
                ((p[j][d as usize] / q[j][d as usize]).min(1.0), r)
            }
            None => {
                let mut r = p[j].clone();
                r[d as usize] = 0.0;
                (p[j][d as usize], r)
            }
        };
        let total: f64 = residual.iter().sum();
        let residual = if total > 0.0 { residual.iter().map(|x| x / total).collect() } else { p[j].clone() };
        add_draws(&mut law, &drafts[..j], &residual, reach * (1.0 - accept));
        reach *= accept;
        accepts.push(accept);
    }
    add_draws(&mut law, drafts, &p[len], reach);
    Ok(Expected { law, p, accept: accepts, scale })
}

/// Adds `mass` times the law `row` of the token drawn after `accepted`.
fn add_draws(law: &mut Law, accepted: &[u32], row: &[f64], mass: f64) {
    for (c, &pc) in row.iter().enumerate() {
        if mass * pc > 0.0 {
            let seq: Vec<i64> = accepted.iter().map(|&t| i64::from(t)).chain([c as i64]).collect();
            *law.entry(seq).or_default() += mass * pc;
        }
    }
}
