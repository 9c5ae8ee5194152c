//! `specdec generate`: decoding of one prompt on any backend, plain or
//! speculative (MODEL-15, DECODE-1 .. DECODE-8), through the backend-generic
//! engine of `specdec-decoder`. Text streams to stdout as it is generated;
//! `--json` prints one object instead. Temperature 0 is greedy with ties to
//! the lowest id; otherwise sampling runs on the device with noise from the
//! request's own PCG64 streams seeded by `--seed`, so a run is reproducible.
//! `--compare` also runs plain decoding and reports the speedup.
//! `--logprobs N` reports each token's logprob and its `N` most likely
//! alternatives (LOGPROB-1 .. LOGPROB-4), raw or processed, after the text
//! (in `--json`, under `logprobs`); with `--compare`, the largest difference
//! from plain decoding's.

use std::io::Write as _;
use std::sync::Arc;
use std::time::Instant;

use serde_json::json;
use specdec_backend::model::ModelBackend;
use specdec_backend::{PenaltyScope, SamplingParams};
use specdec_decoder::{Constrained, ConstraintSpec, Engine, EngineConfig, LogprobMode, LogprobRequest, MAX_TOP_LOGPROBS, ProposerChoice, Request, RunOutput, TokenLogprob, TokenTable};
use specdec_models::{LlamaWeights, Tokenizer};

use specdec_registry::Job;

/// The request of one `specdec generate`.
pub struct Generate {
    /// The target, shared with a DFlash drafter (which reads its head).
    pub weights: Arc<LlamaWeights>,
    pub tokenizer: Option<Tokenizer>,
    pub prompt: String,
    pub chat: bool,
    pub max_tokens: usize,
    pub sampling: SamplingParams,
    pub logit_bias: Vec<(u32, f64)>,
    pub seed: u64,
    pub json: bool,
    pub proposer: ProposerChoice,
    pub k: usize,
    /// The pay-off controller picks each step's k in `0 ..= k` (CTRL-7).
    pub payoff: bool,
    pub compare: bool,
    pub logprobs: Option<LogprobRequest>,
    /// The constraint the output text must match (CONSTRAIN-1 .. CONSTRAIN-4).
    pub constraint: Option<ConstraintSpec>,
}

/// `--regex R`, `--json-schema FILE` or `--grammar FILE` (one at most),
/// read and checked.
pub fn constraint_flags(regex: Option<String>, json_schema: Option<&std::path::Path>, grammar: Option<&std::path::Path>) -> Result<Option<ConstraintSpec>, String> {
    let read = |flag: &str, path: &std::path::Path| std::fs::read_to_string(path).map_err(|e| format!("{flag} {}: {e}", path.display()));
    let spec = match (regex, json_schema, grammar) {
        (None, None, None) => return Ok(None),
        (Some(r), None, None) => ConstraintSpec::Regex(r),
        (None, Some(path), None) => ConstraintSpec::JsonSchema(serde_json::from_str(&read("--json-schema", path)?).map_err(|e| format!("--json-schema {}: {e}", path.display()))?),
        (None, None, Some(path)) => ConstraintSpec::grammar(&read("--grammar", path)?).map_err(|e| format!("--grammar {}: {e}", path.display()))?,
        _ => return Err("give only one of --regex, --json-schema and --grammar".into()),
    };
    // Compiled once here so a bad pattern or schema fails before the model loads.
    specdec_constraint::Constraint::new(&spec).map_err(|e| format!("--{}: {e}", spec.kind().replace('_', "-")))?;
    Ok(Some(spec))
}

/// A request's constraint over `tok`'s tokens, the model's vocabulary of
/// `vocab` ids (ids past the tokenizer's are not text).
pub fn constrained(spec: &ConstraintSpec, tok: &Tokenizer, vocab: usize) -> Result<Constrained, String> {
    Constrained::new(spec.clone(), TokenTable::of_tokenizer(tok, vocab)?).map_err(|e| e.to_string())
}

