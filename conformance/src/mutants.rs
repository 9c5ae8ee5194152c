//! Deliberately broken verifiers (STAT-5): the bug classes the statistical
//! checks must reject. Each is a backend wrapping the reference whose
//! explicit-noise `rejection_verify` has one defect; everything else is the
//! reference. Test fixtures only: never used to produce tokens.

use specdec_backend::{Backend, Comparator, DrawMethod, DrawNoiseArg, HostTensor, Precision, RefTensor, ReferenceBackend, RejectionArgs, RejectionNoise, Result, Verified};
use specdec_reference::kvcache::BatchKvCache;
use specdec_reference::{PAD, lossy};

/// The defect a mutant carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Defect {
    /// LOSSY-1 in place of rejection sampling (threshold 0.1).
    LossyThreshold,
    /// LOSSY-2 in place of rejection sampling (epsilon 0.3, delta 0.09).
    LossyTypical,
    /// The seed-004 `<=` comparator (only visible with coarse uniforms).
    LessEqComparator,
    /// The correction is drawn from `p` instead of `max(0, p - q)`.
    ResidualIsTarget,
    /// The residual is drawn as if it summed to 1.
    ResidualNotRenormalised,
    /// The bonus is drawn from the last draft row instead of row `len`.
    BonusFromWrongRow,
}

impl Defect {
    pub const ALL: [Defect; 6] = [Defect::LossyThreshold, Defect::LossyTypical, Defect::LessEqComparator, Defect::ResidualIsTarget, Defect::ResidualNotRenormalised, Defect::BonusFromWrongRow];

    pub fn name(self) -> &'static str {
        match self {
            Defect::LossyThreshold => "lossy-threshold",
            Defect::LossyTypical => "lossy-typical",
            Defect::LessEqComparator => "less-eq-comparator",
            Defect::ResidualIsTarget => "residual-is-target",
            Defect::ResidualNotRenormalised => "residual-not-renormalised",
            Defect::BonusFromWrongRow => "bonus-from-wrong-row",
        }
    }
}

/// The reference with one defect.
#[derive(Debug, Clone, Copy)]
pub struct Mutant(pub Defect);

fn f(t: &RefTensor) -> &HostTensor<f64> {
    match t {
        RefTensor::F64(t) => t,
        RefTensor::I64(_) => panic!("mutants are driven by the samplers, which pass floats here"),
    }
}

fn i(t: &RefTensor) -> &HostTensor<i64> {
    match t {
        RefTensor::I64(t) => t,
        RefTensor::F64(_) => panic!("mutants are driven by the samplers, which pass ids here"),
    }
}

impl Mutant {
    /// The residual/bonus defects, written out as the scalar loop with the bug.
    fn broken_verify(&self, a: &RejectionArgs<'_, RefTensor>, u: &HostTensor<f64>, v: &HostTensor<f64>) -> Verified<RefTensor> {
        let (p, d, lens) = (f(a.target_probs), i(a.draft_tokens), i(a.proposal_lens));
        let q = a.draft_probs.map(f);
        let (batch, k, vocab) = (d.shape()[0], d.shape()[1], p.shape()[2]);
        let mut tokens = vec![PAD; batch * (k + 1)];
        let mut accepted = Vec::with_capacity(batch);
        let row = |t: &HostTensor<f64>, b: usize, j: usize| t.lane(&[b, j]).expect("sampler shapes").to_vec();
        for b in 0..batch {
            let len = lens.data()[b] as usize;
            let mut n = 0;
            let next = loop {
                let pr = row(p, b, n);
                if n == len {
                    let bonus_row = if self.0 == Defect::BonusFromWrongRow && len > 0 { row(p, b, len - 1) } else { pr };
                    break draw(&bonus_row, v.data()[b * (k + 1) + n], true);
                }
                let x = d.data()[b * k + n] as usize;
                let qr = q.map_or_else(|| (0..vocab).map(|y| if y == x { 1.0 } else { 0.0 }).collect(), |q| row(q, b, n));
                if u.data()[b * k + n] * qr[x] < pr[x] {
                    tokens[b * (k + 1) + n] = x as i64;
                    n += 1;
                    continue;
                }
                let weights: Vec<f64> = match self.0 {
                    Defect::ResidualIsTarget => pr,
                    _ => pr.iter().zip(&qr).map(|(a, b)| (a - b).max(0.0)).collect(),
                };
                break draw(&weights, v.data()[b * (k + 1) + n], self.0 != Defect::ResidualNotRenormalised);
            };
            tokens[b * (k + 1) + n] = next as i64;
            accepted.push(n as i64);
        }
        Verified { tokens: RefTensor::I64(HostTensor::new(vec![batch, k + 1], tokens).expect("shape")), num_accepted: RefTensor::I64(HostTensor::from_vec(accepted)) }
    }
}

