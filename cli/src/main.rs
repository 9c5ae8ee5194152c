//! `specdec`: run the conformance suite on any backend in this build, check
//! external case files, bless golden cases from the reference, and run the
//! statistics campaign. Exit status is non-zero whenever a check fails.
//!
//! Commands: `backends`; `conform` (the suite, `--shard I/N` for one shard)
//! and `check` (a vendor's case file); `bless`; `stats` (the losslessness
//! campaign with plots, seed sweeps: `campaign.rs`); `model info`, `model
//! export` and `model tiny` (`model.rs`); `generate` (plain or speculative
//! decoding through the decoder, `--compare`); `draft-data` (DFlash training
//! data, with prompts the target writes itself); `engine-check` (the engine
//! section on `decoder:..`, `exec:..`, `http://..` or `llama-cpp+http://..`)
//! and `engine-adapter` (specdec's decoder as an exec engine); `report merge`
//! (`merge.rs`: conformance, sweep and fuzz shards into one report;
//! `recipes/sharded/` runs the shards on Slurm, Kubernetes or a CI matrix);
//! `serve` (`specdec-serve`; `--model` may be `tiny:NAME`) and `load` (the
//! load generator against any OpenAI-compatible server). Backends come from
//! `specdec-registry`; each failing check prints a command that reruns it
//! (`tests/check.rs`).

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use indicatif::{ProgressBar, ProgressStyle};
use specdec_backend::ModelBackend;
use specdec_conformance::case::Case;
use specdec_conformance::harness::write_reports;
use specdec_conformance::host::HostSection;
use specdec_conformance::model_section::ModelFiles;
use specdec_conformance::ops::HOST_OPS;
use specdec_conformance::report::Report;
use specdec_conformance::runner::Runner;
use specdec_conformance::shard::Shard;
use specdec_conformance::suite::{self, Item, KernelSection, Selection, Status, SuiteConfig};

mod bless;
mod campaign;
mod draft_data;
mod engine;
mod generate;
mod merge;
mod model;
mod serve;

use specdec_registry::{Describe, Job, all_names, opt_in_names, with_backend};

