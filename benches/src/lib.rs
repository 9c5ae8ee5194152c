//! The speedup report behind `cargo xtask bench`: kernels and forward passes
//! timed under criterion next to the machine's measured memory limits, and
//! end-to-end speculative decoding on SmolLM2 next to plain decoding and the
//! theory's prediction, the same on a mix of prompt categories beside the
//! peers (HF transformers, llama.cpp), written as Markdown, JSON and SVG
//! plots under `reports/bench/`.
//!
//! Invariants: every speed is a ratio measured in one run (to the machine's
//! copy bandwidth, to the reference, to plain decoding, to a peer timed in
//! the same run), never an absolute time asserted in a test; every backend
//! times the same inputs, generated once from fixed seeds; an end-to-end row
//! exists only for a run whose greedy tokens equal plain decoding's.
//!
//! Sections (one bench target, `benches/report.rs`): the machine's copy and
//! read bandwidth ([`machine`]); the verify kernels as the decoder calls
//! them, each next to its memory-bound limit ([`kernels`]); the n-gram index
//! against a rescan at 1 M tokens ([`ngram`]); SmolLM2 forwards next to the
//! weight-bandwidth roofline ([`forward`]); speculative against plain
//! decoding per backend, proposer, prompt and k, with the THEORY-2/3/4
//! predictions from the measured acceptance and cost ratio ([`e2e`]); the
//! prompt mix ([`mix`], `fixtures/prompts/mix.json`: seven categories under
//! the pay-off controller, batches of 1, 4 and 16, each in three rounds of
//! plain-then-speculative runs with the median ratio within a round, since a
//! small machine's memory speed drifts, and HF transformers, llama.cpp's
//! binding and its server plain and with their n-gram drafters on the same
//! token ids, `adapters/peers/bench_generate.py`); `specdec serve` under load
//! ([`serve_load`]); the cost of logprobs and of a JSON schema's mask per
//! decode step, and n-gram drafts under the schema, on a tool-call mix
//! ([`features`]); HF transformers' verify timed in the same run when the
//! peers are installed ([`peer`], `adapters/peers/bench_hf.py`); Markdown,
//! JSON and SVG ([`report`], [`plot`]). Criterion times kernels and forwards;
//! end-to-end runs are timed by the decoder's own clock (a multi-second run
//! per configuration, where criterion's ten samples would not fit).

pub mod e2e;
pub mod features;
pub mod forward;
pub mod kernels;
pub mod machine;
pub mod mix;
pub mod ngram;
pub mod peer;
pub mod plot;
pub mod report;
pub mod serve_load;

use specdec_registry::{Entry, Job, Role};

/// Runs `job` on every backend of the registry that this build and machine
/// have, in registry order (the scalar reference only when
/// `with_reference`: it is the kernels' yardstick, far too slow for a model;
/// the reduced-precision model variants, whose kernels are their base
/// backend's, only when `with_variants`); returns the names that ran.
/// `SPECDEC_BENCH_BACKENDS` (comma-separated names) keeps only those
/// backends, e.g. the GPU ones on a machine whose host backends were timed
/// elsewhere. A backend unavailable here is left out of the report.
pub fn each_backend<J: Job<Out = ()>>(job: &mut J, with_reference: bool, with_variants: bool) -> Vec<String> {
    let only = std::env::var("SPECDEC_BENCH_BACKENDS").ok();
    let wanted = |e: &Entry| {
        let role = match e.role {
            Role::Reference => with_reference,
            Role::Variant => with_variants,
            Role::Host | Role::Accelerator => true,
        };
        role && only.as_deref().is_none_or(|list| list.split(',').any(|n| n.trim() == e.name))
    };
    specdec_registry::each(job, wanted).into_iter().filter(|(_, ran)| ran.is_ok()).map(|(name, _)| name.to_string()).collect()
}

/// When this process started benching: estimates older than this are a
/// previous run's (criterion leaves them on disk when a filter skips a bench).
pub fn run_started() -> std::time::SystemTime {
    static START: std::sync::LazyLock<std::time::SystemTime> = std::sync::LazyLock::new(std::time::SystemTime::now);
    *START
}

/// Reads criterion's mean estimate (ns) of `group/function` from `target/criterion`
/// (criterion names the group's folder with each `/` made `_`), only when this
/// run wrote it: a stale estimate is never reported as measured now.
pub fn mean_ns(criterion_dir: &std::path::Path, group: &str, function: &str) -> Option<f64> {
    let path = criterion_dir.join(group.replace('/', "_")).join(function).join("new/estimates.json");
    if std::fs::metadata(&path).and_then(|m| m.modified()).ok()? < run_started() {
        return None;
    }
    let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(path).ok()?).ok()?;
    v.get("mean")?.get("point_estimate")?.as_f64()
}

/// Whether a backend's device is this machine's memory (the host bandwidth
/// is its limit); an accelerator's limit is its own, not measured here.
pub fn on_host(device: &str) -> bool {
    device == "cpu" || device == "host"
}
