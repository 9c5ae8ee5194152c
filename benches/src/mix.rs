//! The speedup report on a prompt mix (`fixtures/prompts/mix.json`): seven
//! categories of chat prompts (the six of a public speculative-decoding
//! benchmark plus code editing), each run greedy, plain and with every
//! proposer under the pay-off controller (`specdec generate`'s default), per
//! category and overall; batches of 1, 4 and 16 requests for plain against
//! speculative throughput; and the peers (HF transformers, llama.cpp's Python
//! binding and its own server), plain and with their own n-gram drafters,
//! timed in the same run on the same token ids
//! (`adapters/peers/bench_generate.py`); and the prefill apart from the
//! decode, ours and the plain peers', per category.
//!
//! Invariant: every speculative run, single or batched, must emit exactly
//! the tokens of its plain run (greedy losslessness, DECODE-1); the first
//! that does not stops the section with an error, so a row of the report is
//! always a lossless run. Speedups are within one backend in one run; the
//! peers' ratios are tokens per second in the same run on the same machine.
//!
//! Each prompt (and each batch) runs in [`ROUNDS`] rounds, a round being the
//! plain run and then each proposer's, back to back. A speedup is the median
//! over the rounds of the ratio within a round: the memory speed of a small
//! machine drifts by 10-20 % within minutes, which moves a ratio of two
//! single runs by as much as a controller's whole margin, and adjacent runs
//! see the same speed.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use specdec_backend::model::{LlamaWeights, ModelBackend};
use specdec_decoder::{EngineConfig, ProposerChoice, RunOutput};

use crate::e2e::{greedy_run, label};

/// Rounds of every prompt's and batch's runs (see the module doc).
pub const ROUNDS: usize = 3;

/// The index of the median of `values` (the lower median of an even count).
/// `None` for no values.
pub fn median_index(values: &[f64]) -> Option<usize> {
    let mut order: Vec<usize> = (0..values.len()).collect();
    order.sort_by(|&a, &b| values[a].total_cmp(&values[b]));
    order.get(values.len().checked_sub(1)? / 2).copied()
}

/// [`ROUNDS`] rounds of `plain` then every proposer's run (`spec(i)`, for
/// proposer `i` of `proposers`), each checked to emit exactly the plain
/// run's tokens; per proposer, the round whose ratio to its own plain run
/// is the median, as `(that run, the ratio)`, after the median plain run.
fn in_rounds(
    proposers: usize,
    what: &str,
    mut plain: impl FnMut() -> Result<RunOutput, String>,
    mut spec: impl FnMut(usize) -> Result<(RunOutput, String), String>,
) -> Result<(RunOutput, Vec<(RunOutput, f64)>), String> {
    let mut rounds = Vec::with_capacity(ROUNDS);
    for _ in 0..ROUNDS {
        let base = plain()?;
        let mut specs = Vec::with_capacity(proposers);
        for i in 0..proposers {
            let (run, name) = spec(i)?;
            if tokens_of(&run) != tokens_of(&base) {
                return Err(format!("{what}, {name}: greedy speculative tokens differ from plain decoding"));
            }
            specs.push(run);
        }
        rounds.push((base, specs));
    }
    let pick = |values: &[f64]| median_index(values).ok_or_else(|| "no rounds".to_string());
    let plain_rates: Vec<f64> = rounds.iter().map(|(p, _)| p.decode_tokens_per_s()).collect();
    let plain_at = pick(&plain_rates)?;
    let mut chosen = Vec::with_capacity(proposers);
    for i in 0..proposers {
        let ratios: Vec<f64> = rounds.iter().zip(&plain_rates).map(|((_, s), plain)| s[i].decode_tokens_per_s() / plain).collect();
        let at = pick(&ratios)?;
        chosen.push((rounds[at].1[i].clone(), ratios[at]));
    }
    Ok((rounds.swap_remove(plain_at).0, chosen))
}

/// Requests per batch in the throughput table.
pub const BATCHES: [usize; 3] = [1, 4, 16];

/// The mix's proposers and the largest `k` the controller may pick: prompt
/// lookup (`K = 8`, as the report's sweep) and the shipped DFlash draft
/// (`K = 4`).
pub fn proposers() -> Vec<(ProposerChoice, usize)> {
    vec![(ProposerChoice::Ngram, 8), (ProposerChoice::Dflash(specdec_conformance::model_section::shipped_dflash_dir()), 4)]
}

#[derive(Deserialize)]
struct Fixture {
    categories: Vec<FixtureCategory>,
}

