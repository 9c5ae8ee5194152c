//! A load generator for any OpenAI-compatible server: `concurrency`
//! clients each send `requests` streamed completions in turn, and the run
//! reports throughput and latency (time to first token, inter-token gaps,
//! whole-request latency) as percentiles.
//!
//! Speculation pays at low load and costs at high load (the verify window
//! competes with other requests' decodes for the same step); one run per
//! concurrency with speculation on and off, against the same server, shows
//! where the two cross. Bounded by construction: a fixed number of
//! requests, each with a timeout.

use std::io::{BufRead, BufReader};
use std::time::{Duration, Instant};

use serde::Serialize;
use serde_json::{Value, json};

/// Prompts of a load run when none are given: one per kind of request a
/// chat server sees (question, summary, code, list, rewrite, reasoning).
pub const PROMPTS: [&str; 6] = [
    "What are three good habits for staying healthy?",
    "Summarize in two sentences: The city council met on Tuesday to discuss the new park. Residents asked for more trees, a playground and benches. The council agreed to fund the trees and the playground this year and the benches next year.",
    "Write a Python function that returns the sum of the squares of a list of numbers.",
    "List the planets of the solar system in order from the sun.",
    "Rewrite this sentence in a formal tone: hey, can u send me the report by tomorrow?",
    "If a train travels 60 km in 45 minutes, what is its average speed in km per hour? Explain.",
];

/// One load run's setting.
#[derive(Debug, Clone)]
pub struct LoadSpec {
    /// `http://HOST:PORT`.
    pub url: String,
    pub model: Option<String>,
    /// Text prompts, sent as chat messages in turn.
    pub prompts: Vec<String>,
    pub max_tokens: usize,
    pub concurrency: usize,
    /// Requests each client sends, one after the other.
    pub requests: usize,
    /// `speculation` of every request (specdec's field; another server ignores it at its own peril).
    pub speculation: Option<bool>,
    pub temperature: f64,
    pub timeout: Duration,
}

/// What one load run measured.
#[derive(Debug, Clone, Serialize)]
pub struct LoadResult {
    pub concurrency: usize,
    pub speculation: Option<bool>,
    pub requests: usize,
    pub failed: usize,
    /// Generated tokens (the server's `usage`).
    pub tokens: u64,
    pub wall_s: f64,
    /// Generated tokens per second over the run.
    pub tokens_per_s: f64,
    pub ttft_p50_s: f64,
    pub ttft_p90_s: f64,
    /// Gaps between a request's streamed tokens (a chunk's gap shared by its tokens).
    pub itl_p50_s: f64,
    pub itl_p90_s: f64,
    pub latency_p50_s: f64,
    pub latency_p90_s: f64,
}

/// One request's clock.
struct Timed {
    ttft: f64,
    gaps: Vec<f64>,
    latency: f64,
    tokens: u64,
}

fn percentile(v: &mut [f64], q: f64) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(f64::total_cmp);
    v[((v.len() - 1) as f64 * q).round() as usize]
}

/// Runs `spec`; failed requests are counted, not fatal.
pub fn run(spec: &LoadSpec) -> Result<LoadResult, String> {
    if spec.prompts.is_empty() || spec.concurrency == 0 || spec.requests == 0 {
        return Err("a load run needs prompts, concurrency and requests".into());
    }
    let agent: ureq::Agent = ureq::Agent::config_builder().timeout_global(Some(spec.timeout)).http_status_as_error(false).build().into();
    let start = Instant::now();
    let results: Vec<Result<Timed, String>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..spec.concurrency)
            .map(|c| {
                let agent = agent.clone();
                s.spawn(move || (0..spec.requests).map(|i| one(&agent, spec, &spec.prompts[(c * spec.requests + i) % spec.prompts.len()], (c * spec.requests + i) as u64)).collect::<Vec<_>>())
            })
            .collect();
        handles.into_iter().flat_map(|h| h.join().unwrap_or_else(|_| vec![Err("a client thread panicked".into())])).collect()
    });
    let wall_s = start.elapsed().as_secs_f64();
    let failed = results.iter().filter(|r| r.is_err()).count();
    if let Some(Err(first)) = results.iter().find(|r| r.is_err()) {
        eprintln!("load: {failed} of {} requests failed; the first: {first}", results.len());
    }
    let ok: Vec<Timed> = results.into_iter().filter_map(Result::ok).collect();
    let tokens: u64 = ok.iter().map(|t| t.tokens).sum();
    let (mut ttft, mut gaps, mut latency): (Vec<f64>, Vec<f64>, Vec<f64>) =
        (ok.iter().map(|t| t.ttft).collect(), ok.iter().flat_map(|t| t.gaps.iter().copied()).collect(), ok.iter().map(|t| t.latency).collect());
    Ok(LoadResult {
        concurrency: spec.concurrency,
        speculation: spec.speculation,
        requests: spec.concurrency * spec.requests,
        failed,
        tokens,
        wall_s,
        tokens_per_s: tokens as f64 / wall_s,
        ttft_p50_s: percentile(&mut ttft, 0.5),
        ttft_p90_s: percentile(&mut ttft, 0.9),
        itl_p50_s: percentile(&mut gaps, 0.5),
        itl_p90_s: percentile(&mut gaps, 0.9),
        latency_p50_s: percentile(&mut latency, 0.5),
        latency_p90_s: percentile(&mut latency, 0.9),
    })
}

