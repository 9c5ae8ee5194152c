//! Sampled losslessness (STAT-1 .. STAT-6): chi-squared checks of one-step
//! outputs and of whole generated sequences against exact target laws,
//! driven by explicit noise from a seeded PCG64, and the negative controls
//! that prove the checks have teeth.
//!
//! The same catalogue serves `cargo test` (one seed, the default) and the
//! `specdec stats` campaign (reports, plots, seed sweeps).

use rand::{RngExt, SeedableRng};
use rand_pcg::Pcg64;
use specdec_backend::{Backend, BackendError, Comparator, DrawNoiseArg, HostTensor, ReferenceBackend, RejectionArgs, RejectionNoise, SamplingParams};
use specdec_stats::{Decision, TestReport, judge_holm, total_variation};

use crate::model::{TableModel, shipped_models};
use crate::mutants::{Defect, Mutant};
use crate::stat::{self, FAMILY_ALPHA, Measure, Scenario, pick, scenarios, stream_seed};

/// How drafts are produced for a one-step check.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum DraftMode {
    /// Drafts drawn from the `q` the verifier is given.
    Proper,
    /// Drafts drawn from `q` at temperature 0.5, the verifier told `q` at 1.
    WrongTemperature,
    /// Two-position iterative unmasking (position 1, then position 0 given
    /// it), reporting each step's softmax as `q` (DRAFT-5).
    IterativeUnmasking,
}

/// Sampling options of a check.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Options {
    /// Accept uniforms from a 4-bit source (`j / 16`), as low-precision RNG
    /// kernels produce; makes `u = 0` happen with probability 1/16.
    pub coarse_uniforms: bool,
    pub drafts: DraftMode,
}

impl Default for Options {
    fn default() -> Self {
        Options { coarse_uniforms: false, drafts: DraftMode::Proper }
    }
}

