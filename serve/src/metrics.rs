//! The server's Prometheus metrics, in the text exposition format (0.0.4):
//! requests by endpoint and status, prompt and generated tokens, running
//! and waiting requests, drafts proposed and accepted per position, tokens
//! per step, time to first token and inter-token latency.
//!
//! The engine thread writes the decode metrics and the handlers the
//! request counts; one mutex guards them all (a scrape or a step takes it
//! for microseconds, never across an await).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::Mutex;

use specdec_decoder::Acceptance;

/// A histogram with fixed upper bounds (seconds or counts).
#[derive(Debug, Clone)]
struct Histogram {
    bounds: &'static [f64],
    counts: Vec<u64>,
    sum: f64,
    count: u64,
}

impl Histogram {
    fn new(bounds: &'static [f64]) -> Self {
        Histogram { bounds, counts: vec![0; bounds.len()], sum: 0.0, count: 0 }
    }

    fn observe(&mut self, v: f64) {
        for (b, c) in self.bounds.iter().zip(&mut self.counts) {
            if v <= *b {
                *c += 1;
            }
        }
        self.sum += v;
        self.count += 1;
    }

    fn render(&self, out: &mut String, name: &str, help: &str) {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
        for (b, c) in self.bounds.iter().zip(&self.counts) {
            let _ = writeln!(out, "{name}_bucket{{le=\"{b}\"}} {c}");
        }
        let _ = writeln!(out, "{name}_bucket{{le=\"+Inf\"}} {}\n{name}_sum {}\n{name}_count {}", self.count, self.sum, self.count);
    }
}

const LATENCY: &[f64] = &[0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0];
const PER_STEP: &[f64] = &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 8.0, 12.0, 16.0, 32.0, 65.0];

#[derive(Debug)]
struct Inner {
    requests: BTreeMap<(String, u16), u64>,
    prompt_tokens: u64,
    generation_tokens: u64,
    running: u64,
    waiting: u64,
    cancelled: u64,
    batch_steps: u64,
    request_steps: u64,
    proposed_at: Vec<u64>,
    accepted_at: Vec<u64>,
    tokens_per_step: Histogram,
    ttft: Histogram,
    itl: Histogram,
}

/// Every metric the server exports.
#[derive(Debug)]
pub struct Metrics(Mutex<Inner>);

impl Default for Metrics {
    fn default() -> Self {
        Metrics(Mutex::new(Inner {
            requests: BTreeMap::new(),
            prompt_tokens: 0,
            generation_tokens: 0,
            running: 0,
            waiting: 0,
            cancelled: 0,
            batch_steps: 0,
            request_steps: 0,
            proposed_at: Vec::new(),
            accepted_at: Vec::new(),
            tokens_per_step: Histogram::new(PER_STEP),
            ttft: Histogram::new(LATENCY),
            itl: Histogram::new(LATENCY),
        }))
    }
}

