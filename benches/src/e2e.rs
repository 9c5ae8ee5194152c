//! End-to-end speedup of speculative decoding on SmolLM2: for each backend,
//! proposer, prompt and `k`, the decoder's tokens per second against plain
//! decoding of the same prompt on the same backend in the same run, the
//! acceptance it measured, the cost ratio `c` it measured, and the speedup
//! the theory predicts from those two (THEORY-2, THEORY-3), with the best
//! `k` by THEORY-4 next to the best measured one.
//!
//! Each configuration is one multi-second greedy run timed by the decoder's
//! own clock (`RunOutput::timings`, prefill excluded): criterion's ten
//! samples per configuration would not fit the report's time budget. Greedy
//! runs must be token-identical to plain decoding: the bench fails on the
//! first that is not, so every row of a report is a lossless run.
//!
//! Each proposer also runs once per prompt under the pay-off controller
//! (CTRL-7 .. CTRL-10, `specdec generate`'s default for greedy decoding),
//! which picks each step's `k` in `0 ..= K` (`K` the largest swept): its rows
//! say what speculation gives when it is allowed to step back where it
//! does not pay.

use std::sync::Arc;

use serde::Serialize;
use specdec_backend::SamplingParams;
use specdec_backend::model::{LlamaWeights, ModelBackend};
use specdec_decoder::{Engine, EngineConfig, NoSink, ProposerChoice, Request, RunOutput};
use specdec_reference::theory;

/// The prompts of the report, by id in `fixtures/prompts/smollm2.json`, with their kind.
pub const PROMPTS: [(&str, &str); 3] = [("code-rename", "repetitive (editing code)"), ("story", "open-ended"), ("chat-photosynthesis", "chat")];

/// Draft lengths swept for a proposer: up to 8 for prompt lookup, which
/// costs nothing to draft; up to 4 for the model drafters, which pay for
/// every draft while their acceptance falls with the position (THEORY-4's
/// k for them has been 1 in every run), so that the report fits its time
/// budget. THEORY-4's k is run too when it falls outside.
pub fn ks(p: &ProposerChoice) -> &'static [usize] {
    match p {
        ProposerChoice::Ngram => &[1, 2, 4, 8],
        _ => &[1, 2, 4],
    }
}

/// The proposers of the report: prompt lookup, the target's first 10 of 30
/// layers as a self-draft (early exit), and the shipped DFlash block draft
/// trained for SmolLM2 (`cargo xtask train-dflash`; none of the report's
/// prompts is among its training prompts). SmolLM2-135M is the smallest
/// model of its family, so there is no separate draft model to run.
pub fn proposers() -> Vec<ProposerChoice> {
    vec![ProposerChoice::Ngram, ProposerChoice::EarlyExit(10), ProposerChoice::Dflash(specdec_conformance::model_section::shipped_dflash_dir())]
}

/// What the shipped DFlash draft's `training.json` says about its training
/// and its held-out acceptance, as a Markdown paragraph; `None` without one.
pub fn dflash_training() -> Option<String> {
    let text = std::fs::read_to_string(specdec_conformance::model_section::shipped_dflash_dir().join("training.json")).ok()?;
    let log: serde_json::Value = serde_json::from_str(&text).ok()?;
    let c = &log["config"];
    let last = log["evals"].as_array()?.last()?;
    let per: Vec<String> = last["acceptance_per_position"].as_array()?.iter().filter_map(|a| a.as_f64()).map(|a| format!("{a:.3}")).collect();
    // Logs from before the trainer took a device were made on the CPU.
    let (recipe, device) = match c["device"].as_str().unwrap_or("cpu") {
        "cpu" => ("`cargo xtask train-dflash`", "a CPU".to_string()),
        gpu => ("`train/gpu-recipe.sh`", format!("a GPU (`{gpu}`)")),
    };
    Some(format!(
        "`fixtures/dflash/smollm2-135m-instruct` ({recipe}): {} draft layer(s), block {}, target layers {}; {} steps of {} sequences x {} blocks over {} training anchors ({} sequences), {:.0} s on {device}. On the {} held-out sequences (greedy continuations of prompts it never saw), every fourth anchor: tau {:.3} ({:.3} drafts accepted per block), the fraction of blocks whose first i drafts all match: {}.",
        c["draft_layers"],
        c["block_size"],
        log["target_layer_ids"],
        c["steps"],
        c["seqs_per_step"],
        c["anchors_per_seq"],
        log["train_anchors"],
        log["train_sequences"],
        log["seconds"].as_f64()?,
        log["heldout_sequences"],
        last["tau"].as_f64()?,
        last["accepted_per_block"].as_f64()?,
        per.join(", ")
    ))
}