/// Inverse CDF; `normalise = false` compares `v` with the raw running sum.
fn draw(w: &[f64], v: f64, normalise: bool) -> usize {
    let total: f64 = if normalise { w.iter().sum() } else { 1.0 };
    let mut c = 0.0;
    for (x, &wx) in w.iter().enumerate() {
        c += wx;
        if v * total < c {
            return x;
        }
    }
    w.iter().rposition(|&x| x > 0.0).unwrap_or(0)
}

/// What every test-fixture backend here shares: host tensors, the reference's
/// transfers, and the given name and precision (functions of `&self`).
macro_rules! host_fixture {
    ($name:expr, $precision:expr) => {
        type Tensor = RefTensor;
        type KvCache = BatchKvCache;

        fn name(&self) -> String {
            ($name)(self)
        }
        fn device(&self) -> String {
            "host".into()
        }
        fn precision(&self) -> Precision {
            ($precision)(self)
        }
        specdec_backend::reference_transfers!();
    };
}

/// A mutant named from its defect, with the reference's precision.
macro_rules! host_mutant {
    () => {
        host_fixture!(|m: &Self| format!("mutant-{}", m.0.name()), |_: &Self| ReferenceBackend.precision());
    };
}

impl Backend for Mutant {
    host_mutant!();

    fn rejection_verify(&self, a: RejectionArgs<'_, RefTensor>, n: RejectionNoise<'_, RefTensor>, cmp: Comparator) -> Result<Verified<RefTensor>> {
        let DrawNoiseArg::InverseCdf(v) = n.draw else {
            return Err(self.unsupported(specdec_backend::Op::RejectionVerify));
        };
        // A mutant breaks the algorithm, not the validation: bad input gets the reference's error.
        ReferenceBackend.rejection_verify(a, n, cmp)?;
        let (p, d, l) = (f(a.target_probs), i(a.draft_tokens), i(a.proposal_lens));
        let wrap =
            |o: specdec_reference::VerifyOutput| Verified { tokens: RefTensor::I64(o.tokens), num_accepted: RefTensor::I64(HostTensor::from_vec(o.num_accepted.iter().map(|&x| x as i64).collect())) };
        match self.0 {
            Defect::LossyThreshold => Ok(wrap(lossy::lossy_threshold_verify(p, d, l, 0.1)?)),
            Defect::LossyTypical => Ok(wrap(lossy::lossy_typical_verify(p, d, l, 0.3, 0.09, f(v))?)),
            Defect::LessEqComparator => ReferenceBackend.rejection_verify(a, n, Comparator::Seed004LessEq),
            _ => Ok(self.broken_verify(&a, f(n.accept_uniforms), f(v))),
        }
    }
}

/// A [`Mutant`] that states more slack than its dtype's cap allows
/// (BACKEND-6): it must fail `precision/within-cap`, and its defect must still
/// fail the checks that catch it, because the judge uses the capped values.
#[derive(Debug, Clone, Copy)]
pub struct OverstatedPrecision(pub Defect, pub Precision);

