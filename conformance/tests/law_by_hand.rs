//! STAT-7's expected law, worked out by hand: the joint law of (accepted count,
//! next token) that the statistical and exact checks compare every backend
//! with, the reference included, on two small scenarios whose numbers are
//! computed below in the comments, not by any reference function.

use specdec_conformance::stat::{Scenario, accepted_and_next_law};

fn close(got: &[f64], want: &[f64]) {
    assert_eq!(got.len(), want.len());
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!((g - w).abs() < 1e-12, "cell {i}: got {g}, want {w} (law {got:?})");
    }
}

#[test]
fn drafts_from_q() {
    // p0 = (.5, .5, 0), q0 = (.25, .25, .5): beta0 = sum min = .5; the residual
    // (p0 - q0)+ = (.25, .25, 0) normalises to (.5, .5, 0). p1 = (.2, .3, .5).
    let s = Scenario { name: "hand-q", p: vec![vec![0.5, 0.5, 0.0], vec![0.2, 0.3, 0.5]], q: Some(vec![vec![0.25, 0.25, 0.5]]), fixed_drafts: vec![] };
    // len 0: n = 0 and the bonus from p0.
    close(&accepted_and_next_law(&s, 0), &[0.5, 0.5, 0.0, 0.0, 0.0, 0.0]);
    // len 1: n = 0 with (1 - .5) (.5, .5, 0); n = 1 with .5 p1.
    close(&accepted_and_next_law(&s, 1), &[0.25, 0.25, 0.0, 0.1, 0.15, 0.25]);
}

#[test]
fn fixed_drafts_without_q() {
    // p0 = (.5, .3, .2) with the fixed draft 1: beta0 = .3, the residual is p0
    // without id 1, (.5, 0, .2) / .7. p1 = (.1, .9, 0).
    let s = Scenario { name: "hand-fixed", p: vec![vec![0.5, 0.3, 0.2], vec![0.1, 0.9, 0.0]], q: None, fixed_drafts: vec![1] };
    // len 1: n = 0 with .7 (5/7, 0, 2/7) = (.5, 0, .2); n = 1 with .3 p1 = (.03, .27, 0).
    close(&accepted_and_next_law(&s, 1), &[0.5, 0.0, 0.2, 0.03, 0.27, 0.0]);
}

#[test]
fn a_residual_without_mass_falls_back_to_p() {
    // p0 = q0 = (1, 0): beta0 = 1, the rejection branch has probability 0, and
    // the law is the bonus from p1 = (0, 1) after the accepted draft.
    let s = Scenario { name: "hand-equal", p: vec![vec![1.0, 0.0], vec![0.0, 1.0]], q: Some(vec![vec![1.0, 0.0]]), fixed_drafts: vec![] };
    close(&accepted_and_next_law(&s, 1), &[0.0, 0.0, 0.0, 1.0]);
}
