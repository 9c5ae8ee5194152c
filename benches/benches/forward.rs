//! SmolLM2-135M forward speed of every backend in this build, one run:
//! a one-token decode step at a 32-token context, a 9-token verify window
//! (k = 8) at the same context, and a 64-token prefill. Prints and writes
//! `reports/bench/forward.md` with tokens per second and each backend's
//! ratio to the fastest, measured in this run. Needs `SPECDEC_SMOLLM2_GGUF`
//! (`eval "$(cargo xtask model)"` prints it).

use std::fmt::Write as _;

use criterion::Criterion;
use specdec_backend::ReferenceBackend;
use specdec_backend::model::{ForwardRequest, ModelBackend};
use specdec_benches::mean_ns;
use specdec_models::LlamaWeights;

const CONTEXT: usize = 32;
const WINDOW: usize = 9;
const PREFILL: usize = 64;

fn tokens(n: usize, salt: u32) -> Vec<u32> {
    (0..n as u32).map(|i| (i * 7919 + salt * 104_729) % 49_000 + 100).collect()
}

fn bench_backend<B: ModelBackend>(c: &mut Criterion, name: &str, b: &B, w: &LlamaWeights, samples: usize) {
    let model = b.load_model(w).expect("load");
    let mut cache = b.new_model_cache(&model, 1, CONTEXT + PREFILL + WINDOW).expect("cache");
    b.forward(&model, &mut cache, &ForwardRequest::last_logits(&[tokens(CONTEXT, 1)])).expect("prefill");
    let one = [tokens(1, 2)];
    let window = [tokens(WINDOW, 3)];
    let download = |out: specdec_backend::ForwardOutput<B::Tensor>| b.download_f64(out.logits.as_ref().expect("logits")).expect("download");
    c.benchmark_group("decode").sample_size(samples).bench_function(name, |bench| {
        bench.iter(|| {
            let out = download(b.forward(&model, &mut cache, &ForwardRequest::last_logits(&one)).expect("decode"));
            b.cache_trim(&mut cache, &[1]).expect("trim");
            out
        })
    });
    c.benchmark_group("verify9").sample_size(samples).bench_function(name, |bench| {
        bench.iter(|| {
            let out = download(b.forward(&model, &mut cache, &ForwardRequest::all_logits(&window)).expect("window"));
            b.cache_trim(&mut cache, &[WINDOW]).expect("trim");
            out
        })
    });
    let prompt = [tokens(PREFILL, 4)];
    c.benchmark_group("prefill64").sample_size(samples).bench_function(name, |bench| {
        bench.iter(|| {
            let mut fresh = b.new_model_cache(&model, 1, PREFILL).expect("cache");
            download(b.forward(&model, &mut fresh, &ForwardRequest::last_logits(&prompt)).expect("prefill"))
        })
    });
}

fn main() {
    let Some(path) = std::env::var_os("SPECDEC_SMOLLM2_GGUF") else {
        eprintln!("SPECDEC_SMOLLM2_GGUF is not set: run `eval \"$(cargo xtask model)\"` first");
        return;
    };
    let weights = specdec_models::load(&path).expect("SmolLM2 loads").weights;
    let mut c = Criterion::default().configure_from_args();
    let mut names = vec!["reference", "ndarray", "candle-cpu"];
    bench_backend(&mut c, "reference", &ReferenceBackend, &weights, 10);
    bench_backend(&mut c, "ndarray", &specdec_ndarray::NdarrayBackend::new(), &weights, 10);
    bench_backend(&mut c, "candle-cpu", &specdec_candle::CandleBackend::cpu(), &weights, 10);
    if let Ok(b) = specdec_tch::TchBackend::try_cpu() {
        bench_backend(&mut c, "tch-cpu", &b, &weights, 10);
        names.push("tch-cpu");
    }
    if let Ok(b) = specdec_candle::CandleBackend::cuda(0) {
        bench_backend(&mut c, "candle-cuda", &b, &weights, 10);
        names.push("candle-cuda");
    }
    c.final_summary();

    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let dir = std::env::var("CARGO_TARGET_DIR").map_or_else(|_| root.join("target"), std::path::PathBuf::from).join("criterion");
    let mut md = format!(
        "# SmolLM2-135M forward, f32, one run ({} cores)\n\nContext {CONTEXT} tokens; `verify9` is a 9-token window (k = 8); `prefill64` a 64-token prompt into an empty cache.\n\n| step | backend | mean | tokens/s | time relative to the fastest |\n|---|---|---|---|---|\n",
        std::thread::available_parallelism().map_or(1, |p| p.get())
    );
    for (group, per_call) in [("decode", 1usize), ("verify9", WINDOW), ("prefill64", PREFILL)] {
        let times: Vec<(&str, f64)> = names.iter().filter_map(|n| mean_ns(&dir, group, n).map(|t| (*n, t))).collect();
        let fastest = times.iter().map(|(_, t)| *t).fold(f64::INFINITY, f64::min);
        for (name, t) in &times {
            let _ = writeln!(md, "| {group} | {name} | {:.1} ms | {:.1} | {:.2} |", t / 1e6, per_call as f64 / (t / 1e9), t / fastest);
        }
    }
    for name in &names {
        if let (Some(d), Some(v)) = (mean_ns(&dir, "decode", name), mean_ns(&dir, "verify9", name)) {
            let _ = writeln!(md, "\n{name}: a 9-token verify window costs {:.2}x a one-token decode.", v / d);
        }
    }
    print!("\n{md}");
    let out = root.join("reports/bench");
    if std::fs::create_dir_all(&out).is_ok() {
        let _ = std::fs::write(out.join("forward.md"), md);
    }
}
