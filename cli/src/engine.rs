//! `specdec engine-check` (the engine section on any engine) and
//! `specdec engine-adapter` (specdec's own decoder as an exec engine,
//! PROTO-9).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use specdec_backend::ModelBackend;
use specdec_backend::model::LlamaWeights;
use specdec_conformance::check::{CheckResult, SuiteConfig};
use specdec_conformance::e2e_section::K;
use specdec_conformance::e2e_section::{build_proposer, engine_config, tiny_text};
use specdec_conformance::engine_section::{self, ENGINE_MODEL, LargeModel, OwnConstraint, OwnModel};
use specdec_conformance::report::Report;
use specdec_decoder::EngineConfig;
use specdec_decoder::{ConstraintSpec, Detokenize, ProposerChoice, TokenTable};
use specdec_engines::{DecoderEngine, ExecEngine, GenerationEngine, HttpEngine, serve_exec};
use specdec_models::tiny::TinySpec;
use specdec_registry::{Job, with_backend};

/// An engine named on the command line: `decoder:BACKEND:PROPOSER`,
/// `exec:COMMAND`, or the URL of a server: OpenAI-compatible (`http://..`) or
/// llama.cpp's (`llama-cpp+http://..`), with `,plain=URL` where speculation
/// is fixed when the server starts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EngineSpec {
    Decoder { backend: String, proposer: String },
    Exec(String),
    Http(String),
}

impl EngineSpec {
    /// The label in check names: the proposer, or the transport.
    fn label(&self) -> &str {
        match self {
            EngineSpec::Decoder { proposer, .. } => proposer,
            EngineSpec::Exec(_) => "exec",
            EngineSpec::Http(url) if url.starts_with("llama-cpp+") => "llama-cpp",
            EngineSpec::Http(_) => "http",
        }
    }
}

impl std::str::FromStr for EngineSpec {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        if s.starts_with("http://") || s.starts_with("llama-cpp+") {
            specdec_engines::parse_http_engine(s)?;
            return Ok(EngineSpec::Http(s.into()));
        }
        match s.split_once(':') {
            Some(("exec", command)) if !command.trim().is_empty() => Ok(EngineSpec::Exec(command.into())),
            Some(("decoder", rest)) => match rest.split_once(':') {
                Some((backend, proposer)) if !backend.is_empty() && !proposer.is_empty() => Ok(EngineSpec::Decoder { backend: backend.into(), proposer: proposer.into() }),
                _ => Err(format!("`{s}`: expected decoder:BACKEND:PROPOSER (e.g. decoder:ndarray:ngram)")),
            },
            _ => Err(format!("unknown engine `{s}`: expected decoder:BACKEND:PROPOSER, exec:COMMAND, http://HOST:PORT or llama-cpp+http://HOST:PORT")),
        }
    }
}

fn tiny() -> Result<Arc<LlamaWeights>, String> {
    let spec = TinySpec::preset(ENGINE_MODEL).ok_or_else(|| format!("no tiny preset `{ENGINE_MODEL}`"))?;
    spec.weights().map(Arc::new).map_err(|e| e.to_string())
}

/// How `specdec engine-check` reaches and judges an engine.
pub struct CheckOptions {
    /// An exec engine's time for one batch; an HTTP engine's for one request.
    pub timeout: Duration,
    /// The model checks on this model instead of the tiny model's section.
    pub model: Option<PathBuf>,
    /// An HTTP engine's statement, where its server publishes none.
    pub statement: Option<PathBuf>,
    /// The served model's tokenizer: the checks whose oracle is the
    /// engine's own plain decoding (ENGINE-10) instead of the reference's.
    pub tokenizer: Option<String>,
    /// Their prompts (`.jsonl` or the prompt-file envelope); the shipped
    /// SmolLM2 prompts where absent.
    pub prompts: Option<PathBuf>,
}

impl CheckOptions {
    /// Reaches an engine that is not specdec's in-process decoder.
    fn connect(&self, spec: &EngineSpec) -> Result<Box<dyn GenerationEngine>, String> {
        match spec {
            EngineSpec::Exec(command) => Ok(Box::new(ExecEngine::spawn(command, self.timeout).map_err(|e| e.to_string())?)),
            EngineSpec::Http(url) => {
                let statement = match &self.statement {
                    Some(p) => Some(serde_json::from_str(&std::fs::read_to_string(p).map_err(|e| format!("{}: {e}", p.display()))?).map_err(|e| format!("{}: not a statement: {e}", p.display()))?),
                    None => None,
                };
                Ok(Box::new(HttpEngine::connect(url, statement, self.timeout).map_err(|e| e.to_string())?))
            }
            EngineSpec::Decoder { .. } => Err("specdec's decoder runs in process".into()),
        }
    }
}

