//! `cargo xtask bench` runs this: the whole speedup report (see the crate
//! docs), written to `reports/bench/`. `SPECDEC_BENCH_SECTIONS` picks
//! sections (`kernels,ngram,forward,e2e,mix,serve,features`, all by default); forward, e2e,
//! mix, serve and features need `SPECDEC_SMOLLM2_GGUF`; the peer columns need `SPECDEC_PEERS_PYTHON` (and
//! `SPECDEC_LLAMA_CPP_PATH` and `SPECDEC_LLAMA_SERVER` for llama.cpp's binding and server in the mix). `SPECDEC_BENCH_MIX_BACKENDS` names
//! the backends the prompt mix runs on (`ndarray`, the fastest CPU backend, by default).

use std::path::{Path, PathBuf};
use std::time::Duration;

use criterion::Criterion;
use indicatif::{ProgressBar, ProgressStyle};
use specdec_backend::model::{LlamaWeights, ModelBackend};
use specdec_benches::e2e::{self, BenchPrompt, E2e, PROMPTS};
use specdec_benches::kernels::{self, Inputs, SHAPES};
use specdec_benches::machine::Machine;
use specdec_benches::report::Report;
use specdec_benches::{each_backend, forward, peer};
use specdec_benches::{features, mix};
use specdec_registry::Job;

/// The backend the load section serves on: `specdec serve`'s default, the
/// fastest lossless CPU backend (RESULTS), so the section times what a user
/// of the server gets.
const SERVE_BACKEND: &str = "ndarray";

/// Default new tokens per end-to-end run (`SPECDEC_BENCH_TOKENS` overrides).
const MAX_TOKENS: usize = 48;

/// The prompt mix's backends by default: one, the fastest on a CPU, so the
/// section fits the report's time budget.
const MIX_BACKENDS: &str = "ndarray";

struct KernelJob<'a> {
    c: &'a mut Criterion,
    inputs: &'a Inputs,
    machine: &'a Machine,
    dir: &'a Path,
    out: Vec<kernels::KernelTime>,
}

impl Job for KernelJob<'_> {
    type Out = ();
    fn run<B: ModelBackend>(&mut self, name: &str, b: &B) {
        self.out.extend(kernels::bench(self.c, name, b, self.inputs, self.machine, self.dir));
    }
}

struct ForwardJob<'a> {
    c: &'a mut Criterion,
    weights: &'a LlamaWeights,
    machine: &'a Machine,
    dir: &'a Path,
    out: Vec<forward::ForwardTime>,
}

impl Job for ForwardJob<'_> {
    type Out = ();
    fn run<B: ModelBackend>(&mut self, name: &str, b: &B) {
        self.out.extend(forward::bench(self.c, name, b, self.weights, self.machine, self.dir));
    }
}

struct E2eJob<'a> {
    /// Shared by every DFlash drafter the sweep builds (it reads the head).
    weights: &'a std::sync::Arc<LlamaWeights>,
    prompts: &'a [BenchPrompt],
    max_tokens: usize,
    out: E2e,
    /// The first failure; later backends are skipped, earlier rows kept.
    failure: Option<String>,
}

impl Job for E2eJob<'_> {
    type Out = ();
    fn run<B: ModelBackend>(&mut self, name: &str, b: &B) {
        if self.failure.is_some() {
            return;
        }
        // Plain, every swept k, and one pay-off run per proposer.
        let runs = self.prompts.len() * (1 + e2e::proposers().iter().map(|p| e2e::ks(p).len() + 1).sum::<usize>());
        let bar = progress_bar(name.to_string(), runs);
        let mut tick = |what: &str| tick(&bar, what);
        match e2e::measure(name, b, self.weights, self.prompts, self.max_tokens, &mut tick) {
            Ok(e) => {
                self.out.plain.extend(e.plain);
                self.out.spec.extend(e.spec);
                self.out.best_k.extend(e.best_k);
            }
            Err(why) => self.failure = Some(why),
        }
        bar.finish_and_clear();
    }
}

struct MixJob<'a> {
    weights: &'a std::sync::Arc<LlamaWeights>,
    prompts: &'a [mix::MixPrompt],
    max_tokens: usize,
    /// The backends the mix runs on (`SPECDEC_BENCH_MIX_BACKENDS`).
    wanted: Vec<String>,
    out: mix::Mix,
    failure: Option<String>,
}

impl Job for MixJob<'_> {
    type Out = ();
    fn run<B: ModelBackend>(&mut self, name: &str, b: &B) {
        if self.failure.is_some() || !self.wanted.iter().any(|w| w == name) {
            return;
        }
        let bar = progress_bar(format!("mix {name}"), self.prompts.len() + mix::BATCHES.len());
        let mut tick = |what: &str| tick(&bar, what);
        match mix::measure(name, b, self.weights, self.prompts, self.max_tokens, &mut tick) {
            Ok(m) => {
                self.out.runs.extend(m.runs);
                self.out.batches.extend(m.batches);
            }
            Err(why) => self.failure = Some(why),
        }
        bar.finish_and_clear();
    }
}

