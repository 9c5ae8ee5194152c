//! Device-generic unit tests: each runs on the CPU and, where libtorch sees one, on CUDA.
//! The conformance suite is the main judge; these pin down the libtorch-specific choices.

use specdec_backend::{Backend, Comparator, DrawMethod, ErrorKind, HostTensor, PAD, RejectionArgs, TrimMode};

use crate::{TchBackend, TchTensor};

fn backends() -> Vec<TchBackend> {
    let mut all = vec![TchBackend::cpu()];
    all.extend(TchBackend::cuda_if_available().ok());
    all
}

fn f(be: &TchBackend, shape: &[usize], data: &[f64]) -> TchTensor {
    be.upload_f64(&HostTensor::new(shape.to_vec(), data.to_vec()).expect("shape")).expect("upload")
}

fn i(be: &TchBackend, shape: &[usize], data: &[i64]) -> TchTensor {
    be.upload_i64(&HostTensor::new(shape.to_vec(), data.to_vec()).expect("shape")).expect("upload")
}

fn ints(be: &TchBackend, t: &TchTensor) -> Vec<i64> {
    be.download_i64(t).expect("download").into_data()
}

#[test]
fn argmax_ties_go_to_the_lowest_id() {
    for be in backends() {
        // Row 0 ties ids 1 and 3 (a device argmax may return either); row 1 is padding.
        let scores = f(&be, &[1, 2, 5], &[0.0, 2.0, f64::NEG_INFINITY, 2.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0]);
        let out = be.greedy_verify(&scores, &i(&be, &[1, 1], &[PAD]), &i(&be, &[1], &[0])).expect("valid");
        assert_eq!(ints(&be, &out.tokens), [1, PAD], "{}", be.name());
    }
}

#[test]
fn nan_padding_rows_are_neither_validated_nor_read() {
    for be in backends() {
        let nan = f64::NAN;
        // len 1: rows 0 and 1 are read, row 2 is padding full of NaN.
        let scores = f(&be, &[1, 3, 3], &[0.0, 5.0, 1.0, 9.0, 0.0, 0.0, nan, nan, nan]);
        let out = be.greedy_verify(&scores, &i(&be, &[1, 2], &[1, PAD]), &i(&be, &[1], &[1])).expect("valid");
        assert_eq!(ints(&be, &out.tokens), [1, 0, PAD]);
        assert_eq!(ints(&be, &out.num_accepted), [1]);

        // Rejection: target row 2 and draft row 1 are padding for len 1.
        let p = f(&be, &[1, 3, 2], &[0.5, 0.5, 0.0, 1.0, nan, nan]);
        let q = f(&be, &[1, 2, 2], &[0.5, 0.5, nan, nan]);
        let args = RejectionArgs { target_probs: &p, draft_probs: Some(&q), draft_tokens: &i(&be, &[1, 2], &[0, PAD]), proposal_lens: &i(&be, &[1], &[1]) };
        let out = be.rejection_verify_seeded(args, DrawMethod::ExponentialRace, Comparator::Strict, 7).expect("valid");
        // p == q at the draft: always accepted; the bonus comes from row 1 (one-hot at 1).
        assert_eq!(ints(&be, &out.tokens), [0, 1, PAD]);
    }
}

#[test]
fn seeded_verify_is_reproducible_and_thread_safe() {
    let run = |be: &TchBackend, seed: u64| {
        let rows = 64;
        let p: Vec<f64> = (0..rows * 2).flat_map(|_| [0.25, 0.25, 0.5]).collect();
        let q: Vec<f64> = (0..rows).flat_map(|_| [0.5, 0.5, 0.0]).collect();
        let (p, q) = (f(be, &[rows, 2, 3], &p), f(be, &[rows, 1, 3], &q));
        let (d, l) = (i(be, &[rows, 1], &vec![0; rows]), i(be, &[rows], &vec![1; rows]));
        let args = RejectionArgs { target_probs: &p, draft_probs: Some(&q), draft_tokens: &d, proposal_lens: &l };
        ints(be, &be.rejection_verify_seeded(args, DrawMethod::InverseCdf, Comparator::Strict, seed).expect("valid").tokens)
    };
    for be in backends() {
        let (a, b) = (run(&be, 11), run(&be, 12));
        assert_eq!(a, run(&be, 11));
        assert_ne!(a, b, "64 rows of fresh noise should differ between seeds");
        // Concurrent callers must not interleave seeding and drawing.
        let threads: Vec<_> = (0..4).map(|t| std::thread::spawn(move || (t, run(&be, 11 + t % 2)))).collect();
        for h in threads {
            let (t, got) = h.join().expect("no panic");
            assert_eq!(got, if t % 2 == 0 { a.clone() } else { b.clone() });
        }
    }
}