/// Runs the engine section on `engine` (on the tiny model, or the model
/// checks on `--model`); writes reports; `Ok(false)` when a check failed.
pub fn check(engine: &str, cfg: &SuiteConfig, reports: &[PathBuf], options: &CheckOptions) -> Result<bool, String> {
    let spec: EngineSpec = engine.parse()?;
    if options.prompts.is_some() && options.tokenizer.is_none() && options.model.is_none() {
        return Err("--prompts goes with --tokenizer or --model (the tiny model's checks have their own prompts)".into());
    }
    let mut report = match (&options.tokenizer, &options.model) {
        (Some(tokenizer), _) => check_own(&spec, &own_model(tokenizer, options.prompts.as_deref())?, cfg, options)?,
        (None, Some(path)) => check_large(&spec, &large_model(path, options.prompts.as_deref())?, cfg, options)?,
        (None, None) => check_tiny(&spec, cfg, options)?,
    };
    let quoted = |flag: &str, v: Option<String>| v.map_or(String::new(), |v| format!(" --{flag} '{v}'"));
    let given = [
        quoted("model", options.model.as_ref().map(|m| m.display().to_string())),
        quoted("tokenizer", options.tokenizer.clone()),
        quoted("prompts", options.prompts.as_ref().map(|p| p.display().to_string())),
        quoted("statement", options.statement.as_ref().map(|p| p.display().to_string())),
    ]
    .concat();
    for r in &mut report.results {
        r.repro = format!("specdec engine-check --engine '{engine}'{given} --seed {} --filter '{}'", cfg.seed, r.name);
    }
    crate::print_report(&report);
    crate::write_all(reports, std::slice::from_ref(&report))?;
    let ok = !report.summary.failed;
    println!("{}", verdict_line(&report));
    Ok(ok)
}

/// The report's one line: the verdict, what ran, and the first failure.
fn verdict_line(report: &Report) -> String {
    let failed: Vec<&str> = report.results.iter().filter(|r| r.status == specdec_conformance::suite::Status::Fail).map(|r| r.name.as_str()).collect();
    match failed.first() {
        None => "engine checks: PASS".into(),
        Some(first) => format!("engine checks: FAIL ({} failed, first `{first}`)", failed.len()),
    }
}

/// Tokens of a constrained tool call in ENGINE-10's `constrained` check (a
/// tool call of the mix's schema takes some 30 to 60).
const TOOL_CALL_TOKENS: usize = 128;

