//! Every public function rejects bad input with a typed error naming the argument.

use specdec_stats::*;

fn mismatch(left_len: usize, right_len: usize) -> StatsError {
    StatsError::LengthMismatch { left: "observed", left_len, right: "expected", right_len }
}

#[test]
fn gof_and_tv_input_errors() {
    type F = fn(&[u64], &[f64]) -> Result<(), StatsError>;
    let fs: [F; 3] = [|o, e| chi_squared_gof(o, e).map(drop), |o, e| g_test_gof(o, e).map(drop), |o, e| total_variation(o, e).map(drop)];
    for f in fs {
        assert_eq!(f(&[], &[1.0]), Err(StatsError::Empty { arg: "observed" }));
        assert_eq!(f(&[1], &[]), Err(StatsError::Empty { arg: "expected" }));
        assert_eq!(f(&[1, 2, 3], &[0.5, 0.5]), Err(mismatch(3, 2)));
        assert_eq!(f(&[0, 0], &[0.5, 0.5]), Err(StatsError::ZeroSamples { arg: "observed" }));
        assert_eq!(f(&[u64::MAX, 1], &[0.5, 0.5]), Err(StatsError::CountOverflow { arg: "observed" }));
        assert!(matches!(f(&[1, 1], &[0.5, f64::NAN]), Err(StatsError::NotFinite { arg: "expected", index: Some(1), .. })));
        assert!(matches!(f(&[1, 1], &[f64::INFINITY, 0.5]), Err(StatsError::NotFinite { arg: "expected", index: Some(0), .. })));
        assert_eq!(f(&[1, 1, 1], &[0.6, 0.6, -0.2]), Err(StatsError::Negative { arg: "expected", index: Some(2), value: -0.2 }));
        assert!(matches!(f(&[1, 1], &[0.5, 0.5 + 2e-9]), Err(StatsError::NotNormalized { arg: "expected", tolerance: 1e-9, .. })));
        assert!(matches!(f(&[1, 1], &[0.4, 0.4]), Err(StatsError::NotNormalized { .. })));
        // Within tolerance is accepted.
        assert_eq!(f(&[1, 1], &[0.5, 0.5 + 5e-10]), Ok(()));
    }
}

#[test]
fn pooling_plan_errors() {
    assert_eq!(plan_pooling(0, &[1.0]), Err(StatsError::ZeroSamples { arg: "n" }));
    assert_eq!(plan_pooling(5, &[]), Err(StatsError::Empty { arg: "expected" }));
    assert!(matches!(plan_pooling(5, &[f64::NAN]), Err(StatsError::NotFinite { .. })));
    assert!(matches!(plan_gof(10, &[0.5, 0.5], 0.0, 0.2), Err(StatsError::NotInOpenUnitInterval { arg: "alpha", .. })));
    assert!(matches!(plan_gof(10, &[0.5, 0.5], 0.05, 1.0), Err(StatsError::NotInOpenUnitInterval { arg: "beta", .. })));
}

#[test]
fn chi_squared_p_value_errors() {
    assert!(matches!(chi_squared_p_value(f64::NAN, 3), Err(StatsError::NotFinite { arg: "statistic", .. })));
    assert!(matches!(chi_squared_p_value(f64::INFINITY, 3), Err(StatsError::NotFinite { .. })));
    assert!(matches!(chi_squared_p_value(-1.0, 3), Err(StatsError::Negative { arg: "statistic", .. })));
    assert_eq!(chi_squared_p_value(1.0, 0), Err(StatsError::TooSmall { arg: "df", value: 0, min: 1 }));
    assert!(matches!(chi_squared_p_value(1.0, u64::MAX), Err(StatsError::TooLarge { arg: "df", .. })));
    assert!(chi_squared_p_value(1e9, 1_000_000_000).is_ok());
}

