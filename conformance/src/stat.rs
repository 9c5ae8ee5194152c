//! Statistical checks of `rejection_verify_seeded`, the one operation whose
//! randomness a backend owns (CONV-10), under the policy of STAT-1 .. STAT-4:
//! a fixed default seed, a family-wise false-failure rate of 1e-4 per run
//! (Holm), a sample size chosen so that every check can detect a total
//! variation of 0.02 with probability 0.999 (asserted before sampling), and
//! no retries. Each row gets a random proposal length in `0..=k`, and the
//! joint law of (accepted count, next token) is checked, so a residual or
//! bonus taken from the wrong row shows as well as a wrong accept test.

use rand::{RngExt, SeedableRng};
use rand_pcg::Pcg64;
use specdec_backend::{Backend, BackendError, Comparator, DrawMethod, HostTensor, PAD, RejectionArgs};
use specdec_stats::{Alternative, Decision, PowerClaim, TestReport, binomial_test, chi_squared_gof, judge_holm, min_samples, plan_gof};

use crate::check::{CheckResult, Selection, settle};
use crate::compare::Verdict;

/// Draws an id from a (valid, generated) row with the reference's inverse
/// CDF: how the samplers and generators draft tokens.
pub(crate) fn pick(row: &[f64], u: f64) -> i64 {
    specdec_reference::sampling::sample_inverse_cdf(row, u).expect("generated rows are valid").token as i64
}

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
    /// The joint law of the accepted count and the token after the accepted
    /// drafts (REJECT-2 .. REJECT-4, THEORY-5), over random proposal lengths.
    AcceptedAndNext,
    /// The joint law of the (accepted count, next token) outcomes of rows
    /// `2i` and `2i + 1` of one call, each with its own random proposal
    /// length: the product of the per-row laws when every row draws its own
    /// noise (BACKEND-5, STAT-8). The per-row law is checked by
    /// [`Measure::AcceptedAndNext`]; this catches rows that share or overlap
    /// noise, which leaves every row's own law intact.
    RowPairs,
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
            Measure::AcceptedAndNext => "accepted-and-next",
            Measure::RowPairs => "row-pairs",
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
    let p = vec![norm(&[5.0, 1.0, 3.0, 0.0, 2.0, 4.0]), norm(&[1.0, 4.0, 1.0, 2.0, 0.0, 3.0]), norm(&[2.0, 2.0, 5.0, 1.0, 1.0, 0.0]), norm(&[3.0, 0.0, 1.0, 4.0, 2.0, 1.0])];
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

/// The scenario of the row-independence checks (STAT-8): `k = 1`, `V = 3`,
/// chosen so that a shared or overlapping uniform moves tokens on both rows
/// of a pair. A draft is accepted with probability 1/2; a rejection draws
/// from the residual `(0.6, 0.4, 0)`, a bonus from `(0.2, 0.5, 0.3)`, so an
/// inverse-CDF uniform read by both rows of a pair (the second row's
/// correction reading the first row's bonus uniform, as a row stride of `k`
/// instead of `k + 1` does) couples their tokens.
pub fn row_pairs_scenario() -> Scenario {
    Scenario { name: "row-pairs", p: vec![vec![0.4, 0.3, 0.3], vec![0.2, 0.5, 0.3]], q: Some(vec![vec![0.1, 0.1, 0.8]]), fixed_drafts: vec![] }
}

/// A scenario by name: one of [`scenarios`] or [`row_pairs_scenario`].
pub fn scenario(name: &str) -> Option<Scenario> {
    scenarios().into_iter().chain(std::iter::once(row_pairs_scenario())).find(|s| s.name == name)
}

/// Every statistical check.
pub fn specs() -> Vec<StatSpec> {
    let mut out = Vec::new();
    for s in scenarios() {
        for method in [DrawMethod::InverseCdf, DrawMethod::ExponentialRace] {
            out.push(StatSpec { scenario: s.name, method, measure: Measure::FirstToken, rules: &["REJECT-7", "STAT-2", "STAT-3"] });
            out.push(StatSpec { scenario: s.name, method, measure: Measure::AcceptedAndNext, rules: &["REJECT-7", "REJECT-4", "THEORY-5", "STAT-3"] });
        }
    }
    for method in [DrawMethod::InverseCdf, DrawMethod::ExponentialRace] {
        out.push(StatSpec { scenario: row_pairs_scenario().name, method, measure: Measure::RowPairs, rules: &["BACKEND-5", "STAT-8", "STAT-3"] });
    }
    out
}

