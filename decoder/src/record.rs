//! A proposer that never proposes and records the target's hidden states:
//! the data source of draft training (a DFlash drafter learns from the
//! target's hidden rows at `target_layer_ids`, MODEL-9).
//!
//! With it the engine decodes plainly (the output is plain greedy or plain
//! sampled decoding) and, after the prefill and after every step, hands over
//! the hidden rows of the tokens that stay in the target cache. So when a
//! request finishes, its record holds one `K·hidden` row for every position
//! of prompt + output but the last (the last emitted token is never fed),
//! exactly the rows one forward over that sequence would return.

use rand_pcg::Pcg64;
use specdec_backend::model::ModelBackend;

use crate::error::DecodeError;
use crate::proposer::{Observed, Proposal, Proposer, SeqView};

/// Records `[positions, K·hidden]` rows per request.
#[derive(Debug, Clone)]
pub struct HiddenRecorder {
    layers: Vec<usize>,
    width: usize,
    rows: Vec<Vec<f64>>,
}

impl HiddenRecorder {
    /// Records the outputs of target layers `layers` (in this order) of a
    /// target whose hidden width is `hidden_size`.
    pub fn new(layers: Vec<usize>, hidden_size: usize) -> Result<Self, DecodeError> {
        if layers.is_empty() {
            return Err(DecodeError::Config("hidden recorder: no target layer to record".into()));
        }
        let width = layers.len() * hidden_size;
        Ok(HiddenRecorder { layers, width, rows: Vec::new() })
    }

    /// `K·hidden`: the width of one recorded row.
    pub fn width(&self) -> usize {
        self.width
    }

    /// Takes every request's rows, leaving the recorder empty.
    pub fn take(&mut self) -> Vec<Vec<f64>> {
        std::mem::take(&mut self.rows)
    }
}

impl<B: ModelBackend> Proposer<B> for HiddenRecorder {
    fn name(&self) -> String {
        "record-hidden".into()
    }

    fn hidden_layers(&self) -> &[usize] {
        &self.layers
    }

    fn begin(&mut self, _: &B, batch: usize, _: usize, _: usize) -> Result<(), DecodeError> {
        self.rows = vec![Vec::new(); batch];
        Ok(())
    }

    fn propose(&mut self, _: &B, seqs: &[SeqView<'_>], _: &mut [Pcg64]) -> Result<Proposal<B::Tensor>, DecodeError> {
        Ok(Proposal::none(seqs.len()))
    }

    fn observe(&mut self, backend: &B, observed: &Observed<'_, B::Tensor>) -> Result<(), DecodeError> {
        let name = "record-hidden";
        let hidden = observed.hidden.ok_or_else(|| DecodeError::proposer(name, "the target forward returned no hidden states"))?;
        let hidden = backend.download_f64(hidden)?;
        for s in observed.seqs {
            let rows = observed.plan.rows.iter().find(|r| r.seq == s.slot).ok_or_else(|| DecodeError::proposer(name, format!("no hidden rows for sequence {}", s.slot)))?;
            let kept =
                hidden.data().get(rows.token_row * self.width..(rows.token_row + s.kept) * self.width).ok_or_else(|| DecodeError::proposer(name, "the hidden output is shorter than its plan"))?;
            self.rows[s.slot].extend_from_slice(kept);
        }
        Ok(())
    }

    /// A new request in the slot starts its own rows.
    fn release(&mut self, _: &B, slot: usize) -> Result<(), DecodeError> {
        if let Some(rows) = self.rows.get_mut(slot) {
            rows.clear();
        }
        Ok(())
    }
}

/// One request decoded with its hidden rows recorded.
#[derive(Debug, Clone, PartialEq)]
pub struct Recorded {
    /// Prompt, then the generated tokens.
    pub tokens: Vec<u32>,
    pub prompt_len: usize,
    /// `[tokens - 1, K·hidden]` row-major: every position but the last.
    pub rows: Vec<f64>,
}

/// Decodes `requests` plainly on `engine`, recording the target's hidden
/// states at `layers` (of a target with hidden width `hidden_size`).
pub fn record_hidden<B: ModelBackend>(engine: &crate::engine::Engine<'_, B>, requests: &[crate::request::Request], layers: &[usize], hidden_size: usize) -> Result<Vec<Recorded>, DecodeError> {
    let mut recorder = HiddenRecorder::new(layers.to_vec(), hidden_size)?;
    let run = engine.generate(requests, &mut recorder, None, &mut crate::sink::NoSink)?;
    let width = recorder.width();
    requests
        .iter()
        .zip(run.outputs)
        .zip(recorder.take())
        .map(|((r, out), rows)| {
            let tokens: Vec<u32> = r.prompt.iter().chain(&out.tokens).copied().collect();
            if rows.len() != (tokens.len() - 1) * width {
                return Err(DecodeError::Internal(format!("recorded {} hidden values for {} positions of width {width}", rows.len(), tokens.len() - 1)));
            }
            Ok(Recorded { tokens, prompt_len: r.prompt.len(), rows })
        })
        .collect()
}
