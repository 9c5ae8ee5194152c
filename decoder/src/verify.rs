//! The verify of a step on its window: greedy (GREEDY-2 .. GREEDY-4), DFlash
//! blocks (DFLASH-1 .. DFLASH-3) or rejection sampling with each request's
//! own uniforms (REJECT-1 .. REJECT-5, DECODE-3). Only the emitted tokens
//! and the accepted counts come back to the host.

use specdec_backend::model::ModelBackend;
use specdec_backend::{Comparator, DrawNoiseArg, PAD, RejectionArgs, RejectionNoise, Verified};

use crate::config::EngineConfig;
use crate::device;
use crate::error::DecodeError;
use crate::fault::Faults;
use crate::masks::WindowMasks;
use crate::proposer::{Proposal, VerifyRule};
use crate::seq::{Seq, VerifyNoise};
use crate::window::Window;

/// Each active sequence's emitted tokens (its accepted drafts and one more)
/// and its accepted count.
pub(crate) struct Verdict {
    pub(crate) tokens: Vec<Vec<u32>>,
    pub(crate) num_accepted: Vec<usize>,
}

/// Verifies `w`; `config.checked` runs the ops with their validity
/// read-back (GLUE-6).
#[allow(clippy::too_many_arguments)]
pub(crate) fn verify<B: ModelBackend>(
    b: &B,
    vocab: usize,
    config: &EngineConfig,
    w: &Window<B::Tensor>,
    seqs: &mut [Seq],
    active: &[usize],
    p: &Proposal<B::Tensor>,
    masks: &WindowMasks,
) -> Result<Verdict, DecodeError> {
    let (checked, faults) = (config.checked, config.faults());
    let (a, width) = (active.len(), w.width);
    let greedy = active.iter().all(|&i| seqs[i].req.sampling.temperature == 0.0);
    // Row `j` of a sequence counts its context plus its drafts before `j`
    // (LOGITS-13) and is masked with the constraint's state after them
    // (CONSTRAIN-3); rows past its drafts are padding, never read (CONV-7).
    let mut rows = Vec::with_capacity(a * (width + 1));
    for (pos, &i) in active.iter().enumerate() {
        rows.extend((0..=width).map(|j| row_inputs(&seqs[i], &p.drafts[pos], j, faults, masks.rows[pos][j].as_deref())));
    }
    if greedy && p.rule == VerifyRule::DflashBlock && p.drafts.iter().all(|d| d.len() == width) {
        return dflash(b, vocab, w, seqs, active, p, &rows);
    }
    if greedy {
        // Bias and penalties move the argmax (LOGITS-2): verify against the
        // processed one-hot rows, whose argmax is the processed logits'.
        let scores = if device::moves_argmax(&rows) { device::process(b, &w.rows, &rows, vocab)? } else { w.rows.clone() };
        let scores = b.reshape(&scores, &[a, width + 1, vocab])?;
        let v = if checked { b.greedy_verify(&scores, &w.drafts, &w.lens)? } else { b.greedy_verify_unchecked(&scores, &w.drafts, &w.lens)? };
        return download(b, &v, a, width);
    }
    let probs = device::process(b, &w.rows, &rows, vocab)?;
    let probs = b.reshape(&probs, &[a, width + 1, vocab])?;
    let q = match &p.draft_probs {
        Some((q, qw)) if *qw == width => Some(q.clone()),
        Some((q, qw)) => {
            // Widen q to the verify width with padding rows (never read: CONV-7).
            let mut idx = Vec::with_capacity(a * width);
            for pos in 0..a {
                idx.extend((0..width).map(|j| if j < *qw { (pos * qw + j) as i64 } else { PAD }));
            }
            let flat = b.reshape(q, &[a * qw, vocab])?;
            let idx = device::upload_i64(b, vec![idx.len()], idx)?;
            Some(b.reshape(&b.gather_rows(&flat, &idx)?, &[a, width, vocab])?)
        }
        None => None,
    };
    // Each request draws its own uniforms (DECODE-3): one per draft, then
    // one for the drawn token.
    let (mut u, mut v) = (Vec::with_capacity(a * width), Vec::with_capacity(a * (width + 1)));
    for (pos, &i) in active.iter().enumerate() {
        let len = p.drafts[pos].len();
        let (accept, draw) = step_uniforms(&mut seqs[i].verify_noise, len, faults).ok_or_else(|| DecodeError::Request { index: i, reason: "its explicit verify uniforms ran out".into() })?;
        // Exactly one draw row is read (row n_b); one uniform serves it.
        v.extend((0..=width).map(|j| faults.draw_noise(j, &accept, draw)));
        u.extend(accept.iter().copied().chain(std::iter::repeat(0.5)).take(width));
    }
    let u = device::upload_f64(b, vec![a, width], u)?;
    let v = device::upload_f64(b, vec![a, width + 1], v)?;
    let args = RejectionArgs { target_probs: &probs, draft_probs: q.as_ref(), draft_tokens: &w.drafts, proposal_lens: &w.lens };
    let noise = RejectionNoise { accept_uniforms: &u, draw: DrawNoiseArg::InverseCdf(&v) };
    let out = if checked { b.rejection_verify(args, noise, Comparator::Strict)? } else { b.rejection_verify_unchecked(args, noise, Comparator::Strict)? };
    download(b, &out, a, width)
}

