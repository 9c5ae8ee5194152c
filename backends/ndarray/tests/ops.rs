//! Checks beyond the conformance judge: the port must be bit-identical to
//! the reference (not merely within tolerance), name defects exactly as the
//! reference does, ignore NaN padding, and reproduce the reference backend's
//! seeded noise. Written against the `Backend` trait only.

use specdec_backend::{Backend, BackendError, Comparator, DrawMethod, HostTensor, PAD, ReferenceBackend, RejectionArgs};
use specdec_conformance::diff;
use specdec_conformance::execute::{Observed, execute};
use specdec_ndarray::NdarrayBackend;

fn error_text(e: &Option<BackendError>) -> Option<String> {
    // SpecError holds f64 values (NaN != NaN): compare what it says.
    e.as_ref().map(|e| format!("{:?} {}", e.kind(), e))
}

fn assert_same(name: &str, a: &Observed, b: &Observed) {
    assert_eq!(error_text(&a.error), error_text(&b.error), "{name}: errors differ");
    assert_eq!(a.outputs, b.outputs, "{name}: outputs differ");
}

#[test]
fn bit_identical_to_the_reference_on_differential_cases() {
    let nd = NdarrayBackend::new();
    for seed in [1, 20_261_122] {
        for op in diff::ops() {
            for i in 0..150 {
                let case = diff::case(op, i, seed).expect("generator works");
                let ours = execute(&nd, &case).expect("case well-formed");
                let theirs = execute(&ReferenceBackend, &case).expect("case well-formed");
                assert_same(&case.id, &ours, &theirs);
            }
        }
    }
}

fn host_f(shape: Vec<usize>, data: Vec<f64>) -> HostTensor<f64> {
    HostTensor::new(shape, data).expect("shape matches")
}

fn host_i(shape: Vec<usize>, data: Vec<i64>) -> HostTensor<i64> {
    HostTensor::new(shape, data).expect("shape matches")
}

/// B = 2, k = 2, V = 3; sequence 1 proposes one draft, so its target row 2
/// and draft row 1 are padding and hold NaN (CONV-7).
fn padded_batch<B: Backend>(b: &B) -> (B::Tensor, B::Tensor, B::Tensor, B::Tensor) {
    let n = f64::NAN;
    let p = host_f(vec![2, 3, 3], vec![0.2, 0.5, 0.3, 0.1, 0.1, 0.8, 0.6, 0.2, 0.2, 0.3, 0.3, 0.4, 0.5, 0.25, 0.25, n, n, n]);
    let q = host_f(vec![2, 2, 3], vec![0.3, 0.3, 0.4, 0.5, 0.4, 0.1, 0.1, 0.1, 0.8, n, n, n]);
    let d = host_i(vec![2, 2], vec![1, 2, 2, PAD]);
    let l = host_i(vec![2], vec![2, 1]);
    (b.upload_f64(&p).unwrap(), b.upload_f64(&q).unwrap(), b.upload_i64(&d).unwrap(), b.upload_i64(&l).unwrap())
}

#[test]
fn nan_padding_is_neither_validated_nor_read() {
    let nd = NdarrayBackend::new();
    let (p, q, d, l) = padded_batch(&nd);
    let greedy = nd.greedy_verify(&p, &d, &l).expect("padding is not validated");
    assert_eq!(nd.download_i64(&greedy.tokens).unwrap().data(), &[1, 2, 0, 2, 0, PAD]);
    let args = RejectionArgs { target_probs: &p, draft_probs: Some(&q), draft_tokens: &d, proposal_lens: &l };
    for method in [DrawMethod::InverseCdf, DrawMethod::ExponentialRace] {
        let out = nd.rejection_verify_seeded(args, method, Comparator::Strict, 7).expect("padding is not validated");
        let tokens = nd.download_i64(&out.tokens).unwrap();
        assert!(tokens.data().iter().all(|&t| (PAD..3).contains(&t)), "{tokens:?}");
    }
}

#[test]
fn seeded_noise_matches_the_reference_backend() {
    let nd = NdarrayBackend::new();
    let r = ReferenceBackend;
    let (p, q, d, l) = padded_batch(&nd);
    let (rp, rq, rd, rl) = padded_batch(&r);
    for method in [DrawMethod::InverseCdf, DrawMethod::ExponentialRace] {
        for seed in 0..50 {
            let ours = nd.rejection_verify_seeded(RejectionArgs { target_probs: &p, draft_probs: Some(&q), draft_tokens: &d, proposal_lens: &l }, method, Comparator::Strict, seed).unwrap();
            let theirs = r.rejection_verify_seeded(RejectionArgs { target_probs: &rp, draft_probs: Some(&rq), draft_tokens: &rd, proposal_lens: &rl }, method, Comparator::Strict, seed).unwrap();
            assert_eq!(nd.download_i64(&ours.tokens).unwrap(), r.download_i64(&theirs.tokens).unwrap());
            assert_eq!(nd.download_i64(&ours.num_accepted).unwrap(), r.download_i64(&theirs.num_accepted).unwrap());
        }
    }
}

#[test]
fn a_defect_is_named_like_the_reference() {
    let nd = NdarrayBackend::new();
    let (p, _, _, l) = padded_batch(&nd);
    // A draft slot beyond the proposal that is not PAD (CONV-5).
    let d = nd.upload_i64(&host_i(vec![2, 2], vec![1, 2, 2, 0])).unwrap();
    let err = nd.greedy_verify(&p, &d, &l).unwrap_err();
    assert_eq!(err.kind(), Some(specdec_backend::ErrorKind::PaddingMismatch));
    assert!(err.to_string().contains("draft_tokens"), "{err}");
    // A dtype mix-up is a device error, not a spec error.
    assert!(matches!(nd.greedy_verify(&d, &d, &l), Err(BackendError::Device { .. })));
}

#[test]
fn draws_agree_with_the_reference_at_the_extremes() {
    let nd = NdarrayBackend::new();
    let r = ReferenceBackend;
    // Finite weights whose total overflows to inf, with v = 0 (a NaN target)
    // and v near 1; tiny weights; exact zeros at both ends.
    let rows = [vec![1e308, 1e308, 0.0], vec![0.0, 1e-320, 0.0, 1e-320], vec![0.0, 0.25, 0.5, 0.25, 0.0]];
    for w in rows {
        for v in [0.0, 0.5, 0.999_999_999_999_999_9] {
            let wt = host_f(vec![1, w.len()], w.clone());
            let vt = host_f(vec![1], vec![v]);
            // Both agree, on the token or on the error (an overflowing total is NonFinite).
            let ours = nd.draw(&nd.upload_f64(&wt).unwrap(), specdec_backend::DrawNoiseArg::InverseCdf(&nd.upload_f64(&vt).unwrap())).map(|t| nd.download_i64(&t).unwrap()).map_err(|e| e.kind());
            let theirs = r.draw(&r.upload_f64(&wt).unwrap(), specdec_backend::DrawNoiseArg::InverseCdf(&r.upload_f64(&vt).unwrap())).map(|t| r.download_i64(&t).unwrap()).map_err(|e| e.kind());
            assert_eq!(ours, theirs, "w = {w:?}, v = {v}");
        }
    }
}