/// `--controller`: `payoff` or `fixed`; unset, `payoff` for greedy decoding
/// and `fixed` when sampling (a seeded sampled run then repeats its tokens
/// on any machine).
pub fn payoff_controller(flag: Option<&str>, sampling: &SamplingParams) -> Result<bool, String> {
    match flag {
        None => Ok(sampling.temperature == 0.0),
        Some("payoff") => Ok(true),
        Some("fixed") => Ok(false),
        Some(other) => Err(format!("--controller {other:?} must be `payoff` or `fixed`")),
    }
}

impl Generate {
    /// Checks the request before any work (ERR-1: no silent clamping); the
    /// sampling parameters were checked when they were read.
    pub fn validate(&self) -> Result<(), String> {
        if self.max_tokens == 0 {
            return Err("--max-tokens must be at least 1".into());
        }
        if self.k == 0 || self.k > specdec_decoder::engine::MAX_K {
            return Err(format!("--k {} must be in [1, {}]", self.k, specdec_decoder::engine::MAX_K));
        }
        Ok(())
    }
}

/// The largest difference between two runs' entries at the positions both
/// have with the same token (chosen and alternatives, by id); infinite where
/// one lists an alternative the other does not.
fn largest_difference(a: &[TokenLogprob], b: &[TokenLogprob]) -> f64 {
    let mut worst: f64 = 0.0;
    for (x, y) in a.iter().zip(b).take_while(|(x, y)| x.id == y.id) {
        worst = worst.max((x.logprob - y.logprob).abs());
        for &(id, lp) in &x.top {
            worst = worst.max(y.top.iter().find(|(j, _)| *j == id).map_or(f64::INFINITY, |(_, m)| (lp - m).abs()));
        }
    }
    worst
}

/// The sampling flags of `specdec generate` (LOGITS-1 .. LOGITS-12).
#[derive(Debug, Clone, clap::Args)]
pub struct SamplingArgs {
    /// 0 is greedy (ties to the lowest id).
    #[arg(long, default_value_t = 0.0)]
    pub temperature: f64,
    /// 0 disables top-k.
    #[arg(long, default_value_t = 0)]
    pub top_k: usize,
    #[arg(long, default_value_t = 1.0)]
    pub top_p: f64,
    /// Keep ids at least this fraction of the most likely one (after
    /// temperature, top-k and top-p); 0 disables.
    #[arg(long, default_value_t = 0.0)]
    pub min_p: f64,
    /// Divides positive and multiplies negative logits of counted ids (HF,
    /// llama.cpp); 1 disables.
    #[arg(long, default_value_t = 1.0)]
    pub repetition_penalty: f64,
    /// Subtracted once from the logit of every counted id (OpenAI).
    #[arg(long, default_value_t = 0.0)]
    pub presence_penalty: f64,
    /// Subtracted per occurrence from the logit of every counted id (OpenAI).
    #[arg(long, default_value_t = 0.0)]
    pub frequency_penalty: f64,
    /// What the penalties count: `context` (prompt and generated) or `generated`.
    #[arg(long, default_value = "context")]
    pub penalty_scope: String,
    /// `ID:BIAS`, added to that id's logit before everything; repeatable.
    #[arg(long = "logit-bias", value_name = "ID:BIAS")]
    pub logit_bias: Vec<String>,
    /// Reports each token's logprob and this many alternatives (0 ..= 20).
    #[arg(long)]
    pub logprobs: Option<usize>,
    /// `raw` (the model's distribution) or `processed` (the one sampled from).
    #[arg(long, default_value = "raw")]
    pub logprobs_mode: String,
}