/// The processor inputs of verify row `j` of sequence `s` with `drafts`:
/// its context plus the drafts before the row (LOGITS-13), and the row's
/// constraint mask (CONSTRAIN-3).
pub(crate) fn row_inputs<'a>(s: &'a Seq, drafts: &'a [u32], j: usize, faults: Faults, allowed: Option<&'a [bool]>) -> device::Row<'a> {
    let seen = faults.penalty_window(j.min(drafts.len()));
    let row = device::Row { allowed, ..s.row(&drafts[..seen]) };
    faults.window_processors(row, j, drafts.len())
}

/// One step's `len` accept uniforms and its draw uniform, in DECODE-3's
/// order; `None` when given uniforms ran out.
fn step_uniforms(noise: &mut VerifyNoise, len: usize, faults: Faults) -> Option<(Vec<f64>, f64)> {
    let mut accept = (0..len).map(|_| noise.next()).collect::<Option<Vec<f64>>>()?;
    if faults.shared_accept_uniform()
        && let Some(&first) = accept.first()
    {
        // The same count read, the first serving every draft: only the sharing differs.
        accept.fill(first);
    }
    Some((accept, noise.next()?))
}

/// DFLASH-1 .. DFLASH-3 on full blocks `[last, drafts..]` at temperature 0.
fn dflash<B: ModelBackend>(b: &B, vocab: usize, w: &Window<B::Tensor>, seqs: &[Seq], active: &[usize], p: &Proposal<B::Tensor>, rows: &[device::Row<'_>]) -> Result<Verdict, DecodeError> {
    let (a, width) = (active.len(), w.width);
    let one_hot = device::process(b, &w.rows, rows, vocab)?;
    let half = device::upload_f64(b, vec![a * (width + 1)], vec![0.5; a * (width + 1)])?;
    let predict = b.draw(&one_hot, DrawNoiseArg::InverseCdf(&half))?;
    let predict = b.reshape(&predict, &[a, width + 1])?;
    let mut cand = Vec::with_capacity(a * (width + 1));
    for (pos, &i) in active.iter().enumerate() {
        cand.push(i64::from(seqs[i].last()));
        cand.extend(p.drafts[pos].iter().map(|&t| i64::from(t)));
    }
    let cand = device::upload_i64(b, vec![a, width + 1], cand)?;
    let out = b.dflash_accept(&cand, &predict, vocab)?;
    let n = device::download_ids(b, &out.accept_len)?;
    let bonus = device::download_ids(b, &out.bonus)?;
    let tokens = (0..a).map(|pos| p.drafts[pos][..n[pos] as usize].iter().copied().chain([bonus[pos]]).collect()).collect();
    Ok(Verdict { tokens, num_accepted: n.into_iter().map(|x| x as usize).collect() })
}

/// Downloads a verify's emitted tokens (`[A, width + 1]`, PAD after) and counts.
fn download<B: ModelBackend>(b: &B, v: &Verified<B::Tensor>, a: usize, width: usize) -> Result<Verdict, DecodeError> {
    let n = device::download_ids(b, &v.num_accepted)?;
    let all = b.download_i64(&v.tokens)?;
    let mut tokens = Vec::with_capacity(a);
    for (pos, &n) in n.iter().enumerate() {
        let row = &all.data()[pos * (width + 1)..][..=n as usize];
        tokens.push(row.iter().map(|&t| u32::try_from(t).map_err(|_| DecodeError::Internal(format!("the verify emitted id {t}")))).collect::<Result<Vec<_>, _>>()?);
    }
    Ok(Verdict { tokens, num_accepted: n.into_iter().map(|x| x as usize).collect() })
}
