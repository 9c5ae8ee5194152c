//! `specdec draft-data`: the training data of a draft model (issue: DFlash
//! training). Runs the target on any backend over the prompts of one split,
//! batched, decoding greedily, and stores each continuation with the
//! target's hidden states at the chosen layers ([`specdec_models::DraftData`]).
//!
//! The hidden rows come from the decoding itself: a `HiddenRecorder` sits
//! in the proposer's place, so the engine asks every target forward for those
//! layers and hands over the rows of the tokens it keeps; no second pass.
//!
//! A prompt file holds hundreds of prompts; a draft learns from millions of
//! tokens. `--synthesize N` adds N training prompts that the target writes
//! itself (Magpie, Xu et al. 2024): given only its chat template up to a
//! user turn, it samples a user message (temperature 1, request seeds
//! `seed, seed + 1, ..`), so the prompts follow the target's own idea of a
//! user and need no dataset. Messages that do not end in the template's
//! end-of-turn token, are blank, or repeat an earlier one are dropped; the
//! held-out split stays the file's hand-written prompts.

use std::path::PathBuf;

use indicatif::{ProgressBar, ProgressStyle};
use specdec_backend::SamplingParams;
use specdec_backend::model::ModelBackend;
use specdec_decoder::{Engine, EngineConfig, FinishReason, NoProposer, NoSink, Request, record_hidden};
use specdec_models::draft_data::{DraftData, DraftSequence};
use specdec_models::prompts::{DraftPrompt, read_prompts};
use specdec_models::{LlamaConfig, LoadedModel, Matrix, Tokenizer};

use specdec_registry::Job;

pub struct DraftDataJob {
    pub model: LoadedModel,
    pub prompts: PathBuf,
    pub split: String,
    pub layers: Vec<usize>,
    pub max_tokens: usize,
    pub batch: usize,
    /// Training prompts the target writes itself, besides the file's.
    pub synthesize: usize,
    /// The first request seed of the synthesis.
    pub seed: u64,
    pub out: PathBuf,
}

/// A synthesised user message has at most this many tokens.
const SYNTH_MAX_TOKENS: usize = 128;

/// `n` user messages sampled from the target (module doc), as chat prompts
/// of the training split numbered from `first_id`.
#[allow(clippy::too_many_arguments)]
fn synthesize_prompts<B: ModelBackend>(
    engine: &Engine<'_, B>,
    tok: &Tokenizer,
    cfg: &LlamaConfig,
    n: usize,
    seed: u64,
    batch: usize,
    first_id: usize,
    bar: &ProgressBar,
) -> Result<Vec<DraftPrompt>, String> {
    let prefix = tok.encode(&tok.chat_user_prefix().map_err(|e| e.to_string())?, false).map_err(|e| e.to_string())?;
    let sampling = SamplingParams::new(1.0, 0, 1.0);
    let mut seen = std::collections::HashSet::new();
    let mut prompts = Vec::new();
    for start in (0..n).step_by(batch) {
        let requests: Vec<Request> =
            (start..n.min(start + batch)).map(|i| Request { sampling, seed: seed.wrapping_add(i as u64), eos: cfg.eos_ids(), ..Request::greedy(prefix.clone(), SYNTH_MAX_TOKENS) }).collect();
        let run = engine.generate(&requests, &mut NoProposer, None, &mut NoSink).map_err(|e| e.to_string())?;
        for out in run.outputs.into_iter().filter(|o| o.finish == FinishReason::Eos) {
            let text = tok.decode(&out.tokens, true).map_err(|e| e.to_string())?.trim().to_string();
            if !text.is_empty() && seen.insert(text.clone()) {
                prompts.push(DraftPrompt { id: first_id + prompts.len(), split: "train".into(), kind: "synthetic".into(), chat: true, text });
            }
        }
        bar.inc(requests.len() as u64);
        bar.set_message(format!("{} prompts kept", prompts.len()));
    }
    Ok(prompts)
}

impl Job for DraftDataJob {
    type Out = Result<(), String>;

    fn run<B: ModelBackend>(&mut self, _name: &str, b: &B) -> Result<(), String> {
        if self.batch == 0 || self.max_tokens == 0 {
            return Err("--batch and --max-tokens must be at least 1".into());
        }
        let tok = self.model.tokenizer.as_ref().ok_or("this model has no tokenizer; the prompts are text")?;
        let weights = &self.model.weights;
        let cfg = &weights.config;
        if self.synthesize > 0 && self.split != "train" {
            return Err("--synthesize makes training prompts; the held-out split is the file's own".into());
        }
        let all = read_prompts::<DraftPrompt>(&self.prompts).map_err(|e| e.to_string())?;
        let first_id = all.iter().map(|p| p.id + 1).max().unwrap_or(0);
        let mut prompts: Vec<_> = all.into_iter().filter(|p| p.split == self.split).collect();
        if prompts.is_empty() {
            return Err(format!("{} has no prompt in split `{}`", self.prompts.display(), self.split));
        }
        let model = b.load_model(weights).map_err(|e| e.to_string())?;
        let engine = Engine::new(b, &model, cfg, EngineConfig { k: 0, ..EngineConfig::default() }).map_err(|e| e.to_string())?;
        let width = self.layers.len() * cfg.hidden_size;
        let style = |unit: &str| ProgressStyle::with_template(&format!("{{prefix:>10}} [{{bar:30}}] {{pos}}/{{len}} {unit} {{elapsed}} {{wide_msg}}")).expect("valid template").progress_chars("=> ");
        if self.synthesize > 0 {
            let bar = ProgressBar::new(self.synthesize as u64).with_style(style("requests"));
            bar.set_prefix("synthesize");
            let made = synthesize_prompts(&engine, tok, cfg, self.synthesize, self.seed, self.batch, first_id, &bar)?;
            bar.finish();
            println!("draft-data: {} of {} synthesised user messages kept (ended by end-of-turn, non-blank, distinct)", made.len(), self.synthesize);
            prompts.extend(made);
        }
        let bar = ProgressBar::new(prompts.len() as u64).with_style(style("prompts"));
        bar.set_prefix("draft-data");
        let mut sequences = Vec::with_capacity(prompts.len());
        let mut generated = 0;
        for chunk in prompts.chunks(self.batch) {
            let mut requests = Vec::with_capacity(chunk.len());
            for p in chunk {
                let ids = tok.prompt_ids(&p.text, p.chat).map_err(|e| e.to_string())?;
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
