//! The commit of a verified step: each sequence emits its tokens up to a
//! stop condition (DECODE-6, DECODE-7), the target cache keeps exactly the
//! prompt and the emitted tokens but the last (DECODE-5, KV-6; with the
//! min-accepted policy every sequence keeps the batch's smallest accepted
//! count, KV-7), and the step's draft counts are recorded once.

use specdec_backend::model::ModelBackend;

use crate::config::{EngineConfig, Rollback};
use crate::error::DecodeError;
use crate::fault::Faults;
use crate::masks::WindowMasks;
use crate::request::{Acceptance, FinishReason};
use crate::seq::Seq;
use crate::sink::Sink;
use crate::stop::{Appended, Detokenize};
use crate::verify::Verdict;
use specdec_reference::TokenLogprob;

/// What a step committed: each active sequence's emitted count (in active
/// order) and the step's draft counts over the active sequences.
pub(crate) struct Committed {
    pub(crate) kept: Vec<usize>,
    pub(crate) counts: Acceptance,
}

/// Emits, trims the cache and counts; `proposed[pos]` is each active sequence's draft count.
#[allow(clippy::too_many_arguments)]
pub(crate) fn commit<B: ModelBackend>(
    b: &B,
    cache: &mut B::ModelCache,
    config: &EngineConfig,
    seqs: &mut [Seq],
    active: &[usize],
    proposed: &[usize],
    verdict: &Verdict,
    masks: &WindowMasks,
    logprobs: Vec<Vec<TokenLogprob>>,
    detok: Option<&dyn Detokenize>,
    sink: &mut dyn Sink,
) -> Result<Committed, DecodeError> {
    let faults = config.faults();
    let shared = match config.rollback {
        Rollback::PerSequence => None,
        Rollback::MinAccepted => verdict.num_accepted.iter().min().copied(),
    };
    let mut amounts = vec![0usize; seqs.len()];
    let mut counts = Acceptance::default();
    let mut kept = Vec::with_capacity(active.len());
    for ((pos, &i), mut entries) in active.iter().enumerate().zip(logprobs) {
        let n = shared.unwrap_or(verdict.num_accepted[pos]);
        counts.record(proposed[pos], n);
        seqs[i].acceptance.record(proposed[pos], n);
        // The forward appended the last token and the drafts; keep the last
        // token and the emitted ones but the new last (KV-6), fewer when a
        // stop cut the run (DECODE-5).
        // A row whose constraint allows nothing was read: the run stops at
        // the tokens before it and the request fails there, alone, as plain
        // decoding would after emitting them (CONSTRAIN-2).
        let cut = masks.cut(pos, n);
        let run = &verdict.tokens[pos][..=n];
        let emitted = emit(&mut seqs[i], i, cut.map_or(run, |(j, _)| &run[..j]), faults, detok, sink);
        if let Some((_, why)) = cut
            && seqs[i].finish.is_none()
        {
            seqs[i].finish = Some(FinishReason::Error);
            seqs[i].error = Some(why.to_string());
        }
        // One entry per emitted token: none past a stop that cut the run (LOGPROB-3).
        entries.truncate(if faults.logprobs_past_stop() { n + 1 } else { emitted });
        seqs[i].logprobs.extend(entries);
        amounts[i] = 1 + proposed[pos] - emitted + faults.extra_trim();
        kept.push(emitted);
    }
    b.cache_trim(cache, &amounts)?;
    Ok(Committed { kept, counts })
}

/// Appends a step's tokens to a sequence until a stop condition holds;
/// returns how many were emitted.
fn emit(s: &mut Seq, slot: usize, tokens: &[u32], faults: Faults, detok: Option<&dyn Detokenize>, sink: &mut dyn Sink) -> usize {
    let start = s.out.len();
    if tokens.is_empty() {
        return 0;
    }
    let reaches_cap = start + tokens.len() >= s.req.max_tokens;
    for (j, &t) in tokens.iter().enumerate() {
        s.out.push(t);
        s.context.push(t);
        let inside = j + 1 < tokens.len();
        let detok = if (inside && faults.stop_at_run_end_only()) || (reaches_cap && faults.length_before_stop()) { None } else { detok };
        match s.stop.check(&s.out, detok) {
            Appended::Finished(FinishReason::Eos) if inside && faults.emits_past_eos() => {}
            Appended::Finished(FinishReason::Length) if inside && faults.emits_past_length() => {}
            Appended::Finished(reason) => {
                s.finish = Some(faults.reported(reason));
                break;
            }
            Appended::Continue => {}
        }
    }
    sink.emit(slot, &s.out[start..]);
    s.out.len() - start
}