#[derive(Parser)]
#[command(name = "specdec", version, about = "Speculative-decoding reference and conformance testbed")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Lists the backends of this build and whether each can run here.
    Backends,
    /// Runs the conformance suite (golden, differential, statistical checks).
    Conform {
        /// A backend name, or `all` for every backend available in this build.
        #[arg(long, default_value = "all")]
        backend: String,
        /// Only checks whose name contains this (or matches it, with `*`).
        #[arg(long)]
        filter: Option<String>,
        /// A selection file (TOML: include, exclude, xfail glob lists).
        #[arg(long)]
        xfails: Option<PathBuf>,
        /// The run seed (default: SPECDEC_SEED, else the fixed default).
        #[arg(long)]
        seed: Option<u64>,
        /// Where to write reports: a directory (JSON, Markdown and JUnit per
        /// backend) or a file ending in .json, .md or .xml. Repeatable.
        #[arg(long)]
        report: Vec<PathBuf>,
        /// Differential cases per operation.
        #[arg(long, default_value_t = specdec_conformance::diff::DEFAULT_CASES_PER_OP)]
        diff_cases: usize,
        /// Skip the statistical checks.
        #[arg(long)]
        no_stat: bool,
        /// The SmolLM2 GGUF of the model section (default: SPECDEC_SMOLLM2_GGUF).
        #[arg(long)]
        smollm2: Option<PathBuf>,
        /// Its HF-layout export (default: SPECDEC_SMOLLM2_HF).
        #[arg(long)]
        smollm2_hf: Option<PathBuf>,
        /// Run shard I of N (I counted from 0): only the checks whose name
        /// hashes to I; `specdec report merge` makes the run's report of the
        /// N shards' JSON reports.
        #[arg(long)]
        shard: Option<Shard>,
    },
    /// Model files: `info PATH`, `export GGUF DIR`, `tiny --preset NAME DIR`.
    Model {
        #[command(subcommand)]
        command: model::ModelCommand,
    },
    /// Plain or speculative decoding of one prompt (MODEL-15, DECODE-1 .. DECODE-8).
    Generate {
        /// An HF-layout directory or a `.gguf` file.
        #[arg(long)]
        model: PathBuf,
        /// The default is the fastest lossless backend measured (RESULTS):
        /// `ndarray`, batch-invariant, multiplying a GGUF's Q8_0 and Q4_1
        /// blocks as stored; `reference` is the plain f64 forward.
        #[arg(long, default_value = "ndarray")]
        backend: String,
        #[arg(long)]
        prompt: String,
        /// Wrap the prompt in the model's chat template.
        #[arg(long)]
        chat: bool,
        #[arg(long, default_value_t = 64)]
        max_tokens: usize,
        #[command(flatten)]
        sampling: generate::SamplingArgs,
        #[arg(long, default_value_t = 0)]
        seed: u64,
        /// Print one JSON object (prompt_ids, token_ids, text, finish_reason,
        /// proposer, acceptance, mean_accepted, tokens_per_step, steps, timings).
        #[arg(long)]
        json: bool,
        /// none, ngram, draft:PATH, early-exit:L, dflash:PATH or dflash-iter:PATH.
        #[arg(long, default_value = "none")]
        proposer: specdec_decoder::ProposerChoice,
        /// Drafts per step at most.
        #[arg(long, default_value_t = 4)]
        k: usize,
        /// Who picks each step's k: `payoff` (speculate only where this run
        /// measures that it pays, CTRL-7 .. CTRL-10) or `fixed` (always --k).
        /// Default: `payoff` for greedy decoding; `fixed` when sampling, where
        /// timing-driven choices would make a seeded run's tokens depend on
        /// the machine (they keep the law).
        #[arg(long)]
        controller: Option<String>,
        /// Also run plain decoding and print the speedup (greedy: fails if the tokens differ).
        #[arg(long)]
        compare: bool,
        /// Constrain the output text to match this regex (CONSTRAIN-1).
        #[arg(long)]
        regex: Option<String>,
        /// Constrain the output to compact JSON valid under this schema file
        /// (the subset of spec section 23).
        #[arg(long, value_name = "FILE")]
        json_schema: Option<PathBuf>,
        /// Constrain the output text to this GBNF grammar file (llama.cpp's
        /// format, rule `root`; a recursive one is a context-free language).
        #[arg(long, value_name = "FILE")]
        grammar: Option<PathBuf>,
    },
    /// Training data for a draft: the target's greedy continuations of one
    /// split of a prompt file, with its hidden states at `--layers`.
    DraftData {
        /// An HF-layout directory or a `.gguf` file.
        #[arg(long)]
        model: PathBuf,
        #[arg(long, default_value = "reference")]
        backend: String,
        #[arg(long, default_value = "fixtures/dflash/prompts.json")]
        prompts: PathBuf,
        /// `train` or `heldout`.
        #[arg(long, default_value = "train")]
        split: String,
        /// Target layers to record, comma-separated (a DFlash draft's `target_layer_ids`).
        #[arg(long, value_delimiter = ',', required = true)]
        layers: Vec<usize>,
        #[arg(long, default_value_t = 128)]
        max_tokens: usize,
        /// Requests decoded together.
        #[arg(long, default_value_t = 16)]
        batch: usize,
        /// Also this many training prompts written by the target itself
        /// (sampled user turns of its chat template; `train` split only).
        #[arg(long, default_value_t = 0)]
        synthesize: usize,
        /// The first request seed of `--synthesize`.
        #[arg(long, default_value_t = 0)]
        seed: u64,
        #[arg(long)]
        out: PathBuf,
    },
    /// Runs a case file written by anyone, reporting each case.
    Check {
        cases: PathBuf,
        #[arg(long, default_value = "reference")]
        backend: String,
        #[arg(long)]
        filter: Option<String>,
        /// Only the case with this id (what a failure's repro command names).
        #[arg(long = "case")]
        case_id: Option<String>,
        #[arg(long)]
        report: Vec<PathBuf>,
    },
    /// The engine checks (spec section 21) on an engine: specdec's own
    /// decoder (`decoder:BACKEND:PROPOSER`), any engine speaking the exec
    /// protocol's `generate` operation (`exec:COMMAND`, PROTO-9), or a server
    /// (`http://HOST:PORT` OpenAI-compatible, `llama-cpp+http://HOST:PORT`
    /// llama.cpp's; `,plain=URL` names a second server started without
    /// speculation where the first speculates for every request).
    EngineCheck {
        #[arg(long)]
        engine: String,
        #[arg(long)]
        filter: Option<String>,
        /// Leaves out the checks whose names match this glob (repeatable),
        /// e.g. `'engine/*/processors/*/on'`: they are reported skipped.
        #[arg(long)]
        exclude: Vec<String>,
        #[arg(long)]
        seed: Option<u64>,
        #[arg(long)]
        report: Vec<PathBuf>,
        /// Seconds an exec engine has for one batch of generations.
        #[arg(long, default_value_t = 600)]
        timeout: u64,
        /// A large model (`.gguf` or HF layout, with a tokenizer) the engine
        /// runs: its checks are greedy identity and speculation on against off
        /// instead of the tiny model's (`decoder:` engines load it; an exec or
        /// HTTP engine must run the same weights).
        #[arg(long)]
        model: Option<PathBuf>,
        /// For a server that publishes no statement on `/v1/models`:
        /// a JSON file of ENGINE-1's statement (name, version, speculation,
        /// vocab, greedy_epsilon, batch_invariant, stop_strings, and
        /// optionally eos_ids).
        #[arg(long)]
        statement: Option<PathBuf>,
        /// The served model's tokenizer (a `.gguf`, an HF folder, a
        /// `tokenizer.json`; `tiny:tiny-v12-l2` for the tiny model): the
        /// checks whose oracle is the engine's own plain decoding (ENGINE-10),
        /// for any model, with nothing from the reference.
        #[arg(long)]
        tokenizer: Option<String>,
        /// With `--tokenizer` or `--model`: the prompts (`.jsonl`, one
        /// `{"id", "chat", "text"}` per line, or the prompt-file envelope);
        /// the shipped SmolLM2 prompts where absent.
        #[arg(long)]
        prompts: Option<PathBuf>,
        /// Run shard I of N (I counted from 0); `specdec report merge`
        /// joins the shards' JSON reports.
        #[arg(long)]
        shard: Option<Shard>,
    },
    /// Serves specdec's own decoder on the engine checks' tiny model as an
    /// exec engine (PROTO-9) on stdin/stdout.
    EngineAdapter {
        #[arg(long, default_value = "reference")]
        backend: String,
        /// A proposer of the end-to-end section (`ngram`, `draft:seeded`, `draft:self`, ...).
        #[arg(long, default_value = "ngram")]
        proposer: String,
        #[arg(long, default_value_t = 3)]
        k: usize,
    },
    /// The speculative decoder behind an OpenAI-compatible HTTP API
    /// (`/v1/completions`, `/v1/chat/completions`, `/v1/models`, `/health`,
    /// `/metrics`), with continuous batching; until SIGTERM or SIGINT.
    Serve(serve::ServeArgs),
    /// Load on an OpenAI-compatible server: CLIENTS streaming chat clients
    /// at each concurrency, speculation on and off (specdec's `speculation`
    /// field); throughput and latency percentiles, and the crossover.
    Load {
        /// The server, `http://HOST:PORT`.
        #[arg(long)]
        url: String,
        #[arg(long, value_delimiter = ',', default_value = "1,2,4,8,16")]
        concurrency: Vec<usize>,
        /// Requests each client sends in turn.
        #[arg(long, default_value_t = 2)]
        requests: usize,
        #[arg(long, default_value_t = 32)]
        max_tokens: usize,
        #[arg(long, default_value_t = 0.0)]
        temperature: f64,
        /// A JSON list of prompt strings (default: the speedup report's prompts).
        #[arg(long)]
        prompts: Option<PathBuf>,
        /// `both` (on and off per level), `on`, `off`, or `server` (the server's own setting).
        #[arg(long, default_value = "both")]
        speculation: String,
        /// Writes the results as JSON.
        #[arg(long)]
        json: Option<PathBuf>,
    },
    /// Recomputes `expected_by: reference` outputs and regenerates
    /// `fixtures/cases/blessed/`; `--check` fails on drift instead of writing.
    Bless {
        #[arg(long)]
        check: bool,
        #[arg(long, default_value = "fixtures")]
        fixtures: PathBuf,
    },
    /// The statistics campaign: lossless checks and negative controls with
    /// reports and plots; `--sweep N` reruns the lossless family over N seeds.
    Stats {
        #[arg(long)]
        seed: Option<u64>,
        #[arg(long, default_value = "reports/stats")]
        out: PathBuf,
        #[arg(long)]
        sweep: Option<u64>,
        /// With `--sweep N`: run shard I of N only (every N-th seed from I).
        #[arg(long, requires = "sweep")]
        shard: Option<Shard>,
    },
    /// Reports of sharded runs: `merge SHARD_DIR...`.
    Report {
        #[command(subcommand)]
        command: ReportCommand,
    },
}

