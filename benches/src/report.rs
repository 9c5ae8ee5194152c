//! The report: one JSON file with every measurement, a Markdown page of
//! tables and ratios read from it, and two SVG plots.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

use serde::Serialize;

use crate::e2e::{E2e, PROMPTS};
use crate::forward::{CONTEXT, ForwardTime, SHORT_WINDOW, WINDOW};
use crate::kernels::{KernelTime, OPS, SHAPES};
use crate::machine::Machine;
use crate::ngram::NgramTime;
use crate::peer::PeerTimes;
use crate::plot::{Line, lines};

#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub machine: Machine,
    /// How the report was made (the command, tokens per run).
    pub command: String,
    pub max_tokens: usize,
    pub kernels: Vec<KernelTime>,
    /// The peer's timings, or why there are none.
    pub peer: Result<PeerTimes, String>,
    pub ngram: Option<NgramTime>,
    pub forward: Vec<ForwardTime>,
    pub e2e: E2e,
    /// Why the end-to-end section stopped early, if it did (e.g. a speculative
    /// run whose tokens differ from plain decoding): the rest is still reported.
    pub e2e_failure: Option<String>,
    /// The prompt mix (`crate::mix`) and its peers, or why there are none.
    pub mix: crate::mix::Mix,
    pub mix_peers: Result<crate::mix::Peers, String>,
    /// Why the mix stopped early (a speculative run that was not lossless).
    pub mix_failure: Option<String>,
    /// `specdec serve` under load, plain against speculative, or why not.
    pub serve: Result<crate::serve_load::ServeLoad, String>,
    /// Logprobs and a JSON schema per decode step, or why not.
    pub features: Result<crate::features::Features, String>,
    /// Sections left out of this run and why.
    pub skipped: Vec<String>,
}

fn ms(s: f64) -> String {
    format!("{:.3}", s * 1e3)
}