impl Backend for OverstatedPrecision {
    host_fixture!(|m: &Self| format!("mutant-{}-overstated", m.0.name()), |m: &Self| m.1);

    fn rejection_verify(&self, a: RejectionArgs<'_, RefTensor>, n: RejectionNoise<'_, RefTensor>, cmp: Comparator) -> Result<Verified<RefTensor>> {
        Mutant(self.0).rejection_verify(a, n, cmp)
    }
}

/// A `draw`, and the correction and bonus draws of a `rejection_verify`,
/// whose inverse-CDF scan accumulates in f32 (values and running sum) while it
/// states f64 (BACKEND-4): the defect the large-vocabulary cases
/// (`diff::large_vocab_case`) must catch. Accept decisions, exponential races,
/// verifies without draft rows and validation are the reference's.
#[derive(Debug, Clone, Copy)]
pub struct F32AccumulatingDraw;

/// SAMPLE-1's scan with an f32 running sum.
fn f32_scan(row: &[f64], u: f64) -> i64 {
    let total = row.iter().fold(0.0f32, |s, &x| s + x as f32);
    let target = u as f32 * total;
    let mut below = 0.0f32;
    for (id, &x) in row.iter().enumerate() {
        below += x as f32;
        if target < below {
            return id as i64;
        }
    }
    row.iter().rposition(|&x| x > 0.0).unwrap_or(0) as i64
}

impl Backend for F32AccumulatingDraw {
    host_fixture!(|_: &Self| "mutant-f32-accumulating-draw".to_string(), |_: &Self| ReferenceBackend.precision());

    fn draw(&self, weights: &RefTensor, noise: DrawNoiseArg<'_, RefTensor>) -> Result<RefTensor> {
        let checked = ReferenceBackend.draw(weights, noise)?;
        let DrawNoiseArg::InverseCdf(v) = noise else { return Ok(checked) };
        let w = f(weights);
        let vocab = w.shape()[1];
        let tokens = w.data().chunks(vocab).zip(f(v).data()).map(|(row, &u)| f32_scan(row, u)).collect();
        Ok(RefTensor::I64(HostTensor::from_vec(tokens)))
    }

    fn rejection_verify(&self, a: RejectionArgs<'_, RefTensor>, n: RejectionNoise<'_, RefTensor>, cmp: Comparator) -> Result<Verified<RefTensor>> {
        let checked = ReferenceBackend.rejection_verify(a, n, cmp)?;
        let (DrawNoiseArg::InverseCdf(v), Some(q)) = (n.draw, a.draft_probs) else { return Ok(checked) };
        let (p, q, lens, v) = (f(a.target_probs), f(q), i(a.proposal_lens), f(v));
        let (k, accepted) = (i(a.draft_tokens).shape()[1], i(&checked.num_accepted));
        let mut tokens = i(&checked.tokens).data().to_vec();
        for (b, (&n, &len)) in accepted.data().iter().zip(lens.data()).enumerate() {
            let (n, at) = (n as usize, b * (k + 1) + n as usize);
            let pr = p.lane(&[b, n]).expect("validated");
            // REJECT-3's residual at a rejection, REJECT-4's target row for the bonus.
            let w: Vec<f64> = if n < len as usize { pr.iter().zip(q.lane(&[b, n]).expect("validated")).map(|(p, q)| (p - q).max(0.0)).collect() } else { pr.to_vec() };
            tokens[at] = f32_scan(&w, v.data()[at]);
        }
        let tokens = RefTensor::I64(HostTensor::new(vec![accepted.len(), k + 1], tokens).expect("the reference's shape"));
        Ok(Verified { tokens, num_accepted: checked.num_accepted })
    }
}

