//! `cargo xtask engines`: the engine checks (spec section 21) on real engines (opt-in,
//! not in CI).
//!
//! Runs `specdec engine-check` on specdec's own decoder for every CPU backend and every
//! proposer of the tiny model, and on HF transformers' `generate` (the pinned release the
//! peers use, from PyPI into `.cache/venv-peers`) with each of its speculation paths the
//! tiny model can take: prompt lookup, the model as its own assistant, early exit, and DFlash
//! driving the seeded drafter of the end-to-end section exported in DRAFT-6's layout. And two
//! historical releases around a published losslessness bug: transformers 4.43.4, whose
//! prompt lookup emits the tokens after an eos it drafted and the target accepted
//! mid-run (fixed by huggingface/transformers#31301), which the `eos` check must fail,
//! and 4.44.2, the first release with the fix, which must pass it (installed with
//! `pip --target` beside the peers' torch, their pinned dependencies with them). Each
//! run writes `reports/engines/<engine>.{json,md}`; the table (engine, version, check,
//! status, rules, evidence, repro) goes to `reports/engines/ENGINES.md` and to stdout. A
//! failing engine is a result of this command, not an error: the table shows it.
//!
//! Also: llama.cpp through `llama-cpp-python` (PyPI has only its source: built once into a
//! cached wheel, `.cache/wheels/llama`, then installed with `--target` into
//! `.cache/engines-llama`), plain and with its prompt-lookup drafter, on the tiny model
//! written as an f32 GGUF; llama.cpp's own server (`llama-server`, built once from the
//! same source with CMake from PyPI) through its native endpoint, plain, with its n-gram
//! drafter and with the model as its own draft, each beside a plain server for the
//! requests with speculation off; and `specdec serve` over HTTP. Their statements say
//! what the server takes (processors, logprobs, JSON schemas), so the logprob, processor
//! and constrained families run on it.
//!
//! Then ENGINE-10 on SmolLM2, given only its GGUF as the tokenizer: each engine's
//! speculation against its own plain decoding under the concurrency sweep, on llama.cpp's
//! server (its n-gram drafter, and the model as its own draft model, each against the
//! server started without speculation) and on `specdec serve` with two backends.
//!
//! Servers are started on 127.0.0.1 and stopped here. Two checks run at once (each mostly
//! one thread), and llama.cpp builds in the background while the first engines run.
//! `--only TEXT` runs the runs whose name contains it, building only what they need.
//! `--resume` reuses each run an earlier invocation finished at the same commit on a clean
//! tree (recorded in `<run>.done.json` beside its report): the whole table takes longer
//! than a working sitting on two cores (transformers' runs alone take 45-75 min each),
//! so it may be finished in two, and says which runs it reused.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

/// The tiny model's proposers, as the end-to-end section names them.
const PROPOSERS: [&str; 6] = ["ngram", "draft:seeded", "draft:self", "early-exit:1", "dflash:seeded", "dflash-iter:seeded"];
/// Backends of the CPU build.
const BACKENDS: [&str; 4] = ["reference", "ndarray", "candle-cpu", "tch-cpu"];
/// HF transformers' speculation paths on the tiny model: (slug suffix, `--speculation`),
/// `{model}` the tiny model's directory; DFlash drives the section's seeded drafter,
/// exported in DRAFT-6's layout.
const HF_PATHS: [(&str, &str); 4] = [("prompt-lookup-3", "prompt-lookup:3"), ("assistant-self", "assistant:self"), ("early-exit-1", "early-exit:1"), ("dflash-seeded", "dflash:{model}/dflash-seeded")];
/// Historical transformers releases: (version, what the engine checks must say of it).
const HF_HISTORICAL: [(&str, &str); 2] =
    [("4.43.4", "fails `eos` (tokens past an eos prompt lookup drafted and the target accepted)"), ("4.44.2", "passes `eos` (the first release with the fix of #31301)")];
/// Their dependencies that the peers' environment holds at releases they cannot import.
const HF_HISTORICAL_DEPS: [&str; 7] = ["tokenizers==0.19.1", "huggingface_hub==0.24.6", "requests==2.34.2", "urllib3==2.8.0", "idna==3.20", "certifi==2026.10.19.post1", "charset-normalizer==3.5.3"];
/// llama-cpp-python: the release, and its dependencies the peers' environment lacks.
const LLAMA_CPP: &str = "llama-cpp-python==0.3.36";
const LLAMA_CPP_DEPS: [&str; 1] = ["diskcache==5.6.3"];
/// llama.cpp's speculation paths on the tiny model.
const LLAMA_PATHS: [&str; 2] = ["none", "prompt-lookup:3"];
/// CMake from PyPI, which builds llama.cpp's server from the same source.
const CMAKE: &str = "cmake==3.31.6";

/// The CPU llama.cpp is built for; each build has caches of its own, and a server's stamp
/// names its flags.
#[derive(Clone, Copy, Debug)]
pub enum LlamaCpu {
    /// The portable build (AVX2 and FMA, no AVX-512): the engine checks, whose recorded
    /// table ran on it, since its numerics do not depend on the machine it lands on.
    Portable,
    /// This machine's widest vector paths (AVX-512 where the CPU has it) but not AMX: the
    /// speedup report's peers, so a ratio to llama.cpp is to the build a user would make
    /// here. AMX is left out because a host build with it crashed at its first forward on
    /// a virtual machine whose CPU reports AMX (RESULTS, 2026-12-07, fifteenth session).
    Host,
}

impl LlamaCpu {
    fn cmake_flag(self) -> &'static str {
        match self {
            Self::Portable => "-DGGML_NATIVE=OFF",
            Self::Host => "-DGGML_NATIVE=ON",
        }
    }

    /// Compiler flags, given as `CFLAGS` and `CXXFLAGS` (CMake's first configure reads
    /// them; an explicit `-mno-` outlasts `-march=native` in GCC whatever the order).
    fn compiler_flags(self) -> &'static str {
        match self {
            Self::Portable => "",
            Self::Host => "-mno-amx-tile -mno-amx-int8 -mno-amx-bf16",
        }
    }

    /// [`Self::compiler_flags`] as a build's environment: none for the portable build, which
    /// leaves the caller's own `CFLAGS` as they were.
    fn compiler_env(self) -> Vec<(&'static str, &'static str)> {
        let flags = self.compiler_flags();
        if flags.is_empty() { Vec::new() } else { vec![("CFLAGS", flags), ("CXXFLAGS", flags)] }
    }

    /// Both, as a build's stamp records them.
    fn pins(self) -> String {
        format!("{} {}", self.cmake_flag(), self.compiler_flags()).trim().to_string()
    }

    /// The suffix of its cache folders.
    fn suffix(self) -> &'static str {
        match self {
            Self::Portable => "",
            Self::Host => "-host",
        }
    }
}