#[derive(Subcommand)]
enum ReportCommand {
    /// One report from the JSON reports of a sharded run's shards (`conform
    /// --shard`, `stats --sweep --shard`), in the folders or files given:
    /// family verdicts are judged over all shards; a missing or duplicated
    /// shard is an error naming it.
    Merge {
        #[arg(required = true)]
        inputs: Vec<PathBuf>,
        /// Where the merged report goes (JSON, Markdown and JUnit per backend,
        /// or the sweep's `sweep.json` and `sweep.md`).
        #[arg(long, default_value = "reports/merged")]
        out: PathBuf,
    },
}

fn main() -> ExitCode {
    let result = match Cli::parse().command {
        Command::Backends => list_backends(),
        Command::Conform { backend, filter, xfails, seed, report, diff_cases, no_stat, smollm2, smollm2_hf, shard } => {
            let env = ModelFiles::from_env();
            let files = ModelFiles { smollm2_gguf: smollm2.or(env.smollm2_gguf), smollm2_hf: smollm2_hf.or(env.smollm2_hf) };
            suite_config(filter, xfails.as_deref(), seed, diff_cases, !no_stat).and_then(|cfg| conform(&backend, &SuiteConfig { shard, ..cfg }, &report, &files))
        }
        Command::Model { command } => model::run(command),
        Command::Generate { model, backend, prompt, chat, max_tokens, sampling, seed, json, proposer, k, controller, compare, regex, json_schema, grammar } => {
            let constraint = generate::constraint_flags(regex, json_schema.as_deref(), grammar.as_deref());
            constraint.and_then(|constraint| specdec_models::load(&model).map(|l| (l, constraint)).map_err(|e| e.to_string())).and_then(|(loaded, constraint)| {
                let sampling_params = sampling.params()?;
                let payoff = generate::payoff_controller(controller.as_deref(), &sampling_params)?;
                let mut job = generate::Generate {
                    weights: std::sync::Arc::new(loaded.weights),
                    tokenizer: loaded.tokenizer,
                    prompt,
                    chat,
                    max_tokens,
                    sampling: sampling_params,
                    logit_bias: sampling.logit_bias()?,
                    seed,
                    json,
                    proposer,
                    k,
                    payoff,
                    compare,
                    logprobs: sampling.logprobs()?,
                    constraint,
                };
                job.validate()?;
                with_backend(&backend, &mut job)?.map(|()| true)
            })
        }
        Command::DraftData { model, backend, prompts, split, layers, max_tokens, batch, synthesize, seed, out } => specdec_models::load(&model).map_err(|e| e.to_string()).and_then(|loaded| {
            let mut job = draft_data::DraftDataJob { model: loaded, prompts, split, layers, max_tokens, batch, synthesize, seed, out };
            with_backend(&backend, &mut job)?.map(|()| true)
        }),
        Command::Check { cases, backend, filter, case_id, report } => check(&cases, &backend, filter, case_id.as_deref(), &report),
        Command::Bless { check, fixtures } => bless::run(&fixtures, check),
        Command::EngineCheck { engine, filter, exclude, seed, report, timeout, model, statement, tokenizer, prompts, shard } => {
            let options = engine::CheckOptions { timeout: std::time::Duration::from_secs(timeout), model, statement, tokenizer, prompts };
            suite_config(filter, None, seed, specdec_conformance::diff::DEFAULT_CASES_PER_OP, true).and_then(|mut cfg| {
                cfg.selection.exclude.extend(exclude);
                cfg.shard = shard;
                engine::check(&engine, &cfg, &report, &options)
            })
        }
        Command::EngineAdapter { backend, proposer, k } => engine::adapter(&backend, &proposer, k),
        Command::Load { url, concurrency, requests, max_tokens, temperature, prompts, speculation, json } => {
            serve::load(&url, &concurrency, requests, max_tokens, temperature, prompts.as_deref(), &speculation, json.as_deref())
        }
        Command::Serve(args) => serve::serve(args),
        Command::Stats { seed, out, sweep, shard } => match seed.map_or_else(suite::seed_from_env, Ok) {
            Ok(seed) => match sweep {
                Some(n) => campaign::sweep(n, shard, &out),
                None => campaign::run(seed, &out),
            },
            Err(e) => Err(e),
        },
        Command::Report { command: ReportCommand::Merge { inputs, out } } => merge::run(&inputs, &out),
    };
    match result {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("specdec: {e}");
            ExitCode::from(2)
        }
    }
}

