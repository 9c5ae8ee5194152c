//! The verify window of a step: one target forward over each active
//! sequence's `[last token, drafts..]` (ragged, MODEL-8), its logit rows
//! gathered into `[A, width + 1, V]` order (rows past a sequence's drafts
//! are PAD padding, CONV-7), and the drafts and their lengths on the device.
//! The verify reads only this.

use specdec_backend::PAD;
use specdec_backend::model::{ForwardPlan, ForwardRequest, LogitRows, ModelBackend};

use crate::device;
use crate::error::DecodeError;
use crate::fault::Faults;
use crate::proposer::Proposal;
use crate::seq::Seq;

/// A step's window on the device.
pub(crate) struct Window<T> {
    /// `[A·(width + 1), V]`: row `a·(width + 1) + j` holds the target's logits
    /// after sequence `a`'s first `j` drafts, for `j <= len_a`.
    pub(crate) rows: T,
    /// `[A, width]`, PAD after each sequence's drafts.
    pub(crate) drafts: T,
    /// `[A]`: each sequence's draft count.
    pub(crate) lens: T,
    /// The longest proposal (or the draft probabilities' width), at least 1.
    pub(crate) width: usize,
    pub(crate) plan: ForwardPlan,
    /// The hidden states the proposer asked for, of every fed token.
    pub(crate) hidden: Option<T>,
}

/// Feeds every active sequence its window and lays the result out.
#[allow(clippy::too_many_arguments)]
pub(crate) fn forward<B: ModelBackend>(
    b: &B,
    target: &B::Model,
    cache: &mut B::ModelCache,
    seqs: &[Seq],
    active: &[usize],
    p: &Proposal<B::Tensor>,
    hidden_layers: &[usize],
    faults: Faults,
) -> Result<Window<B::Tensor>, DecodeError> {
    let a = active.len();
    let mut tokens = vec![Vec::new(); seqs.len()];
    for (pos, &i) in active.iter().enumerate() {
        tokens[i] = std::iter::once(seqs[i].last()).chain(p.drafts[pos].iter().copied()).collect();
    }
    let q_width = p.draft_probs.as_ref().map_or(0, |(_, w)| *w);
    let width = p.drafts.iter().map(Vec::len).max().unwrap_or(0).max(q_width).max(1);
    let out = b.forward(target, cache, &ForwardRequest { tokens: &tokens, logits: LogitRows::All, hidden_layers })?;
    let logits = out.logits.as_ref().ok_or_else(|| DecodeError::Internal("the verify forward returned no logits".into()))?;

    // Every active sequence fed at least its last token, so the plan's rows
    // are the active sequences, in batch order (MODEL-8).
    if out.plan.rows.len() != a || out.plan.rows.iter().zip(active).any(|(r, &i)| r.seq != i) {
        return Err(DecodeError::Internal("the verify forward's rows are not the active sequences in order".into()));
    }
    let mut index = Vec::with_capacity(a * (width + 1));
    for (pos, rows) in out.plan.rows.iter().enumerate() {
        let len = p.drafts[pos].len();
        for j in 0..=width {
            index.push(if j <= len { (rows.logit_row + faults.window_row(j, len)) as i64 } else { PAD });
        }
    }
    let index = device::upload_i64(b, vec![index.len()], index)?;
    let rows = b.gather_rows(logits, &index)?;
    let mut draft_ids = Vec::with_capacity(a * width);
    for d in &p.drafts {
        draft_ids.extend(d.iter().map(|&t| i64::from(t)));
        draft_ids.extend(std::iter::repeat_n(PAD, width - d.len()));
    }
    let drafts = device::upload_i64(b, vec![a, width], draft_ids)?;
    let lens = device::upload_i64(b, vec![a], p.drafts.iter().map(|d| d.len() as i64).collect())?;
    Ok(Window { rows, drafts, lens, width, plan: out.plan, hidden: out.hidden })
}
