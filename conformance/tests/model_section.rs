//! The model section catches broken forward passes (MODEL-11, MODEL-13,
//! MODEL-14): negative controls that each change one thing about the
//! reference forward must fail the checks aimed at them, and an untouched
//! wrapper must pass, so the section can both pass and fail.

use specdec_backend::model::{ForwardOutput, ForwardRequest, LlamaWeights, LogitRows, ModelBackend, ModelPrecision, RefCache, RefModel};
use specdec_backend::{Backend, Precision, RefTensor, ReferenceBackend, Result};
use specdec_conformance::model_section::{self, ModelFiles};
use specdec_conformance::suite::{Status, SuiteConfig};
use specdec_reference::Tensor;
use specdec_reference::kvcache::BatchKvCache;

#[derive(Clone, Copy, PartialEq, Debug)]
enum Defect {
    None,
    /// Trims one position more than asked (where there is one).
    TrimOneTooMany,
    /// A multi-token window returns each row's successor's logits.
    ShiftedWindow,
    /// Adds 1e-9 of the row scale to one logit: beyond a zero tolerance.
    Perturbed,
    /// States a logit tolerance of 1e-6 and a window epsilon of 0 (batch
    /// invariance), and rounds multi-token windows 1e-9 of the row scale
    /// away from decodes: within the tolerance against the reference, but
    /// not the bit-for-bit equality a window epsilon of 0 claims.
    WindowRoundsApart,
    /// MODEL-17: a port that runs Llama's attention on every checkpoint:
    /// Qwen2's biases read as zero, Qwen3's head norms as ones.
    DropsAttnExtras,
}

struct Mutant(Defect);

impl Backend for Mutant {
    type Tensor = RefTensor;
    type KvCache = BatchKvCache;
    specdec_backend::reference_transfers!();
    fn name(&self) -> String {
        format!("mutant-{:?}", self.0)
    }
    fn device(&self) -> String {
        "host".into()
    }
    fn precision(&self) -> Precision {
        ReferenceBackend.precision()
    }
}

impl ModelBackend for Mutant {
    type Model = RefModel;
    type ModelCache = RefCache;
    fn model_precision(&self) -> ModelPrecision {
        match self.0 {
            Defect::WindowRoundsApart => ModelPrecision { logit_rel_tolerance: 1e-6, ..ReferenceBackend.model_precision() },
            _ => ReferenceBackend.model_precision(),
        }
    }
    fn load_model(&self, w: &LlamaWeights) -> Result<RefModel> {
        if self.0 != Defect::DropsAttnExtras {
            return ReferenceBackend.load_model(w);
        }
        let mut plain = w.clone();
        for extras in plain.layers.iter_mut().map(|l| &mut l.attn) {
            for bias in [&mut extras.q_bias, &mut extras.k_bias, &mut extras.v_bias].into_iter().flatten() {
                bias.data.fill(0.0);
            }
            for norm in [&mut extras.q_norm, &mut extras.k_norm].into_iter().flatten() {
                norm.data.fill(1.0);
            }
        }
        ReferenceBackend.load_model(&plain)
    }
    fn new_model_cache(&self, m: &RefModel, batch: usize, capacity: usize) -> Result<RefCache> {
        ReferenceBackend.new_model_cache(m, batch, capacity)
    }
    fn forward(&self, m: &RefModel, cache: &mut RefCache, req: &ForwardRequest<'_>) -> Result<ForwardOutput<RefTensor>> {
        let mut out = ReferenceBackend.forward(m, cache, req)?;
        let vocab = m.config().vocab_size;
        if let Some(RefTensor::F64(t)) = &out.logits {
            let mut data = t.data().to_vec();
            match self.0 {
                Defect::ShiftedWindow if req.logits == LogitRows::All => {
                    for r in &out.plan.rows {
                        for i in 0..r.count.saturating_sub(1) {
                            let (a, b) = ((r.logit_row + i) * vocab, (r.logit_row + i + 1) * vocab);
                            let next = data[b..b + vocab].to_vec();
                            data[a..a + vocab].copy_from_slice(&next);
                        }
                    }
                }
                Defect::Perturbed => {
                    let scale = data[..vocab].iter().fold(0.0f64, |a, v| a.max(v.abs()));
                    data[0] += 1e-9 * scale;
                }
                Defect::WindowRoundsApart if out.plan.rows.iter().any(|r| r.count > 1) => {
                    let scale = data[..vocab].iter().fold(0.0f64, |a, v| a.max(v.abs()));
                    data[0] += 1e-9 * scale;
                }
                _ => {}
            }
            out.logits = Some(RefTensor::F64(Tensor::new(t.shape().to_vec(), data).unwrap()));
        }
        Ok(out)
    }
    fn cache_lens(&self, cache: &RefCache) -> Vec<usize> {
        ReferenceBackend.cache_lens(cache)
    }
    fn cache_trim(&self, cache: &mut RefCache, amounts: &[usize]) -> Result<()> {
        let amounts: Vec<usize> = match self.0 {
            Defect::TrimOneTooMany => amounts.iter().zip(cache.lens()).map(|(a, l)| if *a > 0 && a < l { a + 1 } else { *a }).collect(),
            _ => amounts.to_vec(),
        };
        ReferenceBackend.cache_trim(cache, &amounts)
    }
    fn cache_contents(&self, cache: &RefCache, layer: usize, seq: usize) -> Result<(Vec<f64>, Vec<f64>)> {
        ReferenceBackend.cache_contents(cache, layer, seq)
    }
}

