//! The model section of the suite: a backend's Llama forward pass against
//! the f64 reference forward, on tiny seeded models and on SmolLM2-135M
//! (MODEL-8 .. MODEL-14).
//!
//! Checks, per model (`model/<model>/<check>`):
//! - `forward`: logits of a ragged batch against the reference, within the
//!   backend's stated relative tolerance; an argmax may differ only where
//!   the reference's top-2 margin is below the stated epsilon (counted);
//! - `verify-window`: one `(k+1)`-token forward against `k+1` one-token
//!   forwards on the same backend: the batch-invariance drift, reported
//!   (max difference, argmax flips, flips excused by the backend's own margin);
//! - `kv-trim`: append, per-sequence trim, re-append gives the logits and
//!   cache of a cache that never held the trimmed tokens;
//! - `hidden`: the hidden states of requested layers, in request order;
//! - on the Llama-family checkpoints HF transformers wrote
//!   (`model/hf-<arch>/..`: Llama 3's rotary scaling, Mistral, Qwen2's
//!   biases, Qwen3's head norms; MODEL-17) also `hf-logits`: the backend's
//!   logits against HF's own, stored beside the checkpoint, within the
//!   backend's tolerance plus [`HF_LOGIT_REL_TOLERANCE`]; a port that
//!   lacks an architecture's addition says so (not supported), never runs
//!   the model without it;
//! - on SmolLM2 also `tokenizer` (round trips, special tokens, pinned ids),
//!   `export` (the HF export loads to the same weights and logits as the
//!   GGUF) and `greedy` (8 prompts x 48 tokens of plain greedy decoding
//!   agree token for token with the reference's, a divergence excused only
//!   at a step whose reference top-2 margin is below the epsilon).
//!
//! Invariants: the oracle is [`specdec_models::RefModel`], computed in the
//! same run (never a stored copy of the code under test; `cargo xtask test`'s
//! suites share one computation of SmolLM2's greedy runs); SmolLM2 checks are
//! reported as not supported, with the reason, when its file is not given.

use std::path::PathBuf;
use std::sync::{Arc, OnceLock};
use std::time::Instant;

use rand::{RngExt, SeedableRng};
use rand_pcg::Pcg64;
use specdec_backend::model::{ForwardRequest, LogitRows, ModelBackend, ModelPrecision};
use specdec_backend::{BackendError, ReferenceBackend};
use specdec_models::prompts::Prompt;
use specdec_models::tiny::TinySpec;
use specdec_models::{LlamaWeights, LoadedModel, RefModel};

use crate::check::{CheckResult, Kind, SuiteConfig, catch, settle};
use crate::compare::{Verdict, row_scale, within};

/// The env var naming the SmolLM2 GGUF file (set by `cargo xtask`).
pub const SMOLLM2_GGUF_ENV: &str = "SPECDEC_SMOLLM2_GGUF";
/// The env var naming its HF-layout export directory.
pub const SMOLLM2_HF_ENV: &str = "SPECDEC_SMOLLM2_HF";
/// The name SmolLM2 has in check names.
pub const SMOLLM2: &str = "smollm2";

/// Tokens per prompt of the greedy agreement check.
pub const GREEDY_TOKENS: usize = 48;

/// Where the real model's files are.
#[derive(Debug, Clone, Default)]
pub struct ModelFiles {
    pub smollm2_gguf: Option<PathBuf>,
    pub smollm2_hf: Option<PathBuf>,
}

impl ModelFiles {
    /// From [`SMOLLM2_GGUF_ENV`] and [`SMOLLM2_HF_ENV`].
    pub fn from_env() -> Self {
        let path = |var| std::env::var_os(var).filter(|v| !v.is_empty()).map(PathBuf::from);
        ModelFiles { smollm2_gguf: path(SMOLLM2_GGUF_ENV), smollm2_hf: path(SMOLLM2_HF_ENV) }
    }
}

/// One check of the model section.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelItem {
    pub name: String,
    pub model: String,
    pub check: &'static str,
    pub rules: &'static [&'static str],
}

const COMMON: [(&str, &[&str]); 4] = [("forward", &["MODEL-8", "MODEL-10", "MODEL-11"]), ("verify-window", &["MODEL-13"]), ("kv-trim", &["MODEL-8", "KV-3"]), ("hidden", &["MODEL-9"])];
const HF_ONLY: [(&str, &[&str]); 1] = [("hf-logits", &["MODEL-17", "MODEL-8"])];
const SMOLLM2_ONLY: [(&str, &[&str]); 3] = [("tokenizer", &["MODEL-6"]), ("export", &["MODEL-4", "MODEL-5"]), ("greedy", &["MODEL-14"])];