#[derive(Deserialize)]
struct FixtureCategory {
    id: String,
    name: String,
    prompts: Vec<FixturePrompt>,
}

#[derive(Deserialize)]
struct FixturePrompt {
    id: String,
    turns: Vec<(String, String)>,
}

/// A prompt of the mix, rendered with the chat template and tokenized.
#[derive(Debug, Clone)]
pub struct MixPrompt {
    pub category: String,
    pub category_name: String,
    pub id: String,
    pub ids: Vec<u32>,
}

/// The fixture's prompts in category order, each conversation rendered by
/// the model's chat template.
pub fn prompts(tok: &specdec_models::Tokenizer) -> Result<Vec<MixPrompt>, String> {
    let text = include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/../fixtures/prompts/mix.json"));
    let fixture: Fixture = serde_json::from_str(text).map_err(|e| format!("fixtures/prompts/mix.json: {e}"))?;
    let mut out = Vec::new();
    for c in fixture.categories {
        for p in c.prompts {
            let turns: Vec<(&str, &str)> = p.turns.iter().map(|(r, t)| (r.as_str(), t.as_str())).collect();
            let chat = tok.chat_conversation(&turns).map_err(|e| format!("prompt {}: {e}", p.id))?;
            let ids = tok.encode(&chat, false).map_err(|e| format!("prompt {}: {e}", p.id))?;
            out.push(MixPrompt { category: c.id.clone(), category_name: c.name.clone(), id: format!("{}/{}", c.id, p.id), ids });
        }
    }
    Ok(out)
}

/// One single-request run: plain (`proposer` `None`) or speculative.
#[derive(Debug, Clone, Serialize)]
pub struct MixRun {
    pub backend: String,
    pub category: String,
    pub prompt: String,
    pub proposer: Option<String>,
    /// The prompt's tokens, and the seconds its prefill took (the target's
    /// and the proposer's).
    pub prompt_tokens: usize,
    pub prefill_s: f64,
    pub tokens: usize,
    pub tokens_per_s: f64,
    /// Over the same prompt's plain run (1 for the plain run).
    pub speedup: f64,
    pub steps: u64,
    pub proposed: u64,
    pub accepted: u64,
    /// Steps run with each `k` (index `k`), as the controller chose.
    pub steps_by_k: Vec<u64>,
}

/// One batch run: `batch` requests at once, plain or speculative.
#[derive(Debug, Clone, Serialize)]
pub struct BatchRun {
    pub backend: String,
    pub batch: usize,
    pub proposer: Option<String>,
    pub tokens: usize,
    pub tokens_per_s: f64,
    pub speedup: f64,
}

/// Everything the mix measured on the backends it ran on.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Mix {
    pub runs: Vec<MixRun>,
    pub batches: Vec<BatchRun>,
}

/// The mix's order for batches: round robin over the categories, so a batch
/// of four holds four categories.
fn round_robin(prompts: &[MixPrompt]) -> Vec<&MixPrompt> {
    let mut by_category: BTreeMap<&str, Vec<&MixPrompt>> = BTreeMap::new();
    let mut order = Vec::new();
    for p in prompts {
        if !by_category.contains_key(p.category.as_str()) {
            order.push(p.category.as_str());
        }
        by_category.entry(&p.category).or_default().push(p);
    }
    let rounds = by_category.values().map(Vec::len).max().unwrap_or(0);
    let by_category = &by_category;
    (0..rounds).flat_map(|i| order.iter().filter_map(move |c| by_category[c].get(i).copied())).collect()
}

fn tokens_of(r: &RunOutput) -> Vec<Vec<u32>> {
    r.outputs.iter().map(|o| o.tokens.clone()).collect()
}