/// The served model as the ENGINE-10 checks know it: `tiny:PRESET` (the
/// section's tiny model and prompts), or a tokenizer (a `.gguf`, an HF
/// folder, a `tokenizer.json`) with the shipped SmolLM2 prompts or
/// `prompts` (chat ones in its ChatML template).
fn own_model(tokenizer: &str, prompts: Option<&Path>) -> Result<OwnModel, String> {
    if let Some(preset) = tokenizer.strip_prefix("tiny:") {
        if preset != ENGINE_MODEL || prompts.is_some() {
            return Err(format!("`{tokenizer}`: the tiny model's checks run `tiny:{ENGINE_MODEL}` with its own prompts"));
        }
        return Ok(OwnModel::tiny());
    }
    let path = Path::new(tokenizer);
    let tok = specdec_models::Tokenizer::open(path).map_err(|e| e.to_string())?;
    let prompts = match prompts {
        Some(p) => specdec_models::prompts::read_prompts::<specdec_models::prompts::Prompt>(p).map_err(|e| e.to_string())?,
        None => specdec_conformance::model_section::shipped_prompts(),
    };
    let encoded = prompts
        .iter()
        .map(|p| {
            let ids = tok.prompt_ids(&p.text, p.chat).map_err(|e| format!("prompt `{}`: {e}", p.id))?;
            if ids.is_empty() {
                return Err(format!("prompt `{}` encodes to no token", p.id));
            }
            Ok((p.id.clone(), ids))
        })
        .collect::<Result<Vec<_>, String>>()?;
    // The model's name in check names: an HF folder's name whole (`Qwen3-0.6B`), a
    // `tokenizer.json`'s folder's, a GGUF file's up to its first dot.
    let folder = |p: &Path| p.canonicalize().ok().and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()));
    let name = if path.is_dir() {
        folder(path)
    } else if path.file_name().is_some_and(|n| n == specdec_models::tokenizer::TOKENIZER_FILE) {
        path.parent().map(|d| if d.as_os_str().is_empty() { Path::new(".") } else { d }).and_then(folder)
    } else {
        path.file_name().and_then(|n| n.to_string_lossy().split('.').next().map(str::to_string))
    };
    let name = name.unwrap_or_else(|| "model".into()).to_lowercase().replace('/', "-");
    let eos = tok.end_ids();
    // The `constrained` check's mix: the shipped tool calls under their JSON schema,
    // where the model can end an answer and its vocabulary can write every name the
    // schema holds (a small alphabet's model could only run into a dead end there).
    let writes = |text: &str| tok.encode(text, false).and_then(|ids| tok.decode(&ids, false)).ok().as_deref() == Some(text);
    let constrained = match specdec_models::prompts::tool_call_mix(&tok) {
        Err(e) => Err(format!("the tool-call prompts do not encode: {e}")),
        Ok(_) if eos.is_empty() => Err("the tokenizer names no end token, so no constrained answer could end".to_string()),
        Ok(mix) => match schema_names(&mix.schema).into_iter().chain(JSON_PUNCTUATION.iter().map(|c| c.to_string())).find(|name| !writes(name)) {
            Some(name) => Err(format!("the vocabulary cannot write `{name}`, which a tool call under the schema holds")),
            None => Ok(OwnConstraint { spec: ConstraintSpec::JsonSchema(mix.schema), prompts: mix.prompts, eos: eos.clone(), max_new_tokens: TOOL_CALL_TOKENS }),
        },
    };
    let text = Arc::new(move |ids: &[u32]| tok.decode(ids, false).unwrap_or_else(|e| format!("<{e}>")));
    Ok(OwnModel { name, prompts: encoded, eos, text, constrained })
}

/// What every JSON tool call writes beside the schema's names.
const JSON_PUNCTUATION: [&str; 5] = ["{", "}", "\"", ":", ","];

/// Every name a JSON schema makes an answer write: its property names and its
/// string `enum` values, at any depth.
fn schema_names(schema: &serde_json::Value) -> Vec<String> {
    let mut names = Vec::new();
    let mut todo = vec![schema];
    while let Some(v) = todo.pop() {
        match v {
            serde_json::Value::Object(map) => {
                if let Some(serde_json::Value::Object(props)) = map.get("properties") {
                    names.extend(props.keys().cloned());
                }
                if let Some(serde_json::Value::Array(values)) = map.get("enum") {
                    names.extend(values.iter().filter_map(|e| e.as_str().map(str::to_string)));
                }
                todo.extend(map.values());
            }
            serde_json::Value::Array(items) => todo.extend(items),
            _ => {}
        }
    }
    names
}

/// The model checks' model: its weights, the prompts (`prompts`, else the
/// shipped SmolLM2 ones; chat ones in the model's template) for greedy
/// identity, and for the two-sample check the `capital` prompt where there
/// is one, else the first.
fn large_model(path: &Path, prompts: Option<&Path>) -> Result<LargeModel, String> {
    let loaded = specdec_models::load(path).map_err(|e| e.to_string())?;
    let tok = loaded.tokenizer.as_ref().ok_or_else(|| format!("{}: the model checks need the model's tokenizer", path.display()))?;
    let prompts = match prompts {
        Some(p) => specdec_models::prompts::read_prompts::<specdec_models::prompts::Prompt>(p).map_err(|e| e.to_string())?,
        None => specdec_conformance::model_section::shipped_prompts(),
    };
    let encode = |p: &specdec_models::prompts::Prompt| -> Result<Vec<u32>, String> { tok.prompt_ids(&p.text, p.chat).map_err(|e| format!("prompt `{}`: {e}", p.id)) };
    let greedy_prompts = prompts.iter().map(encode).collect::<Result<Vec<_>, _>>()?;
    let capital = prompts.iter().find(|p| p.id == "capital").or(prompts.first()).ok_or("no prompts")?;
    let name = path.file_name().map_or("model".into(), |n| n.to_string_lossy().split('.').next().unwrap_or("model").to_lowercase());
    Ok(LargeModel { name, weights: Arc::new(loaded.weights), greedy_prompts, sampled_prompt: encode(capital)? })
}

