//! `specdec draft-data`: the training data of a draft model (issue: DFlash
//! training). Runs the target on any backend over the prompts of one split,
//! batched, decoding greedily, and stores each continuation with the
//! target's hidden states at the chosen layers ([`specdec_models::DraftData`]).
//!
//! The hidden rows come from the decoding itself: a `HiddenRecorder` sits
//! in the proposer's place, so the engine asks every target forward for those
//! layers and hands over the rows of the tokens it keeps; no second pass.

use std::path::PathBuf;

use indicatif::{ProgressBar, ProgressStyle};
use specdec_backend::model::ModelBackend;
use specdec_decoder::{Engine, EngineConfig, Request, record_hidden};
use specdec_models::draft_data::{DraftData, DraftSequence, read_prompts};
use specdec_models::{LoadedModel, Matrix};

use crate::backends::Job;

pub struct DraftDataJob {
    pub model: LoadedModel,
    pub prompts: PathBuf,
    pub split: String,
    pub layers: Vec<usize>,
    pub max_tokens: usize,
    pub batch: usize,
    pub out: PathBuf,
}

impl Job for DraftDataJob {
    type Out = Result<(), String>;

    fn run<B: ModelBackend>(&self, b: &B) -> Result<(), String> {
        if self.batch == 0 || self.max_tokens == 0 {
            return Err("--batch and --max-tokens must be at least 1".into());
        }
        let tok = self.model.tokenizer.as_ref().ok_or("this model has no tokenizer; the prompts are text")?;
        let weights = &self.model.weights;
        let cfg = &weights.config;
        let prompts: Vec<_> = read_prompts(&self.prompts).map_err(|e| e.to_string())?.into_iter().filter(|p| p.split == self.split).collect();
        if prompts.is_empty() {
            return Err(format!("{} has no prompt in split `{}`", self.prompts.display(), self.split));
        }
        let model = b.load_model(weights).map_err(|e| e.to_string())?;
        let engine = Engine::new(b, &model, cfg, EngineConfig { k: 0, ..EngineConfig::default() }).map_err(|e| e.to_string())?;
        let width = self.layers.len() * cfg.hidden_size;
        let bar = ProgressBar::new(prompts.len() as u64)
            .with_style(ProgressStyle::with_template("{prefix:>10} [{bar:30}] {pos}/{len} prompts {elapsed} {wide_msg}").expect("valid template").progress_chars("=> "));
        bar.set_prefix("draft-data");
        let mut sequences = Vec::with_capacity(prompts.len());
        let mut generated = 0;
        for chunk in prompts.chunks(self.batch) {
            let mut requests = Vec::with_capacity(chunk.len());
            for p in chunk {
                let text = if p.chat { tok.chat_prompt(&p.text).map_err(|e| e.to_string())? } else { p.text.clone() };
                let ids = tok.encode(&text, false).map_err(|e| e.to_string())?;
                requests.push(Request { eos: cfg.eos_ids(), ..Request::greedy(ids, self.max_tokens) });
            }
            for (p, rec) in chunk.iter().zip(record_hidden(&engine, &requests, &self.layers, cfg.hidden_size).map_err(|e| e.to_string())?) {
                let hidden = Matrix::new(vec![rec.tokens.len() - 1, width], rec.rows.into_iter().map(|v| v as f32).collect(), "hidden").map_err(|e| e.to_string())?;
                generated += rec.tokens.len() - rec.prompt_len;
                sequences.push(DraftSequence { prompt_id: p.id, kind: p.kind.clone(), tokens: rec.tokens, prompt_len: rec.prompt_len, hidden });
            }
            bar.inc(chunk.len() as u64);
            bar.set_message(format!("{generated} tokens generated"));
        }
        bar.finish();
        let data = DraftData { target_layer_ids: self.layers.clone(), hidden_size: cfg.hidden_size, vocab_size: cfg.vocab_size, sequences };
        data.write(&self.out).map_err(|e| e.to_string())?;
        println!("draft-data: {} sequences, {generated} generated tokens, layers {:?}, on {}, written to {}", data.sequences.len(), self.layers, b.name(), self.out.display());
        Ok(())
    }
}