fn list_backends() -> Result<bool, String> {
    for name in all_names().into_iter().chain(opt_in_names()) {
        let all = if all_names().contains(&name) { "" } else { " (by name only, not in `all`)" };
        match with_backend(name, &mut Describe) {
            Ok(desc) => println!("{name:<16} available{all}: {desc}"),
            Err(why) => println!("{name:<16} unavailable{all}: {why}"),
        }
    }
    Ok(true)
}

/// The conformance run of one backend: the runner's standard sections.
struct Conform<'a> {
    cfg: &'a SuiteConfig,
    files: &'a ModelFiles,
}

impl Job for Conform<'_> {
    type Out = Report;
    fn run<B: ModelBackend>(&mut self, _name: &str, backend: &B) -> Report {
        run_with_progress(&Runner::standard(self.cfg, self.files.clone(), &backend.name()), backend, self.cfg)
    }
}

/// Runs `runner` on `backend` behind a progress bar.
fn run_with_progress<B: ModelBackend>(runner: &Runner<'_, B>, backend: &B, cfg: &SuiteConfig) -> Report {
    let bar = ProgressBar::new(runner.names().len() as u64).with_style(ProgressStyle::with_template("{prefix:>12} [{bar:30}] {pos}/{len} {wide_msg}").expect("valid template").progress_chars("=> "));
    bar.set_prefix(backend.name());
    let report = runner.run(backend, cfg, &mut |r| {
        bar.set_message(r.name.clone());
        bar.inc(1);
    });
    bar.finish_and_clear();
    report
}

