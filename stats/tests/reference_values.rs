//! STAT-6: p-values from survival functions, deterministic pooling, and the
//! reported fields, checked against values computed independently (scipy, mpmath).
//! Known values computed independently with scipy 1.17.1 (and mpmath 1.4.1 where
//! scipy underflows); the exact call is in a comment next to each value.

use specdec_stats::*;

fn close(actual: f64, expected: f64, rel: f64) {
    let err = ((actual - expected) / expected).abs();
    assert!(err <= rel, "actual {actual:e}, expected {expected:e}, rel err {err:e} > {rel:e}");
}

fn tested(r: &GofResult) -> (f64, u64, PValue) {
    match &r.outcome {
        GofOutcome::Tested { statistic, df, p_value } => (*statistic, *df, *p_value),
        other => panic!("expected a tested outcome, got {other:?}"),
    }
}

#[test]
fn pearson_no_pooling() {
    // scipy.stats.chisquare([18,22,25,35], f_exp=[25,25,25,25])
    //   -> statistic 6.32, pvalue 0.09703806460956206
    let r = chi_squared_gof(&[18, 22, 25, 35], &[0.25; 4]).unwrap();
    let (s, df, p) = tested(&r);
    close(s, 6.32, 1e-12);
    assert_eq!(df, 3);
    close(p.value, 0.09703806460956206, 1e-10);
    assert!(r.pooling.pooled.is_empty());
    assert_eq!(r.pooling.cells_after_pooling, 4);
}

#[test]
fn g_test_no_pooling() {
    // scipy.stats.power_divergence([18,22,25,35], f_exp=[25]*4, lambda_="log-likelihood")
    //   -> statistic 6.102241806056668, pvalue 0.10674052010394318
    let r = g_test_gof(&[18, 22, 25, 35], &[0.25; 4]).unwrap();
    assert_eq!(r.kind, TestKind::GTest);
    let (s, df, p) = tested(&r);
    close(s, 6.102241806056668, 1e-12);
    assert_eq!(df, 3);
    close(p.value, 0.10674052010394318, 1e-10);
}

// n = 100, expected counts [50, 30, 10, 6, 4]: cells 4 (e=4) and 3 (e=6) are pooled
// into one cell with e = 10, leaving [50, 30, 10, 10] and df = 3.
const POOL_P: [f64; 5] = [0.5, 0.3, 0.1, 0.06, 0.04];
const POOL_OBS: [u64; 5] = [45, 33, 12, 4, 6];

#[test]
fn pearson_with_pooling() {
    // scipy.stats.chisquare([45,33,12,10], f_exp=[50,30,10,10])
    //   -> statistic 1.2000000000000002, pvalue 0.753004311656458
    let r = chi_squared_gof(&POOL_OBS, &POOL_P).unwrap();
    assert_eq!(r.pooling.pooled, vec![4, 3], "STAT-6: cells with expected count below 5 are pooled");
    assert_eq!(r.pooling.cells_after_pooling, 4, "STAT-6: pooled cells");
    let (s, df, p) = tested(&r);
    close(s, 1.2, 1e-12);
    assert_eq!(df, 3);
    close(p.value, 0.753004311656458, 1e-10);
}

#[test]
fn g_test_with_pooling() {
    // scipy.stats.power_divergence([45,33,12,10], f_exp=[50,30,10,10], lambda_="log-likelihood")
    //   -> statistic 1.18374282093599, pvalue 0.7569060371885633
    let r = g_test_gof(&POOL_OBS, &POOL_P).unwrap();
    let (s, df, p) = tested(&r);
    close(s, 1.18374282093599, 1e-12);
    assert_eq!(df, 3);
    close(p.value, 0.7569060371885633, 1e-10);
}

#[test]
fn pooling_tie_break_is_by_index() {
    // n = 100, expected [3, 6, 6, 85]: cell 0 (<5) starts the pool; the pool (3) is still
    // short, so the next-smallest cell joins: cells 1 and 2 tie at 6, index 1 wins.
    // scipy.stats.chisquare([7,8,85], f_exp=[9,6,85]) -> 1.1111111111111112, 0.5737534207374329
    // scipy.stats.power_divergence([7,8,85], f_exp=[9,6,85], lambda_="log-likelihood")
    //   -> 1.0845111632958089, 0.5814352974058064
    let p = [0.03, 0.06, 0.06, 0.85];
    let obs = [2, 5, 8, 85];
    let plan = plan_pooling(100, &p).unwrap();
    assert_eq!(plan.pooled, vec![0, 1], "STAT-6: pooling depends only on n and the expected law, ties by index");
    assert_eq!(plan.cells_after_pooling, 3);
    let (s, df, pv) = tested(&chi_squared_gof(&obs, &p).unwrap());
    close(s, 1.1111111111111112, 1e-12);
    assert_eq!(df, 2);
    close(pv.value, 0.5737534207374329, 1e-10);
    let (s, _, pv) = tested(&g_test_gof(&obs, &p).unwrap());
    close(s, 1.0845111632958089, 1e-12);
    close(pv.value, 0.5814352974058064, 1e-10);
}

