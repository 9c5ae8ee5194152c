//! Shared inputs for the criterion benches: one realistic verify batch,
//! generated once from a fixed seed, so every backend times the same work.
//! Speed claims are ratios between backends measured in the same run
//! (`ratios`), never absolute times asserted in tests.

use rand::{RngExt, SeedableRng};
use rand_pcg::Pcg64;
use specdec_backend::HostTensor;

/// A verify batch: target/draft rows, drafts, lengths and explicit noise.
pub struct Batch {
    pub target_probs: HostTensor<f64>,
    pub target_logits: HostTensor<f64>,
    pub draft_probs: HostTensor<f64>,
    pub draft_tokens: HostTensor<i64>,
    pub proposal_lens: HostTensor<i64>,
    pub accept_uniforms: HostTensor<f64>,
    pub draw_uniforms: HostTensor<f64>,
}

fn softmax(logits: &[f64]) -> Vec<f64> {
    let m = logits.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let e: Vec<f64> = logits.iter().map(|x| (x - m).exp()).collect();
    let s: f64 = e.iter().sum();
    e.into_iter().map(|x| x / s).collect()
}

/// `batch` sequences, `k` drafts each, vocabulary `vocab`; drafts are drawn from `q`.
pub fn batch(batch: usize, k: usize, vocab: usize, seed: u64) -> Batch {
    let mut rng = Pcg64::seed_from_u64(seed);
    let row = |rng: &mut Pcg64| -> (Vec<f64>, Vec<f64>) {
        let logits: Vec<f64> = (0..vocab).map(|_| 4.0 * rng.random::<f64>()).collect();
        let p = softmax(&logits);
        (logits, p)
    };
    let (mut tl, mut tp, mut dp, mut dt) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for _ in 0..batch {
        for j in 0..=k {
            let (l, p) = row(&mut rng);
            tl.extend(l);
            tp.extend(p);
            if j < k {
                let (_, q) = row(&mut rng);
                let u: f64 = rng.random();
                let mut c = 0.0;
                let x = q.iter().position(|&w| {
                    c += w;
                    u < c
                });
                dt.push(x.unwrap_or(vocab - 1) as i64);
                dp.extend(q);
            }
        }
    }
    let t = |shape: Vec<usize>, d: Vec<f64>| HostTensor::new(shape, d).expect("bench shapes");
    Batch {
        target_probs: t(vec![batch, k + 1, vocab], tp),
        target_logits: t(vec![batch, k + 1, vocab], tl),
        draft_probs: t(vec![batch, k, vocab], dp),
        draft_tokens: HostTensor::new(vec![batch, k], dt).expect("bench shapes"),
        proposal_lens: HostTensor::from_vec(vec![k as i64; batch]),
        accept_uniforms: t(vec![batch, k], (0..batch * k).map(|_| rng.random()).collect()),
        draw_uniforms: t(vec![batch, k + 1], (0..batch * (k + 1)).map(|_| rng.random()).collect()),
    }
}

/// Reads criterion's mean estimate (ns) of `group/function` from `target/criterion`.
pub fn mean_ns(criterion_dir: &std::path::Path, group: &str, function: &str) -> Option<f64> {
    let path = criterion_dir.join(group).join(function).join("new/estimates.json");
    let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(path).ok()?).ok()?;
    v.get("mean")?.get("point_estimate")?.as_f64()
}