impl Report {
    /// Writes `bench.json`, `BENCH.md` and the plots into `dir`.
    pub fn write(&self, dir: &Path) -> Result<(), String> {
        std::fs::create_dir_all(dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
        let json = serde_json::to_string_pretty(self).map_err(|e| e.to_string())?;
        std::fs::write(dir.join("bench.json"), json).map_err(|e| format!("cannot write bench.json: {e}"))?;
        let mut plots = Vec::new();
        if !self.e2e.spec.is_empty() {
            lines(
                &dir.join("speedup_vs_k.svg"),
                "Speedup over plain greedy decoding (SmolLM2-135M)",
                "k (drafts per step)",
                "speedup (geometric mean over prompts)",
                &self.speedup_lines(),
                Some(1.0),
            )?;
            lines(&dir.join("acceptance_per_position.svg"), "Acceptance per draft position at the largest k run", "draft position", "accepted when drafted", &self.acceptance_lines(), None)?;
            plots.extend(["speedup_vs_k.svg", "acceptance_per_position.svg"]);
        }
        std::fs::write(dir.join("BENCH.md"), self.markdown(&plots)).map_err(|e| format!("cannot write BENCH.md: {e}"))
    }

    fn speedup_lines(&self) -> Vec<Line> {
        let mut by: BTreeMap<(String, String), BTreeMap<usize, Vec<f64>>> = BTreeMap::new();
        for r in self.e2e.spec.iter().filter(|r| !r.controlled) {
            by.entry((r.backend.clone(), r.proposer.clone())).or_default().entry(r.k).or_default().push(r.speedup.ln());
        }
        by.into_iter()
            .map(|((b, p), ks)| Line { label: format!("{p} on {b}"), points: ks.into_iter().map(|(k, logs)| (k as f64, (logs.iter().sum::<f64>() / logs.len() as f64).exp())).collect() })
            .collect()
    }

    /// Per proposer and prompt at the largest k it ran, on the first backend
    /// that ran (greedy tokens, hence acceptance, agree across backends).
    fn acceptance_lines(&self) -> Vec<Line> {
        let Some(first) = self.e2e.spec.first().map(|r| r.backend.clone()) else { return Vec::new() };
        let mut widest: BTreeMap<(&str, &str), &crate::e2e::SpecRun> = BTreeMap::new();
        for r in self.e2e.spec.iter().filter(|r| r.backend == first && !r.controlled) {
            let slot = widest.entry((r.proposer.as_str(), r.prompt.as_str())).or_insert(r);
            if r.k > slot.k {
                *slot = r;
            }
        }
        widest
            .into_values()
            .map(|r| Line { label: format!("{}, {} (k = {})", r.proposer, r.prompt, r.k), points: r.acceptance_per_position.iter().enumerate().map(|(j, &a)| ((j + 1) as f64, a)).collect() })
            .collect()
    }

    pub fn markdown(&self, plots: &[&str]) -> String {
        let m = &self.machine;
        let mut md = String::new();
        let _ = writeln!(md, "# specdec speedup report\n");
        let _ = writeln!(md, "Made by `{}`. Every ratio below is between times measured in this one run.\n", self.command);
        let _ = writeln!(
            md,
            "**Machine:** {} cores, {}; copy bandwidth **{:.1} GB/s** (the larger of one thread's {:.1} and all threads' {:.1}; {} MiB buffer, read + write bytes, best of 7); read bandwidth **{:.1} GB/s** (a sum over the same buffer, the larger of one thread's and all threads', best of 7); f32 FMA throughput **{:.1} GFLOP/s** ({} independent FMA chains per core on every core, `{}`, best of 7). A memory-bound limit below is the bytes a kernel must read once over the copy bandwidth, and for the forward's decode also over the read bandwidth; both are given for host backends only (an accelerator's bandwidth is not measured here).\n",
            m.cores,
            m.cpu,
            m.copy_bytes_per_s / 1e9,
            m.one_thread_bytes_per_s / 1e9,
            m.all_threads_bytes_per_s / 1e9,
            m.copy_buffer_bytes >> 20,
            m.read_bytes_per_s / 1e9,
            m.fma_flops_per_s / 1e9,
            crate::machine::FMA_CHAINS,
            m.fma_path
        );
        if let Some(why) = &self.e2e_failure {
            let _ = writeln!(md, "**The end-to-end section failed:** {why}\n");
        }
        if let Some(why) = &self.mix_failure {
            let _ = writeln!(md, "**The prompt mix failed:** {why}\n");
        }
        if !self.skipped.is_empty() {
            let _ = writeln!(md, "Left out of this run: {}.\n", self.skipped.join("; "));
        }
        self.kernels_md(&mut md);
        self.ngram_md(&mut md);
        self.forward_md(&mut md);
        self.e2e_md(&mut md, plots);
        if !self.mix.runs.is_empty() {
            md.push_str(&crate::mix::markdown(&self.mix, &self.mix_peers, self.max_tokens));
        }
        self.serve_md(&mut md);
        md.push_str(&crate::features::markdown(&self.features));
        md
    }

    fn serve_md(&self, md: &mut String) {
        let _ = writeln!(md, "## `specdec serve` under load\n");
        match &self.serve {
            Ok(s) => {
                let _ = writeln!(
                    md,
                    "SmolLM2-135M on {} with {} drafts (k = {}), `--max-batch {}`, greedy; each client streams {} chat requests of {} tokens in turn (the six load prompts of `specdec load`), with speculation on and then off on the same server.\n",
                    s.backend,
                    s.proposer,
                    s.k,
                    s.max_batch,
                    crate::serve_load::REQUESTS,
                    crate::serve_load::MAX_TOKENS
                );
                md.push_str(&specdec_serve::load::markdown(&s.results));
                md.push('\n');
                crate::serve_load::beside_long_md(&s.beside_long, md);
            }
            Err(why) => {
                let _ = writeln!(md, "Not run: {why}\n");
            }
        }
    }

    fn kernels_md(&self, md: &mut String) {
        if self.kernels.is_empty() {
            return;
        }
        let _ = writeln!(md, "## Kernels\n");
        let _ = writeln!(
            md,
            "As the decoder calls them, inputs resident, accepted tokens and counts downloaded (criterion means). `verify_from_logits`: `process_logits` (temperature 1, no top-k/top-p) on the target's `[B, k+1, V]` and the draft's `[B, k, V]` f32 logits, then the unchecked `rejection_verify` with explicit noise. `verify_from_logits_processed`: the same with every sampling processor on, as the decoder runs them (each row's penalty counts over a context of 512 tokens plus the drafts before the row, and a sparse logit bias, built on the host and uploaded per call; repetition 1.2, presence 0.3, frequency 0.2, min-p 0.05): its ratio to `verify_from_logits` is what the processors cost. `greedy_verify`: the unchecked `greedy_verify` on the target's logits. Limit: the logits in the backend's float dtype, read once.\n"
        );
        let peer = self.peer.as_ref().ok();
        match &self.peer {
            Ok(p) => {
                let _ = writeln!(
                    md,
                    "Peer, timed in this run (`adapters/peers/bench_hf.py`; the median of 25 calls, where our times are criterion's means): {}: `_speculative_sampling` once per sequence; greedy is `argmax` and the match count, batched.\n",
                    p.peer
                );
            }
            Err(why) => {
                let _ = writeln!(md, "No peer column: {why}.\n");
            }
        }
        let _ = writeln!(md, "| op | shape | backend | dtype | mean (ms) | x memory limit | x reference | x HF (peer) |\n|---|---|---|---|---|---|---|---|");
        for op in OPS {
            for shape in SHAPES {
                let rows: Vec<&KernelTime> = self.kernels.iter().filter(|k| k.op == op && k.shape == shape).collect();
                let reference = rows.iter().find(|k| k.backend == "reference").map(|k| k.mean_s);
                if let Some(p) = peer.and_then(|p| p.get(op, &shape)) {
                    let _ = writeln!(md, "| {op} | {} | HF transformers | f32 | {} | | | 1 |", shape.label(), ms(p));
                }
                for k in rows {
                    let vs_ref = reference.map_or("-".into(), |r| format!("{:.2}", k.mean_s / r));
                    let vs_peer = peer.and_then(|p| p.get(op, &shape)).map_or("-".into(), |p| format!("{:.2}", k.mean_s / p));
                    let limit = k.times_limit.map_or("-".into(), |x| format!("{x:.1}"));
                    let _ = writeln!(md, "| {op} | {} | {} | {} | {} | {limit} | {vs_ref} | {vs_peer} |", shape.label(), k.backend, k.float_dtype, ms(k.mean_s));
                }
            }
        }
        let _ = writeln!(
            md,
            "\nWhat the processors cost, `verify_from_logits_processed` over `verify_from_logits`, same run:\n\n| shape | backend | plain (ms) | processed (ms) | ratio |\n|---|---|---|---|---|"
        );
        for shape in SHAPES {
            for plain in self.kernels.iter().filter(|k| k.op == OPS[0] && k.shape == shape) {
                if let Some(processed) = self.kernels.iter().find(|k| k.op == OPS[1] && k.shape == shape && k.backend == plain.backend) {
                    let _ = writeln!(md, "| {} | {} | {} | {} | {:.2} |", shape.label(), plain.backend, ms(plain.mean_s), ms(processed.mean_s), processed.mean_s / plain.mean_s);
                }
            }
        }
        let _ = writeln!(md);
    }

    fn ngram_md(&self, md: &mut String) {
        let Some(n) = &self.ngram else { return };
        let _ = writeln!(md, "## Prompt lookup at {} tokens of context\n", n.context);
        let _ = writeln!(
            md,
            "The decoder's incremental index (NGRAM-6, {}) against the linear search a stateless call makes (build and rescan: criterion means; the step: one timed run of 2^20 steps, median of three; seeded Zipf ids with a third of the 64-token blocks repeated).\n",
            n.config
        );
        let _ = writeln!(md, "| step | time | per |\n|---|---|---|");
        let _ = writeln!(md, "| build the index over the context | {} ms | context |", ms(n.build_s));
        let _ = writeln!(md, "| append one token and propose (index), amortised over 2^20 steps from {} tokens | {:.3} us | token |", n.context, n.append_propose_s * 1e6);
        let _ = writeln!(md, "| propose by linear search (rescan) | {} ms | call |", ms(n.rescan_s));
        let _ = writeln!(md, "\nThe index answers a step {:.0}x faster than a rescan.\n", n.rescan_s / n.append_propose_s);
    }

    fn forward_md(&self, md: &mut String) {
        if self.forward.is_empty() {
            return;
        }
        let _ = writeln!(md, "## SmolLM2-135M forward\n");
        let _ = writeln!(
            md,
            "Criterion means. Context {CONTEXT} tokens; `verify5` and `verify9` are windows of {SHORT_WINDOW} and {WINDOW} tokens (k = 4, the decoder's default, and k = 8) at that context; `prefill64` a 64-token prompt into an empty cache. Each timing ends by downloading the last logit row (the verify ops read the rest on the device). Rooflines: the weights a decode step reads once (q8_0: 34 bytes per 32 weights) over the copy bandwidth, and over the read bandwidth; for the prefill, its f32 operations (the layers' products on every token, causal attention, the head on the last row; {:.2} GFLOP) over the measured FMA throughput.\n",
            self.forward[0].prefill64_flops / 1e9
        );
        let _ = writeln!(
            md,
            "| backend | weights | decode (ms) | tokens/s | x copy roofline | x read roofline | verify5 / decode | verify9 (ms) | verify9 / decode | prefill64 (ms) | prefill64 x FMA roofline |\n|---|---|---|---|---|---|---|---|---|---|---|"
        );
        for f in &self.forward {
            let roofline = |x: Option<f64>| x.map_or("-".into(), |x| format!("{x:.2}"));
            let (copy, read) = (roofline(f.decode_times_roofline), roofline(f.decode_times_read_roofline));
            let _ = writeln!(
                md,
                "| {} | {} ({:.0} MB) | {} | {:.1} | {copy} | {read} | {:.2} | {} | {:.2} | {} | {} |",
                f.backend,
                f.weight_dtype,
                f.weight_bytes / 1e6,
                ms(f.decode_s),
                1.0 / f.decode_s,
                f.verify5_over_decode,
                ms(f.verify9_s),
                f.verify9_over_decode,
                ms(f.prefill64_s),
                roofline(f.prefill64_times_fma_roofline)
            );
        }
        let _ = writeln!(md);
    }

    /// The pay-off controller's rows beside the fixed largest k and the
    /// measured best k, per backend, proposer and prompt, and its floor.
    fn controller_md(&self, md: &mut String) {
        let e = &self.e2e;
        let controlled: Vec<_> = e.spec.iter().filter(|r| r.controlled).collect();
        if controlled.is_empty() {
            return;
        }
        let _ = writeln!(
            md,
            "\n### The pay-off controller\n\nEach step's k in 0..=K picked by the pay-off controller (CTRL-7 .. CTRL-10: expected tokens per second from this run's own step times and acceptance; plain steps where drafts do not pay, with sparse probes), against K fixed and the measured best k. Steps by k: how many steps ran with k = 0, 1, ...\n\n| backend | proposer | prompt | pay-off speedup | K fixed | best fixed k | steps by k |\n|---|---|---|---|---|---|---|"
        );
        for r in &controlled {
            let fixed = e.spec.iter().filter(|f| !f.controlled && f.backend == r.backend && f.proposer == r.proposer && f.prompt == r.prompt);
            let at_k = fixed.clone().find(|f| f.k == r.k).map_or(f64::NAN, |f| f.speedup);
            let best = fixed.map(|f| f.speedup).fold(f64::NEG_INFINITY, f64::max);
            let steps: Vec<String> = r.steps_by_k.iter().map(u64::to_string).collect();
            let _ = writeln!(md, "| {} | {} | {} | **{:.2}** | {:.2} | {:.2} | {} |", r.backend, r.proposer, r.prompt, r.speedup, at_k, best, steps.join(" "));
        }
        let floor = controlled.iter().map(|r| r.speedup).fold(f64::INFINITY, f64::min);
        let _ = writeln!(md, "\nThe controller's lowest speedup over every backend, proposer and prompt: **{floor:.2}x**.");
    }

    fn e2e_md(&self, md: &mut String, plots: &[&str]) {
        let e = &self.e2e;
        if e.plain.is_empty() {
            return;
        }
        let _ = writeln!(md, "## End to end: speculative against plain decoding\n");
        let prompts: Vec<String> = PROMPTS.iter().map(|(id, kind)| format!("`{id}` ({kind})")).collect();
        let _ = writeln!(
            md,
            "Greedy, {} new tokens per run, batch 1, prompts {} from `fixtures/prompts/smollm2.json`. Every speculative run below produced exactly the plain run's tokens (the bench stops otherwise). Tokens/s exclude the prefill. `c`: the proposer's seconds per drafted token over the plain run's seconds per token. Predicted: THEORY-3 with THEORY-2's expected tokens from the measured acceptance, `tokens per step / (1 + c x drafts per step)`; it assumes a verify step costs one plain step, so achieved / predicted below 1 measures what a (k+1)-token verify and the loop's overhead really cost.\n",
            self.max_tokens,
            prompts.join(", ")
        );
        let _ = writeln!(md, "### Plain decoding\n\n| backend | prompt | tokens | tokens/s |\n|---|---|---|---|");
        for p in &e.plain {
            let _ = writeln!(md, "| {} | {} | {} | {:.1} |", p.backend, p.prompt, p.tokens, p.tokens_per_s);
        }
        let _ = writeln!(
            md,
            "\n### Best k\n\nTheory: THEORY-4 over k in 1..=K with beta fitted to the measured tokens per step at K, the largest k swept (8 for n-gram drafts, 4 for the model drafters; a step without a proposal counts as a rejection, so for n-gram drafts it is the acceptance per step, below the per-draft rate) and c pooled over the prompts (run too when outside the sweep). Measured: the k with the highest geometric-mean speedup over the prompts. tau: tokens per verify step at the measured k (accepted drafts plus the target's own token), mean over the prompts.\n\n| backend | proposer | fitted beta (per step) | c | theory k | predicted speedup | measured k | tau | measured speedup |\n|---|---|---|---|---|---|---|---|---|"
        );
        for b in &e.best_k {
            let _ = writeln!(
                md,
                "| {} | {} | {:.3} | {:.3} | {} | {:.2} | {} | {:.2} | {:.2} |",
                b.backend, b.proposer, b.fitted_beta, b.cost_ratio, b.theory_k, b.theory_speedup, b.measured_k, b.measured_tau, b.measured_speedup
            );
        }
        self.controller_md(md);
        if let Some(t) = crate::e2e::dflash_training() {
            let _ = writeln!(md, "\n### The DFlash draft\n\n{t}");
        }
        let _ = writeln!(
            md,
            "\n### Every run\n\n| backend | proposer | prompt | k | tokens/s | speedup | mean accepted | tokens/step | c | predicted | achieved / predicted | acceptance per position |\n|---|---|---|---|---|---|---|---|---|---|---|---|"
        );
        for r in &e.spec {
            let per: Vec<String> = r.acceptance_per_position.iter().map(|a| format!("{a:.2}")).collect();
            let k = if r.controlled { format!("0..{} (pay-off)", r.k) } else { r.k.to_string() };
            let _ = writeln!(
                md,
                "| {} | {} | {} | {} | {:.1} | {:.2} | {:.2} | {:.2} | {:.3} | {:.2} | {:.2} | {} |",
                r.backend,
                r.proposer,
                r.prompt,
                k,
                r.tokens_per_s,
                r.speedup,
                r.mean_accepted,
                r.tokens_per_step,
                r.cost_ratio,
                r.predicted_speedup,
                r.achieved_over_predicted,
                per.join(" ")
            );
        }
        for p in plots {
            let _ = writeln!(md, "\n![{p}]({p})");
        }
    }
}
