//! `ndarray-f32` (the vectorised f32 softmax) against its statement: its
//! `process_logits` is within the stated tolerance of the reference on the
//! suite's cases and on long rows, is not the f64 path under another name,
//! and the suite's tolerance check fails the same kernel when it claims
//! bit-exactness, and a kernel ten times less accurate than the statement
//! allows (the negative controls).

use rand::{RngExt, SeedableRng};
use specdec_backend::{Backend, HostTensor, LogitsParams, Precision, RefTensor, ReferenceBackend, Result};
use specdec_conformance::suite::{self, Status, SuiteConfig};
use specdec_ndarray::{NdKvCache, NdTensor, NdarrayBackend};

/// `ndarray-f32` stating `value_tolerance` and `margin_epsilon` of
/// `stated`, with every odd id's probability scaled by `1 + skew`.
struct Stating {
    port: NdarrayBackend,
    stated: f64,
    skew: f64,
}

impl Backend for Stating {
    type Tensor = NdTensor;
    type KvCache = NdKvCache;

    fn name(&self) -> String {
        format!("ndarray-f32 stating {:e}, skewed by {:e}", self.stated, self.skew)
    }
    fn device(&self) -> String {
        self.port.device()
    }
    fn precision(&self) -> Precision {
        Precision { margin_epsilon: self.stated, value_tolerance: self.stated, ..self.port.precision() }
    }
    fn upload_f64(&self, t: &HostTensor<f64>) -> Result<NdTensor> {
        self.port.upload_f64(t)
    }
    fn upload_i64(&self, t: &HostTensor<i64>) -> Result<NdTensor> {
        self.port.upload_i64(t)
    }
    fn download_f64(&self, t: &NdTensor) -> Result<HostTensor<f64>> {
        self.port.download_f64(t)
    }
    fn download_i64(&self, t: &NdTensor) -> Result<HostTensor<i64>> {
        self.port.download_i64(t)
    }
    fn process_logits(&self, l: &NdTensor, p: LogitsParams<'_, NdTensor>) -> Result<NdTensor> {
        let mut out = self.port.download_f64(&self.port.process_logits(l, p)?)?;
        out.data_mut().iter_mut().skip(1).step_by(2).for_each(|x| *x *= 1.0 + self.skew);
        self.port.upload_f64(&out)
    }
}

fn process_logits_checks(b: &Stating) -> Vec<Status> {
    let cfg = SuiteConfig { filter: Some("process_logits".into()), ..SuiteConfig::default() };
    suite::run(b, &suite::all_items(&cfg), &cfg, &mut |_| {}).into_iter().filter(|r| r.status != Status::Skipped).map(|r| r.status).collect()
}

#[test]
fn the_suite_judges_the_f32_softmax_at_its_statement_and_not_below() {
    let port = NdarrayBackend::f32_softmax();
    let stated = port.precision().value_tolerance;
    let honest = process_logits_checks(&Stating { port, stated, skew: 0.0 });
    assert!(!honest.is_empty() && honest.iter().all(|s| *s == Status::Pass), "{honest:?}");
    // Negative controls: the f32 softmax claiming the f64 path's bit-exactness,
    // and one whose error is ten times what the f32 judge allows (1e-6 relative).
    let exact_claim = process_logits_checks(&Stating { port, stated: 0.0, skew: 0.0 });
    assert!(exact_claim.contains(&Status::Fail), "claiming bit-exactness must fail the f32 softmax");
    let too_loose = process_logits_checks(&Stating { port, stated, skew: 1e-5 });
    assert!(too_loose.contains(&Status::Fail), "an error of 1e-5 relative must fail at the statement");
}

/// Long rows of the verify shapes (Qwen- and Llama-size vocabularies), with
/// temperatures, masked ids and a greedy row: the largest absolute
/// difference from the reference is above 0 (it is the f32 path) and within
/// the stated tolerance, and the f64 port stays at exactly 0.
#[test]
fn long_rows_are_within_the_statement() {
    let mut rng = rand_pcg::Pcg64::seed_from_u64(31);
    for vocab in [151_936, 32_768, 4099] {
        let rows = 5;
        let data: Vec<f64> = (0..rows * vocab).map(|i| if i % 977 == 3 { f64::NEG_INFINITY } else { rng.random_range(-12.0..12.0) }).collect();
        let z = HostTensor::new(vec![rows, vocab], data).expect("shape");
        let t = HostTensor::from_vec(vec![1.0, 0.0, 0.6, 2.0, 1.0]);
        let (k, p) = (HostTensor::from_vec(vec![0i64; rows]), HostTensor::from_vec(vec![1.0; rows]));
        let want = {
            let (z, t, k, p) = (RefTensor::F64(z.clone()), RefTensor::F64(t.clone()), RefTensor::I64(k.clone()), RefTensor::F64(p.clone()));
            let RefTensor::F64(out) = ReferenceBackend.process_logits(&z, LogitsParams::new(&t, &k, &p)).expect("valid") else { unreachable!("floats") };
            out
        };
        let worst = |b: &NdarrayBackend| {
            let (zz, tt, kk, pp) = (b.upload_f64(&z).unwrap(), b.upload_f64(&t).unwrap(), b.upload_i64(&k).unwrap(), b.upload_f64(&p).unwrap());
            let got = b.download_f64(&b.process_logits(&zz, LogitsParams::new(&tt, &kk, &pp)).expect("valid")).unwrap();
            got.data().iter().zip(want.data()).map(|(a, b)| (a - b).abs()).fold(0.0, f64::max)
        };
        let f32_worst = worst(&NdarrayBackend::f32_softmax());
        assert!(f32_worst > 0.0 && f32_worst <= NdarrayBackend::f32_softmax().precision().value_tolerance, "V={vocab}: {f32_worst:e}");
        assert_eq!(worst(&NdarrayBackend::new()), 0.0, "V={vocab}");
    }
}
