//! Closed-form theory (THEORY-1 .. THEORY-7): acceptance, expected tokens
//! and speedup, the accepted-length law, and bounds that actually hold.

use crate::error::{Result, SpecError};
use crate::rejection::Residual;
use crate::validate;

fn rows(p: &[f64], q: &[f64]) -> Result<()> {
    if p.is_empty() {
        return Err(SpecError::EmptyVocab { arg: "p" });
    }
    validate::shape("q", &[q.len()], &[p.len()], "[V]")?;
    validate::prob_row("p", &[], p)?;
    validate::prob_row("q", &[], q)
}

fn beta_in_range(name: &'static str, beta: f64) -> Result<()> {
    if (0.0..=1.0).contains(&beta) { Ok(()) } else { Err(SpecError::param(name, beta, "must be in [0, 1]")) }
}

/// THEORY-1: the probability that one draft drawn from `q` is accepted by
/// target `p`: `sum min(p, q)` (not divided by the draft length; erratum E8).
/// Capped at 1, stated here so it is not silent: rows within the CONV-2
/// tolerance can sum to up to 1 + 1e-4, and equal rows summed with rounding
/// exceed 1 by a few ulps; a probability above 1 is meaningless downstream.
pub fn acceptance(p: &[f64], q: &[f64]) -> Result<f64> {
    rows(p, q)?;
    Ok(p.iter().zip(q).map(|(a, b)| a.min(*b)).sum::<f64>().min(1.0))
}

/// THEORY-5: the law of the number of accepted drafts, `P(n = j)` for
/// `j = 0..=gamma`, when position `i` accepts with probability `betas[i]`.
pub fn accepted_length_law(betas: &[f64]) -> Result<Vec<f64>> {
    for &b in betas {
        beta_in_range("beta", b)?;
    }
    let mut law = Vec::with_capacity(betas.len() + 1);
    let mut reach = 1.0; // probability that positions 0..j were all accepted
    for &b in betas {
        law.push(reach * (1.0 - b));
        reach *= b;
    }
    law.push(reach);
    Ok(law)
}

/// THEORY-2: expected tokens emitted per step: `1 + sum_j prod_{i<=j} beta_i`.
pub fn expected_tokens(betas: &[f64]) -> Result<f64> {
    let law = accepted_length_law(betas)?;
    Ok(law.iter().enumerate().map(|(n, p)| (n + 1) as f64 * p).sum())
}

/// THEORY-2 closed form for a constant beta: `(1 - beta^(gamma+1)) / (1 - beta)`.
pub fn expected_tokens_geometric(beta: f64, gamma: usize) -> Result<f64> {
    beta_in_range("beta", beta)?;
    if beta == 1.0 {
        return Ok((gamma + 1) as f64);
    }
    Ok((1.0 - beta.powf(gamma as f64 + 1.0)) / (1.0 - beta))
}

/// THEORY-3: expected walltime speedup for cost ratio `c` (draft step time
/// over target step time): `E[tokens] / (gamma c + 1)` (Leviathan et al.).
pub fn expected_speedup(beta: f64, gamma: usize, cost_ratio: f64) -> Result<f64> {
    if !(cost_ratio.is_finite() && cost_ratio >= 0.0) {
        return Err(SpecError::param("cost_ratio", cost_ratio, "must be finite and >= 0"));
    }
    Ok(expected_tokens_geometric(beta, gamma)? / (gamma as f64 * cost_ratio + 1.0))
}

/// Seed 003's approximation `(1 + gamma beta) / (1 + gamma rho)`. It counts
/// every draft as if accepted independently of the ones before it, so it
/// overestimates; kept only to show the size of erratum E9.
pub fn seed003_speedup_approximation(beta: f64, gamma: usize, rho: f64) -> Result<f64> {
    beta_in_range("beta", beta)?;
    if !(rho.is_finite() && rho >= 0.0) {
        return Err(SpecError::param("rho", rho, "must be finite and >= 0"));
    }
    Ok((1.0 + gamma as f64 * beta) / (1.0 + gamma as f64 * rho))
}

/// THEORY-4: the draft length in `1..=max_gamma` with the highest expected
/// speedup (ties to the shorter), and that speedup.
pub fn best_draft_length(beta: f64, cost_ratio: f64, max_gamma: usize) -> Result<(usize, f64)> {
    if max_gamma == 0 {
        return Err(SpecError::param("max_gamma", max_gamma, "must be >= 1"));
    }
    let mut best = (1, expected_speedup(beta, 1, cost_ratio)?);
    for gamma in 2..=max_gamma {
        let s = expected_speedup(beta, gamma, cost_ratio)?;
        if s > best.1 {
            best = (gamma, s);
        }
    }
    Ok(best)
}

/// THEORY-6: the exact law of the token emitted at one position:
/// `min(p, q)(x) + (1 - beta) * residual(x)`, which equals `p`.
pub fn one_position_output_law(p: &[f64], q: &[f64]) -> Result<Vec<f64>> {
    let beta = acceptance(p, q)?;
    // The drafted token does not matter when q is given in full.
    let res = Residual::new(p, Some(q), 0);
    let total: f64 = res.weights.iter().sum();
    Ok(p.iter().zip(q).zip(&res.weights).map(|((a, b), r)| a.min(*b) + (1.0 - beta) * r / total).collect())
}

/// `KL(p || q)` in nats; `+inf` when `p` puts mass where `q` has none.
pub fn kl_divergence(p: &[f64], q: &[f64]) -> Result<f64> {
    rows(p, q)?;
    Ok(p.iter().zip(q).filter(|&(&a, _)| a > 0.0).map(|(&a, &b)| if b > 0.0 { a * (a / b).ln() } else { f64::INFINITY }).sum())
}

/// THEORY-7: Pinsker's bound `beta >= 1 - sqrt(KL / 2)` (clamped at 0).
pub fn pinsker_acceptance_bound(kl: f64) -> Result<f64> {
    if kl.is_nan() || kl < 0.0 {
        return Err(SpecError::param("kl", kl, "must be >= 0"));
    }
    Ok((1.0 - (kl / 2.0).sqrt()).max(0.0))
}

/// THEORY-7: the Bretagnolle-Huber bound `beta >= exp(-KL) / 2`.
pub fn bretagnolle_huber_acceptance_bound(kl: f64) -> Result<f64> {
    if kl.is_nan() || kl < 0.0 {
        return Err(SpecError::param("kl", kl, "must be >= 0"));
    }
    Ok((-kl).exp() / 2.0)
}