#[test]
fn structural_zero_is_dropped_not_counted() {
    // scipy.stats.chisquare([10,12], f_exp=[11,11]) -> 0.18181818181818182, 0.6698153575994166
    let r = chi_squared_gof(&[10, 12, 0], &[0.5, 0.5, 0.0]).unwrap();
    assert_eq!(r.pooling.structural_zeros, vec![2]);
    let (s, df, p) = tested(&r);
    close(s, 0.18181818181818182, 1e-12);
    assert_eq!(df, 1);
    close(p.value, 0.6698153575994166, 1e-10);
}

#[test]
fn observed_zero_probability_cell_is_impossible() {
    for r in [chi_squared_gof(&[10, 12, 1, 3], &[0.5, 0.5, 0.0, 0.0]).unwrap(), g_test_gof(&[10, 12, 1, 3], &[0.5, 0.5, 0.0, 0.0]).unwrap()] {
        assert_eq!(r.outcome, GofOutcome::ImpossibleOutcome { cells: vec![2, 3] });
        assert_eq!(r.p_value(), Some(0.0), "STAT-6: an observed outcome of expected probability 0 gives p = 0");
        let mut rep = r.to_report("impossible");
        assert!(rep.impossible_outcome);
        rep.judge(1e-12).unwrap();
        assert_eq!(rep.decision, Decision::Reject);
        assert!(rep.to_string().contains("impossible outcome"), "{rep}");
    }
}

#[test]
fn too_few_cells_after_pooling_is_degenerate() {
    // n = 10, expected [9, 0.5, 0.5]: everything ends up in one pool.
    let r = chi_squared_gof(&[8, 1, 1], &[0.9, 0.05, 0.05]).unwrap();
    assert_eq!(r.outcome, GofOutcome::Degenerate);
    assert_eq!(r.pooling.pooled, vec![1, 2, 0]);
    assert_eq!(r.pooling.cells_after_pooling, 1);
    assert_eq!(r.p_value(), None);
    // A single-cell null is degenerate at any n.
    assert_eq!(g_test_gof(&[1000], &[1.0]).unwrap().outcome, GofOutcome::Degenerate);
    let mut rep = r.to_report("degenerate").with_power(0.05, 0.2).unwrap();
    assert_eq!(rep.power, None);
    rep.judge(0.05).unwrap();
    assert_eq!(rep.decision, Decision::Degenerate);
}

#[test]
fn chi_squared_survival_values() {
    // scipy.stats.chi2.sf(3.5, 2) -> 0.1737739434504451
    close(chi_squared_p_value(3.5, 2).unwrap().value, 0.1737739434504451, 1e-12);
    // scipy.stats.chi2.sf(100, 5) -> 5.285148360943219e-20 (1 - cdf would give 0)
    let p = chi_squared_p_value(100.0, 5).unwrap().value;
    assert!(p > 0.0, "STAT-6: p-values come from the survival function, never 1 - cdf");
    close(p, 5.285148360943219e-20, 1e-12);
    // scipy.stats.chi2.sf(1000, 5) -> 6.0100776879208495e-214
    let p = chi_squared_p_value(1000.0, 5).unwrap();
    close(p.value, 6.0100776879208495e-214, 1e-12);
    assert!(!p.floored);
    assert_eq!(chi_squared_p_value(0.0, 3).unwrap().value, 1.0);
}