/// The request-features section on the one backend named `wanted`.
struct FeaturesJob<'a> {
    weights: &'a std::sync::Arc<LlamaWeights>,
    tokenizer: Option<&'a specdec_models::Tokenizer>,
    wanted: &'a str,
    out: Result<features::Features, String>,
}

impl Job for FeaturesJob<'_> {
    type Out = ();
    fn run<B: ModelBackend>(&mut self, name: &str, b: &B) {
        if name != self.wanted {
            return;
        }
        eprintln!("bench: request features on {name}");
        self.out = match self.tokenizer {
            Some(tok) => features::measure(name, b, self.weights, tok, FEATURE_TOKENS),
            None => Err("SmolLM2 has no tokenizer".into()),
        };
    }
}

/// Tokens at most per answer of the request-features section (a tool call
/// ends at eos well before).
const FEATURE_TOKENS: usize = 96;

/// A progress bar of `len` runs, labelled `prefix`.
fn progress_bar(prefix: String, len: usize) -> ProgressBar {
    let bar = ProgressBar::new(len as u64).with_style(ProgressStyle::with_template("{prefix:>12} [{bar:30}] {pos}/{len} {msg}").expect("template").progress_chars("=> "));
    bar.set_prefix(prefix);
    bar
}

/// One finished run on `bar`.
fn tick(bar: &ProgressBar, what: &str) {
    bar.set_message(what.to_string());
    bar.inc(1);
}

fn bench_prompts(tokenizer: Option<&specdec_models::Tokenizer>) -> Result<Vec<BenchPrompt>, String> {
    let tok = tokenizer.ok_or("SmolLM2 has no tokenizer")?;
    let shipped = specdec_conformance::model_section::shipped_prompts();
    PROMPTS
        .iter()
        .map(|(id, kind)| {
            let p = shipped.iter().find(|p| p.id == *id).ok_or_else(|| format!("prompt `{id}` is not in fixtures/prompts/smollm2.json"))?;
            Ok(BenchPrompt { id: p.id.clone(), kind: (*kind).into(), ids: tok.prompt_ids(&p.text, p.chat).map_err(|e| e.to_string())? })
        })
        .collect()
}