/// Runs the mix on `b`; `progress` is told each finished run.
pub fn measure<B: ModelBackend>(name: &str, b: &B, w: &Arc<LlamaWeights>, prompts: &[MixPrompt], max_tokens: usize, progress: &mut dyn FnMut(&str)) -> Result<Mix, String> {
    let model = b.load_model(w).map_err(|e| e.to_string())?;
    let run = |ids: &[&[u32]], k: usize, proposer: &ProposerChoice| greedy_run(b, &model, w, ids, max_tokens, proposer, EngineConfig { k, payoff: k > 0, ..EngineConfig::default() });
    let mut mix = Mix::default();
    let proposers = proposers();
    let spec = |ids: &[&[u32]], i: usize| {
        let (proposer, k) = &proposers[i];
        run(ids, *k, proposer).map(|r| (r, label(proposer)))
    };
    for p in prompts {
        let (plain, specs) = in_rounds(proposers.len(), &format!("{name}, prompt {}", p.id), || run(&[&p.ids], 0, &ProposerChoice::None), |i| spec(&[&p.ids], i))?;
        let row = |r: &RunOutput, proposer: Option<String>, speedup: f64| MixRun {
            backend: name.into(),
            category: p.category.clone(),
            prompt: p.id.clone(),
            proposer,
            prompt_tokens: p.ids.len(),
            prefill_s: r.timings.prefill_s,
            tokens: r.outputs[0].tokens.len(),
            tokens_per_s: r.decode_tokens_per_s(),
            speedup,
            steps: r.acceptance.steps,
            proposed: r.acceptance.proposed,
            accepted: r.acceptance.accepted,
            steps_by_k: r.steps_by_k.clone(),
        };
        mix.runs.push(row(&plain, None, 1.0));
        for ((proposer, _), (r, speedup)) in proposers.iter().zip(&specs) {
            mix.runs.push(row(r, Some(label(proposer)), *speedup));
        }
        progress(&format!("{name} {}", p.id));
    }
    let order = round_robin(prompts);
    for batch in BATCHES {
        let ids: Vec<&[u32]> = order.iter().cycle().take(batch).map(|p| p.ids.as_slice()).collect();
        let (plain, specs) = in_rounds(proposers.len(), &format!("{name}, batch {batch}"), || run(&ids, 0, &ProposerChoice::None), |i| spec(&ids, i))?;
        let row = |r: &RunOutput, proposer: Option<String>, speedup: f64| BatchRun {
            backend: name.into(),
            batch,
            proposer,
            tokens: r.outputs.iter().map(|o| o.tokens.len()).sum(),
            tokens_per_s: r.decode_tokens_per_s(),
            speedup,
        };
        mix.batches.push(row(&plain, None, 1.0));
        for ((proposer, _), (r, speedup)) in proposers.iter().zip(&specs) {
            mix.batches.push(row(r, Some(label(proposer)), *speedup));
        }
        progress(&format!("{name} batch {batch}"));
    }
    Ok(mix)
}

/// A peer's runs in one mode, as `bench_generate.py` prints them.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PeerEngine {
    pub engine: String,
    pub version: String,
    pub mode: String,
    pub runs: Vec<PeerRun>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PeerRun {
    pub prompt: String,
    pub tokens: usize,
    pub decode_s: f64,
    /// 0 where the decode could not be timed (`bench_generate.py`): left out
    /// of the means and ratios, and counted in the report.
    pub tokens_per_s: f64,
    /// Generating one token from the prompt: its prefill and one step.
    pub prefill_s: f64,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Peers {
    pub engines: Vec<PeerEngine>,
    /// Why an engine that was asked for did not run.
    pub skipped: Vec<String>,
}

/// Where the peers are: the peers' Python (HF transformers), llama-cpp-python's
/// directory (put on `PYTHONPATH`), llama.cpp's `llama-server` binary, and the
/// model in both layouts.
pub struct PeerSetup<'a> {
    pub python: &'a Path,
    pub llama_cpp: Option<&'a Path>,
    pub llama_server: Option<&'a Path>,
    pub hf_dir: Option<&'a Path>,
    pub gguf: Option<&'a Path>,
}

/// Times the peers on the mix's token ids (`adapters/peers/bench_generate.py`),
/// with the n-gram proposer's `K` as their prompt-lookup length.
pub fn peers(setup: &PeerSetup<'_>, prompts: &[MixPrompt], max_tokens: usize, scratch: &Path) -> Result<Peers, String> {
    let k = proposers().iter().find(|(p, _)| *p == ProposerChoice::Ngram).map_or(8, |(_, k)| *k);
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let job = serde_json::json!({
        "prompts": prompts.iter().map(|p| serde_json::json!({"id": p.id, "ids": p.ids})).collect::<Vec<_>>(),
        "max_tokens": max_tokens,
        "k": k,
        "threads": threads,
        "hf_dir": setup.hf_dir,
        "gguf": setup.gguf,
        "llama_cpp": setup.llama_cpp.is_some(),
        "llama_server": setup.llama_server,
    });
    std::fs::create_dir_all(scratch).map_err(|e| format!("cannot create {}: {e}", scratch.display()))?;
    let job_file = scratch.join("mix-peers.json");
    std::fs::write(&job_file, job.to_string()).map_err(|e| format!("cannot write {}: {e}", job_file.display()))?;
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../adapters/peers/bench_generate.py");
    let mut cmd = std::process::Command::new(setup.python);
    cmd.arg(&script).arg(&job_file);
    if let Some(dir) = setup.llama_cpp {
        cmd.env("PYTHONPATH", dir);
    }
    let out = cmd.output().map_err(|e| format!("cannot run {}: {e}", setup.python.display()))?;
    if !out.status.success() {
        return Err(format!("the peer script failed ({}): {}", out.status, String::from_utf8_lossy(&out.stderr).lines().last().unwrap_or("")));
    }
    serde_json::from_slice(&out.stdout).map_err(|e| format!("the peer script printed no timings: {e}"))
}