#[test]
fn underflowing_p_values_are_tiny_and_positive() {
    // The true value is below the smallest f64 (scipy.stats.chi2.sf(2000, 5) -> 0.0);
    // mpmath.log10(mpmath.gammainc(2.5, 1000, mpmath.inf, regularized=True)) -> -429.91746682429
    let p = chi_squared_p_value(2000.0, 5).unwrap();
    assert!(p.value > 0.0);
    assert_eq!(p.value, f64::MIN_POSITIVE);
    assert!(p.floored);
    assert!(p.log10 >= -429.91746682429, "log10 must be an upper bound: {}", p.log10);
    assert!(p.log10 - -429.91746682429 < 1e-3, "{}", p.log10);

    // df = 1 (shape <= 1 branch of the bound). scipy.stats.chi2.sf(1600, 1) -> 0.0;
    // mpmath.log10(mpmath.gammainc(0.5, 800, mpmath.inf, regularized=True)) -> -349.135976463682
    let p = chi_squared_p_value(1600.0, 1).unwrap();
    assert_eq!(p.value, f64::MIN_POSITIVE);
    assert!(p.log10 >= -349.135976463682 && p.log10 - -349.135976463682 < 1e-3, "{}", p.log10);

    // Through a whole test: a wildly wrong histogram still gets a positive p-value.
    let r = chi_squared_gof(&[100_000, 0, 0, 0, 0, 0], &[1.0 / 6.0; 6]).unwrap();
    let (_, _, p) = tested(&r);
    assert!(p.value > 0.0 && p.floored);
    let rep = r.to_report("wild");
    assert!(rep.to_string().contains("log10 p<="), "{rep}");
}

#[test]
fn binomial_tests_match_scipy() {
    // scipy.stats.binomtest(k, n, p, alternative=a).pvalue for a in
    // ("two-sided", "less", "greater")
    let cases: [(u64, u64, f64, [f64; 3]); 6] = [
        (7, 20, 0.5, [0.26317596435546875, 0.13158798217773438, 0.9423408508300781]),
        (3, 50, 0.2, [0.011917135597017944, 0.005656361012155322, 0.9987145850467567]),
        (16, 50, 0.2, [0.04929943784225706, 0.9855583426827423, 0.030803422782047694]),
        (682, 925, 0.75, [0.3824915595748517, 0.19600926705388308, 0.8240891223524226]),
        (1, 1000, 0.01, [0.0011310695918519608, 0.0004792444535789191, 0.9999568287525893]),
        // statrs's capped continued fraction: ~1e-9 relative error at n = 1e6.
        (299_500, 1_000_000, 0.3, [0.27571383835807006, 0.13785089222411243, 0.8626293017097364]),
    ];
    for (k, n, p0, expected) in cases {
        let tol = if n >= 1_000_000 { 1e-8 } else { 1e-10 };
        for (alt, want) in [Alternative::TwoSided, Alternative::Less, Alternative::Greater].into_iter().zip(expected) {
            let r = binomial_test(k, n, p0, alt).unwrap();
            assert!(!r.impossible_outcome);
            close(r.p_value.value, want, tol);
        }
    }
}

#[test]
fn binomial_extreme_tails_stay_positive() {
    // scipy.stats.binomtest(0, 10000, 0.5).pvalue -> 0.0;
    // exact: mpmath.log10(2 * mpmath.mpf(0.5)**10000) -> -3009.99892664415
    let r = binomial_test(0, 10_000, 0.5, Alternative::TwoSided).unwrap();
    assert_eq!(r.p_value.value, f64::MIN_POSITIVE);
    assert!(r.p_value.floored);
    assert!((r.p_value.log10 - -3009.99892664415).abs() < 1e-6, "{}", r.p_value.log10);
    // scipy.stats.binomtest(0, 3000, 0.3, alternative="less").pvalue -> 0.0;
    // exact: 3000 * mpmath.log10(mpmath.mpf("0.7")) -> -464.70587995723
    let r = binomial_test(0, 3000, 0.3, Alternative::Less).unwrap();
    assert!(r.p_value.value > 0.0);
    assert!((r.p_value.log10 - -464.70587995723).abs() < 1e-6, "{}", r.p_value.log10);
}

#[test]
fn binomial_deterministic_nulls() {
    let r = binomial_test(3, 10, 0.0, Alternative::TwoSided).unwrap();
    assert!(r.impossible_outcome);
    assert_eq!(r.p_value.value, 0.0);
    let r = binomial_test(9, 10, 1.0, Alternative::Greater).unwrap();
    assert!(r.impossible_outcome);
    let r = binomial_test(10, 10, 1.0, Alternative::TwoSided).unwrap();
    assert!(!r.impossible_outcome);
    assert_eq!(r.p_value.value, 1.0);
    let r = binomial_test(0, 10, 0.0, Alternative::Less).unwrap();
    assert_eq!(r.p_value.value, 1.0);
}

