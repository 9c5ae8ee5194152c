//! Exact losslessness proofs for the reference (REJECT-7, STAT-7): no
//! sampling; the reference's verify step is integrated over its noise by
//! bisection (`specdec_conformance::exact`) and compared with the target.

use proptest::prelude::*;
use specdec_backend::{Comparator, ReferenceBackend};
use specdec_conformance::compare::Verdict;
use specdec_conformance::exact::{accepted_count_law, check_scenario, first_token_law, fixed_row_instances, generation_law, max_abs_diff, step_law};
use specdec_conformance::model::shipped_models;
use specdec_conformance::mutants::{Defect, Mutant};
use specdec_conformance::stat;
use specdec_reference::theory;

const TOL: f64 = 1e-12;

/// A probability row over `v` ids with exact zeros.
fn row(v: usize) -> impl Strategy<Value = Vec<f64>> {
    prop::collection::vec(prop_oneof![1 => Just(0.0), 3 => 0.05f64..1.0], v).prop_map(|mut w| {
        if w.iter().all(|&x| x == 0.0) {
            w[0] = 1.0;
        }
        let s: f64 = w.iter().sum();
        w.iter().map(|x| x / s).collect()
    })
}

/// How a draft row relates to its target row.
#[derive(Debug, Clone, Copy)]
enum Relation {
    Independent,
    Equal,
    Disjoint,
    OneHot(usize),
    /// q is zero on part of p's support.
    Partial,
}

fn relate(p: &[f64], q: &[f64], rel: Relation) -> Vec<f64> {
    let v = p.len();
    let norm = |w: Vec<f64>| {
        let s: f64 = w.iter().sum();
        if s == 0.0 { q.to_vec() } else { w.into_iter().map(|x| x / s).collect() }
    };
    match rel {
        Relation::Independent => q.to_vec(),
        Relation::Equal => p.to_vec(),
        Relation::Disjoint => norm(p.iter().map(|&x| if x > 0.0 { 0.0 } else { 1.0 }).collect()),
        Relation::OneHot(i) => (0..v).map(|j| if j == i % v { 1.0 } else { 0.0 }).collect(),
        Relation::Partial => norm(q.iter().enumerate().map(|(i, &x)| if i % 2 == 0 { x } else { 0.0 }).collect()),
    }
}

fn relation() -> impl Strategy<Value = Relation> {
    prop_oneof![Just(Relation::Independent), Just(Relation::Equal), Just(Relation::Disjoint), (0usize..8).prop_map(Relation::OneHot), Just(Relation::Partial),]
}

/// `(p rows [k+1], q rows [k])` with one relation per draft position.
fn step() -> impl Strategy<Value = (Vec<Vec<f64>>, Vec<Vec<f64>>)> {
    (2usize..5, 1usize..4).prop_flat_map(|(v, k)| {
        (prop::collection::vec(row(v), k + 1), prop::collection::vec(row(v), k), prop::collection::vec(relation(), k)).prop_map(|(p, q, rel)| {
            let q = q.iter().zip(&rel).enumerate().map(|(j, (q, r))| relate(&p[j], q, *r)).collect();
            (p, q)
        })
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    /// REJECT-7: the first emitted token has exactly the target law p[0], and
    /// the accepted count has exactly the law of THEORY-5.
    #[test]
    fn one_step_is_exactly_lossless((p, q) in step()) {
        let k = q.len();
        let law = step_law(&ReferenceBackend, &fixed_row_instances(&p, Some(&q), &[], k), Comparator::Strict).unwrap();
        let total: f64 = law.values().sum();
        prop_assert!((total - 1.0).abs() < TOL, "the law sums to {}", total);
        for (got, want) in first_token_law(&law, p[0].len()).iter().zip(&p[0]) {
            prop_assert!((got - want).abs() < TOL, "first token {:?} vs target {:?}", first_token_law(&law, p[0].len()), p[0]);
        }
        let betas: Vec<f64> = p.iter().zip(&q).map(|(p, q)| theory::acceptance(p, q).unwrap()).collect();
        let want = theory::accepted_length_law(&betas).unwrap();
        for (got, want) in accepted_count_law(&law, k).iter().zip(&want) {
            prop_assert!((got - want).abs() < TOL, "accepted-count law {:?} vs {:?}", accepted_count_law(&law, k), want);
        }
    }

    /// RESID-2 / REJECT-7: drafts without probabilities (q one-hot at a fixed
    /// draft) are lossless too, and accept draft j with probability p_j(x_j).
    #[test]
    fn drafts_without_probabilities_are_exactly_lossless((p, _q) in step(), seed in 0usize..100) {
        let k = p.len() - 1;
        let v = p[0].len();
        let drafts: Vec<i64> = (0..k).map(|j| ((seed + 3 * j) % v) as i64).collect();
        let law = step_law(&ReferenceBackend, &fixed_row_instances(&p, None, &drafts, k), Comparator::Strict).unwrap();
        for (got, want) in first_token_law(&law, v).iter().zip(&p[0]) {
            prop_assert!((got - want).abs() < TOL);
        }
        let betas: Vec<f64> = drafts.iter().zip(&p).map(|(&x, p)| p[x as usize]).collect();
        for (got, want) in accepted_count_law(&law, k).iter().zip(&theory::accepted_length_law(&betas).unwrap()) {
            prop_assert!((got - want).abs() < TOL);
        }
    }
}

/// REJECT-7 over whole sequences: with prefix-dependent rows (the
/// multi-draft chain), speculative decoding generates the first 3 tokens
/// with exactly the target's law, for k = 1, 2, 3 and every shipped model.
#[test]
fn generation_is_exactly_lossless_on_shipped_models() {
    for model in shipped_models() {
        let target = model.target_law(3);
        for k in 1..=3 {
            let law = generation_law(&ReferenceBackend, &model, k, 3, Comparator::Strict).unwrap();
            let diff = max_abs_diff(&law, &target);
            assert!(diff < TOL, "{} with k = {k}: max |law - target| = {diff:e}", model.name);
        }
    }
}

/// REJECT-3/REJECT-4 for every proposal length: the exact joint law of
/// (accepted count, next token) equals the target's, so the correction comes
/// from the rejected row and the bonus from row `len`, never row `k`.
#[test]
fn every_proposal_length_is_exactly_lossless() {
    for scenario in stat::scenarios() {
        let verdict = check_scenario(&ReferenceBackend, &scenario);
        assert!(matches!(verdict, Verdict::Pass { max_abs_err, .. } if max_abs_err < TOL), "{}: {verdict:?}", scenario.name);
    }
}

/// STAT-7 has teeth: the exact law of each mutant differs from the target.
#[test]
fn exact_integration_rejects_the_mutants() {
    let overlap = stat::scenarios().into_iter().find(|s| s.name == "overlap").unwrap();
    for defect in [Defect::LossyThreshold, Defect::LossyTypical, Defect::ResidualIsTarget, Defect::ResidualNotRenormalised, Defect::BonusFromWrongRow] {
        match check_scenario(&Mutant(defect), &overlap) {
            Verdict::Fail(msg) => println!("{}: {msg}", defect.name()),
            other => panic!("{} was not detected: {other:?}", defect.name()),
        }
    }
}