/// The per-position acceptance probabilities `beta_j` and the normalised
/// law `r_j` a correction at row `j` is drawn from (RESID-1 .. RESID-3).
/// Per draft row, the acceptance probability and the law of the token drawn
/// after a rejection, derived here from their definitions rather than by the
/// reference's `theory::acceptance` and `residual_distribution`: the reference's
/// own statistical and exact checks then compare it with an independent
/// derivation, so a defect in those functions cannot hide in the expectation.
fn acceptance_and_residuals(s: &Scenario) -> (Vec<f64>, Vec<Vec<f64>>) {
    (0..s.p.len() - 1)
        .map(|j| {
            let p = &s.p[j];
            let (beta, weights): (f64, Vec<f64>) = match &s.q {
                // A draft x ~ q is kept with probability min(1, p(x) / q(x)):
                // sum_x q(x) min(1, p(x) / q(x)) = sum_x min(p(x), q(x)); after a
                // rejection the next token follows max(p - q, 0) (REJECT-2/3, RESID-1).
                Some(q) => (p.iter().zip(&q[j]).map(|(a, b)| a.min(*b)).sum(), p.iter().zip(&q[j]).map(|(a, b)| (a - b).max(0.0)).collect()),
                // A fixed draft x is kept with probability p(x); after a rejection
                // the next token follows p without x (RESID-2).
                None => {
                    let x = usize::try_from(s.fixed_drafts[j]).expect("scenario drafts are ids");
                    (p[x], p.iter().enumerate().map(|(i, &a)| if i == x { 0.0 } else { a }).collect())
                }
            };
            let mass: f64 = weights.iter().sum();
            // RESID-3: a residual without mass falls back to p.
            let residual = if mass > 0.0 { weights.iter().map(|w| w / mass).collect() } else { p.clone() };
            (beta, residual)
        })
        .unzip()
}

/// The joint law of (accepted count `n`, next token `x`) for proposal length
/// `len`, as cells `n * V + x`: `prod_{i<n} beta_i (1 - beta_n) r_n(x)` for
/// `n < len`, and `prod_{i<len} beta_i p_len(x)` for the bonus.
pub fn accepted_and_next_law(s: &Scenario, len: usize) -> Vec<f64> {
    let (k, v) = (s.p.len() - 1, s.p[0].len());
    let (betas, residuals) = acceptance_and_residuals(s);
    let mut law = vec![0.0; (k + 1) * v];
    let mut reach = 1.0;
    for n in 0..=len {
        let (stop, row) = if n < len { (1.0 - betas[n], &residuals[n]) } else { (1.0, &s.p[len]) };
        for (x, &px) in row.iter().enumerate() {
            law[n * v + x] += reach * stop * px;
        }
        if n < len {
            reach *= betas[n];
        }
    }
    law
}

/// The law a check compares against; proposal lengths are uniform on `0..=k`.
pub fn expected(s: &Scenario, measure: Measure) -> Vec<f64> {
    let k = s.p.len() - 1;
    match measure {
        Measure::FirstToken => s.p[0].clone(),
        Measure::AcceptedAndNext => {
            let mut law = vec![0.0; (k + 1) * s.p[0].len()];
            for len in 0..=k {
                for (cell, p) in law.iter_mut().zip(accepted_and_next_law(s, len)) {
                    *cell += p / (k + 1) as f64;
                }
            }
            law
        }
        Measure::RowPairs => {
            let row = expected(s, Measure::AcceptedAndNext);
            row.iter().flat_map(|a| row.iter().map(move |b| a * b)).collect()
        }
    }
}

/// STAT-3: the smallest sample size whose plan detects [`DETECTABLE_DELTA`]
/// at the Bonferroni level of the family, checked before any sampling.
pub fn planned_n(expected: &[f64], family_size: usize) -> Result<u64, String> {
    planned_n_for(expected, family_size, DETECTABLE_DELTA, BETA)
}

/// The smallest sample size whose plan detects a total variation of `delta`
/// with miss probability `beta` at the Bonferroni level of the family.
pub fn planned_n_for(expected: &[f64], family_size: usize, delta: f64, beta: f64) -> Result<u64, String> {
    let alpha = FAMILY_ALPHA / family_size as f64;
    let cells = expected.iter().filter(|&&x| x > 0.0).count().max(2);
    let mut n = min_samples(cells, delta, alpha, beta).map_err(|e| e.to_string())?;
    while n < 1 << 30 {
        let plan = plan_gof(n, expected, alpha, beta).map_err(|e| e.to_string())?;
        match plan.power {
            Some(p) if p.detectable_delta <= delta => return Ok(n),
            _ => n += n / 4 + 1,
        }
    }
    Err(format!("no sample size reaches a detectable TV of {delta} for {expected:?}"))
}