/// llama.cpp's server on the tiny model: (slug suffix, its speculation flags); every one
/// is paired with a server started without speculation for the requests with it off.
const LLAMA_SERVER_PATHS: [(&str, &[&str]); 3] = [
    ("none", &[]),
    // A one-token lookup: its drafter copies only where the match leaves at least the
    // lookup's length to copy, so a two-token lookup never drafts in a cycle of two.
    ("ngram-simple-3", &["--spec-type", "ngram-simple", "--spec-ngram-simple-size-n", "1", "--spec-ngram-simple-size-m", "3"]),
    ("draft-self-3", &["--spec-type", "draft-simple", "--spec-draft-n-max", "3", "--model-draft", "{gguf}"]),
];
/// llama.cpp's server on the tiny model: its slots (requests it batches at once).
const LLAMA_TINY_SLOTS: usize = 4;
/// The tiny model's logits from llama.cpp's f32 kernels, with an f32 KV cache, lie this
/// close to the reference's (about 2e-6 measured; with its default f16 cache, up to 1.5e-3).
const LLAMA_TINY_EPSILON: f64 = 1e-4;
/// The flags of that f32 KV cache.
const LLAMA_TINY_CACHE: [&str; 4] = ["--cache-type-k", "f32", "--cache-type-v", "f32"];
/// ENGINE-10 on SmolLM2 with llama.cpp's server: (slug part, speculation flags), each
/// against the server started without speculation. Its n-gram drafter as on the tiny
/// model, and a draft model: SmolLM2 is the smallest of its family, so the model drafts
/// for itself (as llama.cpp's `draft-simple` runs any draft GGUF).
const OWN_LLAMA_SERVER: [(&str, &[&str]); 2] = [
    ("ngram-simple-3", &["--spec-type", "ngram-simple", "--spec-ngram-simple-size-n", "1", "--spec-ngram-simple-size-m", "3"]),
    ("draft-self-3", &["--spec-type", "draft-simple", "--spec-draft-n-max", "3", "--model-draft", "{gguf}"]),
];
/// Slots of the SmolLM2 servers: the sweep's loads up to 16 run batched at once, 64
/// queue four deep.
const OWN_SLOTS: usize = 16;
/// What the statement of llama.cpp's server on SmolLM2's Q4_1 says of its logits: its
/// kernels quantize activations to 8 bits, so a logprob (and a top-2 margin) may move by
/// this much between a one-token decode and a verify window.
const OWN_LLAMA_EPSILON: f64 = 1e-2;
/// SmolLM2's vocabulary.
const SMOLLM2_VOCAB: usize = 49152;
/// ENGINE-10 on a model the f64 reference cannot run: `fixtures/architectures/gpt2`
/// (GPT-2: learned positions, LayerNorm, GELU; random weights HF wrote) as llama.cpp's
/// converter writes it, in f32 with an f32 KV cache; its n-gram drafter against its plain
/// server, on the checkpoints' prompts (their 48-id alphabet).
const FOREIGN_LLAMA_SERVER: [(&str, &[&str]); 1] = [("ngram-simple-3", &["--spec-type", "ngram-simple", "--spec-ngram-simple-size-n", "1", "--spec-ngram-simple-size-m", "3"])];
/// Named by its model first: ENGINE-10 names the model of a GGUF by its file name.
const FOREIGN_GGUF: &str = "fixtures/architectures/gpt2/gpt2.llama.cpp-f32.gguf";
const FOREIGN_PROMPTS: &str = "fixtures/architectures/prompts.jsonl";
const FOREIGN_SUFFIX: &str = "-gpt2-own";
const FOREIGN_VOCAB: usize = 48;
/// `specdec serve` backends under ENGINE-10 on SmolLM2: the f32 port and its
/// batch-invariant Q8_0 one.
const OWN_SERVE_BACKENDS: [&str; 2] = ["ndarray", "ndarray-q8_0"];
/// What llama.cpp may fail, and why (checked: any other failure fails the command).
/// Its sampler chain applies top-p to the untempered distribution (top-k, typical, top-p,
/// min-p, then temperature), where the spec tempers first (LOGITS-1 .. LOGITS-5): at
/// T 0.7 with top-p 0.9 it keeps another set of ids, speculation on and off alike. On
/// SmolLM2's Q4_1 weights its forward quantizes activations to 8 bits, so its greedy
/// tokens leave the f64 reference's (at a margin of 0.016 with the adapter's f32 KV cache;
/// with its default f16 cache, at 0.22, and its prompt lookup then also changed its own
/// greedy output on 2 of 8 prompts): greedy identity fails.
/// Its server runs the same chain. And it answers 500 (`unordered_map::at`) to a
/// request with `n_probs` and a stop string its vocabulary cannot tokenize: it tokenizes
/// the stop string to trim the probabilities, falling back to byte tokens the tiny
/// model's twelve pieces lack (a real SentencePiece vocabulary has them), so the
/// `logprobs` checks, whose cases include a stop string straddling two tokens, stop there.
/// Under ENGINE-10 on SmolLM2 it fails nothing: each speculating server equals its plain
/// one at every load of the sweep.
const LLAMA_EXPECTED: [(&str, &[&str]); 8] = [
    ("llama-cpp-none", &["sampled/t07-topp09/on", "sampled/t07-topp09/off"]),
    ("llama-cpp-prompt-lookup-3", &["sampled/t07-topp09/on", "sampled/t07-topp09/off"]),
    ("llama-server-none", &["sampled/t07-topp09/on", "sampled/t07-topp09/off", "logprobs/on", "logprobs/off"]),
    ("llama-server-ngram-simple-3", &["sampled/t07-topp09/on", "sampled/t07-topp09/off", "logprobs/on", "logprobs/off"]),
    ("llama-server-draft-self-3", &["sampled/t07-topp09/on", "sampled/t07-topp09/off", "logprobs/on", "logprobs/off"]),
    ("llama-cpp-prompt-lookup-3-smollm2", &["greedy-identity"]),
    ("llama-server-ngram-simple-3-smollm2-own", &[]),
    ("llama-server-draft-self-3-smollm2-own", &[]),
];
/// The seed of the table's runs.
pub const ENGINES_SEED: &str = "20261125";

/// Engine checks run at once: the machine's two cores, each check one thread.
const WORKERS: usize = 2;

/// One `specdec engine-check` run of the table.
struct Run {
    slug: String,
    engine: String,
    /// `--model`: the model checks on this model instead of the tiny one.
    model: Option<PathBuf>,
    /// `--statement`: the statement of a server that publishes none.
    statement: Option<PathBuf>,
    /// `--tokenizer`: ENGINE-10's checks on the model of this tokenizer.
    tokenizer: Option<PathBuf>,
    /// `--prompts`: ENGINE-10's prompts, where not the shipped ones.
    prompts: Option<PathBuf>,
}