/// The model specdec's decoder runs where it is the engine under test.
enum DecoderModel {
    /// The engine section's tiny model, with the section's proposers and its text.
    Tiny(Arc<LlamaWeights>),
    /// A loaded model, with the proposers `generate` takes, its tokenizer's
    /// text and its tokens' bytes (which constraints are walked over).
    Loaded(Arc<LlamaWeights>, Option<Box<dyn Detokenize>>, Option<Arc<TokenTable>>),
}

/// A section's checks on one engine called `label`.
type SectionRun<'a> = dyn FnMut(&mut dyn GenerationEngine, &str) -> Vec<CheckResult> + 'a;

/// Runs `section` on the engine `spec` names: an exec or HTTP engine as it
/// is; specdec's decoder on its backend with the model `model` gives (made
/// only then, so that a remote engine never loads one).
fn run_section(spec: &EngineSpec, options: &CheckOptions, cfg: &SuiteConfig, model: impl FnOnce() -> Result<DecoderModel, String>, section: &mut SectionRun) -> Result<Report, String> {
    let mut report = |e: &mut dyn GenerationEngine, label: &str| {
        let info = e.info().clone();
        let results = section(e, label);
        // A shard's report says which it is, so `specdec report merge` can join them.
        Report { shard: cfg.shard, ..Report::for_engine(&info.name, &info.version, info.greedy_epsilon, cfg.seed, results) }
    };
    match spec {
        EngineSpec::Exec(_) | EngineSpec::Http(_) => Ok(report(options.connect(spec)?.as_mut(), spec.label())),
        EngineSpec::Decoder { backend, proposer } => {
            struct OnDecoder<'a, F> {
                proposer: &'a str,
                model: DecoderModel,
                report: F,
            }
            impl<F: FnMut(&mut dyn GenerationEngine, &str) -> Report> Job for OnDecoder<'_, F> {
                type Out = Result<Report, String>;
                fn run<B: ModelBackend>(&mut self, _: &str, backend: &B) -> Self::Out {
                    let mut e = match &mut self.model {
                        DecoderModel::Tiny(w) => decoder_engine(backend, self.proposer, w, engine_config())?,
                        DecoderModel::Loaded(w, text, tokens) => {
                            let p = self.proposer.parse::<ProposerChoice>()?.build(backend, w, K).map_err(|e| e.to_string())?;
                            let e = DecoderEngine::new(backend, Arc::clone(w), p, EngineConfig { k: K, ..engine_config() }, text.take()).map_err(|e| e.to_string())?;
                            match tokens {
                                Some(t) => e.with_constraints(Arc::clone(t)),
                                None => e,
                            }
                        }
                    };
                    Ok((self.report)(&mut e, self.proposer))
                }
            }
            with_backend(backend, &mut OnDecoder { proposer, model: model()?, report })?
        }
    }
}

fn check_large(spec: &EngineSpec, model: &LargeModel, cfg: &SuiteConfig, options: &CheckOptions) -> Result<Report, String> {
    let decoder = || Ok(DecoderModel::Loaded(Arc::clone(&model.weights), None, None));
    run_section(spec, options, cfg, decoder, &mut |e, label| engine_section::run_large(e, label, model, cfg, &mut |_| {}))
}

/// ENGINE-10 on `model`: specdec's decoder runs the tiny model (`tiny:`)
/// or `--model`'s weights.
fn check_own(spec: &EngineSpec, model: &OwnModel, cfg: &SuiteConfig, options: &CheckOptions) -> Result<Report, String> {
    let decoder = || match &options.model {
        Some(path) => {
            let loaded = specdec_models::load(path).map_err(|e| e.to_string())?;
            let tokens = loaded.tokenizer.as_ref().map(|t| TokenTable::of_tokenizer(t, loaded.weights.config.vocab_size)).transpose()?;
            let text = loaded.tokenizer.map(|t| Box::new(move |ids: &[u32]| t.decode(ids, false).unwrap_or_default()) as Box<dyn Detokenize>);
            Ok(DecoderModel::Loaded(Arc::new(loaded.weights), text, tokens))
        }
        None if model.name == ENGINE_MODEL => Ok(DecoderModel::Tiny(tiny()?)),
        None => Err("a decoder: engine with a tokenizer other than `tiny:` runs --model's weights: give --model".into()),
    };
    run_section(spec, options, cfg, decoder, &mut |e, label| engine_section::run_own(e, label, model, cfg, &mut |_| {}))
}

fn check_tiny(spec: &EngineSpec, cfg: &SuiteConfig, options: &CheckOptions) -> Result<Report, String> {
    let w = tiny()?;
    run_section(spec, options, cfg, || Ok(DecoderModel::Tiny(Arc::clone(&w))), &mut |e, label| engine_section::run(e, label, &w, cfg, &mut |_| {}))
}