/// Every model check, before selection.
pub fn model_items() -> Vec<ModelItem> {
    let mut models: Vec<String> = TinySpec::PRESETS.iter().map(|(n, _)| n.to_string()).collect();
    models.extend(ARCHITECTURE_CASES.iter().map(|c| format!("{HF_PREFIX}{c}")));
    models.push(SMOLLM2.into());
    let mut items = Vec::new();
    for m in models {
        let extra: &[(&str, &[&str])] = if m == SMOLLM2 {
            &SMOLLM2_ONLY
        } else if m.starts_with(HF_PREFIX) {
            &HF_ONLY
        } else {
            &[]
        };
        for (check, rules) in COMMON.iter().chain(extra) {
            items.push(ModelItem { name: format!("model/{m}/{check}"), model: m.clone(), check, rules });
        }
    }
    items
}

/// The model a section has loaded, by name, or why it could not be: sections
/// walk their items in model order and load each model once.
pub(crate) type CurrentModel<M> = Option<(String, Result<(Subject, M), Verdict>)>;

/// A model under test: its weights and, for SmolLM2, its tokenizer.
pub(crate) struct Subject {
    pub(crate) weights: Arc<LlamaWeights>,
    pub(crate) loaded: Option<Arc<LoadedModel>>,
    /// HF transformers' logits on the checkpoint, for the `hf-` models.
    pub(crate) hf: Option<HfLogits>,
}

/// The Llama-family checkpoints HF transformers wrote, with its logits
/// (`fixtures/architectures/<case>`, `cargo xtask architectures`).
pub const ARCHITECTURE_CASES: [&str; 5] = ["llama3", "mistral", "qwen2", "qwen3", "phi3"];
/// Their models' prefix in check names.
pub const HF_PREFIX: &str = "hf-";
/// How far the f64 reference lies from HF's logits at most, relative to a
/// row's largest magnitude: HF in float64 still normalises and builds its
/// rotary tables in float32 (measured at most 6.6e-7 on the four cases).
pub const HF_LOGIT_REL_TOLERANCE: f64 = 1e-5;

/// HF's logits of token sequences: `logits[s][t]` is the row after
/// `tokens[s][..=t]`.
#[derive(Debug, Clone, serde::Deserialize)]
pub(crate) struct HfLogits {
    tokens: Vec<Vec<u32>>,
    logits: Vec<Vec<Vec<f64>>>,
}

/// The folder of an architecture case (read from the source tree, where
/// every command of the project runs).
pub fn architecture_dir(case: &str) -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../fixtures/architectures")).join(case)
}

fn smollm2(files: &ModelFiles) -> Result<Arc<LoadedModel>, String> {
    static CACHE: OnceLock<Result<Arc<LoadedModel>, String>> = OnceLock::new();
    let path = files.smollm2_gguf.clone().ok_or_else(|| format!("SmolLM2 not given: set {SMOLLM2_GGUF_ENV} (`cargo xtask` does)"))?;
    CACHE.get_or_init(|| specdec_models::load(&path).map(Arc::new).map_err(|e| e.to_string())).clone()
}

pub(crate) fn subject(model: &str, files: &ModelFiles) -> Result<Subject, Verdict> {
    if model == SMOLLM2 {
        let loaded = smollm2(files).map_err(Verdict::NotSupported)?;
        return Ok(Subject { weights: Arc::new(loaded.weights.clone()), loaded: Some(loaded), hf: None });
    }
    if let Some(case) = model.strip_prefix(HF_PREFIX) {
        let dir = architecture_dir(case);
        if !dir.is_dir() {
            return Err(Verdict::NotSupported(format!("{}: the architecture fixtures are read from the source tree", dir.display())));
        }
        let fail = |e: String| Verdict::Fail(format!("{}: {e}", dir.display()));
        let loaded = specdec_models::load(&dir).map_err(|e| fail(e.to_string()))?;
        let text = std::fs::read_to_string(dir.join("logits.json")).map_err(|e| fail(e.to_string()))?;
        let hf: HfLogits = serde_json::from_str(&text).map_err(|e| fail(format!("logits.json: {e}")))?;
        return Ok(Subject { weights: Arc::new(loaded.weights), loaded: None, hf: Some(hf) });
    }
    let spec = TinySpec::preset(model).ok_or_else(|| Verdict::Fail(format!("unknown model `{model}`")))?;
    let weights = spec.weights().map_err(|e| Verdict::Fail(format!("tiny generator: {e}")))?;
    Ok(Subject { weights: Arc::new(weights), loaded: None, hf: None })
}

