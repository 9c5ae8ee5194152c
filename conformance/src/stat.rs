//! Statistical checks of `rejection_verify_seeded`, the one operation whose
//! randomness a backend owns (CONV-10), under the policy of STAT-1 .. STAT-4:
//! a fixed default seed, a family-wise false-failure rate of 1e-4 per run
//! (Holm), a sample size chosen so that every check can detect a total
//! variation of 0.02 with probability 0.999 (asserted before sampling), and
//! no retries.

use rand::{RngExt, SeedableRng};
use rand_pcg::Pcg64;
use specdec_backend::{Backend, BackendError, Comparator, DrawMethod, HostTensor, PAD, RejectionArgs};
use specdec_reference::theory;
use specdec_stats::{Decision, TestReport, chi_squared_gof, judge_holm, min_samples, plan_gof};

use crate::compare::Verdict;

/// STAT-2: the family-wise false-failure rate of one backend run.
pub const FAMILY_ALPHA: f64 = 1e-4;
/// STAT-3: the total-variation distance every check must be able to detect ...
pub const DETECTABLE_DELTA: f64 = 0.02;
/// ... with this miss probability.
pub const BETA: f64 = 1e-3;

/// What a statistical check measures.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Measure {
    /// The first emitted token against `p[0]` (REJECT-7).
    FirstToken,
    /// The accepted count against THEORY-5.
    AcceptedCount,
}

/// One statistical check: a scenario and what is measured.
#[derive(Debug, Clone)]
pub struct StatSpec {
    pub scenario: &'static str,
    pub method: DrawMethod,
    pub measure: Measure,
    pub rules: &'static [&'static str],
}

impl StatSpec {
    pub fn name(&self) -> String {
        let method = match self.method {
            DrawMethod::InverseCdf => "inverse-cdf",
            DrawMethod::ExponentialRace => "exp-race",
        };
        let measure = match self.measure {
            Measure::FirstToken => "first-token",
            Measure::AcceptedCount => "accepted-count",
        };
        format!("stat/{}/{method}/{measure}", self.scenario)
    }
}

/// The scenarios: `p` rows `[k+1, V]`, `q` rows `[k, V]` (or none: drafts
/// without probabilities, fixed draft tokens).
pub struct Scenario {
    pub name: &'static str,
    pub p: Vec<Vec<f64>>,
    pub q: Option<Vec<Vec<f64>>>,
    /// For `q = None`: the fixed drafts.
    pub fixed_drafts: Vec<i64>,
}

fn norm(w: &[f64]) -> Vec<f64> {
    let s: f64 = w.iter().sum();
    w.iter().map(|x| x / s).collect()
}

/// The scenarios every backend is checked on (V = 6, k = 3).
pub fn scenarios() -> Vec<Scenario> {
    let p = vec![
        norm(&[5.0, 1.0, 3.0, 0.0, 2.0, 4.0]),
        norm(&[1.0, 4.0, 1.0, 2.0, 0.0, 3.0]),
        norm(&[2.0, 2.0, 5.0, 1.0, 1.0, 0.0]),
        norm(&[3.0, 0.0, 1.0, 4.0, 2.0, 1.0]),
    ];
    vec![
        Scenario {
            name: "overlap",
            p: p.clone(),
            q: Some(vec![norm(&[1.0, 3.0, 3.0, 2.0, 1.0, 1.0]), norm(&[4.0, 1.0, 1.0, 1.0, 1.0, 1.0]), norm(&[1.0, 1.0, 1.0, 1.0, 4.0, 2.0])]),
            fixed_drafts: vec![],
        },
        Scenario { name: "equal", p: p.clone(), q: Some(p[..3].to_vec()), fixed_drafts: vec![] },
        Scenario {
            name: "disjoint",
            p: p.clone(),
            // q lives where p is zero: every draft is rejected.
            q: Some(vec![norm(&[0.0, 0.0, 0.0, 1.0, 0.0, 0.0]), norm(&[0.0, 0.0, 0.0, 0.0, 1.0, 0.0]), norm(&[0.0, 0.0, 0.0, 0.0, 0.0, 1.0])]),
            fixed_drafts: vec![],
        },
        Scenario {
            name: "one-hot-q",
            p: p.clone(),
            q: Some(vec![norm(&[0.0, 0.0, 1.0, 0.0, 0.0, 0.0]), norm(&[0.0, 1.0, 0.0, 0.0, 0.0, 0.0]), norm(&[1.0, 0.0, 0.0, 0.0, 0.0, 0.0])]),
            fixed_drafts: vec![],
        },
        Scenario {
            name: "partial-support",
            p: p.clone(),
            // q = 0 where p > 0 (ids 4, 5): only the residual can emit them.
            q: Some(vec![norm(&[1.0, 1.0, 1.0, 1.0, 0.0, 0.0]), norm(&[2.0, 1.0, 1.0, 0.0, 0.0, 0.0]), norm(&[1.0, 3.0, 0.0, 1.0, 0.0, 0.0])]),
            fixed_drafts: vec![],
        },
        Scenario { name: "no-draft-probs", p, q: None, fixed_drafts: vec![0, 1, 2] },
    ]
}