/// A proposer's name in the report: a checkpoint by its directory's name, not its path.
pub fn label(p: &ProposerChoice) -> String {
    match p {
        ProposerChoice::Dflash(dir) => format!("dflash:{}", dir.file_name().map_or_else(|| dir.display().to_string(), |n| n.to_string_lossy().into_owned())),
        other => other.to_string(),
    }
}

/// A prompt, tokenized.
pub struct BenchPrompt {
    pub id: String,
    pub kind: String,
    pub ids: Vec<u32>,
}

/// One plain run.
#[derive(Debug, Clone, Serialize)]
pub struct PlainRun {
    pub backend: String,
    pub prompt: String,
    pub tokens: usize,
    pub tokens_per_s: f64,
    /// Seconds per generated token: the target step time `c` is measured against.
    pub step_s: f64,
}

/// One speculative run next to its plain run.
#[derive(Debug, Clone, Serialize)]
pub struct SpecRun {
    pub backend: String,
    pub proposer: String,
    pub prompt: String,
    /// The drafts per step (with the controller: at most).
    pub k: usize,
    /// Whether the pay-off controller picked each step's `k` in `0 ..= k`.
    pub controlled: bool,
    /// Steps run with each `k` (index `k`).
    pub steps_by_k: Vec<u64>,
    pub tokens: usize,
    pub tokens_per_s: f64,
    pub speedup: f64,
    /// `accepted_at[j] / proposed_at[j]`: how often position `j` was accepted when drafted.
    pub acceptance_per_position: Vec<f64>,
    pub mean_accepted: f64,
    pub tokens_per_step: f64,
    pub drafts_per_step: f64,
    /// Drafts proposed in the run and the proposer's seconds, for pooling over prompts.
    pub proposed: u64,
    pub propose_s: f64,
    /// The plain run's seconds per token.
    pub plain_step_s: f64,
    /// One proposer token over one target step, measured: proposer seconds per
    /// drafted token over the plain run's seconds per token.
    pub cost_ratio: f64,
    /// THEORY-3 with THEORY-2's expected tokens from the measured acceptance
    /// per position: `tokens_per_step / (1 + c * drafts_per_step)` (for a
    /// proposer that always drafts `k`, exactly `E[tokens] / (k c + 1)`).
    pub predicted_speedup: f64,
    pub achieved_over_predicted: f64,
}

/// The best `k` of a backend and proposer, by theory and by measurement.
#[derive(Debug, Clone, Serialize)]
pub struct BestK {
    pub backend: String,
    pub proposer: String,
    /// Acceptance per step fitted so that THEORY-2's geometric expectation at
    /// the largest `k` reproduces the measured tokens per step (mean over the
    /// prompts). A step without a proposal counts as a rejection, so for a
    /// proposer that sometimes proposes nothing it is below the per-draft rate.
    pub fitted_beta: f64,
    /// The cost ratio at the largest `k`, pooled over the prompts: proposer
    /// seconds (in plain steps) over drafts proposed. A prompt without drafts
    /// adds nothing to either, rather than a 0 to an average.
    pub cost_ratio: f64,
    /// THEORY-4's best `k` in `1..=8`, and its predicted speedup; run too when not swept.
    pub theory_k: usize,
    pub theory_speedup: f64,
    /// The measured `k` with the highest geometric-mean measured speedup over the prompts.
    pub measured_k: usize,
    pub measured_speedup: f64,
    /// `tau` at the measured `k`: tokens per verify step (accepted drafts plus
    /// the target's own token), mean over the prompts.
    pub measured_tau: f64,
}