/// Runs the selected model checks on `backend`; models load once each.
pub fn run<B: ModelBackend>(backend: &B, cfg: &SuiteConfig, files: &ModelFiles, progress: &mut dyn FnMut(&CheckResult)) -> Vec<CheckResult> {
    let mut results = Vec::new();
    let mut current: CurrentModel<B::Model> = None;
    for item in model_items() {
        let mut result = CheckResult::unselected(&item.name, Kind::Model, format!("model/{}", item.check), item.rules, &backend.name(), cfg.seed);
        if !cfg.wants(&item.name) {
            progress(&result);
            results.push(result);
            continue;
        }
        let start = Instant::now();
        if current.as_ref().is_none_or(|(m, _)| *m != item.model) {
            current = Some((item.model.clone(), load_subject(backend, &item.model, files)));
        }
        let verdict = match &current {
            Some((_, Ok((subject, model)))) => catch(|| run_check(backend, subject, model, &item, files)).unwrap_or_else(Verdict::Fail),
            Some((_, Err(v))) => v.clone(),
            None => unreachable!("set above"),
        };
        result.millis = start.elapsed().as_secs_f64() * 1e3;
        settle(&mut result, verdict, &cfg.selection);
        progress(&result);
        results.push(result);
    }
    results
}

/// Loads a model of the sections and uploads it to `backend`.
pub(crate) fn load_subject<B: ModelBackend>(backend: &B, model: &str, files: &ModelFiles) -> Result<(Subject, B::Model), Verdict> {
    catch(|| {
        let s = subject(model, files)?;
        let m = backend.load_model(&s.weights).map_err(|e| backend_verdict(&e))?;
        Ok((s, m))
    })
    .unwrap_or_else(|msg| Err(Verdict::Fail(msg)))
}

pub(crate) fn backend_verdict(e: &BackendError) -> Verdict {
    match e {
        e if e.is_not_supported() => Verdict::NotSupported(e.to_string()),
        _ => Verdict::Fail(e.to_string()),
    }
}

/// A check's outcome before it becomes a verdict: excused rows and the largest difference seen.
type Outcome = Result<(usize, f64), String>;

fn run_check<B: ModelBackend>(b: &B, s: &Subject, m: &B::Model, item: &ModelItem, files: &ModelFiles) -> Verdict {
    let outcome = match item.check {
        "forward" => check_forward(b, s, m),
        "verify-window" => check_verify_window(b, s, m),
        "kv-trim" => check_kv_trim(b, s, m),
        "hidden" => check_hidden(b, s, m),
        "tokenizer" => check_tokenizer(s),
        "export" => check_export(b, s, m, files),
        "greedy" => check_greedy(b, s, m),
        "hf-logits" => check_hf_logits(b, s, m),
        other => Err(format!("unknown model check `{other}`")),
    };
    match outcome {
        Ok((excused, max_abs_err)) => Verdict::Pass { excused, max_abs_err },
        Err(msg) if msg.starts_with(NOT_SUPPORTED) => Verdict::NotSupported(msg[NOT_SUPPORTED.len()..].to_string()),
        Err(msg) => Verdict::Fail(msg),
    }
}

pub(crate) const NOT_SUPPORTED: &str = "not supported: ";

pub(crate) fn err(e: BackendError) -> String {
    match e {
        e if e.is_not_supported() => format!("{NOT_SUPPORTED}{e}"),
        _ => e.to_string(),
    }
}

/// Prompts of a model: seeded ids for tiny models, encoded text for SmolLM2.
fn prompts(s: &Subject, lens: &[usize], seed: u64) -> Result<Vec<Vec<u32>>, String> {
    if let Some(loaded) = &s.loaded {
        let tok = loaded.tokenizer.as_ref().ok_or("SmolLM2 has no tokenizer")?;
        // Long enough for any prefix length the checks ask (at most 16 tokens).
        const TEXTS: [&str; 3] = [
            "The capital of France is Paris, and the capital of Italy is Rome; both cities are old.",
            "def add(a, b):\n    return a + b\n\nprint(add(2, 3))  # prints five\n",
            "Once upon a time, in a land far away, there lived a fox who loved to read books.",
        ];
        return TEXTS
            .iter()
            .zip(lens)
            .map(|(t, &n)| {
                let ids = tok.encode(t, false).map_err(|e| e.to_string())?;
                if ids.len() < n {
                    return Err(format!("prompt text {t:?} has {} tokens, fewer than the {n} asked", ids.len()));
                }
                Ok(ids[..n].to_vec())
            })
            .collect();
    }
    let vocab = s.weights.config.vocab_size as u32;
    let mut rng = Pcg64::seed_from_u64(seed);
    Ok(lens.iter().map(|&n| (0..n).map(|_| rng.random_range(0..vocab)).collect()).collect())
}