/// Every statistical check.
pub fn specs() -> Vec<StatSpec> {
    let mut out = Vec::new();
    for s in scenarios() {
        for method in [DrawMethod::InverseCdf, DrawMethod::ExponentialRace] {
            out.push(StatSpec { scenario: s.name, method, measure: Measure::FirstToken, rules: &["REJECT-7", "STAT-2", "STAT-3"] });
            out.push(StatSpec { scenario: s.name, method, measure: Measure::AcceptedCount, rules: &["REJECT-7", "THEORY-5", "STAT-3"] });
        }
    }
    out
}

/// The exact law a check compares against.
fn expected(s: &Scenario, measure: Measure) -> Vec<f64> {
    match measure {
        Measure::FirstToken => s.p[0].clone(),
        Measure::AcceptedCount => {
            let betas: Vec<f64> = match &s.q {
                Some(q) => q.iter().zip(&s.p).map(|(q, p)| theory::acceptance(p, q).expect("valid rows")).collect(),
                // A fixed draft x is accepted with probability p(x) (RESID-2).
                None => s.fixed_drafts.iter().zip(&s.p).map(|(&x, p)| p[x as usize]).collect(),
            };
            theory::accepted_length_law(&betas).expect("betas in [0, 1]")
        }
    }
}

/// STAT-3: the smallest sample size whose plan detects [`DETECTABLE_DELTA`]
/// at the Bonferroni level of the family, checked before any sampling.
pub fn planned_n(expected: &[f64], family_size: usize) -> Result<u64, String> {
    let alpha = FAMILY_ALPHA / family_size as f64;
    let cells = expected.iter().filter(|&&x| x > 0.0).count().max(2);
    let mut n = min_samples(cells, DETECTABLE_DELTA, alpha, BETA).map_err(|e| e.to_string())?;
    while n < 1 << 30 {
        let plan = plan_gof(n, expected, alpha, BETA).map_err(|e| e.to_string())?;
        match plan.power {
            Some(p) if p.detectable_delta <= DETECTABLE_DELTA => return Ok(n),
            _ => n += n / 4 + 1,
        }
    }
    Err(format!("no sample size reaches a detectable TV of {DETECTABLE_DELTA} for {expected:?}"))
}

/// Draws for a check whose law is a single certain outcome: any other
/// outcome is impossible, so there is no false-failure rate to control.
pub const CERTAIN_OUTCOME_SAMPLES: u64 = 20_000;

/// A statistical check's outcome before the family is judged.
pub type Outcome = Result<TestReport, Verdict>;

/// Samples one check on `backend`. Never retried (STAT-4).
pub fn run<B: Backend>(backend: &B, spec: &StatSpec, seed: u64) -> Outcome {
    let scenario = scenarios().into_iter().find(|s| s.name == spec.scenario).expect("spec names a scenario");
    let law = expected(&scenario, spec.measure);
    let certain = law.iter().filter(|&&x| x > 0.0).count() == 1;
    let n = if certain { CERTAIN_OUTCOME_SAMPLES } else { planned_n(&law, specs().len()).map_err(Verdict::Fail)? };
    let counts = sample(backend, &scenario, spec, n as usize, seed).map_err(|e| match e {
        BackendError::NotSupported { op, .. } => Verdict::NotSupported(format!("`{op}` is not supported")),
        other => Verdict::Fail(other.to_string()),
    })?;
    if certain {
        let cell = law.iter().position(|&x| x > 0.0).expect("one certain cell");
        return Err(if counts[cell] == n {
            Verdict::Pass { excused: 0, max_abs_err: 0.0 }
        } else {
            Verdict::Fail(format!("outcome {cell} is certain, but {} of {n} draws landed elsewhere: {counts:?}", n - counts[cell]))
        });
    }
    let result = chi_squared_gof(&counts, &law).map_err(|e| Verdict::Fail(e.to_string()))?;
    result.to_report(spec.name()).with_power(FAMILY_ALPHA / specs().len() as f64, BETA).map_err(|e| Verdict::Fail(e.to_string()))
}

