//! Property tests: invariants that must hold for all valid inputs, and no panics on
//! arbitrary ones.

use proptest::prelude::*;
use proptest::test_runner::RngSeed;
use specdec_stats::*;

fn normalised(weights: Vec<f64>) -> Vec<f64> {
    let s: f64 = weights.iter().sum();
    weights.iter().map(|w| w / s).collect()
}

/// Weights in [0, 1] with some exact zeros, at least one positive.
fn null_distribution(len: std::ops::Range<usize>) -> impl Strategy<Value = Vec<f64>> {
    prop::collection::vec(prop_oneof![1 => Just(0.0), 4 => 0.001f64..1.0], len).prop_filter("some mass", |w| w.iter().any(|&x| x > 0.0)).prop_map(normalised)
}

proptest! {
    // Fixed seeds: the suite must give the same verdict on every run.
    #![proptest_config(ProptestConfig { cases: 256, rng_seed: RngSeed::Fixed(0x5eed_0001), ..ProptestConfig::default() })]

    #[test]
    fn gof_results_are_well_formed(
        (p, obs) in null_distribution(1..12).prop_flat_map(|p| {
            let len = p.len();
            (Just(p), prop::collection::vec(0u64..200, len))
        })
    ) {
        prop_assume!(obs.iter().any(|&c| c > 0));
        for r in [chi_squared_gof(&obs, &p).unwrap(), g_test_gof(&obs, &p).unwrap()] {
            let pool = &r.pooling;
            let impossible = p.iter().zip(&obs).any(|(&q, &o)| q == 0.0 && o > 0);
            match &r.outcome {
                GofOutcome::Tested { statistic, df, p_value } => {
                    prop_assert!(!impossible);
                    prop_assert!(*statistic >= 0.0);
                    prop_assert_eq!(*df as usize, pool.cells_after_pooling - 1);
                    prop_assert!(p_value.value > 0.0 && p_value.value <= 1.0);
                }
                GofOutcome::ImpossibleOutcome { cells } => {
                    prop_assert!(impossible);
                    prop_assert!(cells.iter().all(|&i| p[i] == 0.0 && obs[i] > 0));
                }
                GofOutcome::Degenerate => prop_assert!(!impossible && pool.cells_after_pooling < 2),
            }
            // The pooling rule's postconditions.
            let n = r.n as f64;
            let pooled_e: f64 = pool.pooled.iter().map(|&i| n * p[i]).sum();
            let support = p.iter().filter(|&&q| q > 0.0).count();
            prop_assert!(pool.pooled.len() != 1 || support == 1);
            if pool.cells_after_pooling >= 2 {
                prop_assert!(pool.pooled.is_empty() || pooled_e >= MIN_EXPECTED_COUNT - 1e-9);
                for (i, &q) in p.iter().enumerate() {
                    if q > 0.0 && !pool.pooled.contains(&i) {
                        prop_assert!(n * q >= MIN_EXPECTED_COUNT - 1e-9);
                    }
                }
            }
            let tv = total_variation(&obs, &p).unwrap();
            prop_assert!((0.0..=1.0).contains(&tv));
        }
    }

    #[test]
    fn no_panics_on_arbitrary_floats(
        p in prop::collection::vec(any::<f64>(), 0..6),
        obs in prop::collection::vec(any::<u64>(), 0..6),
        x in any::<f64>(), y in any::<f64>(), z in any::<f64>(),
        k in any::<u64>(), n in any::<u64>(), m in 0usize..5,
    ) {
        let _ = chi_squared_gof(&obs, &p);
        let _ = g_test_gof(&obs, &p);
        let _ = total_variation(&obs, &p);
        let _ = plan_pooling(n, &p);
        let _ = holm(&p, x);
        let _ = chi_squared_p_value(x, k % 50);
        let _ = chi_squared_p_value(x.abs(), k);
        let _ = noncentrality_for_power(k, x, y);
        let _ = min_samples(m.max(k as usize % 100), x, y, z);
        let _ = wilson_interval(k % 1000, n % 1000, x);
        let _ = clopper_pearson_interval(k % 1000, n % 1000, x);
        let _ = binomial_test(k % 1000, n % 1000, x, Alternative::TwoSided);
        let _ = binomial_test(k, n, x, Alternative::Greater);
        let big_n = n % 20_000_000_000;
        let _ = binomial_test(k % (big_n + 1), big_n, x.abs() % 1.0, Alternative::TwoSided);
        let _ = clopper_pearson_interval(k % (big_n + 1), big_n, x);
        let _ = noncentral_chi_squared_cdf(x, y % 100.0, z % 100.0);
        let _ = noncentral_chi_squared_sf(x, y % 100.0, z % 100.0);
        let _ = noncentral_chi_squared_sf(x, y, z);
        let _ = noncentral_chi_squared_cdf(x, y, z.abs() % 1e6);
        let _ = gof_power(m, n % 100_000, x, y);
        let _ = detectable_delta(m, n % 100_000, x, y);
    }

    #[test]
    fn holm_rejections_are_a_prefix_of_the_sorted_p_values(
        p in prop::collection::vec(0.0f64..=1.0, 1..20), alpha in 0.001f64..0.5,
    ) {
        let d = holm(&p, alpha).unwrap();
        for i in 0..p.len() {
            prop_assert_eq!(d[i].alpha, alpha / (p.len() - d[i].rank) as f64);
            for j in 0..p.len() {
                if d[j].rejected && p[i] <= p[j] {
                    prop_assert!(d[i].rejected, "p[{}]={} kept while p[{}]={} rejected", i, p[i], j, p[j]);
                }
            }
            // Holm rejects at least what Bonferroni rejects.
            if p[i] <= alpha / p.len() as f64 {
                prop_assert!(d[i].rejected);
            }
        }
    }

    #[test]
    fn binomial_p_values_are_consistent(n in 1u64..400, frac in 0.0f64..=1.0, p0 in 0.01f64..0.99) {
        let k = (frac * n as f64) as u64;
        let two = binomial_test(k, n, p0, Alternative::TwoSided).unwrap().p_value.value;
        let less = binomial_test(k, n, p0, Alternative::Less).unwrap().p_value.value;
        let greater = binomial_test(k, n, p0, Alternative::Greater).unwrap().p_value.value;
        for v in [two, less, greater] {
            prop_assert!(v > 0.0 && v <= 1.0);
        }
        // The two-sided set contains the whole tail on k's side.
        prop_assert!(two >= less.min(greater) * (1.0 - 1e-9));
        prop_assert!(less + greater >= 1.0 - 1e-9); // they share P(X = k)
        let w = wilson_interval(k, n, 0.05).unwrap();
        let cp = clopper_pearson_interval(k, n, 0.05).unwrap();
        let phat = k as f64 / n as f64;
        for iv in [w, cp] {
            prop_assert!(0.0 <= iv.lower && iv.lower <= phat + 1e-12);
            prop_assert!(phat - 1e-12 <= iv.upper && iv.upper <= 1.0);
        }
    }

    #[test]
    fn noncentral_cdf_and_sf_sum_to_one(x in 0.0f64..200.0, df in 0.5f64..60.0, lambda in 0.0f64..300.0) {
        let c = noncentral_chi_squared_cdf(x, df, lambda).unwrap();
        let s = noncentral_chi_squared_sf(x, df, lambda).unwrap();
        prop_assert!((c + s - 1.0).abs() < 1e-12, "cdf {} + sf {}", c, s);
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, rng_seed: RngSeed::Fixed(0x5eed_0002), ..ProptestConfig::default() })]

    #[test]
    fn min_samples_and_detectable_delta_are_inverse(
        m in 2usize..40, delta in 0.01f64..0.5, alpha in 0.001f64..0.1, beta in 0.05f64..0.5,
    ) {
        let n = min_samples(m, delta, alpha, beta).unwrap();
        prop_assert!(detectable_delta(m, n, alpha, beta).unwrap() <= delta);
        prop_assert!(gof_power(m, n, delta, alpha).unwrap() >= 1.0 - beta);
        if n > 1 {
            prop_assert!(detectable_delta(m, n - 1, alpha, beta).unwrap() > delta);
            prop_assert!(gof_power(m, n - 1, delta, alpha).unwrap() < 1.0 - beta);
        }
    }
}