/// Runs one forward and downloads its logits as rows.
fn logits_of<B: ModelBackend>(b: &B, m: &B::Model, cache: &mut B::ModelCache, req: &ForwardRequest<'_>, vocab: usize) -> Result<Vec<Vec<f64>>, String> {
    let out = b.forward(m, cache, req).map_err(err)?;
    let t = out.logits.ok_or("the forward returned no logits")?;
    rows(&b.download_f64(&t).map_err(err)?, vocab, out.plan.logit_rows, "logits")
}

fn rows(t: &specdec_backend::HostTensor<f64>, width: usize, n: usize, what: &str) -> Result<Vec<Vec<f64>>, String> {
    if t.shape() != [n, width] {
        return Err(format!("{what} has shape {:?}, expected [{n}, {width}]", t.shape()));
    }
    Ok(t.data().chunks(width).map(<[f64]>::to_vec).collect())
}

/// The top id (ties to the lowest id) and the margin to the runner-up.
pub fn top2(row: &[f64]) -> (usize, f64) {
    let mut best = 0;
    for (i, v) in row.iter().enumerate() {
        if *v > row[best] {
            best = i;
        }
    }
    let second = row.iter().enumerate().filter(|(i, _)| *i != best).map(|(_, v)| *v).fold(f64::NEG_INFINITY, f64::max);
    (best, row[best] - second)
}

/// Compares observed rows with expected rows: relative error within
/// `tol` (per unit of the expected row's largest magnitude), argmax equal
/// unless the expected margin is below `eps` (then counted as excused).
fn compare_rows(what: &str, observed: &[Vec<f64>], expected: &[Vec<f64>], tol: f64, eps: f64) -> Outcome {
    if observed.len() != expected.len() {
        return Err(format!("{what}: {} rows, expected {}", observed.len(), expected.len()));
    }
    let (mut excused, mut max_abs) = (0, 0.0f64);
    for (r, (o, e)) in observed.iter().zip(expected).enumerate() {
        let scale = row_scale(e);
        let (mut worst, mut at) = (0.0f64, 0);
        for (i, (a, b)) in o.iter().zip(e).enumerate() {
            let d = (a - b).abs();
            if !within(d, worst) {
                (worst, at) = (d, i);
            }
        }
        max_abs = max_abs.max(worst);
        if !within(worst, tol * scale) {
            return Err(format!("{what}: row {r} index {at}: {} vs expected {} (|diff| {worst:.3e} > {tol:e} x row scale {scale:.3e})", o[at], e[at]));
        }
        let ((oi, _), (ei, margin)) = (top2(o), top2(e));
        if oi != ei {
            if margin < eps {
                excused += 1;
            } else {
                return Err(format!("{what}: row {r}: argmax {oi}, expected {ei} with margin {margin:.3e} >= epsilon {eps:e}"));
            }
        }
    }
    Ok((excused, max_abs))
}

fn precision<B: ModelBackend>(b: &B) -> ModelPrecision {
    b.model_precision()
}

fn check_forward<B: ModelBackend>(b: &B, s: &Subject, m: &B::Model) -> Outcome {
    let cfg = &s.weights.config;
    let ps = prompts(s, &[1, 4, 7], 1)?;
    let mut cache = b.new_model_cache(m, ps.len(), 16).map_err(err)?;
    let observed = logits_of(b, m, &mut cache, &ForwardRequest::all_logits(&ps), cfg.vocab_size)?;
    let oracle = RefModel::new((*s.weights).clone());
    let mut rc = oracle.new_cache(ps.len(), 16).map_err(|e| e.to_string())?;
    let out = oracle.forward(&mut rc, &ForwardRequest::all_logits(&ps)).map_err(|e| e.to_string())?;
    let expected: Vec<Vec<f64>> = out.logits.chunks(cfg.vocab_size).map(<[f64]>::to_vec).collect();
    if b.cache_lens(&cache) != ps.iter().map(Vec::len).collect::<Vec<_>>() {
        return Err(format!("cache lengths {:?} after a prefill of {:?} tokens", b.cache_lens(&cache), ps.iter().map(Vec::len).collect::<Vec<_>>()));
    }
    let p = precision(b);
    compare_rows("forward logits", &observed, &expected, p.logit_rel_tolerance, p.argmax_margin_epsilon)
}