/// Everything one backend produced.
#[derive(Debug, Clone, Default, Serialize)]
pub struct E2e {
    pub plain: Vec<PlainRun>,
    pub spec: Vec<SpecRun>,
    pub best_k: Vec<BestK>,
}

/// One backend with the model loaded: what every run of it shares.
struct Runner<'a, B: ModelBackend> {
    name: &'a str,
    b: &'a B,
    model: B::Model,
    w: &'a Arc<LlamaWeights>,
    max_tokens: usize,
}

/// A plain run's tokens, tokens per second and seconds per token.
struct Plain {
    tokens: Vec<u32>,
    tokens_per_s: f64,
    step_s: f64,
}

/// One greedy run of a batch of `prompts` (stopping at the model's eos or
/// after `max_tokens`) with `proposer` drafting up to `config.k` (under the
/// pay-off controller when `config.payoff`).
pub fn greedy_run<B: ModelBackend>(
    b: &B,
    model: &B::Model,
    w: &Arc<LlamaWeights>,
    prompts: &[&[u32]],
    max_tokens: usize,
    proposer: &ProposerChoice,
    config: EngineConfig,
) -> Result<RunOutput, String> {
    let mut p = proposer.build(b, w, config.k.max(1)).map_err(|e| e.to_string())?;
    let engine = Engine::new(b, model, &w.config, config).map_err(|e| e.to_string())?;
    let sampling = SamplingParams::new(0.0, 0, 1.0);
    let requests: Vec<Request> = prompts.iter().map(|ids| Request { sampling, eos: w.config.eos_ids(), ..Request::greedy(ids.to_vec(), max_tokens) }).collect();
    engine.generate(&requests, p.as_mut(), None, &mut NoSink).map_err(|e| e.to_string())
}

impl<B: ModelBackend> Runner<'_, B> {
    fn run(&self, prompt: &[u32], k: usize, proposer: &ProposerChoice, payoff: bool) -> Result<RunOutput, String> {
        greedy_run(self.b, &self.model, self.w, &[prompt], self.max_tokens, proposer, EngineConfig { k, payoff, ..EngineConfig::default() })
    }

    fn plain(&self, p: &BenchPrompt) -> Result<(PlainRun, Plain), String> {
        let r = self.run(&p.ids, 0, &ProposerChoice::None, false)?;
        let tokens = r.outputs[0].tokens.clone();
        let step_s = (r.timings.total_s() - r.timings.prefill_s) / tokens.len().max(1) as f64;
        let row = PlainRun { backend: self.name.into(), prompt: p.id.clone(), tokens: tokens.len(), tokens_per_s: r.decode_tokens_per_s(), step_s };
        Ok((row, Plain { tokens, tokens_per_s: r.decode_tokens_per_s(), step_s }))
    }

    /// One speculative run of `p`, judged against its plain run.
    fn spec(&self, p: &BenchPrompt, k: usize, proposer: &ProposerChoice, plain: &Plain, controlled: bool) -> Result<SpecRun, String> {
        let r = self.run(&p.ids, k, proposer, controlled)?;
        if r.outputs[0].tokens != plain.tokens {
            let how = if controlled { " under the pay-off controller" } else { "" };
            return Err(format!("{}, {}, k = {k}{how}, prompt {}: greedy speculative tokens differ from plain decoding", self.name, label(proposer), p.id));
        }
        let a = &r.acceptance;
        let drafts_per_step = if a.steps == 0 { 0.0 } else { a.proposed as f64 / a.steps as f64 };
        let cost_ratio = if a.proposed == 0 { 0.0 } else { r.timings.propose_s / a.proposed as f64 / plain.step_s };
        let predicted = a.tokens_per_step() / (1.0 + cost_ratio * drafts_per_step);
        let speedup = r.decode_tokens_per_s() / plain.tokens_per_s;
        Ok(SpecRun {
            backend: self.name.into(),
            proposer: label(proposer),
            prompt: p.id.clone(),
            k,
            controlled,
            steps_by_k: r.steps_by_k.clone(),
            tokens: r.outputs[0].tokens.len(),
            tokens_per_s: r.decode_tokens_per_s(),
            speedup,
            acceptance_per_position: a.rate_per_position(),
            mean_accepted: a.mean_accepted(),
            tokens_per_step: a.tokens_per_step(),
            drafts_per_step,
            proposed: a.proposed,
            propose_s: r.timings.propose_s,
            plain_step_s: plain.step_s,
            cost_ratio,
            predicted_speedup: predicted,
            achieved_over_predicted: speedup / predicted,
        })
    }
}

