//! Defects found by review, each pinned against the reference.

use specdec_backend::{Backend, BackendError, DrawNoiseArg, ErrorKind, HostTensor, ReferenceBackend};
use specdec_ndarray::NdarrayBackend;

/// SAMPLE-2: with weights so large and exponentials so small that `w / e`
/// overflows to `+inf` for every id, the race must still pick the largest
/// ratio (id 1: its exponential is 1e5 times smaller), as the reference
/// does, not tie the infinities and hand the draw to id 0.
#[test]
fn exponential_race_survives_overflow() {
    let w = HostTensor::new(vec![1, 2], vec![0.5e308, 0.5e308]).unwrap();
    let e = HostTensor::new(vec![1, 2], vec![1e-30, 1e-35]).unwrap();
    let reference =
        ReferenceBackend.download_i64(&ReferenceBackend.draw(&ReferenceBackend.upload_f64(&w).unwrap(), DrawNoiseArg::ExponentialRace(&ReferenceBackend.upload_f64(&e).unwrap())).unwrap()).unwrap();
    assert_eq!(reference.data(), &[1]);
    let b = NdarrayBackend::new();
    let got = b.download_i64(&b.draw(&b.upload_f64(&w).unwrap(), DrawNoiseArg::ExponentialRace(&b.upload_f64(&e).unwrap())).unwrap()).unwrap();
    assert_eq!(got.data(), reference.data());
}

/// ERR-1, KV-1: a cache shape whose size overflows is a typed error naming
/// `capacity`, as in the reference, never a panic.
#[test]
fn kv_new_overflow_is_a_typed_error() {
    for (b, h, d, c) in [(usize::MAX, 2, 1, 1), (1, 1, 1, usize::MAX), (1 << 20, 1 << 20, 1 << 20, 1 << 20)] {
        let want = ReferenceBackend.kv_new(b, h, d, c).map(|_| ()).unwrap_err();
        match NdarrayBackend::new().kv_new(b, h, d, c).map(|_| ()) {
            Err(BackendError::Invalid(e)) => {
                assert_eq!(e.kind(), ErrorKind::InvalidParameter);
                assert_eq!(e.arg(), Some("capacity"), "{e}");
                assert_eq!(BackendError::Invalid(e).to_string(), want.to_string());
            }
            other => panic!("({b}, {h}, {d}, {c}): {other:?}"),
        }
    }
}
