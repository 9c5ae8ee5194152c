//! `engine/<label>/logprobs/{on,off}` (ENGINE-7, LOGPROB-1 .. LOGPROB-4):
//! every reported logprob, chosen and top-n, equals the f64 reference's at
//! its position given the prompt and the tokens the engine generated
//! before it, within the engine's stated epsilon, one entry per generated
//! token; for every mode the engine states. The requests are the exact
//! checks' (greedy runs; an eos, a stop string and a length cap falling
//! inside accepted runs, whose entries must end where the output does)
//! and sampled ones with the processors the engine takes (processed
//! logprobs of a row depend on its penalty counts, LOGITS-13).

use specdec_backend::model::{ForwardRequest, LlamaWeights, LogitRows, RefModel};
use specdec_backend::{PenaltyScope, SamplingParams};
use specdec_decoder::{LogprobMode, LogprobRequest};
use specdec_engines::{EngineInfo, Generation, GenerationEngine, GenerationRequest, Processor};
use specdec_reference::logprob::{entry, floored};
use specdec_reference::{RowInputs, bias_row, logprob_row};

use super::{GreedyRun, exact_cases, generate};
use crate::compare::Verdict;
use crate::e2e_section::{penalty_counts_of, sampled_setup};

/// Alternatives asked per token.
pub const LOGPROB_TOP: usize = 5;
/// The largest logprob epsilon an engine may state (as its greedy epsilon).
pub const MAX_LOGPROB_EPSILON: f64 = 1e-2;
/// Sampled requests per mode, and their tokens.
const SAMPLED_REQUESTS: u64 = 8;
const SAMPLED_LEN: usize = 12;

/// The check, speculation `on` or off.
pub(super) fn check(engine: &mut dyn GenerationEngine, w: &LlamaWeights, plain: &[GreedyRun], on: bool, seed: u64) -> Result<Verdict, Verdict> {
    let info = engine.info().clone();
    let Some(statement) = info.logprobs.clone() else {
        return Ok(Verdict::NotSupported("the engine states no logprobs".into()));
    };
    if !(0.0..=MAX_LOGPROB_EPSILON).contains(&statement.epsilon) {
        return Err(Verdict::Fail(format!("the engine states a logprob epsilon of {:e}, outside [0, {MAX_LOGPROB_EPSILON:e}]", statement.epsilon)));
    }
    if statement.modes.is_empty() {
        return Err(Verdict::Fail("the engine states logprobs of no mode".into()));
    }
    let requests = requests(&info, w, plain, on, seed)?;
    let model = RefModel::new(w.clone());
    let mut judged = 0;
    for mode in statement.modes {
        let ask = LogprobRequest { top: LOGPROB_TOP.min(statement.max_top), mode };
        let asked: Vec<GenerationRequest> = requests.iter().map(|r| GenerationRequest { logprobs: Some(ask), ..r.clone() }).collect();
        let outputs = generate(engine, &asked)?;
        for (i, (r, got)) in asked.iter().zip(&outputs).enumerate() {
            judge(&model, r, got, statement.epsilon).map_err(|e| {
                Verdict::Fail(format!("{} logprobs, request {i} (prompt {:?}, T {}, max {}, eos {:?}, stop {:?}): {e}", mode.name(), r.prompt, r.temperature, r.max_new_tokens, r.eos, r.stop))
            })?;
            judged += got.tokens.len();
        }
    }
    if judged == 0 {
        return Err(Verdict::Fail("no token was generated: nothing was judged".into()));
    }
    Ok(Verdict::Pass { excused: 0, max_abs_err: 0.0 })
}

/// The exact checks' requests (whose outputs end by eos, stop strings and
/// caps inside runs) and sampled ones, with speculation `on` or off.
fn requests(info: &EngineInfo, w: &LlamaWeights, plain: &[GreedyRun], on: bool, seed: u64) -> Result<Vec<GenerationRequest>, Verdict> {
    let mut out = Vec::new();
    for check in ["greedy-identity", "eos", "length", "stop"] {
        if let Ok(cases) = exact_cases(check, info, w, plain)? {
            out.extend(cases.into_iter().map(|c| c.req));
        }
    }
    let (prompt, eos) = sampled_setup(w).map_err(Verdict::Fail)?;
    // Sampled rows' processed logprobs: truncated, with every processor the
    // engine takes (the penalty counts grow with the drafts, LOGITS-13), so a
    // processor a transport loses shows in exact values.
    let mut params = SamplingParams::new(0.8, 6, 1.0);
    if info.processors.contains(&Processor::MinP) {
        params.min_p = 0.05;
    }
    if info.processors.contains(&Processor::RepetitionPenalty) && info.penalty_scopes.contains(&PenaltyScope::Context) {
        params.repetition_penalty = 1.3;
    }
    if info.penalty_scopes.contains(&PenaltyScope::Context) {
        if info.processors.contains(&Processor::PresencePenalty) {
            params.presence_penalty = 0.3;
        }
        if info.processors.contains(&Processor::FrequencyPenalty) {
            params.frequency_penalty = 0.2;
        }
    }
    let bias = if info.processors.contains(&Processor::LogitBias) { vec![(eos, -1.5)] } else { Vec::new() };
    for i in 0..SAMPLED_REQUESTS {
        out.push(GenerationRequest { eos: vec![eos], logit_bias: bias.clone(), ..GenerationRequest::sampled(prompt.clone(), params, seed.wrapping_add(i), SAMPLED_LEN, true) });
    }
    Ok(out.into_iter().map(|r| GenerationRequest { speculation: on, ..r }).collect())
}