impl Metrics {
    fn with<R>(&self, f: impl FnOnce(&mut Inner) -> R) -> R {
        // A panic elsewhere while holding the lock leaves counters, never an invariant.
        f(&mut self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner))
    }

    /// One answered request.
    pub fn request(&self, endpoint: &str, status: u16) {
        self.with(|m| *m.requests.entry((endpoint.to_string(), status)).or_default() += 1);
    }

    pub fn queue(&self, running: usize, waiting: usize) {
        self.with(|m| (m.running, m.waiting) = (running as u64, waiting as u64));
    }

    pub fn prompt(&self, tokens: usize) {
        self.with(|m| m.prompt_tokens += tokens as u64);
    }

    pub fn batch_step(&self) {
        self.with(|m| m.batch_steps += 1);
    }

    pub fn first_token(&self, seconds: f64) {
        self.with(|m| m.ttft.observe(seconds));
    }

    /// `tokens` emitted at once after `seconds`: each counts one gap of `seconds / tokens`.
    pub fn tokens(&self, tokens: usize, seconds: Option<f64>) {
        self.with(|m| {
            m.generation_tokens += tokens as u64;
            if let Some(s) = seconds {
                for _ in 0..tokens {
                    m.itl.observe(s / tokens as f64);
                }
            }
        });
    }

    pub fn cancelled(&self) {
        self.with(|m| m.cancelled += 1);
    }

    /// A finished request's draft counts.
    pub fn finished(&self, a: &Acceptance, emitted: usize) {
        self.with(|m| {
            m.request_steps += a.steps;
            if a.steps > 0 {
                m.tokens_per_step.observe(emitted as f64 / a.steps as f64);
            }
            for (dst, src) in [(&mut m.proposed_at, &a.proposed_at), (&mut m.accepted_at, &a.accepted_at)] {
                if dst.len() < src.len() {
                    dst.resize(src.len(), 0);
                }
                dst.iter_mut().zip(src).for_each(|(d, s)| *d += s);
            }
        });
    }

    /// Requests running now (a test asserts it drains to 0).
    pub fn running(&self) -> u64 {
        self.with(|m| m.running)
    }

    /// The text exposition.
    pub fn render(&self) -> String {
        self.with(|m| {
            let mut o = String::new();
            let _ = writeln!(o, "# HELP specdec_requests_total Requests answered, by endpoint and HTTP status.\n# TYPE specdec_requests_total counter");
            for ((e, s), n) in &m.requests {
                let _ = writeln!(o, "specdec_requests_total{{endpoint=\"{e}\",status=\"{s}\"}} {n}");
            }
            let counters = [
                ("specdec_prompt_tokens_total", "Prompt tokens admitted.", m.prompt_tokens),
                ("specdec_generation_tokens_total", "Tokens generated.", m.generation_tokens),
                ("specdec_requests_cancelled_total", "Requests cancelled (client gone or shutdown) before they finished.", m.cancelled),
                ("specdec_batch_steps_total", "Decoder steps over the running batch.", m.batch_steps),
                ("specdec_request_steps_total", "Verify steps of finished requests (each emits its accepted drafts and one token).", m.request_steps),
            ];
            for (name, help, v) in counters {
                let _ = writeln!(o, "# HELP {name} {help}\n# TYPE {name} counter\n{name} {v}");
            }
            for (name, help, v) in [("specdec_requests_running", "Requests in the running batch.", m.running), ("specdec_requests_waiting", "Requests waiting for a slot.", m.waiting)] {
                let _ = writeln!(o, "# HELP {name} {help}\n# TYPE {name} gauge\n{name} {v}");
            }
            for (name, help, v) in [
                ("specdec_draft_proposed_total", "Steps of finished requests that proposed a draft at this position (0-based).", &m.proposed_at),
                ("specdec_draft_accepted_total", "Steps of finished requests whose draft at this position was accepted.", &m.accepted_at),
            ] {
                let _ = writeln!(o, "# HELP {name} {help}\n# TYPE {name} counter");
                for (j, n) in v.iter().enumerate() {
                    let _ = writeln!(o, "{name}{{position=\"{j}\"}} {n}");
                }
            }
            m.tokens_per_step.render(&mut o, "specdec_tokens_per_step", "Tokens per verify step of each finished request.");
            m.ttft.render(&mut o, "specdec_time_to_first_token_seconds", "From a request's arrival to its first token.");
            m.itl.render(&mut o, "specdec_inter_token_latency_seconds", "Between a request's tokens (a step's tokens share its gap).");
            o
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_every_family_once() {
        let m = Metrics::default();
        m.request("completions", 200);
        m.prompt(5);
        m.first_token(0.003);
        m.tokens(3, Some(0.03));
        m.finished(&Acceptance { steps: 2, proposed: 4, accepted: 1, proposed_at: vec![2, 2], accepted_at: vec![1, 0], ..Acceptance::default() }, 3);
        let text = m.render();
        assert!(text.contains("specdec_requests_total{endpoint=\"completions\",status=\"200\"} 1"), "{text}");
        assert!(text.contains("specdec_draft_accepted_total{position=\"0\"} 1"));
        assert!(text.contains("specdec_inter_token_latency_seconds_count 3"));
        assert!(text.contains("specdec_tokens_per_step_bucket{le=\"2\"} 1"));
        assert_eq!(text.matches("# TYPE specdec_time_to_first_token_seconds histogram").count(), 1);
    }
}