/// MODEL-17: the backend's logits of HF's token sequences (one ragged
/// batch) against HF transformers' own, within the backend's tolerance
/// plus [`HF_LOGIT_REL_TOLERANCE`].
fn check_hf_logits<B: ModelBackend>(b: &B, s: &Subject, m: &B::Model) -> Outcome {
    let hf = s.hf.as_ref().ok_or("no HF logits for this model")?;
    let vocab = s.weights.config.vocab_size;
    let mut cache = b.new_model_cache(m, hf.tokens.len(), 64).map_err(err)?;
    let observed = logits_of(b, m, &mut cache, &ForwardRequest::all_logits(&hf.tokens), vocab)?;
    let expected: Vec<Vec<f64>> = hf.logits.iter().flatten().cloned().collect();
    let p = precision(b);
    compare_rows("logits against HF transformers'", &observed, &expected, p.logit_rel_tolerance + HF_LOGIT_REL_TOLERANCE, p.argmax_margin_epsilon)
}

/// MODEL-13: a `(k+1)`-token window against `k+1` one-token decodes.
fn check_verify_window<B: ModelBackend>(b: &B, s: &Subject, m: &B::Model) -> Outcome {
    const WINDOW: usize = 5;
    let vocab = s.weights.config.vocab_size;
    let ps = prompts(s, &[6 + WINDOW], 2)?;
    let (prompt, window) = ps[0].split_at(ps[0].len() - WINDOW);
    let mut a = b.new_model_cache(m, 1, 32).map_err(err)?;
    logits_of(b, m, &mut a, &ForwardRequest::last_logits(&[prompt.to_vec()]), vocab)?;
    let batched = logits_of(b, m, &mut a, &ForwardRequest::all_logits(&[window.to_vec()]), vocab)?;
    let mut c = b.new_model_cache(m, 1, 32).map_err(err)?;
    logits_of(b, m, &mut c, &ForwardRequest::last_logits(&[prompt.to_vec()]), vocab)?;
    let mut single = Vec::new();
    for &t in window {
        single.extend(logits_of(b, m, &mut c, &ForwardRequest::all_logits(&[vec![t]]), vocab)?);
    }
    let p = precision(b);
    compare_rows("verify window vs one-token decodes", &batched, &single, p.window_value_tolerance(), p.window_margin_epsilon)
}

fn check_kv_trim<B: ModelBackend>(b: &B, s: &Subject, m: &B::Model) -> Outcome {
    let vocab = s.weights.config.vocab_size;
    let ps = prompts(s, &[5, 7], 3)?;
    let extra = prompts(s, &[3, 2], 4)?;
    let after = prompts(s, &[2, 3], 5)?;
    let p = precision(b);
    // Trimmed: P, X, trim [3, 1] (sequence 1 keeps X1[0]), then Y.
    let mut t = b.new_model_cache(m, 2, 32).map_err(err)?;
    logits_of(b, m, &mut t, &ForwardRequest::last_logits(&ps), vocab)?;
    logits_of(b, m, &mut t, &ForwardRequest::all_logits(&extra), vocab)?;
    b.cache_trim(&mut t, &[3, 1]).map_err(err)?;
    let want_lens = vec![ps[0].len(), ps[1].len() + 1];
    if b.cache_lens(&t) != want_lens {
        return Err(format!("lengths after trim [3, 1]: {:?}, expected {want_lens:?}", b.cache_lens(&t)));
    }
    if b.cache_trim(&mut t, &[ps[0].len() + 1, 0]).is_ok() {
        return Err("trimming beyond a sequence's length was accepted (KV-4)".into());
    }
    let trimmed = logits_of(b, m, &mut t, &ForwardRequest::all_logits(&after), vocab)?;
    // Fresh: the same tokens, never holding the trimmed ones.
    let mut f = b.new_model_cache(m, 2, 32).map_err(err)?;
    logits_of(b, m, &mut f, &ForwardRequest::last_logits(&ps), vocab)?;
    logits_of(b, m, &mut f, &ForwardRequest::all_logits(&[vec![], vec![extra[1][0]]]), vocab)?;
    let fresh = logits_of(b, m, &mut f, &ForwardRequest::all_logits(&after), vocab)?;
    let (excused, mut max_abs) = compare_rows("logits after trim and re-append", &trimmed, &fresh, p.window_value_tolerance(), p.window_margin_epsilon)?;
    for layer in [0, s.weights.config.num_hidden_layers - 1] {
        for seq in 0..2 {
            let (tk, tv) = b.cache_contents(&t, layer, seq).map_err(err)?;
            let (fk, fv) = b.cache_contents(&f, layer, seq).map_err(err)?;
            for (what, x, y) in [("keys", &tk, &fk), ("values", &tv, &fv)] {
                if x.len() != y.len() {
                    return Err(format!("layer {layer} sequence {seq} {what}: {} values after trim, {} in a fresh cache", x.len(), y.len()));
                }
                let scale = row_scale(y);
                let worst = x.iter().zip(y.iter()).map(|(a, b)| (a - b).abs()).fold(0.0f64, f64::max);
                max_abs = max_abs.max(worst);
                if !within(worst, p.window_value_tolerance() * scale) {
                    return Err(format!("layer {layer} sequence {seq} {what}: |diff| {worst:.3e} from a fresh cache"));
                }
            }
        }
    }
    Ok((excused, max_abs))
}