#[test]
fn binomial_and_interval_errors() {
    for alt in [Alternative::TwoSided, Alternative::Less, Alternative::Greater] {
        assert_eq!(binomial_test(0, 0, 0.5, alt), Err(StatsError::ZeroSamples { arg: "n" }));
        assert_eq!(binomial_test(11, 10, 0.5, alt), Err(StatsError::KExceedsN { k: 11, n: 10 }));
        assert!(matches!(binomial_test(1, 10, f64::NAN, alt), Err(StatsError::NotFinite { arg: "p0", .. })));
        assert!(matches!(binomial_test(1, 10, -0.1, alt), Err(StatsError::NotInClosedUnitInterval { arg: "p0", .. })));
        assert!(matches!(binomial_test(1, 10, 1.5, alt), Err(StatsError::NotInClosedUnitInterval { arg: "p0", .. })));
    }
    let too_big = MAX_BINOMIAL_N + 1;
    let big = StatsError::TooLarge { arg: "n", value: too_big as f64, max: MAX_BINOMIAL_N as f64 };
    assert_eq!(binomial_test(1, too_big, 0.5, Alternative::TwoSided), Err(big.clone()));
    assert_eq!(binomial_test(1, u64::MAX, 0.5, Alternative::TwoSided).map(drop).unwrap_err().to_string(), "`n` is 1.8446744073709552e19, above the supported maximum 1e10");
    assert_eq!(clopper_pearson_interval(1, too_big, 0.05), Err(big));
    assert!(wilson_interval(1, u64::MAX, 0.05).is_ok()); // closed form: no cap
    type F = fn(u64, u64, f64) -> Result<Interval, StatsError>;
    for f in [wilson_interval as F, clopper_pearson_interval as F] {
        assert_eq!(f(0, 0, 0.05), Err(StatsError::ZeroSamples { arg: "n" }));
        assert_eq!(f(3, 2, 0.05), Err(StatsError::KExceedsN { k: 3, n: 2 }));
        for bad in [0.0, 1.0, -0.5, 2.0] {
            assert_eq!(f(1, 2, bad), Err(StatsError::NotInOpenUnitInterval { arg: "alpha", value: bad }));
        }
        assert!(matches!(f(1, 2, f64::NAN), Err(StatsError::NotFinite { arg: "alpha", .. })));
    }
}

#[test]
fn holm_errors() {
    assert_eq!(holm(&[], 0.05), Err(StatsError::Empty { arg: "p_values" }));
    assert!(matches!(holm(&[0.1, f64::NAN], 0.05), Err(StatsError::NotFinite { arg: "p_values", index: Some(1), .. })));
    assert_eq!(holm(&[1.5], 0.05), Err(StatsError::NotInClosedUnitInterval { arg: "p_values", index: Some(0), value: 1.5 }));
    assert!(matches!(holm(&[-0.1], 0.05), Err(StatsError::NotInClosedUnitInterval { .. })));
    for bad in [0.0, 1.0, f64::NAN] {
        assert!(holm(&[0.1], bad).is_err());
    }
    assert_eq!(judge_holm(&mut [], 0.05), Err(StatsError::Empty { arg: "reports" }));
}

#[test]
fn noncentral_errors() {
    type F = fn(f64, f64, f64) -> Result<f64, StatsError>;
    for f in [noncentral_chi_squared_cdf as F, noncentral_chi_squared_sf as F] {
        assert!(matches!(f(f64::NAN, 2.0, 1.0), Err(StatsError::NotFinite { arg: "x", .. })));
        assert!(matches!(f(1.0, 0.0, 1.0), Err(StatsError::TooSmall { arg: "df", .. })));
        assert!(matches!(f(1.0, -2.0, 1.0), Err(StatsError::TooSmall { arg: "df", .. })));
        assert!(matches!(f(1.0, f64::INFINITY, 1.0), Err(StatsError::NotFinite { arg: "df", .. })));
        assert!(matches!(f(1.0, 2.0, f64::NAN), Err(StatsError::NotFinite { arg: "lambda", .. })));
        assert!(matches!(f(1.0, 2.0, -1.0), Err(StatsError::Negative { arg: "lambda", .. })));
    }
    assert!(matches!(noncentral_chi_squared_sf(1.0, 2.0, 2e8), Err(StatsError::TooLarge { arg: "lambda", .. })));
    assert!(matches!(gof_power(6, u64::MAX, 0.5, 0.05), Err(StatsError::TooLarge { arg: "lambda", .. })));
    // Infinite or non-positive x is fine; so is a lambda that underflows when halved.
    assert_eq!(noncentral_chi_squared_cdf(1.0, 2.0, 5e-324), noncentral_chi_squared_cdf(1.0, 2.0, 0.0));
    assert_eq!(noncentral_chi_squared_cdf(f64::INFINITY, 2.0, 1.0), Ok(1.0));
    assert_eq!(noncentral_chi_squared_sf(-3.0, 2.0, 1.0), Ok(1.0));
}