impl SamplingArgs {
    /// The parameters, checked (LOGITS-1), named by their flags.
    pub fn params(&self) -> Result<SamplingParams, String> {
        let penalty_scope = PenaltyScope::from_name(&self.penalty_scope).ok_or_else(|| format!("--penalty-scope {:?} must be `context` or `generated`", self.penalty_scope))?;
        let params = SamplingParams {
            min_p: self.min_p,
            repetition_penalty: self.repetition_penalty,
            presence_penalty: self.presence_penalty,
            frequency_penalty: self.frequency_penalty,
            penalty_scope,
            ..SamplingParams::new(self.temperature, self.top_k, self.top_p)
        };
        params.validate().map_err(|e| match e {
            specdec_backend::SpecError::InvalidParameter { name, value, reason } => format!("--{} {value} {reason}", name.replace('_', "-")),
            other => other.to_string(),
        })?;
        Ok(params)
    }

    /// `--logprobs N --logprobs-mode MODE`, checked.
    pub fn logprobs(&self) -> Result<Option<LogprobRequest>, String> {
        let mode = LogprobMode::from_name(&self.logprobs_mode).ok_or_else(|| format!("--logprobs-mode {:?} must be `raw` or `processed`", self.logprobs_mode))?;
        match self.logprobs {
            Some(top) if top > MAX_TOP_LOGPROBS => Err(format!("--logprobs {top} must be at most {MAX_TOP_LOGPROBS}")),
            Some(top) => Ok(Some(LogprobRequest { top, mode })),
            None => Ok(None),
        }
    }

    /// `--logit-bias ID:BIAS` pairs, parsed (the model checks the ids and
    /// repeats, LOGITS-7, before it runs).
    pub fn logit_bias(&self) -> Result<Vec<(u32, f64)>, String> {
        self.logit_bias
            .iter()
            .map(|pair| {
                let bad = || format!("--logit-bias {pair:?} must be ID:BIAS, an id and a finite number");
                let (id, bias) = pair.split_once(':').ok_or_else(bad)?;
                let (id, bias) = (id.trim().parse::<u32>().map_err(|_| bad())?, bias.trim().parse::<f64>().map_err(|_| bad())?);
                if bias.is_finite() { Ok((id, bias)) } else { Err(bad()) }
            })
            .collect()
    }
}

/// Per-run metrics as JSON (DECODE-8).
fn metrics(run: &RunOutput) -> serde_json::Value {
    let a = &run.acceptance;
    let o = &run.outputs[0];
    let t = &run.timings;
    json!({
        "acceptance": a.acceptance_rate(),
        "acceptance_per_position": a.rate_per_position(),
        "mean_accepted": a.mean_accepted(),
        "tokens_per_step": a.tokens_per_step(),
        "steps": a.steps,
        "plain_steps": a.plain_steps,
        "proposed": a.proposed,
        "accepted": a.accepted,
        "timings": {
            "prefill_ms": t.prefill_s * 1e3,
            "propose_ms": t.propose_s * 1e3,
            "verify_ms": t.verify_s * 1e3,
            "rest_ms": t.rest_s * 1e3,
            "decode_tokens": o.tokens.len(),
            "decode_tokens_per_s": run.decode_tokens_per_s(),
        },
    })
}

impl Job for Generate {
    type Out = Result<(), String>;