fn decoder_engine<'a, B: ModelBackend>(backend: &'a B, proposer: &str, w: &Arc<LlamaWeights>, config: EngineConfig) -> Result<DecoderEngine<'a, B>, String> {
    let p = build_proposer(backend, proposer, w)?;
    DecoderEngine::new(backend, Arc::clone(w), p, config, Some(Box::new(tiny_text))).map(|e| e.with_constraints(specdec_decoder::TokenTable::tiny(w.config.vocab_size))).map_err(|e| e.to_string())
}

/// Serves specdec's decoder on `backend` with `proposer` and `k` over
/// stdin/stdout until stdin closes.
pub fn adapter(backend: &str, proposer: &str, k: usize) -> Result<bool, String> {
    struct Serve<'a> {
        proposer: &'a str,
        k: usize,
    }
    impl Job for Serve<'_> {
        type Out = Result<(), String>;

        fn run<B: ModelBackend>(&mut self, _: &str, backend: &B) -> Self::Out {
            let w = tiny()?;
            let mut engine = decoder_engine(backend, self.proposer, &w, EngineConfig { k: self.k, ..engine_config() })?;
            serve_exec(&mut engine, std::io::stdin().lock(), std::io::stdout().lock()).map_err(|e| e.to_string())
        }
    }
    with_backend(backend, &mut Serve { proposer, k })??;
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn engine_names_parse_or_say_why() {
        assert_eq!("decoder:ndarray:ngram".parse::<EngineSpec>().unwrap(), EngineSpec::Decoder { backend: "ndarray".into(), proposer: "ngram".into() });
        assert_eq!("decoder:reference:draft:seeded".parse::<EngineSpec>().unwrap(), EngineSpec::Decoder { backend: "reference".into(), proposer: "draft:seeded".into() });
        assert_eq!("exec:python3 e.py --x".parse::<EngineSpec>().unwrap(), EngineSpec::Exec("python3 e.py --x".into()));
        assert_eq!("http://127.0.0.1:8000".parse::<EngineSpec>().unwrap(), EngineSpec::Http("http://127.0.0.1:8000".into()));
        let pair = "llama-cpp+http://127.0.0.1:8001,plain=llama-cpp+http://127.0.0.1:8002";
        assert_eq!(pair.parse::<EngineSpec>().unwrap(), EngineSpec::Http(pair.into()));
        assert_eq!(pair.parse::<EngineSpec>().unwrap().label(), "llama-cpp");
        for bad in ["", "decoder:", "decoder:ndarray", "exec:", "exec: ", "vllm:x", "llama-cpp+https://h:1", "http://", "http://h:1,http://h:2", "llama-cpp+http://h:1,plain=http://h:2"] {
            assert!(bad.parse::<EngineSpec>().is_err(), "{bad}");
        }
    }

    /// ENGINE-10 knows a model by its tokenizer alone: GPT-2's GGUF, a model the
    /// reference cannot run, names the model `gpt2`, encodes its prompts, and its
    /// 48-id alphabet (no `_`) cannot write the tool-call schema's names, so the
    /// `constrained` check is not supported, naming one; the tool-call prompts
    /// are plain text for a model without a chat template.
    #[test]
    fn a_foreign_models_tokenizer_gives_the_checks_their_model() {
        let root = concat!(env!("CARGO_MANIFEST_DIR"), "/../fixtures/architectures");
        let m = own_model(&format!("{root}/gpt2/gpt2.llama.cpp-f32.gguf"), Some(Path::new(&format!("{root}/prompts.jsonl")))).unwrap();
        assert_eq!((m.name.as_str(), m.prompts.len(), m.eos.as_slice()), ("gpt2", 4, &[2][..]));
        assert_eq!((m.text)(&m.prompts[0].1), "the capital of france is");
        let why = m.constrained.err().unwrap();
        assert!(why.starts_with("the vocabulary cannot write `") && why.contains('_'), "{why}");
        assert!(OwnModel::tiny().constrained.is_ok());
        let names = schema_names(&serde_json::json!({"properties": {"a": {"enum": ["x_y", 3]}, "b": {"type": "object", "properties": {"c": {}}}}}));
        let mut names: Vec<&str> = names.iter().map(String::as_str).collect();
        names.sort();
        assert_eq!(names, ["a", "b", "c", "x_y"]);
    }
}