fn check_hidden<B: ModelBackend>(b: &B, s: &Subject, m: &B::Model) -> Outcome {
    let cfg = &s.weights.config;
    let layers: Vec<usize> = if cfg.num_hidden_layers > 1 { vec![cfg.num_hidden_layers - 1, 0] } else { vec![0] };
    let ps = prompts(s, &[3, 2], 6)?;
    let req = ForwardRequest { tokens: &ps, logits: LogitRows::None, hidden_layers: &layers };
    let mut cache = b.new_model_cache(m, 2, 8).map_err(err)?;
    let out = b.forward(m, &mut cache, &req).map_err(err)?;
    if out.logits.is_some() {
        return Err("logits returned although none were asked".into());
    }
    let width = layers.len() * cfg.hidden_size;
    let h = out.hidden.ok_or("no hidden states returned")?;
    let observed = rows(&b.download_f64(&h).map_err(err)?, width, out.plan.total_tokens, "hidden states")?;
    let oracle = RefModel::new((*s.weights).clone());
    let mut rc = oracle.new_cache(2, 8).map_err(|e| e.to_string())?;
    let expected_out = oracle.forward(&mut rc, &req).map_err(|e| e.to_string())?;
    let expected: Vec<Vec<f64>> = expected_out.hidden.chunks(width).map(<[f64]>::to_vec).collect();
    // Hidden rows carry no decision: compare values only (an infinite epsilon).
    compare_rows("hidden states", &observed, &expected, precision(b).hidden_rel_tolerance, f64::INFINITY)
}

fn check_tokenizer(s: &Subject) -> Outcome {
    let loaded = s.loaded.as_ref().ok_or("no tokenizer")?;
    let tok = loaded.tokenizer.as_ref().ok_or("SmolLM2 has no tokenizer")?;
    let texts = [
        "The capital of France is Paris.",
        "  leading spaces,\ttabs\tand\n\nnewlines   ",
        "Unicode: naïve café, Ελληνικά, 日本語, emoji 🦀🚀, combining é",
        "digits 1234567890 and 3.14159",
        "code: fn main() { println!(\"{}\", x); }",
        "<|im_start|>user\nhi<|im_end|>\n",
    ];
    for text in texts {
        let ids = tok.encode(text, false).map_err(|e| e.to_string())?;
        let back = tok.decode(&ids, false).map_err(|e| e.to_string())?;
        if back != text {
            return Err(format!("round trip of {text:?} gave {back:?} (ids {ids:?})"));
        }
    }
    for (text, id) in [("<|endoftext|>", 0u32), ("<|im_start|>", 1), ("<|im_end|>", 2)] {
        let ids = tok.encode(text, false).map_err(|e| e.to_string())?;
        if ids != [id] {
            return Err(format!("special token {text} encodes to {ids:?}, expected [{id}]"));
        }
    }
    // Ids worked out by looking the pieces up in the GGUF vocabulary
    // ("The", "Ġcapital", "Ġof", "ĠFrance", "Ġis"; "Hello", "Ġworld").
    for (text, want) in [("The capital of France is", vec![504u32, 3575, 282, 4649, 314]), ("Hello world", vec![19556, 905]), ("2024", vec![34, 32, 34, 36])] {
        let ids = tok.encode(text, false).map_err(|e| e.to_string())?;
        if ids != want {
            return Err(format!("{text:?} encodes to {ids:?}, the vocabulary gives {want:?}"));
        }
    }
    // Single digits are split (the smollm pre-tokenizer), so a number is one id per digit.
    let digits = tok.encode("2024", false).map_err(|e| e.to_string())?;
    if digits.len() != 4 {
        return Err(format!("\"2024\" encodes to {digits:?}: digits must be split one per token"));
    }
    let chat = tok.chat_prompt("Hi").map_err(|e| e.to_string())?;
    let ids = tok.encode(&chat, false).map_err(|e| e.to_string())?;
    if ids.first() != Some(&1) || !chat.ends_with("<|im_start|>assistant\n") {
        return Err(format!("chat prompt {chat:?} does not open with <|im_start|> and end with the assistant header"));
    }
    Ok((0, 0.0))
}

