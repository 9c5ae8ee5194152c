//! Prompt lookup at a long context: building the decoder's incremental index
//! (NGRAM-6) over an existing context and the linear search that rescans the
//! context (NGRAM-2/3, what a stateless call costs) under criterion, and
//! appending one token and proposing (what a decode step costs the
//! proposer), amortised over a million steps. The context is seeded text-like data: Zipf-distributed ids
//! with a third of its 64-token blocks copied from earlier ones, so lookups
//! hit as they do on code and quoted text.

use criterion::Criterion;
use rand::{RngExt, SeedableRng};
use rand_pcg::Pcg64;
use serde::Serialize;
use specdec_backend::NgramConfig;
use specdec_reference::ngram::{self, NgramIndex};

/// One million tokens of context.
pub const CONTEXT: usize = 1 << 20;
const VOCAB: usize = 49_152;
/// Tokens appended after the context in the amortised step timing.
const TAIL: usize = 1 << 20;

#[derive(Debug, Clone, Serialize)]
pub struct NgramTime {
    pub context: usize,
    pub config: String,
    /// Building the index over the whole context.
    pub build_s: f64,
    /// Appending one token to the index built over `context` tokens and
    /// proposing, amortised over `TAIL` steps (see [`amortised_step_s`]).
    pub append_propose_s: f64,
    /// One linear search of the whole context.
    pub rescan_s: f64,
}

/// Seeded text-like ids (see the module docs).
pub fn context(len: usize, seed: u64) -> Vec<i64> {
    let mut rng = Pcg64::seed_from_u64(seed);
    // Zipf(1.1) by inverse CDF over a precomputed table.
    let weights: Vec<f64> = (1..=VOCAB).map(|r| (r as f64).powf(-1.1)).collect();
    let total: f64 = weights.iter().sum();
    let cdf: Vec<f64> = weights
        .iter()
        .scan(0.0, |c, w| {
            *c += w / total;
            Some(*c)
        })
        .collect();
    let mut out: Vec<i64> = Vec::with_capacity(len);
    while out.len() < len {
        let block = 64.min(len - out.len());
        if out.len() >= 64 && rng.random::<f64>() < 1.0 / 3.0 {
            let from = rng.random_range(0..=out.len() - 64);
            out.extend_from_within(from..from + block);
        } else {
            for _ in 0..block {
                let u: f64 = rng.random();
                out.push(cdf.partition_point(|&c| c < u).min(VOCAB - 1) as i64);
            }
        }
    }
    out
}

/// Appending each token of `tail` to a copy of `built` and proposing after
/// each, timed as one run and divided by the steps: amortised, so the tables'
/// growth (one doubling on the way from 1 M to 2 M tokens) is counted once,
/// as a long decode pays it. Criterion's samples would restart from the same
/// size each time and put a whole doubling into a few short samples. The
/// median of three runs.
fn amortised_step_s(built: &NgramIndex, tail: &[i64]) -> f64 {
    let mut runs: Vec<f64> = (0..3)
        .map(|_| {
            let mut index = built.clone();
            let start = std::time::Instant::now();
            for t in tail {
                index.extend(std::slice::from_ref(t)).expect("valid id");
                std::hint::black_box(index.propose().expect("valid context"));
            }
            start.elapsed().as_secs_f64() / tail.len() as f64
        })
        .collect();
    runs.sort_by(f64::total_cmp);
    runs[1]
}

pub fn bench(c: &mut Criterion, criterion_dir: &std::path::Path) -> Option<NgramTime> {
    let cfg = NgramConfig::default();
    // The context, then a continuation of the same kind long enough that no
    // sample's appends wrap around (a wrapped tail would hit at the largest n).
    let mut ctx = context(CONTEXT + TAIL, 20_261_122);
    let tail = ctx.split_off(CONTEXT);
    c.benchmark_group("ngram/build").bench_function("index", |b| {
        b.iter_with_large_drop(|| {
            let mut index = NgramIndex::new(cfg, VOCAB).expect("valid config");
            index.extend(&ctx).expect("valid ids");
            index
        })
    });
    let mut built = NgramIndex::new(cfg, VOCAB).expect("valid config");
    built.extend(&ctx).expect("valid ids");
    c.benchmark_group("ngram/rescan").bench_function("linear", |b| b.iter(|| ngram::propose(&ctx, VOCAB, &cfg).expect("valid context")));
    let mean = |g: &str, f: &str| crate::mean_ns(criterion_dir, g, f).map(|t| t / 1e9);
    Some(NgramTime {
        context: CONTEXT,
        config: format!("n in {}..={}, k = {}", cfg.ngram_min, cfg.ngram_max, cfg.k),
        build_s: mean("ngram/build", "index")?,
        append_propose_s: amortised_step_s(&built, &tail),
        rescan_s: mean("ngram/rescan", "linear")?,
    })
}