/// What a check observes.
#[derive(Debug, Clone)]
pub enum Target {
    /// The first emitted token of one step of a scenario.
    FirstToken(&'static str),
    /// The joint law of (accepted count, next token) of one step of a
    /// scenario, over random proposal lengths.
    AcceptedAndNext(&'static str),
    /// The first `m` generated tokens of a model with `k` drafts per step.
    Sequence { model: String, k: usize, m: usize },
}

/// One sampled check.
#[derive(Debug, Clone)]
pub struct Check {
    pub name: String,
    pub rules: Vec<&'static str>,
    pub target: Target,
    pub options: Options,
}

fn scenario(name: &str) -> Scenario {
    scenarios().into_iter().find(|s| s.name == name).expect("known scenario")
}

fn model(name: &str) -> TableModel {
    shipped_models().into_iter().find(|m| m.name == name).expect("shipped model")
}

/// The exact law a check's counts are compared with.
pub fn expected_law(check: &Check) -> Vec<f64> {
    match &check.target {
        Target::FirstToken(s) => stat::expected(&scenario(s), Measure::FirstToken),
        Target::AcceptedAndNext(s) => stat::expected(&scenario(s), Measure::AcceptedAndNext),
        Target::Sequence { model: name, m, .. } => {
            let model = model(name);
            let law = model.target_law(*m);
            let mut cells = vec![0.0; model.vocab.pow(*m as u32)];
            for (seq, p) in law {
                cells[cell_of(&seq, model.vocab)] += p;
            }
            cells
        }
    }
}

fn cell_of(seq: &[i64], vocab: usize) -> usize {
    seq.iter().fold(0, |acc, &x| acc * vocab + x as usize)
}

/// The lossless checks of the reference (REJECT-7).
pub fn lossless_checks() -> Vec<Check> {
    let mut out = Vec::new();
    for s in scenarios() {
        out.push(Check { name: format!("step/{}/first-token", s.name), rules: vec!["REJECT-7", "STAT-3"], target: Target::FirstToken(s.name), options: Options::default() });
        out.push(Check { name: format!("step/{}/accepted-and-next", s.name), rules: vec!["REJECT-7", "REJECT-4", "THEORY-5"], target: Target::AcceptedAndNext(s.name), options: Options::default() });
    }
    // With 4-bit accept uniforms the strict rule stays exact here (every p/q is
    // a multiple of 1/16 or the draft is impossible): the `<=` control below
    // fails for its comparator alone.
    out.push(Check {
        name: "step/disjoint/first-token/coarse-uniforms".into(),
        rules: vec!["ACCEPT-1", "REJECT-7"],
        target: Target::FirstToken("disjoint"),
        options: Options { coarse_uniforms: true, ..Options::default() },
    });
    for (m, k, len) in [("bigram-v4", 2, 4), ("bigram-v6-sparse", 3, 3), ("bigram-v8-onehot-draft", 2, 3)] {
        out.push(Check {
            name: format!("sequence/{m}/k{k}/len{len}"),
            rules: vec!["REJECT-7", "GREEDY-5", "STAT-3"],
            target: Target::Sequence { model: m.into(), k, m: len },
            options: Options::default(),
        });
    }
    out
}

/// A negative control: a check run against a defect that it must reject.
#[derive(Debug, Clone)]
pub struct Control {
    pub name: String,
    pub defect: Option<Defect>,
    pub check: Check,
}

/// The negative controls (STAT-5).
pub fn controls() -> Vec<Control> {
    let first = |s: &'static str, options: Options| Check { name: format!("step/{s}/first-token"), rules: vec!["STAT-5"], target: Target::FirstToken(s), options };
    let seq = Check { name: "sequence/bigram-v4/k2/len4".into(), rules: vec!["STAT-5"], target: Target::Sequence { model: "bigram-v4".into(), k: 2, m: 4 }, options: Options::default() };
    let coarse = Options { coarse_uniforms: true, ..Options::default() };
    let mut out: Vec<Control> = vec![
        Control { name: "lossy-threshold".into(), defect: Some(Defect::LossyThreshold), check: first("overlap", Options::default()) },
        Control { name: "lossy-typical".into(), defect: Some(Defect::LossyTypical), check: first("overlap", Options::default()) },
        Control { name: "less-eq-comparator".into(), defect: Some(Defect::LessEqComparator), check: first("disjoint", coarse) },
        Control { name: "residual-is-target".into(), defect: Some(Defect::ResidualIsTarget), check: first("overlap", Options::default()) },
        Control { name: "residual-not-renormalised".into(), defect: Some(Defect::ResidualNotRenormalised), check: first("overlap", Options::default()) },
        Control { name: "bonus-from-wrong-row".into(), defect: Some(Defect::BonusFromWrongRow), check: seq.clone() },
        Control { name: "draft-at-other-temperature".into(), defect: None, check: first("overlap", Options { drafts: DraftMode::WrongTemperature, ..Options::default() }) },
        Control {
            name: "iterative-unmasking-q".into(),
            defect: None,
            // Position 0 stays lossless (a mixture of lossless tests over the
            // id chosen for position 1); the bias shows from position 1 on.
            check: Check { options: Options { drafts: DraftMode::IterativeUnmasking, ..Options::default() }, ..seq.clone() },
        },
    ];
    for c in &mut out {
        c.check.rules.push(if c.name == "iterative-unmasking-q" { "DRAFT-5" } else { "REJECT-7" });
    }
    out
}

/// Samples a check's counts with `n` draws on `backend`.
pub fn sample<B: Backend>(backend: &B, check: &Check, n: usize, seed: u64) -> Result<Vec<u64>, BackendError> {
    let mut rng = Pcg64::seed_from_u64(stream_seed(seed, &check.name));
    match &check.target {
        Target::FirstToken(s) | Target::AcceptedAndNext(s) => {
            let s = scenario(s);
            let (tokens, accepted) = sample_step(backend, &s, n, &mut rng, check.options)?;
            let (k, v) = (s.p.len() - 1, s.p[0].len());
            let first = matches!(check.target, Target::FirstToken(_));
            let mut counts = vec![0u64; if first { v } else { (k + 1) * v }];
            for (t, &a) in tokens.iter().zip(&accepted) {
                counts[if first { t[0] as usize } else { a * v + t[a] as usize }] += 1;
            }
            Ok(counts)
        }
        Target::Sequence { model: name, k, m } => {
            let model = model(name);
            let seqs = sample_generation(backend, &model, *k, *m, n, &mut rng, check.options.drafts)?;
            let mut counts = vec![0u64; model.vocab.pow(*m as u32)];
            for s in seqs {
                counts[cell_of(&s[..*m], model.vocab)] += 1;
            }
            Ok(counts)
        }
    }
}

fn uniform(rng: &mut Pcg64, coarse: bool) -> f64 {
    if coarse { f64::from(rng.random_range(0u32..16)) / 16.0 } else { rng.random() }
}

/// `q` at temperature 0.5: the square of `q`, renormalised (LOGITS-3).
fn sharpen(q: &[f64]) -> Vec<f64> {
    let logits: Vec<f64> = q.iter().map(|&x| if x > 0.0 { x.ln() } else { f64::NEG_INFINITY }).collect();
    specdec_reference::process_logits(&logits, SamplingParams::new(0.5, 0, 1.0)).expect("valid row")
}

/// One verify step per row, each row with a random proposal length in
/// `0..=k`; returns each row's tokens and accepted count.
fn sample_step<B: Backend>(backend: &B, s: &Scenario, n: usize, rng: &mut Pcg64, opt: Options) -> Result<(Vec<Vec<i64>>, Vec<usize>), BackendError> {
    let k = s.p.len() - 1;
    let batch = match opt.drafts {
        DraftMode::Proper => stat::scenario_batch(backend, s, n, rng, pick)?,
        DraftMode::WrongTemperature => stat::scenario_batch(backend, s, n, rng, |row, u| pick(&sharpen(row), u))?,
        DraftMode::IterativeUnmasking => unreachable!("iterative unmasking is checked on sequences"),
    };
    let u: Vec<f64> = (0..n * k).map(|_| uniform(rng, opt.coarse_uniforms)).collect();
    let w: Vec<f64> = (0..n * (k + 1)).map(|_| rng.random()).collect();
    let t = |shape: Vec<usize>, d: Vec<f64>| HostTensor::new(shape, d).expect("shapes");
    let (u, w) = (backend.upload_f64(&t(vec![n, k], u))?, backend.upload_f64(&t(vec![n, k + 1], w))?);
    let args = RejectionArgs { target_probs: &batch.p, draft_probs: batch.q.as_ref(), draft_tokens: &batch.drafts, proposal_lens: &batch.lens };
    let out = backend.rejection_verify(args, RejectionNoise { accept_uniforms: &u, draw: DrawNoiseArg::InverseCdf(&w) }, Comparator::Strict)?;
    let tokens = backend.download_i64(&out.tokens)?;
    let accepted = backend.download_i64(&out.num_accepted)?;
    let rows = tokens.data().chunks(k + 1).map(<[i64]>::to_vec).collect();
    Ok((rows, accepted.data().iter().map(|&a| a as usize).collect()))
}

/// Generates `n` sequences of at least `m` tokens by speculative decoding
/// with `k` drafts per step, all sequences stepping together as one batch.
fn sample_generation<B: Backend>(backend: &B, model: &TableModel, k: usize, m: usize, n: usize, rng: &mut Pcg64, mode: DraftMode) -> Result<Vec<Vec<i64>>, BackendError> {
    let v = model.vocab;
    let mut out: Vec<Vec<i64>> = vec![Vec::new(); n];
    loop {
        let active: Vec<usize> = (0..n).filter(|&i| out[i].len() < m).collect();
        if active.is_empty() {
            return Ok(out);
        }
        let b = active.len();
        let (mut p, mut q, mut d) = (Vec::with_capacity(b * (k + 1) * v), Vec::with_capacity(b * k * v), Vec::with_capacity(b * k));
        for &i in &active {
            let mut ctx = model.context.clone();
            ctx.extend(&out[i]);
            let (drafts, rows) = draft_block(model, &ctx, k, rng, mode);
            for j in 0..=k {
                p.extend(model.target(&ctx));
                if j < k {
                    q.extend(&rows[j]);
                    d.push(drafts[j]);
                    ctx.push(drafts[j]);
                }
            }
        }
        let u: Vec<f64> = (0..b * k).map(|_| rng.random()).collect();
        let w: Vec<f64> = (0..b * (k + 1)).map(|_| rng.random()).collect();
        let t = |shape: Vec<usize>, d: Vec<f64>| HostTensor::new(shape, d).expect("shapes");
        let (pt, qt) = (backend.upload_f64(&t(vec![b, k + 1, v], p))?, backend.upload_f64(&t(vec![b, k, v], q))?);
        let dt = backend.upload_i64(&HostTensor::new(vec![b, k], d).expect("shapes"))?;
        let lens = backend.upload_i64(&HostTensor::from_vec(vec![k as i64; b]))?;
        let (ut, wt) = (backend.upload_f64(&t(vec![b, k], u))?, backend.upload_f64(&t(vec![b, k + 1], w))?);
        let args = RejectionArgs { target_probs: &pt, draft_probs: Some(&qt), draft_tokens: &dt, proposal_lens: &lens };
        let res = backend.rejection_verify(args, RejectionNoise { accept_uniforms: &ut, draw: DrawNoiseArg::InverseCdf(&wt) }, Comparator::Strict)?;
        let tokens = backend.download_i64(&res.tokens)?;
        let accepted = backend.download_i64(&res.num_accepted)?;
        for (r, &i) in active.iter().enumerate() {
            let emitted = accepted.data()[r] as usize + 1;
            out[i].extend(&tokens.data()[r * (k + 1)..r * (k + 1) + emitted]);
        }
    }
}

/// Drafts `k` tokens after `ctx` and the rows the verifier is told they came from.
fn draft_block(model: &TableModel, ctx: &[i64], k: usize, rng: &mut Pcg64, mode: DraftMode) -> (Vec<i64>, Vec<Vec<f64>>) {
    let mut ctx = ctx.to_vec();
    let (mut drafts, mut rows) = (Vec::with_capacity(k), Vec::with_capacity(k));
    if mode == DraftMode::IterativeUnmasking && k >= 2 {
        // A block drafter unmasks position 1 first (from the row after the
        // context), then position 0 boosted towards it, and reports each
        // step's softmax: position 1's reported row is not its law given x0.
        let first_row = model.draft(&ctx).to_vec();
        let x1 = pick(&first_row, rng.random());
        let mut s0: Vec<f64> = first_row.iter().enumerate().map(|(i, &x)| if i as i64 == x1 { 4.0 * x } else { x }).collect();
        let total: f64 = s0.iter().sum();
        s0.iter_mut().for_each(|x| *x /= total);
        let x0 = pick(&s0, rng.random());
        drafts.extend([x0, x1]);
        rows.extend([s0, first_row]);
        ctx.extend([x0, x1]);
    }
    while drafts.len() < k {
        let row = model.draft(&ctx).to_vec();
        let x = match mode {
            DraftMode::WrongTemperature => pick(&sharpen(&row), rng.random()),
            _ => pick(&row, rng.random()),
        };
        drafts.push(x);
        rows.push(row);
        ctx.push(x);
    }
    (drafts, rows)
}

/// A check's result: its report (judged later) and the empirical TV distance.
#[derive(Debug, Clone)]
pub struct Outcome {
    pub name: String,
    pub rules: Vec<&'static str>,
    pub report: TestReport,
    pub observed: Vec<u64>,
    pub expected: Vec<f64>,
    pub tv_distance: f64,
}

/// STAT-3: plans `n` for a check inside a family of `family` checks, then
/// samples on `backend` and tests. Never retried (STAT-4).
pub fn run_check<B: Backend>(backend: &B, check: &Check, family: usize, seed: u64) -> Result<Outcome, String> {
    let expected = expected_law(check);
    let n = stat::sample_size(&expected, family)?;
    let observed = sample(backend, check, n as usize, seed).map_err(|e| e.to_string())?;
    let report = stat::test_counts(&check.name, &observed, &expected, family)?;
    let tv_distance = total_variation(&observed, &expected).map_err(|e| e.to_string())?;
    Ok(Outcome { name: check.name.clone(), rules: check.rules.clone(), report, observed, expected, tv_distance })
}

/// The lossless family on the reference, judged with Holm at [`FAMILY_ALPHA`].
pub fn run_lossless_family(seed: u64, progress: &mut dyn FnMut(&str)) -> Result<Vec<Outcome>, String> {
    let checks = lossless_checks();
    let mut outcomes = Vec::with_capacity(checks.len());
    for c in &checks {
        progress(&c.name);
        outcomes.push(run_check(&ReferenceBackend, c, checks.len(), seed)?);
    }
    let mut reports: Vec<TestReport> = outcomes.iter().map(|o| o.report.clone()).collect();
    judge_holm(&mut reports, FAMILY_ALPHA).map_err(|e| e.to_string())?;
    for (o, r) in outcomes.iter_mut().zip(reports) {
        o.report = r;
    }
    Ok(outcomes)
}

/// Runs every negative control at the strictest per-test level a lossless
/// check faces; each must be rejected.
pub fn run_controls(seed: u64, progress: &mut dyn FnMut(&str)) -> Result<Vec<(Control, Outcome)>, String> {
    let family = lossless_checks().len();
    let alpha = FAMILY_ALPHA / family as f64;
    let mut out = Vec::new();
    for c in controls() {
        progress(&c.name);
        let mut outcome = match c.defect {
            Some(defect) => run_check(&Mutant(defect), &c.check, family, seed)?,
            None => run_check(&ReferenceBackend, &c.check, family, seed)?,
        };
        outcome.name = format!("control/{}", c.name);
        outcome.report.label = format!("{} on {}", outcome.name, c.check.name);
        outcome.report.judge(alpha).map_err(|e| e.to_string())?;
        out.push((c, outcome));
    }
    Ok(out)
}

/// Whether a judged report passed (not rejected, not degenerate).
pub fn passed(report: &TestReport) -> bool {
    report.decision == Decision::NotRejected
}