/// Runs every configuration on `b`; `progress` is told each finished run.
pub fn measure<B: ModelBackend>(name: &str, b: &B, w: &Arc<LlamaWeights>, prompts: &[BenchPrompt], max_tokens: usize, progress: &mut dyn FnMut(&str)) -> Result<E2e, String> {
    let runner = Runner { name, b, model: b.load_model(w).map_err(|e| e.to_string())?, w, max_tokens };
    let mut out = E2e::default();
    let mut plains = Vec::new();
    for p in prompts {
        let (row, plain) = runner.plain(p)?;
        out.plain.push(row);
        plains.push(plain);
        progress(&format!("{name} {} plain", p.id));
    }
    for proposer in proposers() {
        let sweep = |k: usize, out: &mut E2e, progress: &mut dyn FnMut(&str)| -> Result<(), String> {
            for (p, plain) in prompts.iter().zip(&plains) {
                out.spec.push(runner.spec(p, k, &proposer, plain, false)?);
                progress(&format!("{name} {} {} k={k}", p.id, label(&proposer)));
            }
            Ok(())
        };
        let swept = ks(&proposer);
        for &k in swept {
            sweep(k, &mut out, progress)?;
        }
        // THEORY-4's k, checked by measurement when the sweep did not run it.
        let theory_k = best_k(name, &label(&proposer), swept, &out)?.theory_k;
        if !swept.contains(&theory_k) {
            sweep(theory_k, &mut out, progress)?;
        }
        out.best_k.push(best_k(name, &label(&proposer), swept, &out)?);
        let kmax = *swept.last().ok_or("no k swept")?;
        for (p, plain) in prompts.iter().zip(&plains) {
            out.spec.push(runner.spec(p, kmax, &proposer, plain, true)?);
            progress(&format!("{name} {} {} pay-off", p.id, label(&proposer)));
        }
    }
    Ok(out)
}

/// The `beta` in `[0, 1)` whose THEORY-2 geometric expectation at `k` is
/// `tokens_per_step` (bisection: the expectation increases with beta).
fn fit_beta(tokens_per_step: f64, k: usize) -> Result<f64, String> {
    let (mut lo, mut hi) = (0.0f64, 1.0 - 1e-12);
    for _ in 0..100 {
        let mid = 0.5 * (lo + hi);
        let e = theory::expected_tokens_geometric(mid, k).map_err(|e| e.to_string())?;
        if e < tokens_per_step { lo = mid } else { hi = mid }
    }
    Ok(0.5 * (lo + hi))
}