/// The reference's logprobs of every position of `tokens` after `r`'s
/// prompt, under `r`'s processors (LOGPROB-1, LOGPROB-2): one forward over
/// the whole sequence, each row with its own penalty counts.
pub fn reference_logprobs(model: &RefModel, r: &GenerationRequest, tokens: &[u32], mode: LogprobMode) -> Result<Vec<Vec<f64>>, String> {
    if tokens.is_empty() {
        return Ok(Vec::new());
    }
    let context: Vec<u32> = r.prompt.iter().chain(tokens).copied().collect();
    let fed = &context[..context.len() - 1];
    let mut cache = model.new_cache(1, fed.len()).map_err(|e| e.to_string())?;
    let out = model.forward(&mut cache, &ForwardRequest { tokens: &[fed.to_vec()], logits: LogitRows::All, hidden_layers: &[] }).map_err(|e| e.to_string())?;
    let vocab = model.config().vocab_size;
    let params = r.params();
    let bias = if r.logit_bias.is_empty() { None } else { Some(bias_row(&r.logit_bias, vocab).map_err(|e| e.to_string())?) };
    let n = r.prompt.len();
    (0..tokens.len())
        .map(|t| {
            let logits = &out.logits[(n - 1 + t) * vocab..][..vocab];
            let counts = penalty_counts_of(&params, &context[..n + t], n, vocab);
            logprob_row(logits, mode, params, RowInputs { counts: counts.as_deref(), bias: bias.as_deref() }).map_err(|e| e.to_string())
        })
        .collect()
}

/// One output's entries against the reference's (LOGPROB-3): one per
/// generated token, the chosen logprob and the top list within `eps`, the
/// top list the largest `top` finite ids (near-ties within `eps` either way).
fn judge(model: &RefModel, r: &GenerationRequest, got: &Generation, eps: f64) -> Result<(), String> {
    let ask = r.logprobs.ok_or("no logprobs were asked")?;
    let entries = got.logprobs.as_deref().ok_or("no logprobs reported")?;
    if entries.len() != got.tokens.len() {
        return Err(format!("{} entries for {} generated tokens {:?} (finish {:?}): entries end where the output ends", entries.len(), got.tokens.len(), got.tokens, got.finish));
    }
    let want = reference_logprobs(model, r, &got.tokens, ask.mode)?;
    for (t, (e, lp)) in entries.iter().zip(&want).enumerate() {
        let chosen = floored(lp[e.id as usize]);
        if (e.logprob - chosen).abs() > eps {
            return Err(format!("token {t} (id {}): logprob {}, the reference's {chosen} (|diff| {:.3e} > epsilon {eps:e})", e.id, e.logprob, (e.logprob - chosen).abs()));
        }
        let best = entry(lp, e.id, ask.top).top;
        if e.top.len() != best.len() {
            return Err(format!("token {t}: {} alternatives, the reference has {} finite of the {} asked", e.top.len(), best.len(), ask.top));
        }
        let last = best.last().map_or(f64::NEG_INFINITY, |b| b.1);
        for (k, &(id, v)) in e.top.iter().enumerate() {
            let reference = lp[id as usize];
            if (v - reference).abs() > eps {
                return Err(format!("token {t}: alternative {k} (id {id}) has logprob {v}, the reference's {reference}"));
            }
            if reference < last - 2.0 * eps {
                return Err(format!("token {t}: alternative {k} (id {id}, {reference}) is not among the reference's top {} {best:?}", ask.top));
            }
            if k > 0 && v > e.top[k - 1].1 + eps {
                return Err(format!("token {t}: alternatives out of order: {:?}", e.top));
            }
        }
    }
    Ok(())
}