/// Draws for a check whose law is a single certain outcome.
pub const CERTAIN_OUTCOME_SAMPLES: u64 = 20_000;

/// The sample size of a check inside a family of `family` (STAT-3).
pub fn sample_size(expected: &[f64], family: usize) -> Result<u64, String> {
    if expected.iter().filter(|&&x| x > 0.0).count() == 1 { Ok(CERTAIN_OUTCOME_SAMPLES) } else { planned_n(expected, family) }
}

/// Tests observed counts against an exact law and states the power (STAT-3,
/// STAT-6). A law with one certain outcome has no chi-squared test: any
/// other outcome is impossible, so the exact binomial test against `p0 = 1`
/// decides, and its power is exact: a deviation of TV `delta` goes unseen
/// with probability `(1 - delta)^n`, so `delta = 1 - beta^(1/n)`.
pub fn test_counts(label: &str, observed: &[u64], expected: &[f64], family: usize) -> Result<TestReport, String> {
    let alpha = FAMILY_ALPHA / family as f64;
    let n: u64 = observed.iter().sum();
    if let Some(cell) = expected.iter().position(|&x| x == 1.0) {
        let result = binomial_test(observed[cell], n, 1.0, Alternative::TwoSided).map_err(|e| e.to_string())?;
        let mut report = result.to_report(label);
        report.power = Some(PowerClaim { alpha, beta: BETA, detectable_delta: 1.0 - BETA.powf(1.0 / n as f64) });
        return Ok(report);
    }
    let result = chi_squared_gof(observed, expected).map_err(|e| e.to_string())?;
    result.to_report(label).with_power(alpha, BETA).map_err(|e| e.to_string())
}

/// A statistical check's outcome before the family is judged.
pub type Outcome = Result<TestReport, Verdict>;

/// Samples one check on `backend`. Never retried (STAT-4).
pub fn run<B: Backend>(backend: &B, spec: &StatSpec, seed: u64) -> Outcome {
    let scenario = scenario(spec.scenario).expect("spec names a scenario");
    let law = expected(&scenario, spec.measure);
    let n = sample_size(&law, specs().len()).map_err(Verdict::Fail)?;
    let counts = sample(backend, &scenario, spec, n as usize, seed).map_err(|e| match e {
        BackendError::NotSupported { op, .. } => Verdict::NotSupported(format!("`{op}` is not supported")),
        other => Verdict::Fail(other.to_string()),
    })?;
    test_counts(&spec.name(), &counts, &law, specs().len()).map_err(Verdict::Fail)
}

/// A stream seed for `name` under run seed `seed`: independent streams for
/// different checks (FNV-1a of the name, mixed with the seed).
pub fn stream_seed(seed: u64, name: &str) -> u64 {
    let h = name.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ b as u64).wrapping_mul(0x100_0000_01b3));
    seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ h
}

/// `n` copies of a scenario on a backend, each row with its own random
/// proposal length in `0..=k`: target rows, draft rows, drafts (PAD past the
/// length) and lengths.
pub(crate) struct ScenarioBatch<T> {
    pub p: T,
    pub q: Option<T>,
    pub drafts: T,
    pub lens: T,
}

/// Builds and uploads a [`ScenarioBatch`]; `draft(row, u)` draws a draft
/// from a `q` row with uniform `u` (drafts without probabilities are fixed).
pub(crate) fn scenario_batch<B: Backend>(backend: &B, s: &Scenario, n: usize, rng: &mut Pcg64, draft: impl Fn(&[f64], f64) -> i64) -> Result<ScenarioBatch<B::Tensor>, BackendError> {
    let (k, v) = (s.p.len() - 1, s.p[0].len());
    let mut drafts = Vec::with_capacity(n * k);
    let mut lens = Vec::with_capacity(n);
    for _ in 0..n {
        let len = rng.random_range(0..=k);
        lens.push(len as i64);
        for j in 0..k {
            drafts.push(match (&s.q, j < len) {
                (_, false) => PAD,
                (Some(q), true) => draft(&q[j], rng.random()),
                (None, true) => s.fixed_drafts[j],
            });
        }
    }
    let rows = |rows: &[Vec<f64>], r: usize| HostTensor::new(vec![n, r, v], (0..n).flat_map(|_| rows.iter().flatten().copied()).collect()).expect("shape");
    Ok(ScenarioBatch {
        p: backend.upload_f64(&rows(&s.p, k + 1))?,
        q: s.q.as_ref().map(|q| backend.upload_f64(&rows(q, k))).transpose()?,
        drafts: backend.upload_i64(&HostTensor::new(vec![n, k], drafts).expect("shape"))?,
        lens: backend.upload_i64(&HostTensor::from_vec(lens))?,
    })
}

