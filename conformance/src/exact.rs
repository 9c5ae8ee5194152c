//! Exact output laws of a verify implementation, with no sampling (STAT-7).
//!
//! With inverse-CDF draws every random decision of a verify step reads one
//! uniform: draft `j`'s accept test reads `u_j` and is accepted on an
//! interval `[0, t_j)`; the correction or bonus drawn at row `j` reads `v_j`
//! and is monotone in it. So the exact law of the step's output is a sum
//! over the drafts of products of interval lengths, and those lengths can
//! be read off the implementation itself by bisecting each boundary. This
//! treats the backend as a black box: what is integrated is the code under
//! test, not a formula copied from it. 64 bisection rounds resolve every
//! boundary to 2^-64, so an exact implementation reproduces the target law
//! to about 1e-15.

use std::collections::BTreeMap;

use specdec_backend::{Backend, BackendError, Comparator, DrawNoiseArg, HostTensor, PAD, RejectionArgs, RejectionNoise};

use crate::model::TableModel;

/// A law over emitted token sequences.
pub type Law = BTreeMap<Vec<i64>, f64>;

/// One sequence to integrate: its target and draft rows, its drafts, and the
/// probability of having drawn these drafts.
#[derive(Debug, Clone)]
pub struct Instance {
    /// `k + 1` target rows.
    pub p: Vec<Vec<f64>>,
    /// `k` draft rows, or `None` (drafts without probabilities).
    pub q: Option<Vec<Vec<f64>>>,
    /// `k` draft slots, PAD from `len` on.
    pub drafts: Vec<i64>,
    /// The proposal length.
    pub len: usize,
    pub weight: f64,
}

/// The bisection depth: boundaries are resolved to 2^-BISECTION_ROUNDS.
pub const BISECTION_ROUNDS: usize = 64;

/// The largest uniform below 1: probes never step outside [0, 1) (CONV-3).
const BELOW_ONE: f64 = 1.0 - f64::EPSILON / 2.0;

/// Noise for one probe row.
pub struct Probe {
    pub instance: usize,
    /// `k` accept uniforms (only the instance's first `len` are read).
    pub u: Vec<f64>,
    /// `k + 1` draw uniforms, one per row.
    pub v: Vec<f64>,
    /// The draw uniform of an engine that draws one per step (DECODE-3):
    /// the value of the row being bisected (0.5 while accept boundaries are).
    pub draw: f64,
}

/// One probe's result: its tokens (`k + 1`, PAD after) and accepted count.
pub type ProbeOut = (Vec<i64>, usize);

/// Runs probes as one batch and returns each row's result: what the exact
/// law integrates (a backend's verify op, or a whole engine step).
pub type ProbeRunner<'a, E> = dyn FnMut(&[Instance], &[Probe]) -> Result<Vec<ProbeOut>, E> + 'a;

/// Runs the probes as one batch and returns each row's result.
fn run<B: Backend>(backend: &B, inst: &[Instance], probes: &[Probe], cmp: Comparator) -> Result<Vec<ProbeOut>, BackendError> {
    let k = inst[0].drafts.len();
    let v = inst[0].p[0].len();
    let n = probes.len();
    let mut p = Vec::with_capacity(n * (k + 1) * v);
    let mut q = Vec::with_capacity(n * k * v);
    let mut d = Vec::with_capacity(n * k);
    let (mut u, mut w) = (Vec::with_capacity(n * k), Vec::with_capacity(n * (k + 1)));
    for probe in probes {
        let i = &inst[probe.instance];
        p.extend(i.p.iter().flatten());
        if let Some(rows) = &i.q {
            q.extend(rows.iter().flatten());
        }
        d.extend(&i.drafts);
        u.extend(probe.u.iter().map(|x| x.min(BELOW_ONE)));
        w.extend(probe.v.iter().map(|x| x.min(BELOW_ONE)));
    }
    let t = |shape: Vec<usize>, data: Vec<f64>| HostTensor::new(shape, data).expect("probe shapes");
    let p = backend.upload_f64(&t(vec![n, k + 1, v], p))?;
    let q = match inst[0].q {
        Some(_) => Some(backend.upload_f64(&t(vec![n, k, v], q))?),
        None => None,
    };
    let d = backend.upload_i64(&HostTensor::new(vec![n, k], d).expect("probe shapes"))?;
    let lens = backend.upload_i64(&HostTensor::from_vec(probes.iter().map(|pr| inst[pr.instance].len as i64).collect()))?;
    let (u, w) = (backend.upload_f64(&t(vec![n, k], u))?, backend.upload_f64(&t(vec![n, k + 1], w))?);
    let args = RejectionArgs { target_probs: &p, draft_probs: q.as_ref(), draft_tokens: &d, proposal_lens: &lens };
    let out = backend.rejection_verify(args, RejectionNoise { accept_uniforms: &u, draw: DrawNoiseArg::InverseCdf(&w) }, cmp)?;
    let tokens = backend.download_i64(&out.tokens)?;
    let accepted = backend.download_i64(&out.num_accepted)?;
    if tokens.shape() != [n, k + 1] || accepted.shape() != [n] {
        let msg = format!("verify returned tokens {:?} and counts {:?} for {n} rows of {k} drafts", tokens.shape(), accepted.shape());
        return Err(BackendError::device(&backend.name(), msg));
    }
    // Out-of-range counts map to k + 1, which no predicate accepts.
    let count = |a: i64| usize::try_from(a).ok().filter(|&a| a <= k).unwrap_or(k + 1);
    Ok((0..n).map(|r| (tokens.data()[r * (k + 1)..(r + 1) * (k + 1)].to_vec(), count(accepted.data()[r]))).collect())
}

