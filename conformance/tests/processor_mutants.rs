//! Negative controls of the processor cases (LOGITS-7 .. LOGITS-11): ports
//! that apply the right processors in a peer's order instead of the spec's
//! must fail the hand-worked golden cases that pin that order, and the
//! reference must pass every one. A case file whose cases a reordered port
//! also passes would pass here and fail this file.

use std::path::Path;

use specdec_backend::{Backend, BackendError, LogitsParams, RefTensor, ReferenceBackend, Result, SamplingParams, reference_transfers};
use specdec_conformance::case::{Case, load};
use specdec_conformance::compare::Verdict;
use specdec_conformance::suite::check_case;
use specdec_reference::logits::pre_process;
use specdec_reference::{RowInputs, Tensor, process_logits};

/// A peer's processor order, each one a real engine's.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Order {
    /// llama.cpp's default chain: min-p on the untempered logits, temperature last.
    MinPBeforeTemperature,
    /// vLLM: min-p right after temperature, before top-k and top-p.
    MinPBeforeTopP,
    /// Penalties on the tempered logits (a port that divides by T first).
    PenaltiesAfterTemperature,
    /// SGLang: the bias added after the penalties.
    BiasAfterPenalties,
}

struct Reordered(Order);

/// One row's inputs, read from the op's host tensors.
struct RowIn {
    logits: Vec<f64>,
    params: SamplingParams,
    counts: Option<Vec<f64>>,
    bias: Option<Vec<f64>>,
}

fn floats(t: &RefTensor) -> &Tensor<f64> {
    match t {
        RefTensor::F64(t) => t,
        RefTensor::I64(_) => panic!("the cases pass floats here"),
    }
}

fn rows_of(logits: &RefTensor, p: &LogitsParams<'_, RefTensor>) -> Result<Vec<RowIn>> {
    // The reference validates the whole input first: invalid cases keep its errors.
    ReferenceBackend.process_logits(logits, *p)?;
    let z = floats(logits);
    let RefTensor::I64(k) = p.top_k else { panic!("top_k is ids") };
    let at = |t: Option<&RefTensor>, r: usize, off: f64| t.map_or(off, |t| floats(t).data()[r]);
    let lane = |t: Option<&RefTensor>, r: usize| t.map(|t| floats(t).lane(&[r]).expect("a row").to_vec());
    Ok((0..z.shape()[0])
        .map(|r| {
            let pen = p.penalties;
            let params = SamplingParams {
                min_p: at(p.min_p, r, 0.0),
                repetition_penalty: at(pen.map(|x| x.repetition), r, 1.0),
                presence_penalty: at(pen.map(|x| x.presence), r, 0.0),
                frequency_penalty: at(pen.map(|x| x.frequency), r, 0.0),
                ..SamplingParams::new(floats(p.temperature).data()[r], k.data()[r] as usize, floats(p.top_p).data()[r])
            };
            RowIn { logits: z.lane(&[r]).expect("a row").to_vec(), params, counts: lane(pen.map(|x| x.counts), r), bias: lane(p.logit_bias, r) }
        })
        .collect())
}

/// `logits` with every id whose weight `exp((l - max) / t)` is below `min_p` masked.
fn min_p_mask(logits: &[f64], t: f64, min_p: f64) -> Vec<f64> {
    let max = logits.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    logits.iter().map(|&l| if ((l - max) / t).exp() >= min_p { l } else { f64::NEG_INFINITY }).collect()
}

impl Reordered {
    fn row(&self, x: &RowIn) -> Vec<f64> {
        let inputs = RowInputs { counts: x.counts.as_deref(), bias: x.bias.as_deref() };
        let p = x.params;
        let plain = SamplingParams { min_p: 0.0, ..p };
        let greedy = p.temperature == 0.0;
        let out = match self.0 {
            Order::MinPBeforeTemperature if !greedy => process_logits(&min_p_mask(&pre_process(&x.logits, &p, inputs), 1.0, p.min_p), plain),
            Order::MinPBeforeTopP if !greedy && p.min_p > 0.0 => {
                // Temperature and top-k, then min-p, then top-p on the survivors.
                let z = pre_process(&x.logits, &p, inputs);
                let cut = process_logits(&z, SamplingParams { top_p: 1.0, ..plain }).expect("valid row");
                let largest = cut.iter().copied().fold(0.0, f64::max);
                let masked: Vec<f64> = z.iter().zip(&cut).map(|(&l, &c)| if c > 0.0 && c >= p.min_p * largest { l } else { f64::NEG_INFINITY }).collect();
                process_logits(&masked, plain)
            }
            Order::PenaltiesAfterTemperature if !greedy => {
                let tempered: Vec<f64> = x.logits.iter().map(|l| l / p.temperature).collect();
                process_logits(&pre_process(&tempered, &p, inputs), SamplingParams { temperature: 1.0, ..p })
            }
            Order::BiasAfterPenalties => {
                let penalised = pre_process(&x.logits, &p, RowInputs { bias: None, ..inputs });
                let biased: Vec<f64> = match &x.bias {
                    Some(b) => penalised.iter().zip(b).map(|(l, b)| l + b).collect(),
                    None => penalised,
                };
                process_logits(&biased, p)
            }
            _ => specdec_reference::process_logits_with(&x.logits, p, inputs),
        };
        out.expect("the reference accepted the row")
    }
}

impl Backend for Reordered {
    type Tensor = RefTensor;
    type KvCache = ();
    reference_transfers!();

    fn name(&self) -> String {
        format!("reordered-{:?}", self.0)
    }

    fn device(&self) -> String {
        "cpu".into()
    }

    fn precision(&self) -> specdec_backend::Precision {
        ReferenceBackend.precision()
    }

    fn process_logits(&self, logits: &RefTensor, p: LogitsParams<'_, RefTensor>) -> Result<RefTensor, BackendError> {
        let rows = rows_of(logits, &p)?;
        let vocab = floats(logits).shape()[1];
        let data = rows.iter().flat_map(|x| self.row(x)).collect();
        Ok(RefTensor::F64(Tensor::new(vec![rows.len(), vocab], data)?))
    }
}

fn cases() -> Vec<Case> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixtures/cases/logits.json");
    let loaded = load(&path).expect("the shipped logits cases load");
    assert!(loaded.errors.is_empty(), "{:?}", loaded.errors);
    loaded.cases
}

fn failing<B: Backend>(b: &B) -> Vec<String> {
    cases().iter().filter(|c| matches!(check_case(b, c), Verdict::Fail(_))).map(|c| c.id.clone()).collect()
}

#[test]
fn the_reference_passes_every_processor_case() {
    assert_eq!(failing(&ReferenceBackend), Vec::<String>::new());
}

/// Each peer order fails the case that pins the spec's order (LOGITS-11),
/// and nothing it computes the same way.
#[test]
fn each_peer_order_fails_the_case_that_pins_it() {
    for (order, pinned) in [
        (Order::MinPBeforeTemperature, "min-p-after-temperature"),
        (Order::MinPBeforeTopP, "min-p-after-top-p"),
        (Order::PenaltiesAfterTemperature, "penalties-before-temperature"),
        (Order::BiasAfterPenalties, "bias-before-repetition"),
    ] {
        let failed = failing(&Reordered(order));
        assert!(failed.contains(&pinned.to_string()), "{order:?} fails {failed:?}, not `{pinned}`");
        assert!(failed.iter().all(|id| !id.starts_with("err-")), "{order:?}: its errors are the reference's: {failed:?}");
    }
}