impl Run {
    fn new(slug: impl Into<String>, engine: impl Into<String>) -> Run {
        Run { slug: slug.into(), engine: engine.into(), model: None, statement: None, tokenizer: None, prompts: None }
    }
}

/// A finished run: its report and seconds.
struct Done {
    slug: String,
    json: PathBuf,
    seconds: f64,
    /// Taken from an earlier invocation at the same commit (`--resume`).
    reused: bool,
}

/// Where the table's runs are recorded, and which earlier ones `--resume` may reuse.
struct Record<'a> {
    out: &'a Path,
    /// The commit of a clean tree; `None` (uncommitted changes, or no git) records nothing
    /// as reusable, since the code a report came from could not be named.
    commit: Option<String>,
    resume: bool,
}

impl Record<'_> {
    fn done_path(&self, slug: &str) -> PathBuf {
        self.out.join(format!("{slug}.done.json"))
    }

    /// The earlier run of `slug` at this commit and seed, if `--resume` and there is one.
    fn reusable(&self, slug: &str) -> Option<Done> {
        let commit = self.commit.as_deref().filter(|_| self.resume)?;
        let record: Value = serde_json::from_str(&std::fs::read_to_string(self.done_path(slug)).ok()?).ok()?;
        let json = self.out.join(format!("{slug}.json"));
        (record["commit"] == commit && record["seed"] == ENGINES_SEED && json.exists()).then(|| Done {
            slug: slug.to_string(),
            json,
            seconds: record["seconds"].as_f64().unwrap_or(f64::NAN),
            reused: true,
        })
    }

    /// Records a finished run as reusable at this commit (nothing on a dirty tree).
    fn finished(&self, done: &Done) -> Result<(), String> {
        let path = self.done_path(&done.slug);
        match &self.commit {
            Some(commit) => {
                let record = serde_json::json!({"commit": commit, "seed": ENGINES_SEED, "seconds": done.seconds});
                std::fs::write(&path, record.to_string()).map_err(|e| format!("cannot write {}: {e}", path.display()))
            }
            None => Ok(()),
        }
    }
}

/// HEAD's commit if the tree has no changes (ignored files aside), else `None`.
fn clean_commit(root: &Path) -> Option<String> {
    let git = |args: &[&str]| Command::new("git").current_dir(root).args(args).output().ok().filter(|o| o.status.success()).map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string());
    git(&["status", "--porcelain"]).filter(String::is_empty)?;
    git(&["rev-parse", "HEAD"])
}

