//! `specdec generate`: plain decoding of one prompt on any backend
//! (MODEL-15). Text streams to stdout as it is generated; `--json` prints
//! one object instead. Temperature 0 is greedy with ties to the lowest id;
//! otherwise the backend's `process_logits` (temperature, top-k, top-p) and
//! `draw` run on the device with uniforms from the request's own PCG64
//! stream, seeded by `--seed`, so a run is reproducible.

use std::io::Write as _;
use std::time::Instant;

use rand::{RngExt, SeedableRng};
use rand_pcg::Pcg64;
use serde_json::json;
use specdec_backend::model::{ForwardRequest, ModelBackend};
use specdec_backend::{DrawNoiseArg, HostTensor, LogitsParams};
use specdec_conformance::model_section::top2;
use specdec_models::LoadedModel;

use crate::backends::Job;

/// The request of one `specdec generate`.
pub struct Generate {
    pub model: LoadedModel,
    pub prompt: String,
    pub chat: bool,
    pub max_tokens: usize,
    pub temperature: f64,
    pub top_k: usize,
    pub top_p: f64,
    pub seed: u64,
    pub json: bool,
}

impl Generate {
    /// Checks the sampling parameters before any work (ERR-1: no silent clamping).
    pub fn validate(&self) -> Result<(), String> {
        if !(self.temperature.is_finite() && self.temperature >= 0.0) {
            return Err(format!("--temperature {} must be a finite number >= 0", self.temperature));
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return Err(format!("--top-p {} must be in (0, 1]", self.top_p));
        }
        if self.max_tokens == 0 {
            return Err("--max-tokens must be at least 1".into());
        }
        Ok(())
    }
}

impl Job for Generate {
    type Out = Result<(), String>;

    fn run<B: ModelBackend>(&self, b: &B) -> Result<(), String> {
        let tok = self.model.tokenizer.as_ref().ok_or("this model has no tokenizer; generate needs one to read the prompt")?;
        let cfg = &self.model.weights.config;
        let text = if self.chat { tok.chat_prompt(&self.prompt).map_err(|e| e.to_string())? } else { self.prompt.clone() };
        let prompt_ids = tok.encode(&text, false).map_err(|e| e.to_string())?;
        if prompt_ids.is_empty() {
            return Err("the prompt encodes to no tokens".into());
        }
        let capacity = prompt_ids.len() + self.max_tokens;
        if capacity > cfg.max_position_embeddings {
            return Err(format!("{} prompt tokens + --max-tokens {} exceed the model's {} positions", prompt_ids.len(), self.max_tokens, cfg.max_position_embeddings));
        }
        let load_start = Instant::now();
        let model = b.load_model(&self.model.weights).map_err(|e| e.to_string())?;
        let load_ms = load_start.elapsed().as_secs_f64() * 1e3;
        let mut cache = b.new_model_cache(&model, 1, capacity).map_err(|e| e.to_string())?;
        let mut rng = Pcg64::seed_from_u64(self.seed);
        let eos = cfg.eos_ids();
        let (mut tokens, mut printed) = (Vec::<u32>::new(), String::new());
        let mut input = vec![prompt_ids.clone()];
        let (mut prefill_ms, mut decode_ms) = (0.0, 0.0);
        let mut finish = "length";
        let stdout = std::io::stdout();
        while tokens.len() < self.max_tokens {
            let step = Instant::now();
            let out = b.forward(&model, &mut cache, &ForwardRequest::last_logits(&input)).map_err(|e| e.to_string())?;
            let logits = out.logits.ok_or("the backend returned no logits")?;
            let id = self.next_token(b, &logits, &mut rng)?;
            let ms = step.elapsed().as_secs_f64() * 1e3;
            if tokens.is_empty() { prefill_ms += ms } else { decode_ms += ms }
            tokens.push(id);
            if eos.contains(&id) {
                finish = "eos";
                break;
            }
            if !self.json {
                // Decode the whole output and print what is new, so a
                // multi-byte character split across tokens prints once whole.
                let now = tok.decode(&tokens, true).map_err(|e| e.to_string())?;
                if now.starts_with(&printed) && !now.ends_with('\u{FFFD}') {
                    let mut lock = stdout.lock();
                    let _ = write!(lock, "{}", &now[printed.len()..]);
                    let _ = lock.flush();
                    printed = now;
                }
            }
            input = vec![vec![id]];
        }
        let text = tok.decode(&tokens, true).map_err(|e| e.to_string())?;
        let decoded = tokens.len().saturating_sub(1);
        if self.json {
            let obj = json!({
                "backend": b.name(),
                "prompt_ids": prompt_ids,
                "token_ids": tokens,
                "text": text,
                "finish_reason": finish,
                "timings": {
                    "load_ms": load_ms,
                    "prefill_ms": prefill_ms,
                    "prefill_tokens": prompt_ids.len(),
                    "decode_ms": decode_ms,
                    "decode_tokens": decoded,
                    "decode_tokens_per_s": if decode_ms > 0.0 { decoded as f64 / decode_ms * 1e3 } else { 0.0 },
                },
            });
            // A closed pipe (`| head`) is not an error of ours.
            let _ = writeln!(stdout.lock(), "{}", serde_json::to_string_pretty(&obj).map_err(|e| e.to_string())?);
        } else {
            let rest = if text.len() > printed.len() && text.starts_with(&printed) { &text[printed.len()..] } else { "" };
            let _ = writeln!(stdout.lock(), "{rest}");
            eprintln!(
                "[{} tokens, finish {finish}; prefill {} tokens in {prefill_ms:.0} ms, decode {:.1} tokens/s on {}]",
                tokens.len(),
                prompt_ids.len(),
                if decode_ms > 0.0 { decoded as f64 / decode_ms * 1e3 } else { 0.0 },
                b.name()
            );
        }
        Ok(())
    }
}

impl Generate {
    /// Greedy (ties to the lowest id) at temperature 0, else processed
    /// logits and an inverse-CDF draw on the device.
    fn next_token<B: ModelBackend>(&self, b: &B, logits: &B::Tensor, rng: &mut Pcg64) -> Result<u32, String> {
        if self.temperature == 0.0 {
            let row = b.download_f64(logits).map_err(|e| e.to_string())?;
            return Ok(top2(row.data()).0 as u32);
        }
        let up_f = |v: f64| b.upload_f64(&HostTensor::from_vec(vec![v])).map_err(|e| e.to_string());
        let temperature = up_f(self.temperature)?;
        let top_p = up_f(self.top_p)?;
        let top_k = b.upload_i64(&HostTensor::from_vec(vec![self.top_k as i64])).map_err(|e| e.to_string())?;
        let probs = b.process_logits(logits, LogitsParams { temperature: &temperature, top_k: &top_k, top_p: &top_p }).map_err(|e| e.to_string())?;
        let u = up_f(rng.random::<f64>())?;
        let id = b.draw(&probs, DrawNoiseArg::InverseCdf(&u)).map_err(|e| e.to_string())?;
        let id = b.download_i64(&id).map_err(|e| e.to_string())?;
        Ok(id.data()[0] as u32)
    }
}