#[test]
fn f32_upload_keeps_values_on_their_side_of_the_checks() {
    for be in backends() {
        let t = f(&be, &[5], &[1e-300, -1e-300, 1.0 - 1e-12, 0.25, 1e300]);
        let back = be.download_f64(&t).expect("download").into_data();
        assert!(back[0] > 0.0 && back[1] < 0.0 && back[2] < 1.0 && back[4].is_infinite());
        assert_eq!(back[3], 0.25);
        // A 1e-300 exponential is outside SAMPLE-2's domain (the binary32
        // normals): rejected as the reference rejects it, never flushed into a tie.
        let w = f(&be, &[1, 2], &[0.0, 1.0]);
        let e = f(&be, &[1, 2], &[1e-300, 1.0]);
        let err = be.draw(&w, specdec_backend::DrawNoiseArg::ExponentialRace(&e)).expect_err("outside the domain");
        assert_eq!(err.kind(), Some(ErrorKind::InvalidNoise));
        // Beyond f32's range a weight is not finite here (the reference only rejects an
        // infinite f64 total); either way it is NonFinite, never a silently clipped value.
        let w = f(&be, &[1, 2], &[1e308, 1e308]);
        let u = f(&be, &[1], &[0.5]);
        let err = be.draw(&w, specdec_backend::DrawNoiseArg::InverseCdf(&u)).expect_err("overflows");
        assert_eq!(err.kind(), Some(ErrorKind::NonFinite));
    }
}

#[test]
fn kv_cache_appends_at_each_length_and_fails_without_change() {
    for be in backends() {
        let mut cache = be.kv_new(2, 1, 1, 3).expect("dims");
        let keys = f(&be, &[2, 1, 2, 1], &[1.0, 2.0, 3.0, 4.0]);
        be.kv_append(&mut cache, &keys, &keys, &i(&be, &[2], &[2, 1])).expect("fits");
        be.kv_append(&mut cache, &keys, &keys, &i(&be, &[2], &[1, 2])).expect("fits");
        let err = be.kv_append(&mut cache, &keys, &keys, &i(&be, &[2], &[1, 0])).expect_err("over capacity");
        assert_eq!(err.kind(), Some(ErrorKind::CapacityExceeded));
        assert_eq!(ints(&be, &be.kv_lens(&cache).expect("lens")), [3, 3]);
        let (k, _) = be.kv_contents(&cache).expect("contents");
        assert_eq!(be.download_f64(&k).expect("download").into_data(), [1.0, 2.0, 1.0, 3.0, 3.0, 4.0]);
        let cut = be.kv_trim(&mut cache, &i(&be, &[2], &[5, 1]), TrimMode::Clamped).expect("clamped");
        assert_eq!(ints(&be, &cut), [3, 1]);
        let err = be.kv_trim(&mut cache, &i(&be, &[2], &[1, 0]), TrimMode::Strict).expect_err("beyond length");
        assert_eq!(err.kind(), Some(ErrorKind::TrimBeyondLength));
        assert_eq!(ints(&be, &be.kv_lens(&cache).expect("lens")), [0, 2]);
    }
}

/// A row with min-p off is the same bit for bit whether or not another row
/// of its call uses min-p (a request's output must not depend on its batch).
#[test]
fn a_row_without_min_p_is_untouched_by_a_min_p_row() {
    for be in backends() {
        // Rows of 64 whose f32 probabilities do not sum to exactly 1.
        let logits: Vec<f64> = (0..128).map(|i| ((i * 37) % 17) as f64 * 0.31 - 2.0).collect();
        let z = f(&be, &[2, 64], &logits);
        let (t, k, p, m) = (f(&be, &[2], &[0.7, 0.7]), i(&be, &[2], &[0, 0]), f(&be, &[2], &[1.0, 1.0]), f(&be, &[2], &[0.0, 0.5]));
        let mut with_min_p = specdec_backend::LogitsParams::new(&t, &k, &p);
        with_min_p.min_p = Some(&m);
        let mixed = be.download_f64(&be.process_logits(&z, with_min_p).expect("valid")).expect("download").into_data();
        let plain = be.download_f64(&be.process_logits(&z, specdec_backend::LogitsParams::new(&t, &k, &p)).expect("valid")).expect("download").into_data();
        assert_eq!(mixed[..64], plain[..64]);
        assert_ne!(mixed[64..], plain[64..], "min-p 0.5 cuts the second row");
    }
}