/// Runs the backend's seeded verify on `n` independent copies of the
/// scenario (`2n` rows for [`Measure::RowPairs`], counted in pairs), each
/// with a random proposal length, and counts the outcome.
fn sample<B: Backend>(backend: &B, s: &Scenario, spec: &StatSpec, n: usize, seed: u64) -> Result<Vec<u64>, BackendError> {
    let (k, v) = (s.p.len() - 1, s.p[0].len());
    let rows_per_outcome = if spec.measure == Measure::RowPairs { 2 } else { 1 };
    let n_rows = n * rows_per_outcome;
    // Drafts and lengths come from a stream of this check's own, independent
    // of the backend's generator and of every other check.
    let mut rng = Pcg64::seed_from_u64(stream_seed(seed, &format!("{}/drafts", spec.name())));
    let batch = scenario_batch(backend, s, n_rows, &mut rng, pick)?;
    let args = RejectionArgs { target_probs: &batch.p, draft_probs: batch.q.as_ref(), draft_tokens: &batch.drafts, proposal_lens: &batch.lens };
    let out = backend.rejection_verify_seeded(args, spec.method, Comparator::Strict, stream_seed(seed, &spec.name()))?;
    let tokens = backend.download_i64(&out.tokens)?;
    let accepted = backend.download_i64(&out.num_accepted)?;
    let misshapen = |what: &str, got: &[usize], want: &[usize]| BackendError::device(&backend.name(), format!("{what} has shape {got:?}, expected {want:?}"));
    if tokens.shape() != [n_rows, k + 1] {
        return Err(misshapen("tokens", tokens.shape(), &[n_rows, k + 1]));
    }
    if accepted.shape() != [n_rows] {
        return Err(misshapen("num_accepted", accepted.shape(), &[n_rows]));
    }
    // Each row's outcome as a cell of its own law, validated.
    let row_cell = |b: usize| -> Result<usize, BackendError> {
        let m = accepted.data()[b];
        if !(0..=k as i64).contains(&m) {
            return Err(BackendError::device(&backend.name(), format!("row {b} accepted {m} drafts, outside [0, {k}]")));
        }
        let x = match spec.measure {
            Measure::FirstToken => tokens.data()[b * (k + 1)],
            Measure::AcceptedAndNext | Measure::RowPairs => tokens.data()[b * (k + 1) + m as usize],
        };
        if !(0..v as i64).contains(&x) {
            return Err(BackendError::device(&backend.name(), format!("row {b} produced token {x}, outside [0, {v})")));
        }
        Ok(match spec.measure {
            Measure::FirstToken => x as usize,
            Measure::AcceptedAndNext | Measure::RowPairs => m as usize * v + x as usize,
        })
    };
    let row_cells = match spec.measure {
        Measure::FirstToken => v,
        Measure::AcceptedAndNext | Measure::RowPairs => (k + 1) * v,
    };
    let mut counts = vec![0u64; row_cells.pow(rows_per_outcome as u32)];
    for i in 0..n {
        let cell = match spec.measure {
            Measure::RowPairs => row_cell(2 * i)? * row_cells + row_cell(2 * i + 1)?,
            _ => row_cell(i)?,
        };
        counts[cell] += 1;
    }
    Ok(counts)
}

/// Judges a statistical family ([`judge_family`]) and settles each member's
/// result in `results` (its slot), named as of `family`, reporting each to
/// `progress`.
pub fn settle_family(results: &mut [CheckResult], outcomes: Vec<(usize, Outcome)>, family: &str, selection: &Selection, progress: &mut dyn FnMut(&CheckResult)) {
    for (slot, verdict, report) in judge_family(outcomes) {
        let r = &mut results[slot];
        r.statistics = report;
        r.family = Some(family.to_string());
        settle(r, verdict, selection);
        progress(r);
    }
}

/// The verdict of a report Holm has judged.
pub fn verdict_of(report: &TestReport) -> Verdict {
    match report.decision {
        Decision::NotRejected => Verdict::Pass { excused: 0, max_abs_err: 0.0 },
        Decision::Reject => Verdict::Fail(format!("distribution differs from the target: {report}")),
        Decision::Degenerate | Decision::Pending => Verdict::Fail(format!("no valid test: {report}")),
    }
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
    if !reports.is_empty()
        && let Err(e) = judge_holm(&mut reports, FAMILY_ALPHA)
    {
        out.extend(slots.drain(..).map(|s| (s, Verdict::Fail(e.to_string()), None)));
        return out;
    }
    for (slot, report) in slots.into_iter().zip(reports) {
        out.push((slot, verdict_of(&report), Some(report)));
    }
    out
}