/// Bisects `sup { x in [0, 1) : pred(x) }` for many monotone predicates at
/// once (true below the boundary). `start[i]` is `pred_i(0)`.
fn bisect<E>(run: &mut ProbeRunner<'_, E>, inst: &[Instance], make: &dyn Fn(usize, f64) -> Probe, count: usize, pred: &dyn Fn(usize, &ProbeOut) -> bool) -> Result<Vec<f64>, E> {
    let zeros: Vec<Probe> = (0..count).map(|i| make(i, 0.0)).collect();
    let at_zero = run(inst, &zeros)?;
    let mut lo = vec![0.0f64; count];
    let mut hi = vec![1.0f64; count];
    let active: Vec<usize> = (0..count).filter(|&i| pred(i, &at_zero[i])).collect();
    for i in 0..count {
        if !pred(i, &at_zero[i]) {
            hi[i] = 0.0; // empty set: boundary 0
        }
    }
    for _ in 0..BISECTION_ROUNDS {
        if active.is_empty() {
            break;
        }
        let probes: Vec<Probe> = active.iter().map(|&i| make(i, 0.5 * (lo[i] + hi[i]))).collect();
        let out = run(inst, &probes)?;
        for (&i, o) in active.iter().zip(&out) {
            let mid = 0.5 * (lo[i] + hi[i]);
            if pred(i, o) { lo[i] = mid } else { hi[i] = mid }
        }
    }
    Ok(hi)
}

/// The exact law of one verify step's emitted tokens, summed over `instances`.
pub fn step_law<B: Backend>(backend: &B, instances: &[Instance], cmp: Comparator) -> Result<Law, BackendError> {
    step_law_of(&mut |inst: &[Instance], probes: &[Probe]| run(backend, inst, probes, cmp), instances)
}

/// [`step_law`] of any verify: `run` gives each probe's result.
pub fn step_law_of<E>(run: &mut ProbeRunner<'_, E>, instances: &[Instance]) -> Result<Law, E> {
    let k = instances[0].drafts.len();
    let v = instances[0].p[0].len();
    let n_inst = instances.len();

    // Phase 1: t[i][j], draft j's accept interval with drafts 0..j accepted (u = 0).
    let accept_probe = |idx: usize, x: f64| {
        let (i, j) = (idx / k, idx % k);
        let mut u = vec![0.0; k];
        u[j] = x;
        Probe { instance: i, u, v: vec![0.5; k + 1], draw: 0.5 }
    };
    let t = bisect(run, instances, &accept_probe, n_inst * k, &|idx, o| o.1 > idx % k)?;

    // Phase 2: for each row j a draw can happen at, the cumulative law of the drawn id.
    // Row j < k draws after a rejection at j (u_j inside the reject interval); row k is the bonus.
    let reject_u = |i: usize, j: usize| {
        let mut u = vec![0.0; k];
        if j < k {
            u[j] = 0.5 * (t[i * k + j] + 1.0);
        }
        u
    };
    let per_inst = (k + 1) * v;
    let draw_probe = |idx: usize, x: f64| {
        let i = idx / per_inst;
        let j = (idx % per_inst) / v;
        let mut vv = vec![0.5; k + 1];
        vv[j] = x;
        Probe { instance: i, u: reject_u(i, j), v: vv, draw: x }
    };
    let cdf = bisect(run, instances, &draw_probe, n_inst * per_inst, &|idx, o| {
        let j = (idx % per_inst) / v;
        let c = (idx % v) as i64;
        o.1 == j && j <= k && o.0[j] <= c
    })?;

    let mut law = Law::new();
    for (i, inst) in instances.iter().enumerate() {
        let mut reach = inst.weight; // probability that drafts 0..j were all accepted
        for j in 0..=inst.len {
            let stop = if j < inst.len { 1.0 - t[i * k + j] } else { 1.0 };
            if reach * stop > 0.0 {
                let mut below = 0.0;
                for c in 0..v {
                    let f = cdf[i * per_inst + j * v + c].max(below);
                    let mass = f - below;
                    below = f;
                    if mass > 0.0 {
                        let mut seq = inst.drafts[..j].to_vec();
                        seq.push(c as i64);
                        *law.entry(seq).or_default() += reach * stop * mass;
                    }
                }
            }
            if j < inst.len {
                reach *= t[i * k + j];
            }
        }
    }
    Ok(law)
}

