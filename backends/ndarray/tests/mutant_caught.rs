//! Proof that the suite has teeth against a real port: the ndarray backend
//! with its residual broken the way a port might break it (the correction
//! drawn from the target row `p` itself instead of `max(0, p - q)`: RESID-1/2,
//! REJECT-3) must fail the suite, on the residual and rejection checks and
//! on the statistical checks, and nowhere else.
//!
//! The broken port lives here, in test code, not behind a feature of the
//! production crate: it wraps [`NdarrayBackend`], delegates every operation,
//! and redraws each rejected row's correction from `p` with that row's own
//! draw noise.

use specdec_backend::{Backend, Comparator, DrawMethod, DrawNoiseArg, HostTensor, NgramConfig, Op, Precision, RefTensor, ReferenceBackend, RejectionArgs, RejectionNoise, Result, TrimMode, Verified};
use specdec_conformance::suite::{self, Kind, Status, SuiteConfig};
use specdec_ndarray::{NdKvCache, NdTensor, NdarrayBackend};

struct BrokenResidual(NdarrayBackend);

impl BrokenResidual {
    /// The rows of `p [R, V]` (or `[B, k+1, V]` flattened) normalised: the
    /// "residual" this port returns whatever `q` says.
    fn rows_of_p(&self, p: &NdTensor) -> Result<NdTensor> {
        let p = self.0.download_f64(p)?;
        let v = *p.shape().last().expect("validated rows");
        let data = p.data().chunks(v).flat_map(|row| row.iter().map(move |x| x / row.iter().sum::<f64>())).collect();
        self.0.upload_f64(&HostTensor::new(p.shape().to_vec(), data).expect("same shape"))
    }

    /// The correct verify's output with every rejected row's correction
    /// (position `n < len`) redrawn from `p[b, n]` with that row's noise.
    fn redraw_corrections(&self, a: &RejectionArgs<'_, NdTensor>, out: Verified<NdTensor>, draw: &HostTensor<f64>, method: DrawMethod) -> Result<Verified<NdTensor>> {
        let p = self.0.download_f64(a.target_probs)?;
        let (lens, accepted) = (self.0.download_i64(a.proposal_lens)?, self.0.download_i64(&out.num_accepted)?);
        let mut tokens = self.0.download_i64(&out.tokens)?;
        let [_, rows, v] = *p.shape() else { unreachable!("validated by the verify") };
        for (b, (&len, &n)) in lens.data().iter().zip(accepted.data()).enumerate() {
            if n >= len {
                continue; // accepted every draft: the bonus is untouched
            }
            let at = b * rows + n as usize;
            let weights = RefTensor::F64(HostTensor::new(vec![1, v], p.data()[at * v..(at + 1) * v].to_vec()).expect("one row"));
            let noise = match method {
                DrawMethod::InverseCdf => RefTensor::F64(HostTensor::new(vec![1], vec![draw.data()[at]]).expect("one uniform")),
                DrawMethod::ExponentialRace => RefTensor::F64(HostTensor::new(vec![1, v], draw.data()[at * v..(at + 1) * v].to_vec()).expect("one row")),
            };
            let arg = match method {
                DrawMethod::InverseCdf => DrawNoiseArg::InverseCdf(&noise),
                DrawMethod::ExponentialRace => DrawNoiseArg::ExponentialRace(&noise),
            };
            let RefTensor::I64(x) = ReferenceBackend.draw(&weights, arg)? else { unreachable!("draw returns ids") };
            tokens.data_mut()[b * rows + n as usize] = x.data()[0];
        }
        Ok(Verified { tokens: self.0.upload_i64(&tokens)?, num_accepted: out.num_accepted })
    }
}

impl Backend for BrokenResidual {
    type Tensor = NdTensor;
    type KvCache = NdKvCache;

    fn name(&self) -> String {
        "ndarray-broken-residual".into()
    }
    fn device(&self) -> String {
        self.0.device()
    }
    fn precision(&self) -> Precision {
        self.0.precision()
    }
    fn upload_f64(&self, t: &HostTensor<f64>) -> Result<NdTensor> {
        self.0.upload_f64(t)
    }
    fn upload_i64(&self, t: &HostTensor<i64>) -> Result<NdTensor> {
        self.0.upload_i64(t)
    }
    fn download_f64(&self, t: &NdTensor) -> Result<HostTensor<f64>> {
        self.0.download_f64(t)
    }
    fn download_i64(&self, t: &NdTensor) -> Result<HostTensor<i64>> {
        self.0.download_i64(t)
    }