    fn run<B: ModelBackend>(&mut self, _name: &str, b: &B) -> Result<(), String> {
        let tok = self.tokenizer.as_ref().ok_or("this model has no tokenizer; generate needs one to read the prompt")?;
        let weights = &self.weights;
        let cfg = &weights.config;
        let text = if self.chat { tok.chat_prompt(&self.prompt).map_err(|e| e.to_string())? } else { self.prompt.clone() };
        let prompt_ids = tok.encode(&text, false).map_err(|e| e.to_string())?;
        if prompt_ids.is_empty() {
            return Err("the prompt encodes to no tokens".into());
        }
        if prompt_ids.len() + self.max_tokens > cfg.max_position_embeddings {
            return Err(format!("{} prompt tokens + --max-tokens {} exceed the model's {} positions", prompt_ids.len(), self.max_tokens, cfg.max_position_embeddings));
        }
        let load_start = Instant::now();
        let model = b.load_model(weights).map_err(|e| e.to_string())?;
        let mut proposer = self.proposer.build(b, weights, self.k).map_err(|e| e.to_string())?;
        let load_ms = load_start.elapsed().as_secs_f64() * 1e3;
        let k = if self.proposer == ProposerChoice::None { 0 } else { self.k };
        let payoff = self.payoff && k > 0;
        let engine = Engine::new(b, &model, cfg, EngineConfig { k, payoff, ..EngineConfig::default() }).map_err(|e| e.to_string())?;
        let request = Request {
            sampling: self.sampling,
            logit_bias: self.logit_bias.clone(),
            seed: self.seed,
            eos: cfg.eos_ids(),
            logprobs: self.logprobs,
            constraint: self.constraint.as_ref().map(|c| constrained(c, tok, cfg.vocab_size)).transpose()?,
            ..Request::greedy(prompt_ids.clone(), self.max_tokens)
        };
        let stdout = std::io::stdout();
        let (mut streamed, mut printed) = (Vec::<u32>::new(), String::new());
        let mut sink = |_: usize, ids: &[u32]| {
            if self.json {
                return;
            }
            // Decode the whole output and print what is new, so a multi-byte
            // character split across tokens prints once, whole; stop tokens are not text.
            streamed.extend(ids.iter().filter(|t| !request.eos.contains(t)));
            if let Ok(now) = tok.decode(&streamed, true)
                && now.starts_with(&printed)
                && !now.ends_with('\u{FFFD}')
            {
                let mut lock = stdout.lock();
                let _ = write!(lock, "{}", &now[printed.len()..]);
                let _ = lock.flush();
                printed = now;
            }
        };
        let run = engine.generate(std::slice::from_ref(&request), proposer.as_mut(), None, &mut sink).map_err(|e| e.to_string())?;
        let out = &run.outputs[0];
        if let Some(why) = &out.error {
            return Err(format!("after {} tokens: {why}", out.tokens.len()));
        }
        let plain = if self.compare && self.proposer != ProposerChoice::None {
            let engine = Engine::new(b, &model, cfg, EngineConfig { k: 0, ..EngineConfig::default() }).map_err(|e| e.to_string())?;
            Some(engine.generate(std::slice::from_ref(&request), &mut specdec_decoder::NoProposer, None, &mut specdec_decoder::NoSink).map_err(|e| e.to_string())?)
        } else {
            None
        };
        let text = tok.decode(&out.tokens, true).map_err(|e| e.to_string())?;
        let proposer_name = if self.proposer == ProposerChoice::None { "none".to_string() } else { proposer.name() };
        let comparison = plain.as_ref().map(|p| {
            let same = p.outputs[0].tokens == out.tokens;
            let speedup = run.decode_tokens_per_s() / p.decode_tokens_per_s().max(f64::MIN_POSITIVE);
            (same, speedup, p)
        });
        // Speculation against plain decoding, position by position where both have the token.
        let logprob_diff = match (&out.logprobs, plain.as_ref().and_then(|p| p.outputs[0].logprobs.as_ref())) {
            (Some(on), Some(off)) => Some(largest_difference(on, off)),
            _ => None,
        };
        let token_text = |id: u32| tok.decode(&[id], false).unwrap_or_default();
        // Whether the output keeps its constraint: every token allowed in turn, a match where it ended.
        let kept = request.constraint.as_ref().map(|c| {
            let state = specdec_constraint::state_after(c.constraint(), &out.tokens, c.table().vocabulary(), &request.eos);
            (state.is_some(), state.is_some_and(|s| c.constraint().accepts(s)))
        });
        if self.json {
            let mut obj = json!({
                "backend": b.name(),
                "proposer": proposer_name,
                "k": k,
                "controller": if payoff { "payoff" } else { "fixed" },
                "steps_by_k": run.steps_by_k,
                "prompt_ids": prompt_ids,
                "token_ids": out.tokens,
                "text": text,
                "finish_reason": out.finish.name(),
                "load_ms": load_ms,
            });
            let m = metrics(&run);
            for key in ["acceptance", "acceptance_per_position", "mean_accepted", "tokens_per_step", "steps", "plain_steps", "proposed", "accepted", "timings"] {
                obj[key] = m[key].clone();
            }
            if let Some((same, speedup, p)) = &comparison {
                obj["compare"] = json!({
                    "plain_token_ids": p.outputs[0].tokens,
                    "identical_tokens": same,
                    "plain_decode_tokens_per_s": p.decode_tokens_per_s(),
                    "speedup": speedup,
                });
                if let Some(d) = logprob_diff {
                    obj["compare"]["max_logprob_difference"] = json!(d);
                }
            }
            if let (Some(spec), Some((allowed, matches))) = (&self.constraint, kept) {
                obj["constraint"] = json!({"kind": spec.kind(), "every_token_allowed": allowed, "matches": matches});
            }
            if let Some(entries) = &out.logprobs {
                let entry = |id: u32, lp: f64| json!({"id": id, "token": token_text(id), "logprob": lp});
                obj["logprobs"] =
                    entries.iter().map(|e| json!({"id": e.id, "token": token_text(e.id), "logprob": e.logprob, "top": e.top.iter().map(|&(id, lp)| entry(id, lp)).collect::<Vec<_>>()})).collect();
            }
            // A closed pipe (`| head`) is not an error of ours.
            let _ = writeln!(stdout.lock(), "{}", serde_json::to_string_pretty(&obj).map_err(|e| e.to_string())?);
        } else {
            let _ = writeln!(stdout.lock());
            let a = &run.acceptance;
            eprintln!(
                "[{} tokens, finish {}; {} on {}, k {k}{}: {} steps, acceptance {:.2}, {:.2} tokens/step; decode {:.1} tokens/s; prefill {} tokens in {:.0} ms]",
                out.tokens.len(),
                out.finish.name(),
                proposer_name,
                b.name(),
                if payoff { format!(" (pay-off controller; steps by k {:?})", run.steps_by_k) } else { String::new() },
                a.steps,
                a.acceptance_rate(),
                a.tokens_per_step(),
                run.decode_tokens_per_s(),
                prompt_ids.len(),
                run.timings.prefill_s * 1e3,
            );
            if let Some((same, speedup, p)) = &comparison {
                let logprobs = logprob_diff.map_or(String::new(), |d| format!("; logprobs differ by at most {d:.3e}"));
                eprintln!("[compare: plain decoding {:.1} tokens/s; tokens {}; speedup {speedup:.2}x{logprobs}]", p.decode_tokens_per_s(), if *same { "identical" } else { "DIFFER" });
            }
            if let (Some(spec), Some((allowed, matches))) = (&self.constraint, kept) {
                eprintln!(
                    "[constraint {}: {}]",
                    spec.kind(),
                    if matches {
                        "the output matches"
                    } else if allowed {
                        "every token allowed; no match yet where the output ended"
                    } else {
                        "BROKEN: a token the constraint refuses"
                    }
                );
            }
            for (t, e) in out.logprobs.iter().flatten().enumerate() {
                let top: Vec<String> = e.top.iter().map(|&(id, lp)| format!("{id} {:?} {lp:.4}", token_text(id))).collect();
                eprintln!("[logprob {t:>4}: {} {:?} {:.4}; top: {}]", e.id, token_text(e.id), e.logprob, top.join(", "));
            }
        }
        match comparison {
            Some((false, _, _)) if self.sampling.temperature == 0.0 => Err("speculative and plain greedy tokens differ".into()),
            _ => Ok(()),
        }
    }
}