/// The instances of one step with fixed rows and proposal length `len`:
/// every draft sequence with positive probability under `q` (or the fixed
/// drafts when `q` is `None`), PAD-padded to `k`.
pub fn fixed_row_instances(p: &[Vec<f64>], q: Option<&[Vec<f64>]>, fixed_drafts: &[i64], len: usize) -> Vec<Instance> {
    let k = p.len() - 1;
    let pad = |mut d: Vec<i64>| {
        d.resize(k, PAD);
        d
    };
    let Some(q) = q else {
        return vec![Instance { p: p.to_vec(), q: None, drafts: pad(fixed_drafts[..len].to_vec()), len, weight: 1.0 }];
    };
    let mut out = vec![(Vec::new(), 1.0)];
    for row in &q[..len] {
        out = out
            .into_iter()
            .flat_map(|(d, w): (Vec<i64>, f64)| {
                row.iter().enumerate().filter(|&(_, &x)| x > 0.0).map(move |(x, &qx)| {
                    let mut d = d.clone();
                    d.push(x as i64);
                    (d, w * qx)
                })
            })
            .collect();
    }
    out.into_iter().map(|(drafts, weight)| Instance { p: p.to_vec(), q: Some(q.to_vec()), drafts: pad(drafts), len, weight }).collect()
}

/// The instances of one step of `model` after `prefix` with `k` drafts drawn
/// from the drafter: rows depend on the drafts (the multi-draft chain).
pub fn model_instances(model: &TableModel, prefix: &[i64], k: usize) -> Vec<Instance> {
    let mut out = vec![(Vec::new(), 1.0)];
    for _ in 0..k {
        out = out
            .into_iter()
            .flat_map(|(d, w): (Vec<i64>, f64)| {
                let mut ctx = prefix.to_vec();
                ctx.extend(&d);
                let row = model.draft(&ctx).to_vec();
                row.into_iter().enumerate().filter(|&(_, x)| x > 0.0).map(move |(x, qx)| {
                    let mut d = d.clone();
                    d.push(x as i64);
                    (d, w * qx)
                })
            })
            .collect();
    }
    out.into_iter()
        .map(|(drafts, weight)| {
            let mut ctx = prefix.to_vec();
            let mut p = Vec::with_capacity(k + 1);
            let mut q = Vec::with_capacity(k);
            for &d in &drafts {
                p.push(model.target(&ctx).to_vec());
                q.push(model.draft(&ctx).to_vec());
                ctx.push(d);
            }
            p.push(model.target(&ctx).to_vec());
            Instance { p, q: Some(q), drafts, len: k, weight }
        })
        .collect()
}

/// The exact law of the first `m` tokens that speculative decoding with `k`
/// drafts per step generates after the model's context (steps repeat until
/// `m` tokens exist; later tokens are cut).
pub fn generation_law<B: Backend>(backend: &B, model: &TableModel, k: usize, m: usize, cmp: Comparator) -> Result<Law, BackendError> {
    let mut cache: BTreeMap<Vec<i64>, Law> = BTreeMap::new();
    generation_law_from(backend, model, k, m, cmp, &model.context.clone(), &mut cache)
}