fn check_export<B: ModelBackend>(b: &B, s: &Subject, m: &B::Model, files: &ModelFiles) -> Outcome {
    let dir = files.smollm2_hf.clone().ok_or_else(|| format!("{NOT_SUPPORTED}the HF export is not given: set {SMOLLM2_HF_ENV} (`cargo xtask` does)"))?;
    let hf = specdec_models::load(&dir).map_err(|e| e.to_string())?;
    // The saved dtype is informational; every other config field must survive.
    let (mut a, mut c) = (hf.weights.config.clone(), s.weights.config.clone());
    (a.torch_dtype, c.torch_dtype) = (None, None);
    if a != c {
        return Err(format!("the HF export's config differs from the GGUF's: {a:?} vs {c:?}"));
    }
    if let Some(((name, _), _)) = hf.weights.named().into_iter().zip(s.weights.named()).find(|(x, y)| x != y) {
        return Err(format!("the HF export's tensor `{name}` differs from the GGUF's"));
    }
    let (Some(a), Some(c)) = (&hf.tokenizer, s.loaded.as_ref().and_then(|l| l.tokenizer.as_ref())) else {
        return Err("a tokenizer is missing from the GGUF or the export".into());
    };
    let text = "Exported tokenizers agree: 12 ÿ 🦀 <|im_end|>";
    if a.encode(text, false).map_err(|e| e.to_string())? != c.encode(text, false).map_err(|e| e.to_string())? {
        return Err("the exported tokenizer encodes differently".into());
    }
    // Same weights, same backend: the logits must be identical.
    let vocab = s.weights.config.vocab_size;
    let ps = prompts(s, &[6], 7)?;
    let hm = b.load_model(&hf.weights).map_err(err)?;
    let mut c1 = b.new_model_cache(m, 1, 8).map_err(err)?;
    let mut c2 = b.new_model_cache(&hm, 1, 8).map_err(err)?;
    let x = logits_of(b, m, &mut c1, &ForwardRequest::last_logits(&ps), vocab)?;
    let y = logits_of(b, &hm, &mut c2, &ForwardRequest::last_logits(&ps), vocab)?;
    compare_rows("GGUF vs HF-export logits", &x, &y, 0.0, 0.0)
}

/// One greedy generation: tokens and, per step, the top-2 margin.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct GreedyRun {
    pub tokens: Vec<u32>,
    pub margins: Vec<f64>,
}

/// Where an output leaves a greedy run's tokens (DECODE-2, ENGINE-3).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Divergence {
    /// No token differs where both have one (the lengths may differ).
    None,
    /// The first differing token, at a step whose top-2 margin is below the epsilon.
    Excused(usize),
    /// The first differing token, at a step whose margin does not excuse it.
    Unexcused(usize),
}

impl GreedyRun {
    /// Where `got` first leaves this run's tokens, judged with `eps`.
    pub fn divergence(&self, got: &[u32], eps: f64) -> Divergence {
        match got.iter().zip(&self.tokens).position(|(a, b)| a != b) {
            Some(step) if self.margins[step] < eps => Divergence::Excused(step),
            Some(step) => Divergence::Unexcused(step),
            None => Divergence::None,
        }
    }
}