/// One streamed chat completion, timed chunk by chunk.
fn one(agent: &ureq::Agent, spec: &LoadSpec, prompt: &str, seed: u64) -> Result<Timed, String> {
    let mut body = json!({
        "messages": [{"role": "user", "content": prompt}], "max_tokens": spec.max_tokens, "temperature": spec.temperature,
        "seed": seed, "stream": true, "stream_options": {"include_usage": true}, "return_token_ids": true,
    });
    if let Some(on) = spec.speculation {
        body["speculation"] = json!(on);
    }
    if let Some(m) = &spec.model {
        body["model"] = json!(m);
    }
    let url = format!("{}/v1/chat/completions", spec.url.trim_end_matches('/'));
    let sent = Instant::now();
    let reply = agent.post(&url).send_json(&body).map_err(|e| format!("{url}: {e}"))?;
    if reply.status() != 200 {
        return Err(format!("{url}: status {}", reply.status()));
    }
    let (mut ttft, mut last, mut gaps, mut tokens) = (None, sent, Vec::new(), 0u64);
    for line in BufReader::new(reply.into_body().into_reader()).lines() {
        let line = line.map_err(|e| format!("{url}: reading the stream: {e}"))?;
        let Some(data) = line.strip_prefix("data: ") else { continue };
        if data == "[DONE]" {
            break;
        }
        let chunk: Value = serde_json::from_str(data).map_err(|e| format!("{url}: a chunk that is not JSON ({e})"))?;
        if let Some(usage) = chunk.pointer("/usage/completion_tokens").and_then(Value::as_u64) {
            tokens = usage;
        }
        let n = chunk.pointer("/choices/0/token_ids").and_then(Value::as_array).map_or(0, Vec::len);
        if n > 0 {
            let now = Instant::now();
            match ttft {
                None => ttft = Some(now.duration_since(sent).as_secs_f64()),
                Some(_) => gaps.extend(std::iter::repeat_n(now.duration_since(last).as_secs_f64() / n as f64, n)),
            }
            last = now;
        }
    }
    Ok(Timed { ttft: ttft.ok_or_else(|| format!("{url}: no token came back"))?, gaps, latency: sent.elapsed().as_secs_f64(), tokens })
}

/// The concurrency at which plain decoding overtakes speculation in
/// throughput: the first level where plain tokens/s reach speculative's
/// (`None` when speculation wins at every level run).
pub fn crossover(results: &[LoadResult]) -> Option<usize> {
    let mut levels: Vec<usize> = results.iter().map(|r| r.concurrency).collect();
    levels.sort_unstable();
    levels.dedup();
    levels.into_iter().find(|&c| {
        let at = |on: bool| results.iter().find(|r| r.concurrency == c && r.speculation == Some(on)).map(|r| r.tokens_per_s);
        matches!((at(true), at(false)), (Some(s), Some(p)) if p >= s)
    })
}

/// A Markdown table of load runs, with the crossover stated.
pub fn markdown(results: &[LoadResult]) -> String {
    let mut md =
        String::from("| concurrency | speculation | requests (failed) | tokens/s | TTFT p50 / p90 (ms) | inter-token p50 / p90 (ms) | latency p50 / p90 (s) |\n|---|---|---|---|---|---|---|\n");
    for r in results {
        let spec = match r.speculation {
            Some(true) => "on",
            Some(false) => "off",
            None => "server's",
        };
        md.push_str(&format!(
            "| {} | {spec} | {} ({}) | {:.1} | {:.0} / {:.0} | {:.1} / {:.1} | {:.2} / {:.2} |\n",
            r.concurrency,
            r.requests,
            r.failed,
            r.tokens_per_s,
            r.ttft_p50_s * 1e3,
            r.ttft_p90_s * 1e3,
            r.itl_p50_s * 1e3,
            r.itl_p90_s * 1e3,
            r.latency_p50_s,
            r.latency_p90_s
        ));
    }
    md.push_str(&match crossover(results) {
        Some(c) => format!("\nCrossover: from concurrency {c} on, plain decoding's throughput reaches speculative decoding's.\n"),
        None => "\nNo crossover in this range: speculative decoding's throughput stays above plain decoding's at every concurrency run.\n".into(),
    });
    md
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r(c: usize, on: bool, tps: f64) -> LoadResult {
        LoadResult {
            concurrency: c,
            speculation: Some(on),
            requests: c,
            failed: 0,
            tokens: 0,
            wall_s: 1.0,
            tokens_per_s: tps,
            ttft_p50_s: 0.0,
            ttft_p90_s: 0.0,
            itl_p50_s: 0.0,
            itl_p90_s: 0.0,
            latency_p50_s: 0.0,
            latency_p90_s: 0.0,
        }
    }

    #[test]
    fn the_crossover_is_the_first_level_plain_catches_up() {
        let runs = [r(1, true, 30.0), r(1, false, 20.0), r(4, true, 50.0), r(4, false, 55.0), r(8, true, 60.0), r(8, false, 70.0)];
        assert_eq!(crossover(&runs), Some(4));
        assert_eq!(crossover(&runs[..2]), None);
        assert!(markdown(&runs).contains("from concurrency 4 on"));
        let mut v = vec![3.0, 1.0, 2.0];
        assert_eq!(percentile(&mut v, 0.5), 2.0);
        assert!(percentile(&mut [], 0.5).is_nan());
    }
}