/// Runs every engine (or, with `only`, the runs whose slug contains it) and returns the
/// table. llama.cpp is built (once) in the background while specdec's decoder and
/// transformers run; then llama.cpp's engines on the tiny model, the SmolLM2 runs, and
/// the checks whose oracle is each engine's own plain decoding (ENGINE-10) on SmolLM2.
pub fn run(root: &Path, specdec: &Path, python: &Path, smollm2: &Path, only: Option<&str>, resume: bool) -> Result<String, String> {
    let out = root.join("reports/engines");
    std::fs::create_dir_all(&out).map_err(|e| format!("cannot create {}: {e}", out.display()))?;
    let commit = clean_commit(root);
    if resume && commit.is_none() {
        return Err("--resume reuses runs of a commit: this tree has uncommitted changes (or is not a git checkout)".into());
    }
    let record = Record { out: &out, commit, resume };
    let wanted = |slug: &str| only.is_none_or(|o| slug.contains(o));
    let model = root.join(".cache/models/tiny-v12-l2-hf");
    let status = Command::new(specdec).args(["model", "tiny", "--preset", "tiny-v12-l2", "--gguf", "--dflash"]).arg(&model).status().map_err(|e| e.to_string())?;
    if !status.success() {
        return Err(format!("specdec model tiny failed: {status}"));
    }
    let server_slugs: Vec<String> = LLAMA_SERVER_PATHS
        .iter()
        .map(|(p, _)| format!("llama-server-{p}"))
        .chain(OWN_LLAMA_SERVER.iter().map(|(p, _)| format!("llama-server-{p}-smollm2-own")))
        .chain(FOREIGN_LLAMA_SERVER.iter().map(|(p, _)| format!("llama-server-{p}{FOREIGN_SUFFIX}")))
        .collect();
    let need_server = server_slugs.iter().any(|s| wanted(s));
    let need_binding = LLAMA_PATHS.iter().map(|p| format!("llama-cpp-{}", p.replace(':', "-"))).chain(["llama-cpp-prompt-lookup-3-smollm2".to_string()]).any(|s| wanted(&s));
    let builds = {
        let (root, python) = (root.to_path_buf(), python.to_path_buf());
        std::thread::spawn(move || -> Result<(Option<PathBuf>, Option<PathBuf>), String> {
            Ok((
                if need_binding { Some(ensure_llama_cpp(&root, &python, LlamaCpu::Portable)?) } else { None },
                if need_server { Some(llama_server(&root, &python, LlamaCpu::Portable)?) } else { None },
            ))
        })
    };
    let mut first: Vec<Run> = Vec::new();
    // Engines run from the repository root, so their commands (and the table's repro
    // lines) name repository paths.
    let rel = |p: &Path| p.strip_prefix(root).unwrap_or(p).display().to_string();
    let hf = format!("{} adapters/engines/hf_generate.py {}", rel(python), rel(&model));
    for (suffix, path) in HF_PATHS {
        first.push(Run::new(format!("hf-transformers-{suffix}"), format!("exec:{hf} --speculation {}", path.replace("{model}", &rel(&model)))));
    }
    for (version, _) in HF_HISTORICAL {
        if wanted(&format!("hf-transformers-{version}-prompt-lookup-3")) {
            let dir = historical(root, python, version)?;
            first.push(Run::new(format!("hf-transformers-{version}-prompt-lookup-3"), format!("exec:PYTHONPATH={} {hf} --speculation prompt-lookup:3", rel(&dir))));
        }
    }
    // specdec's decoder after transformers' runs, the phase's longest (45-75 min each
    // against 1-15 for the decoder's): two workers then end the phase nearly together.
    for b in BACKENDS {
        for p in PROPOSERS {
            first.push(Run::new(format!("specdec-{b}-{}", p.replace(':', "-")), format!("decoder:{b}:{p}")));
        }
    }
    // specdec serve over HTTP: started here on a free port, stopped after its check.
    let serve_slug = "specdec-serve-http-ndarray-ngram";
    let mut server = if wanted(serve_slug) { Some(Server::specdec(specdec, root, "tiny:tiny-v12-l2", "ndarray")?) } else { None };
    if let Some(s) = &server {
        first.push(Run::new(serve_slug, format!("http://{}", s.addr)));
    }
    first.retain(|r| wanted(&r.slug));
    let mut done = run_all(root, specdec, &record, &first)?;
    server.iter_mut().for_each(Server::stop);

    let (llama, llama_server) = builds.join().map_err(|_| "the llama.cpp build thread panicked".to_string())??;
    let mut second: Vec<Run> = Vec::new();
    let gguf = model.join("tiny-v12-l2.gguf");
    if let Some(llama) = &llama {
        for path in LLAMA_PATHS {
            second.push(Run::new(
                format!("llama-cpp-{}", path.replace(':', "-")),
                format!("exec:PYTHONPATH={} {} adapters/engines/llama_cpp_generate.py {} --speculation {path}", rel(llama), rel(python), rel(&gguf)),
            ));
        }
    }
    // llama.cpp's own server, through its native endpoint: one server per speculation
    // setting and one plain server for the requests with speculation off. The tiny model
    // with an end token of its own: the server's `ignore_eos` bans it, and no id of the
    // law the checks enumerate.
    let mut servers = Vec::new();
    if let Some(binary) = llama_server.as_ref().filter(|_| LLAMA_SERVER_PATHS.iter().any(|(p, _)| wanted(&format!("llama-server-{p}")))) {
        let version = llama_server_version(binary)?;
        let gguf_end = model.join("tiny-v12-l2-end.gguf");
        // Its KV cache in f32 (the default is f16), so that the logits of the f32 GGUF lie
        // within LLAMA_TINY_EPSILON of the reference's.
        let tiny = |flags: &[&str]| Server::llama(binary, &gguf_end, &[substitute(flags, &gguf_end), LLAMA_TINY_CACHE.map(String::from).to_vec()].concat(), LLAMA_TINY_SLOTS);
        second.extend(llama_server_runs(
            &out,
            &version,
            &mut servers,
            &LLAMA_SERVER_PATHS,
            &ServedModel { suffix: "", vocab: 12, epsilon: LLAMA_TINY_EPSILON, tokenizer: None, prompts: None },
            &wanted,
            tiny,
        )?);
    }
    // SmolLM2, whose law cannot be enumerated: greedy identity and speculation on
    // against off (`--model`), on specdec's decoder and on llama.cpp.
    second.push(Run { model: Some(smollm2.to_path_buf()), ..Run::new("specdec-tch-cpu-ngram-smollm2", "decoder:tch-cpu:ngram") });
    if let Some(llama) = &llama {
        second.push(Run {
            model: Some(smollm2.to_path_buf()),
            ..Run::new(
                "llama-cpp-prompt-lookup-3-smollm2",
                format!("exec:PYTHONPATH={} {} adapters/engines/llama_cpp_generate.py {} --speculation prompt-lookup:3 --n-ctx 512 --greedy-epsilon 1e-2", rel(llama), rel(python), rel(smollm2)),
            )
        });
    }
    second.retain(|r| wanted(&r.slug));
    done.extend(run_all(root, specdec, &record, &second)?);
    servers.iter_mut().for_each(Server::stop);
    servers.clear();

    // ENGINE-10 on SmolLM2: each engine's speculation against its own plain decoding,
    // given only the model's tokenizer (the GGUF), under the concurrency sweep.
    let mut third: Vec<Run> = Vec::new();
    if let Some(binary) = llama_server.as_ref().filter(|_| OWN_LLAMA_SERVER.iter().any(|(p, _)| wanted(&format!("llama-server-{p}-smollm2-own")))) {
        let version = llama_server_version(binary)?;
        let big = |flags: &[&str]| Server::llama(binary, smollm2, &substitute(flags, smollm2), OWN_SLOTS);
        third.extend(llama_server_runs(
            &out,
            &version,
            &mut servers,
            &OWN_LLAMA_SERVER,
            &ServedModel { suffix: "-smollm2-own", vocab: SMOLLM2_VOCAB, epsilon: OWN_LLAMA_EPSILON, tokenizer: Some(smollm2), prompts: None },
            &wanted,
            big,
        )?);
    }
    // And on a model the reference cannot run (GPT-2), as any vendor's: its GGUF from
    // llama.cpp's converter, known to the checks by that file's tokenizer alone.
    if let Some(binary) = llama_server.as_ref().filter(|_| wanted(&format!("llama-server-{}{FOREIGN_SUFFIX}", FOREIGN_LLAMA_SERVER[0].0))) {
        let version = llama_server_version(binary)?;
        let gguf = root.join(FOREIGN_GGUF);
        let foreign = |flags: &[&str]| Server::llama(binary, &gguf, &[flags.iter().map(|f| f.to_string()).collect(), LLAMA_TINY_CACHE.map(String::from).to_vec()].concat(), OWN_SLOTS);
        let prompts = root.join(FOREIGN_PROMPTS);
        let model = ServedModel { suffix: FOREIGN_SUFFIX, vocab: FOREIGN_VOCAB, epsilon: LLAMA_TINY_EPSILON, tokenizer: Some(&gguf), prompts: Some(&prompts) };
        third.extend(llama_server_runs(&out, &version, &mut servers, &FOREIGN_LLAMA_SERVER, &model, &wanted, foreign)?);
    }
    let mut serves = Vec::new();
    for backend in OWN_SERVE_BACKENDS {
        let slug = format!("specdec-serve-{backend}-ngram-smollm2-own");
        if wanted(&slug) {
            let s = Server::specdec(specdec, root, &smollm2.display().to_string(), backend)?;
            third.push(Run { tokenizer: Some(smollm2.to_path_buf()), ..Run::new(slug, format!("http://{}", s.addr)) });
            serves.push(s);
        }
    }
    done.extend(run_all(root, specdec, &record, &third)?);
    servers.iter_mut().chain(serves.iter_mut()).for_each(Server::stop);

    let text = table(&done, only)?;
    let path = out.join(if only.is_some() { "ENGINES-only.md" } else { "ENGINES.md" });
    std::fs::write(&path, &text).map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    expectations(&done, &path)?;
    Ok(text)
}

/// `flags` with `{gguf}` replaced by `gguf`.
fn substitute(flags: &[&str], gguf: &Path) -> Vec<String> {
    flags.iter().map(|f| f.replace("{gguf}", &gguf.display().to_string())).collect()
}

/// The model a set of llama.cpp server runs serves, as their statements and
/// names say it.
struct ServedModel<'a> {
    /// Appended to each run's slug (`-smollm2-own`).
    suffix: &'a str,
    vocab: usize,
    /// The greedy epsilon the statement claims.
    epsilon: f64,
    /// With a tokenizer the runs are ENGINE-10's (`--tokenizer`).
    tokenizer: Option<&'a Path>,
    /// ENGINE-10's prompts (`--prompts`), where not the shipped ones.
    prompts: Option<&'a Path>,
}