/// The geometric mean (1 for none).
fn geomean(xs: impl Iterator<Item = f64>) -> f64 {
    let (sum, n) = xs.fold((0.0, 0usize), |(s, n), x| (s + x.ln(), n + 1));
    if n == 0 { 1.0 } else { (sum / n as f64).exp() }
}

fn mean(xs: impl Iterator<Item = f64>) -> f64 {
    let (sum, n) = xs.fold((0.0, 0usize), |(s, n), x| (s + x, n + 1));
    if n == 0 { 0.0 } else { sum / n as f64 }
}

/// One aggregate of runs: mean tokens/s, pooled acceptance and tokens per
/// step, geometric-mean speedup, and the lowest speedup of any prompt.
struct Pooled {
    tokens_per_s: f64,
    acceptance: f64,
    tokens_per_step: f64,
    speedup: f64,
    worst: f64,
}

fn pool<'a>(runs: impl Iterator<Item = &'a MixRun> + Clone) -> Pooled {
    let (proposed, accepted) = runs.clone().fold((0, 0), |(p, a), r| (p + r.proposed, a + r.accepted));
    let (tokens, steps) = runs.clone().fold((0, 0), |(t, s), r| (t + r.tokens as u64, s + r.steps));
    Pooled {
        tokens_per_s: mean(runs.clone().map(|r| r.tokens_per_s)),
        acceptance: if proposed == 0 { 0.0 } else { accepted as f64 / proposed as f64 },
        tokens_per_step: if steps == 0 { 0.0 } else { tokens as f64 / steps as f64 },
        speedup: geomean(runs.clone().map(|r| r.speedup)),
        worst: runs.map(|r| r.speedup).fold(f64::INFINITY, f64::min),
    }
}