fn generation_law_from<B: Backend>(backend: &B, model: &TableModel, k: usize, m: usize, cmp: Comparator, prefix: &[i64], cache: &mut BTreeMap<Vec<i64>, Law>) -> Result<Law, BackendError> {
    if !cache.contains_key(prefix) {
        let law = step_law(backend, &model_instances(model, prefix, k), cmp)?;
        cache.insert(prefix.to_vec(), law);
    }
    let step = cache[prefix].clone();
    let mut out = Law::new();
    for (emitted, p) in step {
        if emitted.len() >= m {
            *out.entry(emitted[..m].to_vec()).or_default() += p;
        } else {
            let mut next = prefix.to_vec();
            next.extend(&emitted);
            for (rest, q) in generation_law_from(backend, model, k, m - emitted.len(), cmp, &next, cache)? {
                let mut seq = emitted.clone();
                seq.extend(rest);
                *out.entry(seq).or_default() += p * q;
            }
        }
    }
    Ok(out)
}

/// The law of the accepted count of one step with fixed rows, from a step law.
pub fn accepted_count_law(law: &Law, k: usize) -> Vec<f64> {
    let mut counts = vec![0.0; k + 1];
    for (seq, p) in law {
        counts[seq.len() - 1] += p;
    }
    counts
}

/// The law of the first emitted token, from a step law.
pub fn first_token_law(law: &Law, vocab: usize) -> Vec<f64> {
    let mut out = vec![0.0; vocab];
    for (seq, p) in law {
        if let Some(&x) = seq.first()
            && x != PAD
        {
            out[x as usize] += p;
        }
    }
    out
}

/// The joint law of (accepted count, next token) from a step law, as cells
/// `n * V + x` for `n` in `0..=k`.
pub fn accepted_and_next(law: &Law, k: usize, vocab: usize) -> Vec<f64> {
    let mut out = vec![0.0; (k + 1) * vocab];
    for (seq, p) in law {
        if let Some(&x) = seq.last() {
            out[(seq.len() - 1) * vocab + x as usize] += p;
        }
    }
    out
}

/// `max |a - b|` over the union of outcomes.
pub fn max_abs_diff(a: &Law, b: &Law) -> f64 {
    a.keys().chain(b.keys()).map(|s| (a.get(s).copied().unwrap_or(0.0) - b.get(s).copied().unwrap_or(0.0)).abs()).fold(0.0, f64::max)
}

/// STAT-7 for any backend: for every proposal length `0..=k`, the exact
/// joint law of (accepted count, next token) of `backend` on a fixed-row
/// scenario equals the target's (see `stat::accepted_and_next_law`). The
/// tolerance is 1e-12, or ten times the backend's margin epsilon as capped
/// for its dtype (BACKEND-6, so at most 1e-4 for f32): a port
/// whose decisions move by at most that epsilon moves each boundary, so
/// each interval's measure, by at most as much.
pub fn check_scenario<B: Backend>(backend: &B, scenario: &crate::stat::Scenario) -> crate::compare::Verdict {
    use crate::compare::Verdict;
    let tol = (10.0 * backend.precision().judged().margin_epsilon).max(1e-12);
    let (k, v) = (scenario.p.len() - 1, scenario.p[0].len());
    let mut worst: f64 = 0.0;
    for len in 0..=k {
        let instances = fixed_row_instances(&scenario.p, scenario.q.as_deref(), &scenario.fixed_drafts, len);
        let law = match step_law(backend, &instances, Comparator::Strict) {
            Ok(law) => law,
            Err(BackendError::NotSupported { op, .. }) => return Verdict::NotSupported(format!("`{op}` is not supported")),
            Err(e) => return Verdict::Fail(e.to_string()),
        };
        let want = crate::stat::accepted_and_next_law(scenario, len);
        let got = accepted_and_next(&law, k, v);
        let err = got.iter().zip(&want).map(|(a, b)| (a - b).abs()).fold((law.values().sum::<f64>() - 1.0).abs(), f64::max);
        if err > tol {
            return Verdict::Fail(format!("proposal length {len}: the exact (accepted count, next token) law is off by {err:.3e} > {tol:e}"));
        }
        worst = worst.max(err);
    }
    Verdict::Pass { excused: 0, max_abs_err: worst }
}

/// The scenarios checked exactly on every backend.
pub const EXACT_SCENARIOS: [&str; 4] = ["overlap", "disjoint", "partial-support", "no-draft-probs"];