/// The runs of llama.cpp's server, one per `(path, flags)` wanted: a server per
/// speculation setting (`start(flags)`, pushed onto `servers`), each paired with the
/// plain one (started once) for the requests with speculation off, and the statement
/// the server cannot publish (`--statement`, written into `out`).
fn llama_server_runs(
    out: &Path,
    version: &str,
    servers: &mut Vec<Server>,
    paths: &[(&str, &[&str])],
    model: &ServedModel<'_>,
    wanted: &dyn Fn(&str) -> bool,
    start: impl Fn(&[&str]) -> Result<Server, String>,
) -> Result<Vec<Run>, String> {
    let ServedModel { suffix, vocab, epsilon, tokenizer, prompts } = *model;
    let mut runs = Vec::new();
    let mut plain: Option<String> = None;
    for (path, flags) in paths {
        let slug = format!("llama-server-{path}{suffix}");
        if !wanted(&slug) {
            continue;
        }
        let plain_url = match &plain {
            Some(url) => url.clone(),
            None => {
                servers.push(start(&[])?);
                let url = format!("llama-cpp+http://{}", servers[servers.len() - 1].addr);
                plain = Some(url.clone());
                url
            }
        };
        let url = if flags.is_empty() {
            plain_url.clone()
        } else {
            servers.push(start(flags)?);
            format!("llama-cpp+http://{}", servers[servers.len() - 1].addr)
        };
        let statement = out.join(format!("{slug}.statement.json"));
        std::fs::write(&statement, llama_server_statement(path, version, vocab, epsilon, tokenizer.is_none()).to_string()).map_err(|e| format!("cannot write {}: {e}", statement.display()))?;
        runs.push(Run { statement: Some(statement), tokenizer: tokenizer.map(Path::to_path_buf), prompts: prompts.map(Path::to_path_buf), ..Run::new(slug, format!("{url},plain={plain_url}")) });
    }
    Ok(runs)
}

/// What llama.cpp's server takes and reports, as its README and native endpoint
/// state them (ENGINE-1): stop strings, no per-request eos ids (the transport cuts
/// after the first), min-p, logit bias and its three penalties over the whole context,
/// JSON schemas and regexes (its grammar sampler; a regex as its GBNF), and with `logprobs` the raw and the
/// post-sampling top-n probabilities (`n_probs`, `post_sampling_probs`), all within
/// `epsilon` of the reference's logits. Not `logprobs` on SmolLM2: its server gives one
/// probability entry per complete UTF-8 character, not per token (a character split
/// over two byte tokens has one entry, of the second id), so no entry can be matched
/// to its token and every check would stop at that contract breach.
fn llama_server_statement(path: &str, version: &str, vocab: usize, epsilon: f64, logprobs: bool) -> Value {
    let mut statement = serde_json::json!({
        "name": format!("llama-server/{path}"), "version": version, "speculation": path, "vocab": vocab,
        "greedy_epsilon": epsilon, "batch_invariant": false, "stop_strings": true, "eos_ids": false,
        "processors": ["min_p", "logit_bias", "repetition_penalty", "presence_penalty", "frequency_penalty"],
        "penalty_scopes": ["context"],
        "constraints": ["json_schema", "regex", "grammar"],
    });
    if logprobs {
        statement["logprobs"] = serde_json::json!({"modes": ["raw", "processed"], "max_top": 10, "epsilon": epsilon});
    }
    statement
}

/// Runs `runs` on [`WORKERS`] workers, each run's output in `out/<slug>.log`; the
/// reports in the order of `runs`.
fn run_all(root: &Path, specdec: &Path, record: &Record, runs: &[Run]) -> Result<Vec<Done>, String> {
    let rel = |p: &Path| p.strip_prefix(root).unwrap_or(p).display().to_string();
    let out = record.out;
    let one = |r: &Run| -> Result<Done, String> {
        if let Some(done) = record.reusable(&r.slug) {
            eprintln!("xtask: engine {}: reused (finished at this commit in {:.0} s)", r.slug, done.seconds);
            return Ok(done);
        }
        // A run that does not finish leaves no record to reuse.
        let _ = std::fs::remove_file(record.done_path(&r.slug));
        let json = out.join(format!("{}.json", r.slug));
        let log_path = out.join(format!("{}.log", r.slug));
        let log = std::fs::File::create(&log_path).map_err(|e| format!("cannot create {}: {e}", log_path.display()))?;
        let err = log.try_clone().map_err(|e| e.to_string())?;
        let start = std::time::Instant::now();
        let status = Command::new(specdec)
            .current_dir(root)
            // One thread per run: WORKERS runs share the cores, and candle's and libtorch's
            // pools of one per core each, side by side, spin against each other (candle's
            // runs took 6-15 times ndarray's on 2026-11-29). Outputs do not depend on it.
            .envs(xtask::test_pool::POOL_THREADS.map(|var| (var, "1")))
            .args(["engine-check", "--seed", ENGINES_SEED, "--engine", &r.engine])
            .args(r.model.iter().flat_map(|m| ["--model".to_string(), rel(m)]))
            .args(r.statement.iter().flat_map(|p| ["--statement".to_string(), rel(p)]))
            .args(r.tokenizer.iter().flat_map(|p| ["--tokenizer".to_string(), rel(p)]))
            .args(r.prompts.iter().flat_map(|p| ["--prompts".to_string(), rel(p)]))
            .arg("--report")
            .arg(&json)
            .arg("--report")
            .arg(out.join(format!("{}.md", r.slug)))
            .stdout(log)
            .stderr(err)
            .status()
            .map_err(|e| format!("cannot run {}: {e}", specdec.display()))?;
        let seconds = start.elapsed().as_secs_f64();
        eprintln!("xtask: engine {}: {status} in {seconds:.0} s (log: {})", r.slug, rel(&log_path));
        if !json.exists() {
            return Err(format!("engine {} wrote no report ({status}; see {})", r.slug, rel(&log_path)));
        }
        let done = Done { slug: r.slug.clone(), json, seconds, reused: false };
        record.finished(&done)?;
        Ok(done)
    };
    let next = std::sync::atomic::AtomicUsize::new(0);
    let results: Vec<std::sync::Mutex<Option<Result<Done, String>>>> = runs.iter().map(|_| std::sync::Mutex::new(None)).collect();
    std::thread::scope(|s| {
        for _ in 0..WORKERS {
            s.spawn(|| {
                loop {
                    let i = next.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    let Some(r) = runs.get(i) else { break };
                    *results[i].lock().unwrap_or_else(|e| e.into_inner()) = Some(one(r));
                }
            });
        }
    });
    results.into_iter().map(|m| m.into_inner().unwrap_or_else(|e| e.into_inner()).unwrap_or_else(|| Err("a run was never started".into()))).collect()
}