/// The mix's Markdown: per backend a category table and a batch table, then
/// the peers against the best backend's runs.
pub fn markdown(mix: &Mix, peers: &Result<Peers, String>, max_tokens: usize) -> String {
    let mut md = String::new();
    let _ = writeln!(md, "## The prompt mix\n");
    let _ = writeln!(
        md,
        "`fixtures/prompts/mix.json`: 7 categories of 3 chat prompts each, up to {max_tokens} tokens greedy, stopping at the model's end of sequence. Speculative runs use the pay-off controller (`specdec generate`'s default; n-gram K = 8, DFlash K = 4) and every one emitted exactly its plain run's tokens. Each prompt and batch ran in {ROUNDS} rounds (its plain run, then each proposer's, back to back); a speedup is the median over the rounds of the ratio within a round, and its tokens/s and counts are that round's (the machine's memory speed drifts within minutes, adjacent runs see the same). Per category: mean tokens/s, acceptance pooled (accepted over proposed drafts), tokens per verify step pooled, speedup as the geometric mean over the prompts, and the lowest prompt's speedup.\n"
    );
    let backends: Vec<&str> = mix.runs.iter().map(|r| r.backend.as_str()).fold(Vec::new(), |mut v, b| {
        if !v.contains(&b) {
            v.push(b);
        }
        v
    });
    let categories: Vec<&str> = mix.runs.iter().map(|r| r.category.as_str()).fold(Vec::new(), |mut v, c| {
        if !v.contains(&c) {
            v.push(c);
        }
        v
    });
    for backend in &backends {
        let names: Vec<String> = proposers().iter().map(|(p, _)| label(p)).collect();
        let _ = writeln!(md, "### {backend}\n");
        let mut header = "| category | plain tok/s |".to_string();
        let mut rule = "|---|---|".to_string();
        for p in &names {
            let _ = write!(header, " {p} tok/s | acceptance | tokens/step | speedup (lowest) |");
            rule.push_str("---|---|---|---|");
        }
        let _ = writeln!(md, "{header}\n{rule}");
        for category in categories.iter().map(|c| Some(*c)).chain([None]) {
            let of = |proposer: Option<&str>| -> Vec<&MixRun> {
                mix.runs.iter().filter(|r| r.backend == *backend && category.is_none_or(|c| r.category == c) && r.proposer.as_deref() == proposer).collect()
            };
            let plain = pool(of(None).into_iter());
            let _ = write!(md, "| {} | {:.1} |", category.unwrap_or("**overall**"), plain.tokens_per_s);
            for p in &names {
                let s = pool(of(Some(p)).into_iter());
                let _ = write!(md, " {:.1} | {:.2} | {:.2} | **{:.2}x** ({:.2}x) |", s.tokens_per_s, s.acceptance, s.tokens_per_step, s.speedup, s.worst);
            }
            let _ = writeln!(md);
        }
        let _ = writeln!(
            md,
            "\nBatches (requests round robin over the categories; total tokens/s of the batch):\n\n| batch | plain tok/s | {} |\n|---|---|{}",
            names.iter().map(|p| format!("{p} tok/s (speedup)")).collect::<Vec<_>>().join(" | "),
            "---|".repeat(names.len())
        );
        for batch in BATCHES {
            let rows: Vec<&BatchRun> = mix.batches.iter().filter(|r| r.backend == *backend && r.batch == batch).collect();
            let Some(plain) = rows.iter().find(|r| r.proposer.is_none()) else { continue };
            let spec: Vec<String> = names.iter().map(|p| rows.iter().find(|r| r.proposer.as_deref() == Some(p)).map_or("-".into(), |r| format!("{:.1} ({:.2}x)", r.tokens_per_s, r.speedup))).collect();
            let _ = writeln!(md, "| {batch} | {:.1} | {} |", plain.tokens_per_s, spec.join(" | "));
        }
        let _ = writeln!(md);
    }
    match peers {
        Err(why) => {
            let _ = writeln!(md, "### Peers\n\nNot run: {why}\n");
        }
        Ok(peers) => peers_md(&mut md, mix, peers, &backends, &categories),
    }
    let plain_peers: Vec<&PeerEngine> = peers.as_ref().map(|p| p.engines.iter().filter(|e| e.mode == "plain").collect()).unwrap_or_default();
    prefill_md(&mut md, mix, &plain_peers, &backends, &categories);
    md
}

/// The prefill, apart from the decode: per category, the prompts' mean length,
/// our plain runs' prefill tokens/s, and each plain peer's, with our ratio to
/// it as the geometric mean over the prompts both timed.
fn prefill_md(md: &mut String, mix: &Mix, peers: &[&PeerEngine], backends: &[&str], categories: &[&str]) {
    let _ = writeln!(
        md,
        "### Prefill, same run, same token ids\n\nPrompt tokens over the prefill's seconds, mean over the category's prompts. Ours: the plain run's prefill (the target's forward over the prompt). A peer's: its one-token timing (the prefill and one decode step, best of two; `adapters/peers/bench_generate.py`), so it leans our way by one step. \"ours / X\": the geometric mean over the prompts of its seconds over ours.\n"
    );
    // Each prompt's category and length, as our runs saw them (a peer ran the same ids).
    let prompts: BTreeMap<&str, (&str, usize)> = mix.runs.iter().map(|r| (r.prompt.as_str(), (r.category.as_str(), r.prompt_tokens))).collect();
    let in_category = |prompt: &str, category: Option<&str>| prompts.get(prompt).is_some_and(|(c, _)| category.is_none_or(|want| *c == want));
    for backend in backends {
        let ours: BTreeMap<&str, &MixRun> = mix.runs.iter().filter(|r| r.backend == *backend && r.proposer.is_none() && r.prefill_s > 0.0).map(|r| (r.prompt.as_str(), r)).collect();
        let mut header = format!("| category ({backend}) | prompt tokens | ours tok/s |");
        let mut rule = "|---|---|---|".to_string();
        for e in peers {
            let _ = write!(header, " {} tok/s | ours / it |", e.engine);
            rule.push_str("---|---|");
        }
        let _ = writeln!(md, "{header}\n{rule}");
        for category in categories.iter().map(|c| Some(*c)).chain([None]) {
            let mine: Vec<&MixRun> = ours.values().copied().filter(|r| in_category(&r.prompt, category)).collect();
            let length = mean(mine.iter().map(|r| r.prompt_tokens as f64));
            let rate = mean(mine.iter().map(|r| r.prompt_tokens as f64 / r.prefill_s));
            let _ = write!(md, "| {} | {length:.0} | {rate:.0} |", category.unwrap_or("**overall**"));
            for e in peers {
                let theirs: Vec<&PeerRun> = e.runs.iter().filter(|pr| pr.prefill_s > 0.0 && in_category(&pr.prompt, category)).collect();
                if theirs.is_empty() {
                    let _ = write!(md, " not timed | - |");
                    continue;
                }
                let peer_rate = mean(theirs.iter().map(|pr| prompts[pr.prompt.as_str()].1 as f64 / pr.prefill_s));
                let ratios: Vec<f64> = theirs.iter().filter_map(|pr| ours.get(pr.prompt.as_str()).map(|r| pr.prefill_s / r.prefill_s)).collect();
                if ratios.is_empty() {
                    let _ = write!(md, " {peer_rate:.0} | - |");
                } else {
                    let _ = write!(md, " {peer_rate:.0} | {:.2}x |", geomean(ratios.into_iter()));
                }
            }
            let _ = writeln!(md);
        }
        let _ = writeln!(md);
    }
}