/// A defect in how a seeded verify lays out its noise (BACKEND-5): each row's
/// own law stays exact, only the independence of rows breaks, so only the
/// row-pair checks (STAT-8) can see it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NoiseDefect {
    /// Every row reads row 0's noise (a generator reseeded per row with the
    /// same seed, or noise broadcast over the batch).
    SharedAcrossRows,
    /// The draw noise is read with a row stride of `k` instead of `k + 1`
    /// positions, so row `b + 1`'s first draw reuses row `b`'s last (bonus).
    RowStrideK,
}

impl NoiseDefect {
    pub const ALL: [NoiseDefect; 2] = [NoiseDefect::SharedAcrossRows, NoiseDefect::RowStrideK];

    pub fn name(self) -> &'static str {
        match self {
            NoiseDefect::SharedAcrossRows => "noise-shared-across-rows",
            NoiseDefect::RowStrideK => "noise-row-stride-k",
        }
    }
}

/// The reference whose seeded verify has one [`NoiseDefect`]; the rest is
/// the reference. Test fixture only.
#[derive(Debug, Clone, Copy)]
pub struct SeededMutant(pub NoiseDefect);

impl SeededMutant {
    /// The reference's seeded noise for `batch` rows, laid out with the defect.
    fn noise(&self, seed: u64, (batch, k, v): (usize, usize, usize), method: DrawMethod) -> (HostTensor<f64>, specdec_reference::DrawNoise) {
        use specdec_reference::DrawNoise;
        // One spare row, so that an overlapping layout never reads past the end.
        let (u, draw) = specdec_backend::seeded_noise(seed, batch + 1, k, v, method);
        let (accept_row, draw_row) = (k, (k + 1) * if method == DrawMethod::InverseCdf { 1 } else { v });
        // Where row `b` starts reading: every row at 0, or at a stride one
        // position (of `draw_row / (k + 1)` values) short for the draw noise.
        let start = |b: usize, width: usize, stride: usize| match self.0 {
            NoiseDefect::SharedAcrossRows => 0,
            NoiseDefect::RowStrideK => b * (width - stride),
        };
        let relay = |flat: &[f64], width: usize, stride: usize| -> Vec<f64> { (0..batch).flat_map(|b| flat[start(b, width, stride)..start(b, width, stride) + width].to_vec()).collect() };
        let accept = HostTensor::new(vec![batch, k], relay(u.data(), accept_row, 0)).expect("shape");
        let draw = match draw {
            DrawNoise::InverseCdf(t) => DrawNoise::InverseCdf(HostTensor::new(vec![batch, k + 1], relay(t.data(), draw_row, draw_row / (k + 1))).expect("shape")),
            DrawNoise::ExponentialRace(t) => DrawNoise::ExponentialRace(HostTensor::new(vec![batch, k + 1, v], relay(t.data(), draw_row, draw_row / (k + 1))).expect("shape")),
        };
        (accept, draw)
    }
}

impl Backend for SeededMutant {
    host_mutant!();

    fn rejection_verify_seeded(&self, a: RejectionArgs<'_, RefTensor>, method: DrawMethod, cmp: Comparator, seed: u64) -> Result<Verified<RefTensor>> {
        // A mutant breaks the noise, not the validation: bad input gets the reference's error.
        ReferenceBackend.rejection_verify_seeded(a, method, cmp, seed)?;
        let p = f(a.target_probs);
        let [batch, rows, v] = p.shape() else { unreachable!("validated above") };
        let (u, draw) = self.noise(seed, (*batch, rows - 1, *v), method);
        let (u, draw) = (
            RefTensor::F64(u),
            match draw {
                specdec_reference::DrawNoise::InverseCdf(t) => RefTensor::F64(t),
                specdec_reference::DrawNoise::ExponentialRace(t) => RefTensor::F64(t),
            },
        );
        let draw = match method {
            DrawMethod::InverseCdf => DrawNoiseArg::InverseCdf(&draw),
            DrawMethod::ExponentialRace => DrawNoiseArg::ExponentialRace(&draw),
        };
        ReferenceBackend.rejection_verify(a, RejectionNoise { accept_uniforms: &u, draw }, cmp)
    }
}
