//! The logprobs of a verified step (LOGPROB-4): the token emitted at window
//! position `j` is reported from verify row `j` (the target's distribution
//! after the prompt, the emitted prefix and the drafts before `j`, which
//! are the tokens emitted before it), with row `j`'s own processor inputs
//! (LOGITS-13), never from the draft's `q`. So speculation reports what
//! plain decoding reports at the same position.
//!
//! Cost: only requests that ask for logprobs pay, and only for their emitted
//! rows (one `[V]` row per emitted token downloaded); the arithmetic is the
//! reference's definition in f64 on the host ([`specdec_reference::logprob_row`]).

use specdec_backend::model::ModelBackend;
use specdec_constraint::mask_scores;
use specdec_reference::logprob::entry;
use specdec_reference::{LogprobMode, RowInputs, TokenLogprob, bias_row, logprob_row};

use crate::device;
use crate::error::DecodeError;
use crate::fault::Faults;
use crate::masks::WindowMasks;
use crate::proposer::Proposal;
use crate::seq::Seq;
use crate::verify::{Verdict, row_inputs};
use crate::window::Window;

/// Each active sequence's entries for every token of its verdict (its
/// accepted drafts and one more; the commit keeps those it emits), empty
/// for a request that asked for none.
#[allow(clippy::too_many_arguments)]
pub(crate) fn step_logprobs<B: ModelBackend>(
    b: &B,
    vocab: usize,
    w: &Window<B::Tensor>,
    seqs: &[Seq],
    active: &[usize],
    p: &Proposal<B::Tensor>,
    verdict: &Verdict,
    masks: &WindowMasks,
    faults: Faults,
) -> Result<Vec<Vec<TokenLogprob>>, DecodeError> {
    let mut out = vec![Vec::new(); active.len()];
    let wanted: Vec<usize> = (0..active.len()).filter(|&pos| seqs[active[pos]].req.logprobs.is_some()).collect();
    if wanted.is_empty() {
        return Ok(out);
    }
    let stride = w.width + 1;
    let index: Vec<i64> = wanted.iter().flat_map(|&pos| (0..verdict.tokens[pos].len()).map(move |j| (pos * stride + j) as i64)).collect();
    let index = device::upload_i64(b, vec![index.len()], index)?;
    let rows = b.download_f64(&b.gather_rows(&w.rows, &index)?)?;
    // A negative control only: the draft's q in place of the target's rows.
    let q = match (&p.draft_probs, faults.logprobs_from_draft()) {
        (Some((q, width)), true) => Some((b.download_f64(q)?, *width)),
        _ => None,
    };
    let mut rows = rows.data().chunks_exact(vocab);
    for pos in wanted {
        let (i, s) = (active[pos], &seqs[active[pos]]);
        let Some(ask) = s.req.logprobs else { continue };
        let drafts = &p.drafts[pos];
        for (j, &token) in verdict.tokens[pos].iter().enumerate() {
            let logits = rows.next().ok_or_else(|| DecodeError::Internal("fewer logprob rows than emitted tokens".into()))?;
            let row = row_inputs(s, drafts, j, faults, masks.rows[pos][j].as_deref());
            // The processed law is the masked one (CONSTRAIN-1); the raw one is the model's.
            let masked = row.allowed.filter(|_| ask.mode == LogprobMode::Processed).map(|a| mask_scores(logits, a));
            let logits = masked.as_deref().unwrap_or(logits);
            let counts = row.params.penalised().then(|| row.counts(vocab));
            let bias = if row.bias.is_empty() { None } else { Some(bias_row(row.bias, vocab).map_err(|e| DecodeError::Request { index: i, reason: e.to_string() })?) };
            let inputs = RowInputs { counts: counts.as_deref(), bias: bias.as_deref() };
            let mut lp = logprob_row(logits, ask.mode, row.params, inputs).map_err(|e| DecodeError::Internal(format!("the logprobs of request {i}: {e}")))?;
            if let Some((q, width)) = &q
                && j < drafts.len()
            {
                lp = q.data()[(pos * width + j) * vocab..][..vocab].iter().map(|x| x.ln()).collect();
            }
            if faults.zero_logprobs(!drafts.is_empty()) {
                lp.iter_mut().filter(|x| x.is_finite()).for_each(|x| *x = 0.0);
            }
            out[pos].push(entry(&lp, token, ask.top));
        }
    }
    Ok(out)
}