/// What the run must show, checked after the table is written: specdec's decoder passes
/// every check it runs, transformers 4.43.4 fails `eos` and 4.44.2 does not.
fn expectations(reports: &[Done], table: &Path) -> Result<(), String> {
    let mut wrong = Vec::new();
    for Done { slug, json, .. } in reports {
        let text = std::fs::read_to_string(json).map_err(|e| format!("cannot read {}: {e}", json.display()))?;
        let report: Value = serde_json::from_str(&text).map_err(|e| format!("{}: {e}", json.display()))?;
        let failed: Vec<&str> = report["results"].as_array().into_iter().flatten().filter(|r| r["status"] == "Fail").filter_map(|r| r["name"].as_str()).collect();
        let eos_failed = failed.iter().any(|n| n.ends_with("/eos"));
        if slug.starts_with("specdec-") && !failed.is_empty() {
            wrong.push(format!("{slug}: specdec's decoder failed {failed:?}"));
        } else if slug.starts_with("hf-transformers-4.43.4") && !eos_failed {
            wrong.push(format!("{slug}: the release with the prompt-lookup eos leak passed `eos`"));
        } else if slug.starts_with("hf-transformers-4.44.2") && eos_failed {
            wrong.push(format!("{slug}: the release with the fix failed `eos`"));
        } else if let Some(allowed) = LLAMA_EXPECTED.iter().find(|(s, _)| slug == s).map(|(_, a)| *a)
            && let Some(other) = failed.iter().find(|n| !allowed.iter().any(|a| n.ends_with(a)))
        {
            wrong.push(format!("{slug}: llama.cpp failed `{other}`, which its known divergences do not explain"));
        }
    }
    let table = table.file_name().map(|n| n.to_string_lossy()).unwrap_or_default();
    if wrong.is_empty() { Ok(()) } else { Err(format!("the table is in reports/engines/{table}, but:\n{}", wrong.join("\n"))) }
}

/// A server under test: `specdec serve` or llama.cpp's.
struct Server {
    child: std::process::Child,
    addr: String,
}

impl Server {
    /// `specdec serve` on `model` and `backend` with n-gram speculation, on a free port.
    fn specdec(specdec: &Path, root: &Path, model: &str, backend: &str) -> Result<Server, String> {
        use std::io::BufRead;
        let mut child = Command::new(specdec)
            .current_dir(root)
            .args(["serve", "--model", model, "--backend", backend, "--proposer", "ngram", "--k", "3", "--port", "0", "--max-batch", "16"])
            .stdout(std::process::Stdio::piped())
            .spawn()
            .map_err(|e| format!("cannot start specdec serve: {e}"))?;
        let mut line = String::new();
        let stdout = child.stdout.take().ok_or("specdec serve has no stdout")?;
        std::io::BufReader::new(stdout).read_line(&mut line).map_err(|e| format!("specdec serve: {e}"))?;
        let addr = line.trim().rsplit("http://").next().filter(|a| a.contains(':')).ok_or_else(|| format!("specdec serve said `{}`", line.trim()))?.to_string();
        Ok(Server { child, addr })
    }

