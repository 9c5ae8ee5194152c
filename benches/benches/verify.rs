//! Verification throughput of every backend in this build on the same
//! batch (32 sequences x 4 drafts x 32k vocabulary), with inputs already on
//! the device and the accepted tokens and counts downloaded, as in a decode
//! loop. Prints and writes `reports/bench/verify.md`: each backend's mean
//! time and its ratio to the reference, measured in this run.

use std::fmt::Write as _;

use criterion::Criterion;
use specdec_backend::{Backend, Comparator, DrawNoiseArg, ReferenceBackend, RejectionArgs, RejectionNoise};
use specdec_benches::{Batch, batch, mean_ns};

const SHAPE: (usize, usize, usize) = (32, 4, 32_000);

fn bench_backend<B: Backend>(c: &mut Criterion, name: &str, b: &B, data: &Batch) {
    let up_f = |t| b.upload_f64(t).expect("upload");
    let up_i = |t| b.upload_i64(t).expect("upload");
    let (p, l, q) = (up_f(&data.target_probs), up_f(&data.target_logits), up_f(&data.draft_probs));
    let (d, n) = (up_i(&data.draft_tokens), up_i(&data.proposal_lens));
    let (u, v) = (up_f(&data.accept_uniforms), up_f(&data.draw_uniforms));
    c.benchmark_group("rejection_verify").sample_size(20).bench_function(name, |bench| {
        bench.iter(|| {
            let args = RejectionArgs { target_probs: &p, draft_probs: Some(&q), draft_tokens: &d, proposal_lens: &n };
            let out = b.rejection_verify(args, RejectionNoise { accept_uniforms: &u, draw: DrawNoiseArg::InverseCdf(&v) }, Comparator::Strict).expect("valid batch");
            (b.download_i64(&out.tokens).expect("download"), b.download_i64(&out.num_accepted).expect("download"))
        })
    });
    c.benchmark_group("greedy_verify").sample_size(20).bench_function(name, |bench| {
        bench.iter(|| {
            let out = b.greedy_verify(&l, &d, &n).expect("valid batch");
            (b.download_i64(&out.tokens).expect("download"), b.download_i64(&out.num_accepted).expect("download"))
        })
    });
}

fn main() {
    let mut c = Criterion::default().configure_from_args();
    let data = batch(SHAPE.0, SHAPE.1, SHAPE.2, 7);
    let mut names = vec!["reference", "ndarray", "candle-cpu"];
    bench_backend(&mut c, "reference", &ReferenceBackend, &data);
    bench_backend(&mut c, "ndarray", &specdec_ndarray::NdarrayBackend::new(), &data);
    bench_backend(&mut c, "candle-cpu", &specdec_candle::CandleBackend::cpu(), &data);
    if let Ok(b) = specdec_tch::TchBackend::try_cpu() {
        bench_backend(&mut c, "tch-cpu", &b, &data);
        names.push("tch-cpu");
    }
    if let Ok(b) = specdec_candle::CandleBackend::cuda(0) {
        bench_backend(&mut c, "candle-cuda", &b, &data);
        names.push("candle-cuda");
    }
    c.final_summary();

    // Ratios from this run's estimates.
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let dir = std::env::var("CARGO_TARGET_DIR").map_or_else(|_| root.join("target"), std::path::PathBuf::from).join("criterion");
    let mut md = format!("# Verification time (B = {}, k = {}, V = {}), one run\n\n| op | backend | mean | time relative to the reference |\n|---|---|---|---|\n", SHAPE.0, SHAPE.1, SHAPE.2);
    for group in ["rejection_verify", "greedy_verify"] {
        let base = mean_ns(&dir, group, "reference");
        for name in &names {
            if let Some(t) = mean_ns(&dir, group, name) {
                let ratio = base.map_or("-".into(), |b| format!("{:.2}", t / b));
                let _ = writeln!(md, "| {group} | {name} | {:.3} ms | {ratio} |", t / 1e6);
            }
        }
    }
    print!("\n{md}");
    let out = root.join("reports/bench");
    if std::fs::create_dir_all(&out).is_ok() {
        let _ = std::fs::write(out.join("verify.md"), md);
    }
}