    // The broken operations.
    fn residual(&self, target: &NdTensor, draft: Option<&NdTensor>, drafted: &NdTensor) -> Result<NdTensor> {
        self.0.residual(target, draft, drafted)?; // bad input still gets the port's own error
        self.rows_of_p(target)
    }
    fn rejection_verify(&self, a: RejectionArgs<'_, NdTensor>, n: RejectionNoise<'_, NdTensor>, cmp: Comparator) -> Result<Verified<NdTensor>> {
        let out = self.0.rejection_verify(a, n, cmp)?;
        let (draw, method) = match n.draw {
            DrawNoiseArg::InverseCdf(t) => (t, DrawMethod::InverseCdf),
            DrawNoiseArg::ExponentialRace(t) => (t, DrawMethod::ExponentialRace),
        };
        self.redraw_corrections(&a, out, &self.0.download_f64(draw)?, method)
    }
    fn rejection_verify_seeded(&self, a: RejectionArgs<'_, NdTensor>, method: DrawMethod, cmp: Comparator, seed: u64) -> Result<Verified<NdTensor>> {
        let out = self.0.rejection_verify_seeded(a, method, cmp, seed)?;
        let [batch, rows, v] = *self.0.download_f64(a.target_probs)?.shape() else { unreachable!("validated by the verify") };
        // The noise the port drew (ndarray's seeded stream is the reference's layout).
        let (_, draw) = specdec_backend::seeded_noise(seed, batch, rows - 1, v, method);
        let draw = match draw {
            specdec_reference::DrawNoise::InverseCdf(t) | specdec_reference::DrawNoise::ExponentialRace(t) => t,
        };
        self.redraw_corrections(&a, out, &draw, method)
    }

    // Everything else is the port itself.
    fn greedy_verify(&self, s: &NdTensor, d: &NdTensor, l: &NdTensor) -> Result<Verified<NdTensor>> {
        self.0.greedy_verify(s, d, l)
    }
    fn dflash_accept(&self, c: &NdTensor, t: &NdTensor, vocab: usize) -> Result<specdec_backend::DflashAccepted<NdTensor>> {
        self.0.dflash_accept(c, t, vocab)
    }
    fn process_logits(&self, l: &NdTensor, p: specdec_backend::LogitsParams<'_, NdTensor>) -> Result<NdTensor> {
        self.0.process_logits(l, p)
    }
    fn draw(&self, w: &NdTensor, n: DrawNoiseArg<'_, NdTensor>) -> Result<NdTensor> {
        self.0.draw(w, n)
    }
    fn ngram_propose(&self, c: &NdTensor, l: &NdTensor, vocab: usize, cfg: &NgramConfig) -> Result<(NdTensor, NdTensor)> {
        self.0.ngram_propose(c, l, vocab, cfg)
    }
    fn kv_new(&self, b: usize, h: usize, d: usize, c: usize) -> Result<NdKvCache> {
        self.0.kv_new(b, h, d, c)
    }
    fn kv_append(&self, cache: &mut NdKvCache, k: &NdTensor, v: &NdTensor, c: &NdTensor) -> Result<()> {
        self.0.kv_append(cache, k, v, c)
    }
    fn kv_trim(&self, cache: &mut NdKvCache, a: &NdTensor, mode: TrimMode) -> Result<NdTensor> {
        self.0.kv_trim(cache, a, mode)
    }
    fn kv_lens(&self, cache: &NdKvCache) -> Result<NdTensor> {
        self.0.kv_lens(cache)
    }
    fn kv_contents(&self, cache: &NdKvCache) -> Result<(NdTensor, NdTensor)> {
        self.0.kv_contents(cache)
    }
    fn paged_gather(&self, p: &NdTensor, t: &NdTensor, l: &NdTensor) -> Result<NdTensor> {
        self.0.paged_gather(p, t, l)
    }
    fn reshape(&self, t: &NdTensor, shape: &[usize]) -> Result<NdTensor> {
        self.0.reshape(t, shape)
    }
    fn gather_rows(&self, t: &NdTensor, rows: &NdTensor) -> Result<NdTensor> {
        self.0.gather_rows(t, rows)
    }
    fn concat_rows(&self, parts: &[&NdTensor]) -> Result<NdTensor> {
        self.0.concat_rows(parts)
    }
    fn add_i64(&self, a: &NdTensor, b: &NdTensor) -> Result<NdTensor> {
        self.0.add_i64(a, b)
    }
    fn sub_i64(&self, a: &NdTensor, b: &NdTensor) -> Result<NdTensor> {
        self.0.sub_i64(a, b)
    }
}

#[test]
fn the_suite_catches_the_broken_residual() {
    let cfg = SuiteConfig::default();
    let results = suite::run(&BrokenResidual(NdarrayBackend::new()), &suite::all_items(&cfg), &cfg, &mut |_| {});
    let unsupported: Vec<_> = results.iter().filter(|r| r.status == Status::NotSupported).map(|r| &r.name).collect();
    assert!(unsupported.is_empty(), "the wrapper must delegate every operation: {unsupported:?}");
    let failed: Vec<_> = results.iter().filter(|r| r.status == Status::Fail).collect();
    for op in [Op::Residual, Op::RejectionVerify, Op::RejectionVerifySeeded] {
        assert!(failed.iter().any(|r| r.op == op.name()), "no `{op}` check failed: the mutant went undetected");
    }
    assert!(failed.iter().any(|r| r.kind == Kind::Statistical), "the statistical checks missed the mutant");
    let elsewhere: Vec<_> = failed.iter().filter(|r| !r.op.starts_with("re")).map(|r| &r.name).collect();
    assert!(elsewhere.is_empty(), "unrelated checks failed: {elsewhere:?}");
    println!("{} checks caught the mutant", failed.len());
}