/// The suite configuration of `conform`'s flags.
fn suite_config(filter: Option<String>, xfails: Option<&Path>, seed: Option<u64>, diff_cases: usize, statistical: bool) -> Result<SuiteConfig, String> {
    let selection = match xfails {
        Some(path) => Selection::parse(&std::fs::read_to_string(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?)?,
        None => Selection::default(),
    };
    let seed = seed.map_or_else(suite::seed_from_env, Ok)?;
    Ok(SuiteConfig { seed, filter, selection, diff_cases_per_op: diff_cases, statistical, shard: None })
}

fn conform(backend: &str, cfg: &SuiteConfig, reports: &[PathBuf], files: &ModelFiles) -> Result<bool, String> {
    let names: Vec<&str> = if backend == "all" { all_names() } else { vec![backend] };
    let mut ok = true;
    let mut ran = Vec::new();
    let mut unavailable = Vec::new();
    for name in names {
        match with_backend(name, &mut Conform { cfg, files }) {
            Ok(report) => {
                print_report(&report);
                ok &= !report.summary.failed;
                ran.push(report);
            }
            Err(why) if backend == "all" => {
                println!("{name}: unavailable in this build or on this machine: {why}\n");
                unavailable.push(name);
            }
            Err(why) => return Err(why),
        }
    }
    write_all(reports, &ran)?;
    // The run ends by saying what actually ran: a backend that did not, or
    // checks that were not executed, are never hidden in a PASS.
    println!("backends that ran:");
    for r in &ran {
        let count = |s: Status| r.summary.counts.get(&s).copied().unwrap_or(0);
        let executed = count(Status::Pass) + count(Status::Fail) + count(Status::XFail) + count(Status::XPass);
        println!("  {}: {executed} checks executed, {} not supported, {} not selected", r.backend, count(Status::NotSupported), count(Status::Skipped));
    }
    if !unavailable.is_empty() {
        println!("backends that did not run: {}", unavailable.join(", "));
    }
    if let Some(shard) = cfg.shard {
        // A shard's statistical verdicts are provisional: the merge judges each family over all shards.
        println!("shard {shard}: the other shards' checks are not selected here; `specdec report merge` of all {} shards' JSON reports gives the run's report", shard.count);
    }
    println!("{}", if ok { "conformance: PASS" } else { "conformance: FAIL" });
    Ok(ok)
}

fn print_report(report: &Report) {
    println!("{}", report.summary_line());
    print!("{}", report.coverage_by_op());
    for r in report.results.iter().filter(|r| r.status.is_failure()) {
        println!("  {:?} {}: {}\n    repro: {}", r.status, r.name, r.message, r.repro);
    }
    println!();
}

fn write_all(paths: &[PathBuf], reports: &[Report]) -> Result<(), String> {
    for path in paths {
        let ext = path.extension().and_then(|e| e.to_str()).unwrap_or("");
        if matches!(ext, "json" | "md" | "xml") {
            for r in reports {
                let target = if reports.len() == 1 { path.clone() } else { path.with_file_name(format!("{}-{}", specdec_conformance::harness::report_stem(&r.backend), file_name(path))) };
                let text = match ext {
                    "json" => r.to_json(),
                    "md" => r.to_markdown(),
                    _ => r.to_junit(),
                };
                std::fs::write(&target, text).map_err(|e| format!("cannot write {}: {e}", target.display()))?;
                println!("report: {}", target.display());
            }
        } else {
            for r in reports {
                write_reports(r, path).map_err(|e| format!("cannot write reports to {}: {e}", path.display()))?;
            }
            println!("reports: {}/<backend>.{{json,md,junit.xml}}", path.display());
        }
    }
    Ok(())
}

fn file_name(p: &Path) -> String {
    p.file_name().map(|f| f.to_string_lossy().into_owned()).unwrap_or_default()
}

/// A case file run on one backend; host-op cases run on the reference and
/// join the same report, so they count in its summary and its exit status.
struct CheckFile {
    items: Vec<Item>,
    host: Vec<Case>,
    prefix: String,
    cfg: SuiteConfig,
}

impl Job for CheckFile {
    type Out = Report;
    fn run<B: ModelBackend>(&mut self, _name: &str, backend: &B) -> Report {
        let runner = Runner::default().with(KernelSection::from_items(self.items.clone())).with(HostSection::from_cases(&self.prefix, self.host.clone()));
        runner.run(backend, &self.cfg, &mut |_| {})
    }
}

/// `specdec check FILE` (CASE-8, CASE-9, CASE-11): every case of the file on one
/// backend; the exit status is non-zero when any case fails or is malformed.
fn check(path: &Path, backend: &str, filter: Option<String>, case_id: Option<&str>, reports: &[PathBuf]) -> Result<bool, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    let stem = path.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
    let mut loaded = specdec_conformance::case::parse(&text, path).map_err(|e| e.to_string())?;
    if let Some(id) = case_id {
        let known = loaded.cases.iter().any(|c| c.id == id) || loaded.errors.iter().any(|e| e.case.as_deref() == Some(id));
        if !known {
            return Err(format!("{} has no case with id `{id}`", path.display()));
        }
        loaded.cases.retain(|c| c.id == id);
        loaded.errors.retain(|e| e.case.as_deref() == Some(id));
    }
    let is_host = |c: &Case| HOST_OPS.contains(&c.op.as_str());
    let cfg = SuiteConfig { filter, statistical: false, diff_cases_per_op: 0, ..SuiteConfig::default() };
    let prefix = format!("file/{stem}");
    let host: Vec<Case> = loaded.cases.iter().filter(|c| is_host(c)).cloned().collect();
    loaded.cases.retain(|c| !is_host(c));
    let items = suite::items_named(&prefix, loaded);
    let mut report = with_backend(backend, &mut CheckFile { items, host, prefix: prefix.clone(), cfg })?;
    for r in &mut report.results {
        let id = r.name.strip_prefix(&format!("{prefix}/")).unwrap_or(&r.name);
        r.repro = format!("specdec check {} --backend {backend} --case {}", shell_quote(&path.display().to_string()), shell_quote(id));
    }
    for r in &report.results {
        let status = match r.status {
            Status::Pass if r.excused > 0 => "PASS (excused near boundary)".to_string(),
            s => format!("{s:?}").to_uppercase(),
        };
        println!("{status:<14} {}{}", r.name, if r.message.is_empty() { String::new() } else { format!(": {}", r.message) });
        if r.status.is_failure() {
            println!("{:<14}   repro: {}", "", r.repro);
        }
    }
    println!("{}", report.summary_line());
    write_all(reports, std::slice::from_ref(&report))?;
    Ok(!report.summary.failed)
}

/// `s` as one shell word.
fn shell_quote(s: &str) -> String {
    if !s.is_empty() && s.chars().all(|c| c.is_ascii_alphanumeric() || "-_./=:+@%".contains(c)) { s.to_string() } else { format!("'{}'", s.replace('\'', r"'\''")) }
}