#[test]
fn proportion_intervals_match_scipy() {
    // scipy.stats.binomtest(k, n).proportion_ci(confidence_level=cl, method=m) with
    // m = "wilson" and m = "exact" (Clopper-Pearson): (k, n, cl, wilson, exact)
    type Case = (u64, u64, f64, [f64; 2], [f64; 2]);
    let cases: [Case; 5] = [
        (7, 20, 0.95, [0.1811918241010821, 0.5671457233147637], [0.1539092047845412, 0.5921885345328283]),
        (0, 20, 0.95, [0.0, 0.16112515805281935], [0.0, 0.16843347098308548]),
        (20, 20, 0.95, [0.8388748419471808, 1.0], [0.8315665290169145, 1.0]),
        (1, 1000, 0.99, [0.00011741635361832165, 0.008460566219981695], [5.0125292607668415e-06, 0.007406286938353162]),
        (500, 1000, 0.9, [0.4740276914784201, 0.5259723085215798], [0.473517731235899, 0.5264822687641009]),
    ];
    let near = |a: f64, b: f64| {
        if b == 0.0 { assert!(a.abs() < 1e-15, "{a} vs 0") } else { close(a, b, 1e-9) }
    };
    for (k, n, cl, w, e) in cases {
        let alpha = 1.0 - cl;
        let wi = wilson_interval(k, n, alpha).unwrap();
        near(wi.lower, w[0]);
        near(wi.upper, w[1]);
        let cp = clopper_pearson_interval(k, n, alpha).unwrap();
        near(cp.lower, e[0]);
        near(cp.upper, e[1]);
    }
}

#[test]
fn clopper_pearson_tiny_alpha() {
    // Where statrs's Beta::inverse_cdf is unreliable (q < 1e-15) the bisection path is used.
    // scipy.stats.beta.ppf(5e-21, 3, 48) -> 6.3421719136404945e-09
    // scipy.stats.beta.isf(5e-21, 4, 47) -> 0.6933564522951068
    let cp = clopper_pearson_interval(3, 50, 1e-20).unwrap();
    close(cp.lower, 6.3421719136404945e-09, 1e-12);
    close(cp.upper, 0.6933564522951068, 1e-12);
    // statrs path: scipy.stats.beta.ppf(5e-11, 3, 48) -> 1.3665988384297484e-05,
    // scipy.stats.beta.isf(5e-11, 4, 47) -> 0.48861555955476577
    let cp = clopper_pearson_interval(3, 50, 1e-10).unwrap();
    close(cp.lower, 1.3665988384297484e-05, 1e-12);
    close(cp.upper, 0.48861555955476577, 1e-12);
    // statrs's inverse_cdf never returns here. scipy.stats.beta.ppf(5e-141, 1000, 1)
    //   -> 0.7239339933202859
    let cp = clopper_pearson_interval(1000, 1000, 1e-140).unwrap();
    close(cp.lower, 0.7239339933202859, 1e-12);
    assert_eq!(cp.upper, 1.0);
    // Below ~1e-154 statrs's inverse_cdf panics; here it must not.
    let cp = clopper_pearson_interval(1, 1, 1e-300).unwrap();
    close(cp.lower, 5e-301, 1e-12); // Beta(1, 1) is uniform: the quantile is q itself.
    let w = wilson_interval(1, 1, 1e-300).unwrap();
    assert!(w.lower > 0.0 && w.lower < 1e-3 && w.upper == 1.0, "{w:?}");
}

#[test]
fn noncentral_chi_squared_matches_scipy() {
    // scipy.stats.ncx2.cdf(x, df, nc) and scipy.stats.ncx2.sf(x, df, nc): (x, df, nc, cdf, sf)
    let cases = [
        (5.0, 3.0, 2.0, 0.5934051800831555, 0.4065948199168444),
        (20.0, 5.0, 12.8, 0.6521145962986875, 0.3478854037013125),
        (0.5, 1.0, 0.1, 0.49898181968631766, 0.5010181803136823),
        (100.0, 10.0, 50.0, 0.9917074559129733, 0.008292544087026642),
        (1000.0, 50.0, 800.0, 0.9941272635741245, 0.005872736425876262),
    ];
    for (x, df, nc, cdf, sf) in cases {
        close(noncentral_chi_squared_cdf(x, df, nc).unwrap(), cdf, 1e-9);
        close(noncentral_chi_squared_sf(x, df, nc).unwrap(), sf, 1e-9);
    }
    // scipy.stats.ncx2.sf(200, 4, 10) -> 2.2611866690046293e-27 (sf summed directly, not 1 - cdf)
    close(noncentral_chi_squared_sf(200.0, 4.0, 10.0).unwrap(), 2.2611866690046293e-27, 1e-8);
    // lambda = 0 is central: scipy.stats.chi2.sf(11.070497693516351, 5) -> 0.05000000000000007
    close(noncentral_chi_squared_sf(11.070497693516351, 5.0, 0.0).unwrap(), 0.05, 1e-12);
}