/// Plain greedy decoding of a batch (ties to the lowest id), stopping a
/// sequence at `eos` or after `max_tokens`: the batch is ragged after the
/// first stop, which exercises per-sequence cache state.
pub fn greedy<B: ModelBackend>(b: &B, m: &B::Model, prompts: &[Vec<u32>], max_tokens: usize, eos: &[u32], vocab: usize) -> Result<Vec<GreedyRun>, String> {
    let cap = prompts.iter().map(Vec::len).max().unwrap_or(0) + max_tokens + 1;
    let mut cache = b.new_model_cache(m, prompts.len(), cap).map_err(err)?;
    let mut runs = vec![GreedyRun { tokens: Vec::new(), margins: Vec::new() }; prompts.len()];
    let mut input: Vec<Vec<u32>> = prompts.to_vec();
    for _ in 0..max_tokens {
        if input.iter().all(Vec::is_empty) {
            break;
        }
        let out = b.forward(m, &mut cache, &ForwardRequest::last_logits(&input)).map_err(err)?;
        let t = out.logits.ok_or("no logits")?;
        let rows = rows(&b.download_f64(&t).map_err(err)?, vocab, out.plan.logit_rows, "logits")?;
        let mut next = vec![Vec::new(); prompts.len()];
        for (r, seq_rows) in out.plan.rows.iter().enumerate() {
            let (id, margin) = top2(&rows[r]);
            let run = &mut runs[seq_rows.seq];
            run.tokens.push(id as u32);
            run.margins.push(margin);
            if !eos.contains(&(id as u32)) && run.tokens.len() < max_tokens {
                next[seq_rows.seq] = vec![id as u32];
            }
        }
        input = next;
    }
    Ok(runs)
}

/// The shipped DFlash draft of SmolLM2-135M-Instruct (`cargo xtask train-dflash`).
pub fn shipped_dflash_dir() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixtures/dflash/smollm2-135m-instruct")
}

/// The shipped SmolLM2 prompts (`fixtures/prompts/smollm2.json`).
pub fn shipped_prompts() -> Vec<Prompt> {
    let text = include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/../fixtures/prompts/smollm2.json"));
    specdec_models::prompts::parse_prompts("fixtures/prompts/smollm2.json", text).expect("the shipped prompt file parses (checked by the model tests)")
}

/// The reference's greedy runs of SmolLM2, once per process, and once per test run where
/// the run shares them ([`crate::run_share`]: every suite binary of `cargo xtask test`
/// asks for the same minute of f64 forwards).
fn reference_greedy(s: &Subject, prompts: &[Vec<u32>]) -> Result<Vec<GreedyRun>, String> {
    static CACHE: OnceLock<Result<Vec<GreedyRun>, String>> = OnceLock::new();
    let (eos, vocab) = (s.weights.config.eos_ids(), s.weights.config.vocab_size);
    CACHE
        .get_or_init(|| {
            crate::run_share::shared("smollm2-reference-greedy", &(prompts, GREEDY_TOKENS, &eos, vocab, s.weights.config.num_hidden_layers), || {
                let r = ReferenceBackend;
                let m = r.load_model(&s.weights).map_err(err)?;
                greedy(&r, &m, prompts, GREEDY_TOKENS, &eos, vocab)
            })
        })
        .clone()
}

/// MODEL-14: plain greedy decoding agrees with the reference's token for token.
fn check_greedy<B: ModelBackend>(b: &B, s: &Subject, m: &B::Model) -> Outcome {
    let tok = s.loaded.as_ref().and_then(|l| l.tokenizer.as_ref()).ok_or("SmolLM2 has no tokenizer")?;
    let prompts: Vec<Vec<u32>> = shipped_prompts().iter().map(|p| tok.prompt_ids(&p.text, p.chat).map_err(|e| e.to_string())).collect::<Result<_, _>>()?;
    let expected = reference_greedy(s, &prompts)?;
    let observed = greedy(b, m, &prompts, GREEDY_TOKENS, &s.weights.config.eos_ids(), s.weights.config.vocab_size)?;
    let eps = precision(b).argmax_margin_epsilon;
    let mut excused = 0;
    for (i, (o, e)) in observed.iter().zip(&expected).enumerate() {
        if let Some(step) = o.tokens.iter().zip(&e.tokens).position(|(a, b)| a != b) {
            if e.margins[step] < eps {
                excused += 1;
                continue;
            }
            return Err(format!("prompt {i}: token {step} is {}, the reference's {} (reference top-2 margin {:.3e} >= epsilon {eps:e})", o.tokens[step], e.tokens[step], e.margins[step]));
        }
        if o.tokens.len() != e.tokens.len() {
            return Err(format!("prompt {i}: {} tokens, the reference generated {}", o.tokens.len(), e.tokens.len()));
        }
    }
    Ok((excused, 0.0))
}

/// The model section as a section of the runner.
pub struct ModelSection {
    pub files: ModelFiles,
}

impl<B: ModelBackend> crate::section::Section<B> for ModelSection {
    fn names(&self) -> Vec<String> {
        model_items().into_iter().map(|i| i.name).collect()
    }

    fn run(&self, backend: &B, cfg: &SuiteConfig, progress: &mut dyn FnMut(&CheckResult)) -> Vec<CheckResult> {
        run(backend, cfg, &self.files, progress)
    }
}