/// Runs the backend's seeded verify on `n` independent copies of the scenario
/// and counts the measured outcome.
fn sample<B: Backend>(backend: &B, s: &Scenario, spec: &StatSpec, n: usize, seed: u64) -> Result<Vec<u64>, BackendError> {
    let (k, v) = (s.p.len() - 1, s.p[0].len());
    // Drafts are sampled here, from q, with a stream independent of the backend's.
    let mut rng = Pcg64::seed_from_u64(seed ^ 0xD1A5_7000 ^ (spec.scenario.len() as u64) << 32);
    let mut drafts = Vec::with_capacity(n * k);
    for _ in 0..n {
        for j in 0..k {
            drafts.push(match &s.q {
                Some(q) => crate::lossless::pick(&q[j], rng.random()),
                None => s.fixed_drafts[j],
            });
        }
    }
    let p: Vec<f64> = (0..n).flat_map(|_| s.p.iter().flatten().copied()).collect();
    let p = backend.upload_f64(&HostTensor::new(vec![n, k + 1, v], p).expect("shape"))?;
    let q = match &s.q {
        Some(q) => Some(backend.upload_f64(&HostTensor::new(vec![n, k, v], (0..n).flat_map(|_| q.iter().flatten().copied()).collect()).expect("shape"))?),
        None => None,
    };
    let d = backend.upload_i64(&HostTensor::new(vec![n, k], drafts).expect("shape"))?;
    let lens = backend.upload_i64(&HostTensor::from_vec(vec![k as i64; n]))?;
    let args = RejectionArgs { target_probs: &p, draft_probs: q.as_ref(), draft_tokens: &d, proposal_lens: &lens };
    let backend_seed = seed.wrapping_mul(0x2545_F491_4F6C_DD1D) ^ spec.name().bytes().fold(0u64, |h, b| h.wrapping_mul(31) ^ b as u64);
    let out = backend.rejection_verify_seeded(args, spec.method, Comparator::Strict, backend_seed)?;
    let tokens = backend.download_i64(&out.tokens)?;
    let accepted = backend.download_i64(&out.num_accepted)?;
    let cells = match spec.measure {
        Measure::FirstToken => v,
        Measure::AcceptedCount => k + 1,
    };
    let mut counts = vec![0u64; cells];
    for b in 0..n {
        let x = match spec.measure {
            Measure::FirstToken => tokens.data()[b * (k + 1)],
            Measure::AcceptedCount => accepted.data()[b],
        };
        if x == PAD || x < 0 || x as usize >= cells {
            return Err(BackendError::device(&backend.name(), format!("row {b} produced {x}, outside [0, {cells})")));
        }
        counts[x as usize] += 1;
    }
    Ok(counts)
}

/// Judges all sampled checks of a run together with Holm at [`FAMILY_ALPHA`]
/// (STAT-2). Returns, per slot, the verdict and the report.
pub fn judge_family(outcomes: Vec<(usize, Outcome)>) -> Vec<(usize, Verdict, Option<TestReport>)> {
    let mut reports = Vec::new();
    let mut slots = Vec::new();
    let mut out = Vec::new();
    for (slot, outcome) in outcomes {
        match outcome {
            Ok(report) => {
                slots.push(slot);
                reports.push(report);
            }
            Err(verdict) => out.push((slot, verdict, None)),
        }
    }
    if !reports.is_empty() && let Err(e) = judge_holm(&mut reports, FAMILY_ALPHA) {
        out.extend(slots.drain(..).map(|s| (s, Verdict::Fail(e.to_string()), None)));
        return out;
    }
    for (slot, report) in slots.into_iter().zip(reports) {
        let verdict = match report.decision {
            Decision::NotRejected => Verdict::Pass { excused: 0, max_abs_err: 0.0 },
            Decision::Reject => Verdict::Fail(format!("distribution differs from the target: {report}")),
            Decision::Degenerate | Decision::Pending => Verdict::Fail(format!("no valid test: {report}")),
        };
        out.push((slot, verdict, Some(report)));
    }
    out
}