/// THEORY-4's k from the runs at the largest swept k, and the measured best
/// over every k that ran.
fn best_k(backend: &str, proposer: &str, swept: &[usize], e: &E2e) -> Result<BestK, String> {
    let kmax = *swept.last().ok_or("no k swept")?;
    let at = |k: usize| e.spec.iter().filter(move |r| r.backend == backend && r.proposer == proposer && r.k == k && !r.controlled);
    let n = at(kmax).count().max(1) as f64;
    let tokens_per_step = at(kmax).map(|r| r.tokens_per_step).sum::<f64>() / n;
    let proposed: u64 = at(kmax).map(|r| r.proposed).sum();
    let cost_ratio = if proposed == 0 { 0.0 } else { at(kmax).map(|r| r.propose_s / r.plain_step_s).sum::<f64>() / proposed as f64 };
    let fitted_beta = fit_beta(tokens_per_step, kmax)?;
    let (theory_k, theory_speedup) = theory::best_draft_length(fitted_beta, cost_ratio, kmax).map_err(|e| e.to_string())?;
    let mut measured_best = (swept[0], f64::NEG_INFINITY);
    let mut ran: Vec<usize> = e.spec.iter().filter(|r| r.backend == backend && r.proposer == proposer && !r.controlled).map(|r| r.k).collect();
    ran.sort_unstable();
    ran.dedup();
    for k in ran {
        let logs: Vec<f64> = at(k).map(|r| r.speedup.ln()).collect();
        let g = (logs.iter().sum::<f64>() / logs.len().max(1) as f64).exp();
        if g > measured_best.1 {
            measured_best = (k, g);
        }
    }
    let measured_tau = at(measured_best.0).map(|r| r.tokens_per_step).sum::<f64>() / at(measured_best.0).count().max(1) as f64;
    Ok(BestK { backend: backend.into(), proposer: proposer.into(), fitted_beta, cost_ratio, theory_k, theory_speedup, measured_k: measured_best.0, measured_speedup: measured_best.1, measured_tau })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// THEORY-2 inverted: the fitted beta reproduces the tokens per step it was fitted to.
    #[test]
    fn fit_beta_inverts_the_geometric_expectation() {
        for beta in [0.0, 0.1, 0.5, 0.9, 0.99] {
            let tokens = theory::expected_tokens_geometric(beta, 8).unwrap();
            assert!((fit_beta(tokens, 8).unwrap() - beta).abs() < 1e-9, "beta {beta}");
        }
    }

    fn row(k: usize, speedup: f64, tokens_per_step: f64, cost_ratio: f64) -> SpecRun {
        SpecRun {
            backend: "b".into(),
            proposer: "p".into(),
            prompt: format!("prompt-{speedup}"),
            k,
            controlled: false,
            steps_by_k: Vec::new(),
            tokens: 64,
            tokens_per_s: 0.0,
            speedup,
            acceptance_per_position: Vec::new(),
            mean_accepted: tokens_per_step - 1.0,
            tokens_per_step,
            drafts_per_step: k as f64,
            proposed: 10,
            propose_s: cost_ratio * 10.0 * 0.5,
            plain_step_s: 0.5,
            cost_ratio,
            predicted_speedup: 1.0,
            achieved_over_predicted: speedup,
        }
    }

    /// Measured best k is the geometric-mean argmax over prompts; the theory's is
    /// THEORY-4 at the beta fitted at the largest k and the mean cost ratio there.
    #[test]
    fn best_k_takes_the_geometric_mean_and_theory_4() {
        let beta = 0.7;
        let tokens = theory::expected_tokens_geometric(beta, 8).unwrap();
        let mut e = E2e::default();
        // k = 2: speedups 1.5 and 1.5 (geometric mean 1.5); k = 4: 4.0 and 0.5 (mean 1.41).
        e.spec.extend([row(2, 1.5, 2.0, 0.1), row(2, 1.5, 2.0, 0.1), row(4, 4.0, 2.0, 0.1), row(4, 0.5, 2.0, 0.1)]);
        e.spec.extend([row(8, 1.0, tokens, 0.1), row(8, 1.0, tokens, 0.3)]);
        let b = best_k("b", "p", &[2, 4, 8], &e).unwrap();
        assert_eq!((b.measured_k, (b.measured_speedup * 1e9).round() / 1e9), (2, 1.5));
        assert!((b.fitted_beta - beta).abs() < 1e-9 && (b.cost_ratio - 0.2).abs() < 1e-12);
        assert_eq!((b.theory_k, b.theory_speedup), theory::best_draft_length(beta, 0.2, 8).unwrap());
    }

    /// A prompt that proposed nothing adds nothing to the pooled cost ratio.
    #[test]
    fn a_prompt_without_drafts_does_not_lower_the_cost_ratio() {
        let mut silent = row(8, 1.0, 1.0, 0.0);
        (silent.proposed, silent.propose_s) = (0, 0.0);
        let e = E2e { spec: vec![row(8, 1.0, 2.0, 0.4), silent], ..E2e::default() };
        assert!((best_k("b", "p", &[2, 4, 8], &e).unwrap().cost_ratio - 0.4).abs() < 1e-12);
    }
}
