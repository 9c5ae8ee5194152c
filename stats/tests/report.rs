//! The report record: fields, Holm judging, power statements, serialisation, one-line display.

use specdec_stats::*;

#[test]
fn reports_carry_everything_and_print_one_line() {
    let p = [0.5, 0.3, 0.1, 0.06, 0.04];
    let plan = plan_gof(100, &p, 0.05 / 3.0, 0.2).unwrap();
    assert_eq!(plan.pooling.cells_after_pooling, 4);
    let claim = plan.power.unwrap();
    assert_eq!(claim.detectable_delta, detectable_delta(4, 100, 0.05 / 3.0, 0.2).unwrap());

    let good = chi_squared_gof(&[45, 33, 12, 4, 6], &p).unwrap();
    let bad = g_test_gof(&[80, 10, 5, 3, 2], &p).unwrap();
    let binom = binomial_test(30, 100, 0.5, Alternative::TwoSided).unwrap();
    let mut reports: Vec<TestReport> = [good.to_report("good"), bad.to_report("bad"), binom.to_report("binom")].into_iter().map(|r| r.with_power(0.05 / 3.0, 0.2).unwrap()).collect();
    assert!(reports.iter().all(|r| r.decision == Decision::Pending && r.alpha.is_none()));
    assert_eq!(reports[0].power, Some(claim));
    assert_eq!((reports[0].cells, reports[0].cells_pooled, reports[0].df), (4, 2, Some(3)));

    judge_holm(&mut reports, 0.05).unwrap();
    let decisions: Vec<Decision> = reports.iter().map(|r| r.decision).collect();
    assert_eq!(decisions, [Decision::NotRejected, Decision::Reject, Decision::Reject]);
    // bad (smallest p) was compared with 0.05/3, binom with 0.05/2, good with 0.05.
    let alphas: Vec<f64> = reports.iter().map(|r| r.alpha.unwrap()).collect();
    assert_eq!(alphas, [0.05, 0.05 / 3.0, 0.025]);

    for r in &reports {
        let line = r.to_string();
        println!("{line}");
        assert!(!line.contains('\n'));
        assert!(line.starts_with(&r.label), "{line}");
        assert!(line.contains("TV>="), "{line}");
    }
    assert!(reports[0].to_string().contains("(2 pooled)"), "{}", reports[0]);
    assert!(reports[1].to_string().ends_with("-> REJECTED"), "{}", reports[1]);

    let json = serde_json::to_value(&reports[1]).unwrap();
    for key in ["label", "kind", "n", "cells", "cells_pooled", "statistic", "df", "p_value", "log10_p_value", "p_value_floored", "impossible_outcome", "alpha", "power", "decision"] {
        assert!(json.get(key).is_some(), "STAT-6: every result reports {key}; missing in {json}");
    }
    assert_eq!(json["kind"], "g_test");
    assert_eq!(json["decision"], "reject");
    assert!(json["power"]["detectable_delta"].as_f64().unwrap() > 0.0, "STAT-6: every result reports its detectable distance");
}

#[test]
fn degenerate_reports_count_in_the_family_but_never_pass() {
    let degenerate = chi_squared_gof(&[3, 1], &[0.5, 0.5]).unwrap().to_report("tiny");
    let fine = chi_squared_gof(&[50, 50], &[0.5, 0.5]).unwrap().to_report("fine");
    let mut reports = vec![degenerate, fine];
    judge_holm(&mut reports, 0.05).unwrap();
    assert_eq!(reports[0].decision, Decision::Degenerate);
    assert_eq!(reports[1].decision, Decision::NotRejected);
    assert_eq!(reports[1].alpha, Some(0.025)); // family size 2, ranked first
    assert!(reports[0].to_string().contains("DEGENERATE"), "{}", reports[0]);
}

#[test]
fn single_test_judging() {
    let mut r = binomial_test(3, 50, 0.2, Alternative::TwoSided).unwrap().to_report("one");
    r.judge(0.05).unwrap();
    assert_eq!((r.decision, r.alpha), (Decision::Reject, Some(0.05)));
    r.judge(0.01).unwrap();
    assert_eq!(r.decision, Decision::NotRejected);
    assert_eq!(r.statistic, Some(3.0));
}