fn peers_md<'a>(md: &mut String, mix: &'a Mix, peers: &'a Peers, backends: &[&str], categories: &[&'a str]) {
    let _ = writeln!(md, "### Peers, same run, same token ids\n");
    for e in peers.engines.iter().map(|e| &e.version).fold(Vec::new(), |mut v: Vec<&String>, x| {
        if !v.contains(&x) {
            v.push(x);
        }
        v
    }) {
        let _ = writeln!(md, "- {e}");
    }
    for s in &peers.skipped {
        let _ = writeln!(md, "- not run: {s}");
    }
    let _ = writeln!(
        md,
        "\nDecode tokens/s excluding the prompt (each peer timed generating the full answer and one token, best of two; `adapters/peers/bench_generate.py`), mean over the category's timed prompts. \"ours / X\": our tokens/s over the peer's, plain over plain, and over the peer's n-gram drafter (prompt lookup) the faster of our two proposers on each prompt (a best of two, so it leans our way), per category as the geometric mean over its prompts.\n"
    );
    let prompt_category: BTreeMap<&str, &str> = mix.runs.iter().map(|r| (r.prompt.as_str(), r.category.as_str())).collect();
    for e in &peers.engines {
        let untimed = e.runs.iter().filter(|r| r.tokens_per_s <= 0.0).count();
        if untimed > 0 {
            let _ = writeln!(md, "{} {}: {untimed} of {} prompts not timed (one token, or the whole answer no slower than one token), left out.\n", e.engine, e.mode, e.runs.len());
        }
    }
    // A peer's timed runs of a category (all of them for `None`).
    let timed_runs = |e: &'a PeerEngine, category: Option<&'a str>| {
        let prompt_category = &prompt_category;
        e.runs.iter().filter(move |r| r.tokens_per_s > 0.0 && category.is_none_or(|c| prompt_category.get(r.prompt.as_str()) == Some(&c)))
    };
    let peer_rate = |e: &'a PeerEngine, category: Option<&'a str>| mean(timed_runs(e, category).map(|r| r.tokens_per_s));
    // `None` where no prompt has both a peer's timing and ours (not a ratio of 1 over nothing).
    let peer_ratio = |e: &'a PeerEngine, backend: &str, category: Option<&'a str>, speculative: bool| {
        let ratios: Vec<f64> = timed_runs(e, category)
            .filter_map(|pr| {
                let ours = mix.runs.iter().filter(|r| r.backend == backend && r.prompt == pr.prompt && r.proposer.is_some() == speculative).map(|r| r.tokens_per_s).fold(0.0, f64::max);
                (ours > 0.0).then(|| ours / pr.tokens_per_s)
            })
            .collect();
        (!ratios.is_empty()).then(|| geomean(ratios.into_iter()))
    };
    for backend in backends {
        let mut header = format!("| category ({backend}) |");
        let mut rule = "|---|".to_string();
        for e in &peers.engines {
            let _ = write!(header, " {} {} tok/s | ours / it |", e.engine, e.mode);
            rule.push_str("---|---|");
        }
        let _ = writeln!(md, "{header}\n{rule}");
        for category in categories.iter().map(|c| Some(*c)).chain([None]) {
            let _ = write!(md, "| {} |", category.unwrap_or("**overall**"));
            for e in &peers.engines {
                let speculative = e.mode != "plain";
                if timed_runs(e, category).next().is_none() {
                    let _ = write!(md, " not timed | - |");
                    continue;
                }
                match peer_ratio(e, backend, category, speculative) {
                    Some(ratio) => _ = write!(md, " {:.1} | {ratio:.2}x |", peer_rate(e, category)),
                    None => _ = write!(md, " {:.1} | - |", peer_rate(e, category)),
                }
            }
            let _ = writeln!(md);
        }
        let _ = writeln!(md);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A plain run of backend `b`: 10 tokens at 40 tokens/s in 10 steps, its
    /// 100-token prompt prefilled in 0.5 s.
    fn plain_run(category: &str, prompt: &str) -> MixRun {
        MixRun {
            backend: "b".into(),
            category: category.into(),
            prompt: prompt.into(),
            proposer: None,
            prompt_tokens: 100,
            prefill_s: 0.5,
            tokens: 10,
            tokens_per_s: 40.0,
            speedup: 1.0,
            steps: 10,
            proposed: 0,
            accepted: 0,
            steps_by_k: vec![],
        }
    }

    fn prompt(category: &str, id: &str) -> MixPrompt {
        MixPrompt { category: category.into(), category_name: category.into(), id: id.into(), ids: vec![1] }
    }

    #[test]
    fn batches_take_the_categories_in_turn() {
        let ps = [prompt("a", "a1"), prompt("a", "a2"), prompt("b", "b1"), prompt("c", "c1"), prompt("c", "c2")];
        let order: Vec<&str> = round_robin(&ps).iter().map(|p| p.id.as_str()).collect();
        assert_eq!(order, ["a1", "b1", "c1", "a2", "c2"]);
    }

    #[test]
    fn the_median_is_found_by_position() {
        assert_eq!(median_index(&[3.0, 1.0, 2.0]), Some(2));
        assert_eq!(median_index(&[5.0, 4.0, 1.0, 2.0]), Some(3), "the lower median of an even count");
        assert_eq!(median_index(&[7.0]), Some(0));
        assert_eq!(median_index(&[]), None);
    }

    /// A run of `tokens` generated over `seconds` of decoding.
    fn timed(tokens: &[u32], seconds: f64) -> RunOutput {
        let output = specdec_decoder::Output { tokens: tokens.to_vec(), finish: specdec_decoder::FinishReason::Length, acceptance: Default::default(), logprobs: None, error: None };
        let timings = specdec_decoder::Timings { verify_s: seconds, ..Default::default() };
        RunOutput { outputs: vec![output], acceptance: Default::default(), batch_steps: 0, proposer_errors: 0, steps_by_k: vec![], timings }
    }

    #[test]
    fn a_speedup_is_the_median_ratio_within_rounds() {
        // The machine slows by half in round 2: plain and speculative alike.
        // Ratios within rounds: 2, 2, 1.5; across rounds they would be 4 or 1.
        let plain = [1.0, 2.0, 1.0];
        let spec = [0.5, 1.0, 1.0 / 1.5];
        let (mut p, mut q) = (0, 0);
        let (base, chosen) = in_rounds(
            1,
            "t",
            || {
                p += 1;
                Ok(timed(&[1, 2], plain[p - 1]))
            },
            |_| {
                q += 1;
                Ok((timed(&[1, 2], spec[q - 1]), "ngram".into()))
            },
        )
        .unwrap();
        assert_eq!((p, q), (ROUNDS, ROUNDS));
        assert!((chosen[0].1 - 2.0).abs() < 1e-12, "{}", chosen[0].1);
        assert!((base.decode_tokens_per_s() - 2.0).abs() < 1e-12, "the median plain run");
    }

    /// Negative control: a speculative run whose tokens differ from its
    /// round's plain run stops the section.
    #[test]
    fn a_round_with_other_tokens_is_an_error() {
        let mut q = 0;
        let err = in_rounds(
            1,
            "ndarray, prompt p",
            || Ok(timed(&[1, 2], 1.0)),
            |_| {
                q += 1;
                Ok((timed(if q == 2 { &[1, 3] } else { &[1, 2] }, 1.0), "ngram".into()))
            },
        )
        .unwrap_err();
        assert!(err.contains("ngram") && err.contains("differ"), "{err}");
    }

    /// A peer's prompt whose decode could not be timed (its rate 0) is left
    /// out of the means and ratios and counted; a category with no timed
    /// prompt says so, and one where our runs have no rate shows no ratio,
    /// rather than a ratio of 1 over nothing.
    #[test]
    fn an_untimed_peer_prompt_is_counted_not_averaged() {
        let mut z = plain_run("z", "z1");
        z.tokens_per_s = 0.0;
        let mix = Mix { runs: vec![plain_run("x", "x1"), plain_run("x", "x2"), plain_run("y", "y1"), z], batches: vec![] };
        let run = |prompt: &str, tokens_per_s: f64| PeerRun { prompt: prompt.into(), tokens: 10, decode_s: 0.1, tokens_per_s, prefill_s: 1.0 };
        let engine = PeerEngine { engine: "peer".into(), version: "v".into(), mode: "plain".into(), runs: vec![run("x1", 20.0), run("x2", 0.0), run("y1", 0.0), run("z1", 30.0)] };
        let mut md = String::new();
        peers_md(&mut md, &mix, &Peers { engines: vec![engine], skipped: vec![] }, &["b"], &["x", "y", "z"]);
        assert!(md.contains("peer plain: 2 of 4 prompts not timed"), "{md}");
        assert!(md.contains("| x | 20.0 | 2.00x |"), "the timed prompt alone: {md}");
        assert!(md.contains("| y | not timed | - |"), "{md}");
        assert!(md.contains("| z | 30.0 | - |"), "no ratio where ours has no rate: {md}");
        assert!(md.contains("| **overall** | 25.0 | 2.00x |"), "{md}");
    }

    /// The prefill table: per category our plain runs' and each plain peer's
    /// prompt tokens per second, and the ratio over the prompts both timed; a
    /// peer whose category has no timed prefill says so, and a speculative
    /// run's prefill does not count as ours.
    #[test]
    fn the_prefill_table_compares_the_same_prompts() {
        let ours = |category: &str, prompt: &str, proposer: Option<&str>, prompt_tokens: usize, prefill_s: f64| MixRun {
            proposer: proposer.map(String::from),
            prompt_tokens,
            prefill_s,
            ..plain_run(category, prompt)
        };
        // x1: 100 tokens in 0.5 s (200 tok/s); x2: 300 in 1 s (300 tok/s); y1: 50 in 0.25 s.
        let mix = Mix { runs: vec![ours("x", "x1", None, 100, 0.5), ours("x", "x1", Some("ngram"), 100, 5.0), ours("x", "x2", None, 300, 1.0), ours("y", "y1", None, 50, 0.25)], batches: vec![] };
        let run = |prompt: &str, prefill_s: f64| PeerRun { prompt: prompt.into(), tokens: 10, decode_s: 0.1, tokens_per_s: 10.0, prefill_s };
        // The peer: x1 in 1 s (100 tok/s, ours 2x), x2 in 0.5 s (600 tok/s, ours 0.5x), y1 untimed.
        let engine = PeerEngine { engine: "peer".into(), version: "v".into(), mode: "plain".into(), runs: vec![run("x1", 1.0), run("x2", 0.5), run("y1", 0.0)] };
        let mut md = String::new();
        prefill_md(&mut md, &mix, &[&engine], &["b"], &["x", "y"]);
        assert!(md.contains("| x | 200 | 250 | 350 | 1.00x |"), "{md}");
        assert!(md.contains("| y | 50 | 200 | not timed | - |"), "{md}");
        assert!(md.contains("| **overall** | 150 | 233 | 350 | 1.00x |"), "{md}");
        // Negative control: a peer twice as slow on every prompt is 2x, not 1x.
        let slow = PeerEngine { runs: vec![run("x1", 1.0), run("x2", 2.0)], ..engine.clone() };
        let mut md = String::new();
        prefill_md(&mut md, &mix, &[&slow], &["b"], &["x"]);
        assert!(md.contains("| x | 200 | 250 | 125 | 2.00x |"), "{md}");
    }

    #[test]
    fn pooling_weighs_drafts_and_steps_and_takes_the_geometric_mean() {
        let run = |speedup: f64, tokens: usize, steps: u64, proposed: u64, accepted: u64| MixRun {
            proposer: Some("ngram".into()),
            tokens,
            tokens_per_s: 10.0 * speedup,
            speedup,
            steps,
            proposed,
            accepted,
            ..plain_run("c", "p")
        };
        let runs = [run(2.0, 30, 10, 20, 10), run(0.5, 10, 10, 0, 0)];
        let p = pool(runs.iter());
        assert!((p.speedup - 1.0).abs() < 1e-12, "geometric mean of 2 and 0.5");
        assert_eq!((p.acceptance, p.tokens_per_step, p.worst), (0.5, 2.0, 0.5));
        assert!((p.tokens_per_s - 12.5).abs() < 1e-12);
    }
}
