//! The window rule of structured outputs (CONSTRAIN-3, CONSTRAIN-4): verify
//! row `j` of a window is masked with the constraint's state after the
//! committed output plus `drafts[..j]`, walked from the committed state
//! each step; the committed state moves only with emitted tokens, so a
//! rejection needs no rollback (the state is a value, not a matcher fed
//! with drafts). A row past a draft the constraint refuses is never read
//! (that draft's `p` is 0, so it is rejected) and stays unmasked.
//!
//! Cost: a step with a constrained request downloads its window's logits
//! rows, masks them on the host and uploads them again (`device::process`);
//! requests without a constraint pay nothing.

use crate::fault::Faults;
use crate::seq::Seq;

/// Each active sequence's row masks of a window, `[A][width + 1]`, and the
/// rows where the constraint allows nothing.
pub(crate) struct WindowMasks {
    pub(crate) rows: Vec<Vec<Option<Vec<bool>>>>,
    /// `(active position, row, why)` of each row whose state the vocabulary
    /// cannot continue: left unmasked, its verdict never emitted. Plain
    /// decoding fails there too, once it has emitted the tokens before it;
    /// a row past a rejected draft is never read and costs nothing.
    dead: Vec<(usize, usize, String)>,
}

impl WindowMasks {
    /// Where sequence `pos`'s run of `n` accepted drafts must stop: the
    /// first dead row it read (rows `0 ..= n`), and why.
    pub(crate) fn cut(&self, pos: usize, n: usize) -> Option<(usize, &str)> {
        self.dead.iter().filter(|&&(p, j, _)| p == pos && j <= n).min_by_key(|&&(_, j, _)| j).map(|(_, j, why)| (*j, why.as_str()))
    }
}

/// Each active sequence's row masks for a window of `width` drafts
/// (CONSTRAIN-3): row `j` is masked with the state after the committed
/// output and `drafts[..j]`; `None` for an unconstrained request, a padding
/// row, a row past a draft the constraint refuses (never read), or a dead row.
pub(crate) fn window_masks(seqs: &[Seq], active: &[usize], drafts: &[Vec<u32>], width: usize, faults: Faults) -> WindowMasks {
    let mut out = WindowMasks { rows: Vec::with_capacity(active.len()), dead: Vec::new() };
    for (pos, &i) in active.iter().enumerate() {
        let s = &seqs[i];
        let (Some(c), Some(committed)) = (&s.req.constraint, s.constraint) else {
            out.rows.push(vec![None; width + 1]);
            continue;
        };
        let drafts = &drafts[pos];
        let mut rows = Vec::with_capacity(width + 1);
        let mut state = Some(committed);
        for j in 0..=width {
            let mask = match state {
                Some(st) if j <= drafts.len() && faults.masks_window_row(j) => {
                    let mut mask = c.allowed(st, &s.req.eos);
                    if faults.eos_outside_accept() {
                        s.req.eos.iter().for_each(|&e| mask[e as usize] = true);
                    }
                    if mask.contains(&true) {
                        Some(mask)
                    } else {
                        let why = format!("the constraint allows no token after {} output tokens: the vocabulary cannot continue `{}` there", s.out.len() + j, c.constraint().pattern());
                        out.dead.push((pos, j, why));
                        None
                    }
                }
                _ => None,
            };
            rows.push(mask);
            if j < drafts.len() && !faults.masks_from_committed_state() {
                state = state.and_then(|st| c.advance(st, drafts[j], &s.req.eos));
            }
        }
        out.rows.push(rows);
    }
    out
}

/// Moves a sequence's committed state over the `emitted` tokens its step
/// appended (CONSTRAIN-4); with the rollback fault, over every draft of the
/// step and then the last emitted token, as a matcher fed the drafts and
/// never rolled back would be.
pub(crate) fn commit_state(s: &mut Seq, emitted: usize, drafts: &[u32], faults: Faults) {
    let (Some(c), Some(state)) = (&s.req.constraint, s.constraint) else { return };
    let eos = &s.req.eos;
    let tokens: Vec<u32> =
        if faults.constraint_not_rolled_back() && !drafts.is_empty() { drafts.iter().copied().chain(s.out.last().copied()).collect() } else { s.out[s.out.len() - emitted..].to_vec() };
    s.constraint = tokens.iter().try_fold(state, |st, &t| c.advance(st, t, eos));
}
