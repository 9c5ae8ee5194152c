//! SAMPLE-3 margins and CONV-10 explicit randomness.

use specdec_reference::sampling::{sample_exponential_race, sample_inverse_cdf};
use specdec_reference::{Comparator, DrawNoise, RejectionInputs, Tensor, accept_test, greedy_verify, rejection_verify};

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() < 1e-12
}

/// SAMPLE-3: each decision's margin is its distance to the nearest boundary.
#[test]
fn decision_margins() {
    // Accept test: |p(x) - u q(x)| = |0.6 - 0.5 * 0.3|.
    assert!(close(accept_test(Comparator::Strict, 0.5, 0.6, 0.3).1, 0.45));
    // Inverse CDF: v S = 0.35 lies in [0.2, 0.7) of id 2 (weights [0.2, 0, 0.5, 0.3]); nearest boundary 0.2.
    let d = sample_inverse_cdf(&[0.2, 0.0, 0.5, 0.3], 0.35).unwrap();
    assert_eq!(d.token, 2);
    assert!(close(d.margin, 0.15));
    // Exponential race: scores [0.5, 0.625, 0.5]: (0.625 - 0.5) / 0.625.
    let d = sample_exponential_race(&[0.5, 0.25, 0.25], &[1.0, 0.4, 0.5]).unwrap();
    assert_eq!(d.token, 1);
    assert!(close(d.margin, 0.2));
    // A single candidate cannot flip.
    assert_eq!(sample_exponential_race(&[0.0, 1.0], &[1.0, 1.0]).unwrap().margin, f64::INFINITY);
    // Greedy: the top-two gap of every row read, relative to max(1, |top|): rows [0, 3] and [4, 0].
    let scores = Tensor::from_nested(vec![vec![vec![0.0, 3.0], vec![4.0, 0.0]]]).unwrap();
    let out = greedy_verify(&scores, &Tensor::new(vec![1, 1], vec![1]).unwrap(), &Tensor::from_vec(vec![1])).unwrap();
    assert!(close(out.margins[0], 1.0), "min(3/3, 4/4) = 1, got {}", out.margins[0]);
}

/// SAMPLE-3: a verify output reports the smallest margin of the decisions it made.
#[test]
fn verify_margin_is_the_smallest_decision_margin() {
    let p = Tensor::from_nested(vec![vec![vec![0.5, 0.5], vec![0.9, 0.1]]]).unwrap();
    let q = Tensor::from_nested(vec![vec![vec![0.5, 0.5]]]).unwrap();
    let d = Tensor::new(vec![1, 1], vec![0]).unwrap();
    let l = Tensor::from_vec(vec![1]);
    let u = Tensor::new(vec![1, 1], vec![0.98]).unwrap(); // |0.5 - 0.98 * 0.5| = 0.01
    let draw = DrawNoise::InverseCdf(Tensor::new(vec![1, 2], vec![0.5, 0.5]).unwrap()); // bonus margin 0.4
    let inputs = RejectionInputs { target_probs: &p, draft_probs: Some(&q), draft_tokens: &d, proposal_lens: &l, accept_uniforms: &u, draw: &draw };
    let out = rejection_verify(&inputs, Comparator::Strict).unwrap();
    assert_eq!(out.num_accepted, [1]);
    assert!(close(out.margins[0], 0.01), "{}", out.margins[0]);
}

/// CONV-10: kernels own no randomness: the same noise gives the same
/// answer, and changing only the noise changes it.
#[test]
fn randomness_is_an_explicit_input() {
    let p = Tensor::from_nested(vec![vec![vec![0.5, 0.5], vec![0.5, 0.5]]]).unwrap();
    let q = Tensor::from_nested(vec![vec![vec![0.9, 0.1]]]).unwrap();
    let d = Tensor::new(vec![1, 1], vec![0]).unwrap();
    let l = Tensor::from_vec(vec![1]);
    let run = |u: f64, v: f64| {
        let ut = Tensor::new(vec![1, 1], vec![u]).unwrap();
        let draw = DrawNoise::InverseCdf(Tensor::new(vec![1, 2], vec![v, v]).unwrap());
        let inputs = RejectionInputs { target_probs: &p, draft_probs: Some(&q), draft_tokens: &d, proposal_lens: &l, accept_uniforms: &ut, draw: &draw };
        rejection_verify(&inputs, Comparator::Strict).unwrap().tokens
    };
    assert_eq!(run(0.2, 0.3), run(0.2, 0.3), "CONV-10: the same noise gives the same answer");
    assert_ne!(run(0.2, 0.3), run(0.9, 0.3), "CONV-10: the caller's noise decides: 0.2 * 0.9 < 0.5 accepts, 0.9 * 0.9 >= 0.5 rejects");
}