    /// llama.cpp's server on `gguf` with `flags` and `slots`, on a free port, once its
    /// `/health` answers 200 (it loads the model first).
    fn llama(binary: &Path, gguf: &Path, flags: &[String], slots: usize) -> Result<Server, String> {
        let port = std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).map_err(|e| format!("no free port: {e}"))?.port();
        let addr = format!("127.0.0.1:{port}");
        let child = Command::new(binary)
            .arg("-m")
            .arg(gguf)
            // 256 positions per slot: the checks' prompts and outputs fit with room.
            .args(["--host", "127.0.0.1", "--port", &port.to_string(), "-c", &(256 * slots).to_string(), "-np", &slots.to_string(), "-t", "1", "-tb", "1", "--log-disable"])
            .args(flags)
            .stdout(std::process::Stdio::null())
            .spawn()
            .map_err(|e| format!("cannot start {}: {e}", binary.display()))?;
        let mut server = Server { child, addr };
        let health = format!("http://{}/health", server.addr);
        let start = std::time::Instant::now();
        loop {
            if ureq::get(&health).call().is_ok_and(|r| r.status() == 200) {
                return Ok(server);
            }
            if let Ok(Some(status)) = server.child.try_wait() {
                return Err(format!("llama-server {flags:?} exited ({status}) before it answered"));
            }
            if start.elapsed() > std::time::Duration::from_secs(120) {
                server.stop();
                return Err(format!("llama-server {flags:?} did not answer {health} in 120 s"));
            }
            std::thread::sleep(std::time::Duration::from_millis(200));
        }
    }

    fn stop(&mut self) {
        let _ = Command::new("kill").args(["-TERM", &self.child.id().to_string()]).status();
        let _ = self.child.wait();
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// llama-cpp-python in `.cache/engines-llama[-host]`, from a wheel built once for `cpu`
/// from PyPI's source into `.cache/wheels/llama[-host]` (10 to 20 minutes on 2 cores;
/// no binary wheel for this platform exists), stamped with its pins.
pub fn ensure_llama_cpp(root: &Path, python: &Path, cpu: LlamaCpu) -> Result<PathBuf, String> {
    let dir = root.join(format!(".cache/engines-llama{}", cpu.suffix()));
    let wheels = root.join(format!(".cache/wheels/llama{}", cpu.suffix()));
    let version = LLAMA_CPP.split("==").nth(1).unwrap_or_default();
    let built = |w: &Path| std::fs::read_dir(w).into_iter().flatten().flatten().any(|e| e.file_name().to_string_lossy().starts_with(&format!("llama_cpp_python-{version}-")));
    if !built(&wheels) {
        eprintln!("xtask: building {LLAMA_CPP} ({cpu:?} CPU) from source (once; 10 to 20 minutes on 2 cores)");
        let status = Command::new(python)
            .env("CMAKE_ARGS", format!("{} -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF", cpu.cmake_flag()))
            .envs(cpu.compiler_env())
            .env("CMAKE_BUILD_PARALLEL_LEVEL", "2")
            // No cache: pip's wheel cache is keyed on the source, not on CMAKE_ARGS, and
            // would hand back a wheel built for another CPU.
            .args(["-m", "pip", "wheel", "--quiet", "--disable-pip-version-check", "--no-cache-dir", "--no-deps", "-w"])
            .arg(&wheels)
            .arg(LLAMA_CPP)
            .status()
            .map_err(|e| format!("cannot run pip: {e}"))?;
        if !status.success() || !built(&wheels) {
            return Err(format!("pip could not build {LLAMA_CPP}: {status}"));
        }
    }
    let packages: Vec<String> = std::iter::once(LLAMA_CPP).chain(LLAMA_CPP_DEPS).map(String::from).collect();
    pip_target(python, &dir, &packages, &[std::ffi::OsStr::new("--find-links"), wheels.as_os_str()])
}

/// llama.cpp's server (`llama-server`) in `.cache/engines-llama-server[-host]/bin`, built
/// once for `cpu` from the llama.cpp source that llama-cpp-python's PyPI source release
/// carries (the same llama.cpp the binding runs), with CMake from PyPI: CPU only, no web
/// UI (its build would fetch one from outside PyPI), no TLS.
pub fn llama_server(root: &Path, python: &Path, cpu: LlamaCpu) -> Result<PathBuf, String> {
    let dir = root.join(format!(".cache/engines-llama-server{}", cpu.suffix()));
    let binary = dir.join("bin/llama-server");
    let stamp = dir.join(".specdec-pins");
    let pins = format!("{LLAMA_CPP} {CMAKE} {}", cpu.pins());
    if binary.exists() && std::fs::read_to_string(&stamp).is_ok_and(|s| s == pins) {
        return Ok(binary);
    }
    let cmake_dir = pip_target(python, &root.join(".cache/tools/cmake"), &[CMAKE.to_string()], &[])?;
    let cmake = cmake_dir.join("cmake/data/bin/cmake");
    let src = llama_cpp_source(python, &dir)?;
    let build = dir.join("build");
    eprintln!("xtask: building llama.cpp's server ({cpu:?} CPU) from {LLAMA_CPP}'s source (once)");
    crate::run_command(Command::new(&cmake).envs(cpu.compiler_env()).arg("-S").arg(&src).arg("-B").arg(&build).args([
        "-DCMAKE_BUILD_TYPE=Release",
        cpu.cmake_flag(),
        "-DBUILD_SHARED_LIBS=OFF",
        "-DLLAMA_BUILD_TESTS=OFF",
        "-DLLAMA_BUILD_EXAMPLES=OFF",
        "-DLLAMA_BUILD_TOOLS=ON",
        "-DLLAMA_BUILD_SERVER=ON",
        "-DLLAMA_BUILD_UI=OFF",
        "-DLLAMA_USE_PREBUILT_UI=OFF",
        "-DLLAMA_OPENSSL=OFF",
    ]))?;
    crate::run_command(Command::new(&cmake).arg("--build").arg(&build).args(["--target", "llama-server", "-j", "2"]))?;
    std::fs::create_dir_all(dir.join("bin")).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    std::fs::copy(build.join("bin/llama-server"), &binary).map_err(|e| format!("no llama-server in {}: {e}", build.display()))?;
    let _ = std::fs::remove_dir_all(&build);
    let _ = std::fs::remove_dir_all(&src);
    std::fs::write(&stamp, &pins).map_err(|e| format!("cannot write {}: {e}", stamp.display()))?;
    Ok(binary)
}

/// The llama.cpp source that [`LLAMA_CPP`]'s PyPI source release carries, unpacked
/// afresh into `dir/src` (the release itself kept in `dir/sdist`).
pub(crate) fn llama_cpp_source(python: &Path, dir: &Path) -> Result<PathBuf, String> {
    let sdists = dir.join("sdist");
    crate::run_command(
        Command::new(python).args(["-m", "pip", "download", "--quiet", "--disable-pip-version-check", "--no-deps", "--no-binary", "llama-cpp-python", "-d"]).arg(&sdists).arg(LLAMA_CPP),
    )?;
    let version = LLAMA_CPP.split("==").nth(1).unwrap_or_default();
    let sdist = sdists.join(format!("llama_cpp_python-{version}.tar.gz"));
    let src = dir.join("src");
    let _ = std::fs::remove_dir_all(&src);
    std::fs::create_dir_all(&src).map_err(|e| format!("cannot create {}: {e}", src.display()))?;
    crate::run_command(Command::new("tar").arg("xzf").arg(&sdist).arg("-C").arg(&src).args(["--strip-components=3", &format!("llama_cpp_python-{version}/vendor/llama.cpp")]))?;
    Ok(src)
}

/// The architectures' checkpoints whose llama.cpp-written GGUF the loader reads (the
/// others, and why, in [`CONVERTER_REFUSES`]).
pub(crate) const CONVERTED_ARCHITECTURES: [&str; 4] = ["llama3", "mistral", "qwen2", "qwen3"];
/// What llama.cpp's converter says of the other checkpoints.
pub(crate) const CONVERTER_REFUSES: [(&str, &str); 1] = [("phi3", "refused by the converter: its Phi-3 path needs a SentencePiece `tokenizer.model`")];
/// The converter's one dependency the peers' environment lacks.
const SENTENCEPIECE: &str = "sentencepiece==0.2.1";

/// Writes `<case>/llama.cpp-f32.gguf` beside each checkpoint of
/// [`CONVERTED_ARCHITECTURES`] in `fixtures` with llama.cpp's own converter
/// (`adapters/peers/llama_cpp_convert.py`).
pub(crate) fn convert_architectures(root: &Path, python: &Path, fixtures: &Path) -> Result<(), String> {
    let dir = root.join(".cache/llama-cpp-convert");
    let src = llama_cpp_source(python, &dir)?;
    let deps = pip_target(python, &dir.join("deps"), &[SENTENCEPIECE.to_string()], &[])?;
    let script = root.join("adapters/peers/llama_cpp_convert.py");
    // The foreign model's GGUF as ENGINE-10's run names it ([`FOREIGN_GGUF`]).
    let foreign = root.join(FOREIGN_GGUF);
    let foreign_case = foreign.parent().and_then(Path::file_name).and_then(|n| n.to_str()).ok_or("FOREIGN_GGUF names no case folder")?.to_string();
    let cases = CONVERTED_ARCHITECTURES.iter().map(|c| (c.to_string(), fixtures.join(c).join("llama.cpp-f32.gguf"))).chain([(foreign_case, foreign)]);
    for (case, out) in cases {
        crate::run_command(Command::new(python).arg(&script).arg(&src).arg(&deps).arg(fixtures.join(&case)).arg(&out))?;
        eprintln!("xtask: {case}: llama.cpp's converter wrote {}", out.display());
    }
    for (case, why) in CONVERTER_REFUSES {
        eprintln!("xtask: {case}: not converted: {why}");
    }
    let _ = std::fs::remove_dir_all(&src);
    Ok(())
}

/// What `llama-server --version` says (llama.cpp's build number and commit).
fn llama_server_version(binary: &Path) -> Result<String, String> {
    let out = Command::new(binary).arg("--version").output().map_err(|e| format!("cannot run {}: {e}", binary.display()))?;
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    let line = text.lines().find(|l| l.starts_with("version:")).ok_or_else(|| format!("llama-server --version said `{}`", text.trim()))?;
    Ok(format!("llama.cpp {} ({LLAMA_CPP})", line.trim_start_matches("version:").trim()))
}

/// Installs `packages` (every dependency pinned among them) with pip into `dir`
/// (`--target`, imported through `PYTHONPATH` beside the peers' own), once: a stamp of
/// the pins skips it next time.
fn pip_target(python: &Path, dir: &Path, packages: &[String], extra: &[&std::ffi::OsStr]) -> Result<PathBuf, String> {
    let stamp = dir.join(".specdec-pins");
    let pins = packages.join(" ");
    if std::fs::read_to_string(&stamp).is_ok_and(|s| s == pins) {
        return Ok(dir.to_path_buf());
    }
    let status = Command::new(python)
        .args(["-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--no-cache-dir", "--no-deps", "--upgrade"])
        .args(extra)
        .arg("--target")
        .arg(dir)
        .args(packages)
        .status()
        .map_err(|e| format!("cannot run pip: {e}"))?;
    if !status.success() {
        return Err(format!("pip could not install {pins}: {status}"));
    }
    std::fs::write(&stamp, &pins).map_err(|e| format!("cannot write {}: {e}", stamp.display()))?;
    Ok(dir.to_path_buf())
}

/// A historical transformers release in `.cache/engines-hist/transformers-VERSION`
/// (installed once, stamped with its pins), imported before the peers' own.
fn historical(root: &Path, python: &Path, version: &str) -> Result<PathBuf, String> {
    let packages: Vec<String> = std::iter::once(format!("transformers=={version}")).chain(HF_HISTORICAL_DEPS.iter().map(|d| d.to_string())).collect();
    pip_target(python, &root.join(format!(".cache/engines-hist/transformers-{version}")), &packages, &[])
}

/// One line per engine (its checks passed or not, and time), then every check that did
/// not pass with its rules, evidence and repro command.
fn table(reports: &[Done], only: Option<&str>) -> Result<String, String> {
    let mut summary = String::from("| engine | version | pass | fail | not supported | seconds |\n|---|---|---|---|---|---|\n");
    let mut failures = String::from("| engine | check | status | rules | evidence | repro |\n|---|---|---|---|---|---|\n");
    for Done { slug, json, seconds, reused } in reports {
        let text = std::fs::read_to_string(json).map_err(|e| format!("cannot read {}: {e}", json.display()))?;
        let report: Value = serde_json::from_str(&text).map_err(|e| format!("{}: {e}", json.display()))?;
        let results = report["results"].as_array().ok_or_else(|| format!("{}: no results", json.display()))?;
        let count = |s: &str| results.iter().filter(|r| r["status"] == s).count();
        let version = format!("{} {}", report["backend"].as_str().unwrap_or(slug), report["engine_version"].as_str().unwrap_or("?"));
        summary.push_str(&format!("| {slug} | {version} | {} | {} | {} | {seconds:.0}{} |\n", count("Pass"), count("Fail"), count("NotSupported"), if *reused { " (reused)" } else { "" }));
        for r in results.iter().filter(|r| r["status"] != "Pass" && r["status"] != "Skipped") {
            let rules = r["rules"].as_array().map(|a| a.iter().filter_map(Value::as_str).collect::<Vec<_>>().join(", ")).unwrap_or_default();
            let evidence = r["message"].as_str().unwrap_or("").replace('|', "\\|");
            let evidence: String = evidence.chars().take(300).collect();
            failures.push_str(&format!(
                "| {slug} | `{}` | {} | {rules} | {evidence} | `{}` |\n",
                r["name"].as_str().unwrap_or("?"),
                r["status"].as_str().unwrap_or("?"),
                r["repro"].as_str().unwrap_or("")
            ));
        }
    }
    let mut expected: String = HF_HISTORICAL.iter().map(|(v, what)| format!("- transformers {v} with prompt lookup {what}.\n")).collect();
    expected.push_str("- llama.cpp may fail only these (its sampler tempers after top-p, speculation on and off alike; on SmolLM2's Q4_1 its 8-bit activations move greedy tokens):\n");
    let listed = |checks: &[&str]| if checks.is_empty() { "nothing".to_string() } else { checks.iter().map(|c| format!("`{c}`")).collect::<Vec<_>>().join(", ") };
    expected.extend(LLAMA_EXPECTED.iter().map(|(slug, checks)| format!("  - {slug}: {}\n", listed(checks))));
    let command = only.map_or("`cargo xtask engines`".to_string(), |o| format!("`cargo xtask engines --only {o}` (only the runs whose name contains it)"));
    let reused = reports.iter().filter(|d| d.reused).count();
    let command = match reused {
        0 => command,
        n => format!("{command}; {n} of its {} runs reused, as finished by an earlier invocation at the same commit (`--resume`)", reports.len()),
    };
    Ok(format!("# Engines under test\n\nSeed {ENGINES_SEED}; {command}. Expected of the third-party engines:\n\n{expected}\n{summary}\nEvery check that did not pass:\n\n{failures}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resume_reuses_only_a_finished_run_of_the_same_commit() {
        let out = std::env::temp_dir().join(format!("specdec-engines-record-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&out);
        std::fs::create_dir_all(&out).expect("scratch dir");
        let at = |commit: Option<&str>, resume: bool| Record { out: &out, commit: commit.map(String::from), resume };
        let finish = |record: &Record, slug: &str| {
            std::fs::write(out.join(format!("{slug}.json")), "{}").expect("report");
            record.finished(&Done { slug: slug.into(), json: out.join(format!("{slug}.json")), seconds: 12.0, reused: false }).expect("record");
        };
        finish(&at(Some("abc"), false), "a");
        let reused = at(Some("abc"), true).reusable("a").expect("same commit and seed");
        assert!(reused.reused && reused.seconds == 12.0);
        assert!(at(Some("abc"), false).reusable("a").is_none(), "only with --resume");
        assert!(at(Some("def"), true).reusable("a").is_none(), "another commit");
        assert!(at(Some("abc"), true).reusable("b").is_none(), "a run never finished");
        // A finished run on a dirty tree records nothing to reuse.
        finish(&at(None, false), "c");
        assert!(at(Some("abc"), true).reusable("c").is_none());
        // Nor is a record of another seed reused.
        std::fs::write(out.join("a.done.json"), r#"{"commit": "abc", "seed": "1", "seconds": 1.0}"#).expect("record");
        assert!(at(Some("abc"), true).reusable("a").is_none(), "another seed");
        // Nor one whose report is gone.
        finish(&at(Some("abc"), false), "d");
        std::fs::remove_file(out.join("d.json")).expect("remove");
        assert!(at(Some("abc"), true).reusable("d").is_none(), "no report");
        let _ = std::fs::remove_dir_all(&out);
    }
}