#[test]
fn power_and_sample_size_match_scipy() {
    // lam* = brentq(lambda l: ncx2.sf(chi2.isf(a, df), df, l) - (1 - b), 1e-9, 1e5)
    // min n = ceil(lam* / (4 delta^2)); (m, delta, alpha, beta, lam*, n)
    let cases = [
        (6, 0.1, 0.05, 0.2, 12.827606572305411, 321),
        (2, 0.05, 0.05, 0.2, 7.848860509326204, 785),
        (10, 0.02, 0.001, 0.1, 34.075191279226914, 21297),
        (1000, 0.01, 0.01, 0.05, 192.11766431345293, 480295),
        (6, 0.1, 0.05 / 20.0, 0.2, 21.896062832743816, 548),
    ];
    for (m, delta, alpha, beta, lam, n) in cases {
        close(noncentrality_for_power(m as u64 - 1, alpha, beta).unwrap(), lam, 1e-9);
        assert_eq!(min_samples(m, delta, alpha, beta).unwrap(), n, "m={m} delta={delta}");
    }
    // sqrt(lam* / (4 n)): (m, n, alpha, beta, delta)
    for (m, n, alpha, beta, delta) in [(6, 321, 0.05, 0.2, 0.09995172733747851), (2, 10000, 0.01, 0.2, 0.017087252667244923), (50, 100000, 1e-4, 0.05, 0.013885067525558233)] {
        close(detectable_delta(m, n, alpha, beta).unwrap(), delta, 1e-9);
    }
    // scipy.stats.ncx2.sf(chi2.isf(a, m-1), m-1, 4*n*d*d): (m, n, delta, alpha, power)
    for (m, n, d, a, power) in [(6, 321, 0.1, 0.05, 0.8004433355626149), (6, 100, 0.1, 0.05, 0.29175638956773375), (3, 1000, 0.05, 0.01, 0.6147822057650297)] {
        close(gof_power(m, n, d, a).unwrap(), power, 1e-9);
    }
}

#[test]
fn holm_step_down() {
    // Hand-derived. m = 4, alpha = 0.05: sorted 0.005 <= 0.0125 (reject),
    // 0.01 <= 0.05/3 (reject), 0.03 > 0.025 (stop), 0.04 not rejected although <= 0.05.
    let d = holm(&[0.01, 0.04, 0.03, 0.005], 0.05).unwrap();
    let rejected: Vec<bool> = d.iter().map(|x| x.rejected).collect();
    assert_eq!(rejected, [true, false, false, true]);
    let ranks: Vec<usize> = d.iter().map(|x| x.rank).collect();
    assert_eq!(ranks, [1, 3, 2, 0]);
    let alphas: Vec<f64> = d.iter().map(|x| x.alpha).collect();
    assert_eq!(alphas, [0.05 / 3.0, 0.05, 0.025, 0.0125]);
    // First fails (0.02 > 0.05/3), so nothing is rejected, not even 0.04 <= 0.05.
    assert!(holm(&[0.02, 0.021, 0.04], 0.05).unwrap().iter().all(|x| !x.rejected));
    // Ties are ranked by input index; equality with the threshold rejects.
    let d = holm(&[0.025, 0.025], 0.05).unwrap();
    assert_eq!((d[0].rank, d[1].rank), (0, 1));
    assert!(d.iter().all(|x| x.rejected));
}

#[test]
fn total_variation_hand_computed() {
    // counts/n = [0.5, 0.3, 0.2] vs [0.4, 0.4, 0.2]: ½(0.1 + 0.1 + 0) = 0.1
    assert!((total_variation(&[5, 3, 2], &[0.4, 0.4, 0.2]).unwrap() - 0.1).abs() < 1e-15);
    assert_eq!(total_variation(&[0, 7], &[1.0, 0.0]).unwrap(), 1.0);
    assert_eq!(total_variation(&[1, 1], &[0.5, 0.5]).unwrap(), 0.0);
}