#[test]
fn power_errors() {
    assert_eq!(noncentrality_for_power(0, 0.05, 0.2), Err(StatsError::TooSmall { arg: "df", value: 0, min: 1 }));
    assert_eq!(min_samples(1, 0.1, 0.05, 0.2), Err(StatsError::TooSmall { arg: "m", value: 1, min: 2 }));
    assert!(matches!(min_samples(usize::MAX, 0.1, 0.05, 0.2), Err(StatsError::TooLarge { arg: "m", .. })));
    assert!(matches!(noncentrality_for_power(u64::MAX, 0.05, 0.2), Err(StatsError::TooLarge { arg: "df", .. })));
    assert!(matches!(noncentral_chi_squared_cdf(1.0, 2e9, 1.0), Err(StatsError::TooLarge { arg: "df", .. })));
    assert_eq!(detectable_delta(0, 10, 0.05, 0.2), Err(StatsError::TooSmall { arg: "m", value: 0, min: 2 }));
    assert_eq!(gof_power(1, 10, 0.1, 0.05), Err(StatsError::TooSmall { arg: "m", value: 1, min: 2 }));
    assert_eq!(detectable_delta(6, 0, 0.05, 0.2), Err(StatsError::ZeroSamples { arg: "n" }));
    assert_eq!(gof_power(6, 0, 0.1, 0.05), Err(StatsError::ZeroSamples { arg: "n" }));
    for bad in [0.0, 1.0, -0.1, 1.1] {
        assert_eq!(min_samples(6, bad, 0.05, 0.2), Err(StatsError::NotInOpenUnitInterval { arg: "delta", value: bad }));
        assert_eq!(gof_power(6, 10, bad, 0.05), Err(StatsError::NotInOpenUnitInterval { arg: "delta", value: bad }));
        assert_eq!(min_samples(6, 0.1, bad, 0.2), Err(StatsError::NotInOpenUnitInterval { arg: "alpha", value: bad }));
        assert_eq!(min_samples(6, 0.1, 0.05, bad), Err(StatsError::NotInOpenUnitInterval { arg: "beta", value: bad }));
        assert_eq!(detectable_delta(6, 9, bad, 0.2), Err(StatsError::NotInOpenUnitInterval { arg: "alpha", value: bad }));
        assert_eq!(noncentrality_for_power(5, 0.05, bad), Err(StatsError::NotInOpenUnitInterval { arg: "beta", value: bad }));
    }
    assert!(matches!(min_samples(6, f64::NAN, 0.05, 0.2), Err(StatsError::NotFinite { arg: "delta", .. })));
    assert_eq!(min_samples(6, 0.1, 0.5, 0.5), Err(StatsError::PowerNotAboveSize { sum: 1.0 }));
    assert!(matches!(detectable_delta(6, 9, 0.6, 0.5), Err(StatsError::PowerNotAboveSize { .. })));
    assert!(matches!(min_samples(6, 1e-9, 0.05, 0.2), Err(StatsError::SampleSizeTooLarge { .. })));
}

#[test]
fn report_errors() {
    let r = chi_squared_gof(&[10, 10], &[0.5, 0.5]).unwrap().to_report("x");
    assert!(matches!(r.clone().with_power(0.0, 0.2), Err(StatsError::NotInOpenUnitInterval { arg: "alpha", .. })));
    assert!(matches!(r.clone().with_power(0.05, 0.95), Err(StatsError::PowerNotAboveSize { .. })));
    let mut r2 = r.clone();
    assert!(matches!(r2.judge(1.0), Err(StatsError::NotInOpenUnitInterval { arg: "alpha", .. })));
    assert!(matches!(judge_holm(&mut [r], f64::NAN), Err(StatsError::NotFinite { arg: "alpha", .. })));
}

#[test]
fn messages_name_the_argument() {
    let e = chi_squared_gof(&[1, 1], &[0.5, -0.5]).unwrap_err().to_string();
    assert!(e.contains("`expected[1]`") && e.contains("negative"), "{e}");
    let e = chi_squared_gof(&[1, 1], &[0.5, 0.6]).unwrap_err().to_string();
    assert!(e.contains("`expected`") && e.contains("1e-9"), "{e}");
    let e = binomial_test(5, 4, 0.5, Alternative::Less).unwrap_err().to_string();
    assert_eq!(e, "`k` = 5 exceeds `n` = 4");
    let e = min_samples(6, 0.1, 0.05, 1.0).unwrap_err().to_string();
    assert!(e.contains("`beta`") && e.contains("(0, 1)"), "{e}");
}