fn main() -> Result<(), String> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let criterion_dir = std::env::var("CARGO_TARGET_DIR").map_or_else(|_| root.join("target"), PathBuf::from).join("criterion");
    let sections = std::env::var("SPECDEC_BENCH_SECTIONS").unwrap_or_else(|_| "kernels,ngram,forward,e2e,mix,serve,features".into());
    let want = |s: &str| sections.split(',').any(|x| x.trim() == s);
    let max_tokens = std::env::var("SPECDEC_BENCH_TOKENS").ok().map_or(Ok(MAX_TOKENS), |v| v.parse().map_err(|_| format!("SPECDEC_BENCH_TOKENS={v} is not a token count")))?;
    // No plots: the report reads criterion's estimates only.
    let mut c = Criterion::default().warm_up_time(Duration::from_millis(500)).measurement_time(Duration::from_secs(2)).sample_size(10).without_plots().configure_from_args();
    eprintln!("bench: measuring the machine's copy bandwidth");
    specdec_benches::run_started();
    let machine = Machine::measure();
    let mut skipped = Vec::new();

    let mut kernel_times = Vec::new();
    let mut peer = Err("the kernels section did not run".to_string());
    let mut ngram = None;
    if want("kernels") {
        for shape in SHAPES {
            let inputs = Inputs::new(shape, 20_261_122);
            let mut job = KernelJob { c: &mut c, inputs: &inputs, machine: &machine, dir: &criterion_dir, out: Vec::new() };
            each_backend(&mut job, true, false);
            kernel_times.extend(job.out);
        }
        peer = match std::env::var_os("SPECDEC_PEERS_PYTHON") {
            Some(py) => peer::measure(Path::new(&py), &SHAPES),
            None => Err("SPECDEC_PEERS_PYTHON is not set (`cargo xtask bench` installs HF transformers and sets it)".into()),
        };
    } else {
        skipped.push("kernels (not in SPECDEC_BENCH_SECTIONS)".into());
    }

    if want("ngram") {
        ngram = specdec_benches::ngram::bench(&mut c, &criterion_dir);
    } else {
        skipped.push("n-gram (not in SPECDEC_BENCH_SECTIONS)".into());
    }

    for (section, name) in [("forward", "forward"), ("e2e", "end to end"), ("mix", "prompt mix"), ("serve", "serve under load"), ("features", "request features")] {
        if !want(section) {
            skipped.push(format!("{name} (not in SPECDEC_BENCH_SECTIONS)"));
        }
    }
    let model = match std::env::var_os("SPECDEC_SMOLLM2_GGUF") {
        Some(path) if want("forward") || want("e2e") || want("mix") || want("serve") || want("features") => Some(specdec_models::load(&path).map_err(|e| format!("SmolLM2: {e}"))?),
        Some(_) => None,
        None => {
            skipped.push("forward and end to end (SPECDEC_SMOLLM2_GGUF is not set: `eval \"$(cargo xtask model)\"`)".into());
            None
        }
    };
    let mut forward_times = Vec::new();
    let mut e2e = E2e::default();
    let mut e2e_failure = None;
    let mut serve = Err("not in SPECDEC_BENCH_SECTIONS, or SmolLM2 is not set".to_string());
    let mut features = Err("not in SPECDEC_BENCH_SECTIONS, or SmolLM2 is not set".to_string());
    let (mut mix_runs, mut mix_failure) = (mix::Mix::default(), None);
    let mut mix_peers = Err("not in SPECDEC_BENCH_SECTIONS, or SmolLM2 is not set".to_string());
    if let Some(model) = model {
        // Shared by every DFlash drafter the end-to-end sweep builds (it reads the head).
        let weights = std::sync::Arc::new(model.weights);
        if want("forward") {
            let mut job = ForwardJob { c: &mut c, weights: &weights, machine: &machine, dir: &criterion_dir, out: Vec::new() };
            each_backend(&mut job, false, true);
            forward_times = job.out;
        }
        if want("e2e") {
            let prompts = bench_prompts(model.tokenizer.as_ref())?;
            // The weight-format variants are timed as forwards only: their verify
            // window over decode says what drafting would cost them, and a
            // second end-to-end sweep would not fit the report's budget.
            let mut job = E2eJob { weights: &weights, prompts: &prompts, max_tokens, out: E2e::default(), failure: None };
            each_backend(&mut job, false, false);
            (e2e, e2e_failure) = (job.out, job.failure);
        }
        if want("mix") {
            let tok = model.tokenizer.as_ref().ok_or("SmolLM2 has no tokenizer")?;
            let prompts = mix::prompts(tok)?;
            let wanted = std::env::var("SPECDEC_BENCH_MIX_BACKENDS").unwrap_or_else(|_| MIX_BACKENDS.into()).split(',').map(|s| s.trim().to_string()).collect();
            let mut job = MixJob { weights: &weights, prompts: &prompts, max_tokens, wanted, out: mix::Mix::default(), failure: None };
            each_backend(&mut job, false, false);
            (mix_runs, mix_failure) = (job.out, job.failure);
            mix_peers = match std::env::var_os("SPECDEC_PEERS_PYTHON") {
                None => Err("SPECDEC_PEERS_PYTHON is not set (`cargo xtask bench` installs HF transformers and llama.cpp and sets it)".into()),
                Some(python) => {
                    let var = std::env::var_os;
                    let (llama, server, hf, gguf) = (var("SPECDEC_LLAMA_CPP_PATH"), var("SPECDEC_LLAMA_SERVER"), var("SPECDEC_SMOLLM2_HF"), var("SPECDEC_SMOLLM2_GGUF"));
                    fn path(v: &Option<std::ffi::OsString>) -> Option<&Path> {
                        v.as_deref().map(Path::new)
                    }
                    let setup = mix::PeerSetup { python: Path::new(&python), llama_cpp: path(&llama), llama_server: path(&server), hf_dir: path(&hf), gguf: path(&gguf) };
                    mix::peers(&setup, &prompts, max_tokens, &criterion_dir)
                }
            };
        }
        if want("features") {
            let mut job = FeaturesJob { weights: &weights, tokenizer: model.tokenizer.as_ref(), wanted: MIX_BACKENDS, out: Err(format!("{MIX_BACKENDS} is not in this build")) };
            each_backend(&mut job, false, false);
            features = job.out;
        }
        if want("serve") {
            serve = match &model.tokenizer {
                Some(tok) => specdec_benches::serve_load::measure(SERVE_BACKEND, &weights, tok),
                None => Err("SmolLM2 has no tokenizer".into()),
            };
        }
    }
    c.final_summary();

    let report = Report {
        machine,
        command: "cargo xtask bench".into(),
        max_tokens,
        kernels: kernel_times,
        peer,
        ngram,
        forward: forward_times,
        e2e,
        e2e_failure: e2e_failure.clone(),
        mix: mix_runs,
        mix_peers,
        mix_failure: mix_failure.clone(),
        serve,
        features: features.clone(),
        skipped,
    };
    let dir = root.join("reports/bench");
    report.write(&dir)?;
    eprintln!("bench: wrote reports/bench/BENCH.md, bench.json and the plots");
    print!("{}", std::fs::read_to_string(dir.join("BENCH.md")).map_err(|e| e.to_string())?);
    // A lossless failure is the one outcome a report must not hide: exit non-zero.
    if let Err(why) = features.as_ref()
        && why.contains("other tokens")
    {
        return Err(format!("request features: {why}"));
    }
    if let Some(why) = mix_failure {
        return Err(format!("prompt mix: {why}"));
    }
    e2e_failure.map_or(Ok(()), |why| Err(format!("end to end: {why}")))
}