/// Runs the tiny-model checks named `check` on a mutant; returns their statuses.
fn statuses(defect: Defect, check: &str) -> Vec<Status> {
    let cfg = SuiteConfig { filter: Some(format!("model/tiny-*/{check}")), ..SuiteConfig::default() };
    let results = model_section::run(&Mutant(defect), &cfg, &ModelFiles::default(), &mut |_| {});
    let run: Vec<Status> = results.iter().filter(|r| r.status != Status::Skipped).map(|r| r.status).collect();
    assert_eq!(run.len(), 3, "{defect:?}/{check}: one check per tiny model");
    run
}

#[test]
fn an_untouched_wrapper_passes_every_tiny_check() {
    for check in ["forward", "verify-window", "kv-trim", "hidden"] {
        assert!(statuses(Defect::None, check).iter().all(|s| *s == Status::Pass), "{check}");
    }
}

#[test]
fn each_defect_fails_the_checks_aimed_at_it() {
    for (defect, check) in [(Defect::TrimOneTooMany, "kv-trim"), (Defect::ShiftedWindow, "verify-window"), (Defect::ShiftedWindow, "forward"), (Defect::Perturbed, "forward")] {
        assert!(statuses(defect, check).iter().all(|s| *s == Status::Fail), "{defect:?} passed {check}");
    }
}

/// MODEL-13: a backend stating window epsilon 0 is held to bit-for-bit
/// windows; the same drift passes the forward check, whose bound is the
/// stated tolerance against the reference.
#[test]
fn a_window_epsilon_of_zero_is_held_to_equality() {
    assert!(statuses(Defect::WindowRoundsApart, "verify-window").iter().all(|s| *s == Status::Fail), "drift of 1e-9 passed a claim of batch invariance");
    assert!(statuses(Defect::WindowRoundsApart, "forward").iter().all(|s| *s == Status::Pass), "the forward check's bound is the logit tolerance");
}

/// MODEL-14's greedy loop on a tiny model: a ragged batch stopping at EOS
/// (id 1) gives each sequence the tokens it gives alone.
#[test]
fn greedy_is_batch_independent() {
    let w = specdec_models::tiny::TinySpec::preset("tiny-v32-l2").unwrap().weights().unwrap();
    let b = ReferenceBackend;
    let m = b.load_model(&w).unwrap();
    let prompts = vec![vec![3u32, 4, 5], vec![9], vec![30, 2, 2, 2, 7]];
    let batch = model_section::greedy(&b, &m, &prompts, 12, &[1], 32).unwrap();
    for (p, run) in prompts.iter().zip(&batch) {
        let alone = model_section::greedy(&b, &m, std::slice::from_ref(p), 12, &[1], 32).unwrap();
        assert_eq!(alone[0], *run);
        assert!(run.tokens.len() == 12 || run.tokens.last() == Some(&1));
    }
}

/// MODEL-17: a port that ignores Qwen2's biases and Qwen3's head norms fails
/// the architecture checks of those checkpoints (against HF's logits and
/// against the reference) and passes those of a checkpoint that has neither.
#[test]
fn a_port_without_the_attention_extras_fails_the_qwen_checkpoints_alone() {
    let run = |model: &str| -> Vec<(String, Status)> {
        let cfg = SuiteConfig { filter: Some(format!("model/hf-{model}/*")), ..SuiteConfig::default() };
        let results = model_section::run(&Mutant(Defect::DropsAttnExtras), &cfg, &ModelFiles::default(), &mut |_| {});
        results.into_iter().filter(|r| r.status != Status::Skipped).map(|r| (r.name, r.status)).collect()
    };
    for model in ["qwen2", "qwen3"] {
        let statuses = run(model);
        for check in ["hf-logits", "forward"] {
            let name = format!("model/hf-{model}/{check}");
            assert!(statuses.iter().any(|(n, s)| *n == name && *s == Status::Fail), "{name} did not fail: {statuses:?}");
        }
    }
    let llama3 = run("llama3");
    assert!(!llama3.is_empty() && llama3.iter().all(|(_, s)| *s == Status::Pass), "{llama3:?}");
}
