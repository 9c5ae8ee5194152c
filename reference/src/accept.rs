//! The probabilistic accept test (ACCEPT-1 .. ACCEPT-4).

use serde::{Deserialize, Serialize};

use crate::error::{Result, SpecError};
use crate::tensor::Tensor;
use crate::validate;

/// How a drafted token's uniform is compared with its probabilities.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Comparator {
    /// ACCEPT-1: accept iff `u * q(x) < p(x)`. Never divides; with `q(x) = 0`
    /// it accepts iff `p(x) > 0` (ACCEPT-2). Lossless for `u` uniform on [0, 1).
    #[default]
    Strict,
    /// ACCEPT-3: seed 004's `u <= min(1, p(x) / q(x))`. Kept only to
    /// reproduce that seed: with `u = 0` it accepts a token the target gives
    /// zero probability (erratum E1).
    Seed004LessEq,
}

/// The accept decision for one drafted token, with its margin (SAMPLE-3):
/// how far `u * q(x)` is from the boundary `p(x)`.
pub fn accept_test(comparator: Comparator, u: f64, p_x: f64, q_x: f64) -> (bool, f64) {
    let accepted = match comparator {
        Comparator::Strict => u * q_x < p_x,
        Comparator::Seed004LessEq => {
            if q_x > 0.0 {
                u <= (p_x / q_x).min(1.0)
            } else {
                // p/0 is +inf (min 1, accepted for any u <= 1); 0/0 is NaN (rejected).
                p_x > 0.0
            }
        }
    };
    (accepted, (p_x - u * q_x).abs())
}

/// Seed 004's `speculative_accept` (ACCEPT-4): the longest accepted prefix
/// of `draft_tokens`.
///
/// * `draft_tokens` `[L]`, `L >= 1`; `p`, `q` `[L, V]` target and draft rows;
///   `r` `[L]` uniforms in [0, 1). All rows are validated (CONV-2).
pub fn speculative_accept(draft_tokens: &[i64], p: &Tensor<f64>, q: &Tensor<f64>, r: &[f64], comparator: Comparator) -> Result<Vec<i64>> {
    let len = draft_tokens.len();
    if len == 0 {
        return Err(SpecError::EmptyDraft { arg: "draft_tokens" });
    }
    let vocab = *validate::rank("p", p.shape(), 2, "[L, V]")?.last().unwrap_or(&0);
    if vocab == 0 {
        return Err(SpecError::EmptyVocab { arg: "p" });
    }
    validate::shape("p", p.shape(), &[len, vocab], "[L, V]")?;
    validate::shape("q", q.shape(), &[len, vocab], "[L, V]")?;
    validate::shape("r", &[r.len()], &[len], "[L]")?;
    for (i, &t) in draft_tokens.iter().enumerate() {
        validate::token("draft_tokens", || vec![i], t, vocab)?;
    }
    validate::prob_rows("p", p)?;
    validate::prob_rows("q", q)?;
    for (i, &u) in r.iter().enumerate() {
        validate::uniform("r", || vec![i], u)?;
    }

    let accepted = draft_tokens
        .iter()
        .enumerate()
        .take_while(|&(i, &t)| {
            let x = t as usize;
            accept_test(comparator, r[i], p.lane_at(&[i])[x], q.lane_at(&[i])[x]).0
        })
        .map(|(_, &t)| t)
        .collect();
    Ok(accepted)
}
