//! The op table of case files: which ops a case may name (the backend
//! contract's, and the host ops that run on the reference), what each reads
//! and returns (CASE-9), and the check of a parsed case against it.

use serde_json::{Map, Value};
use specdec_backend::Op;

use crate::format::{Case, CaseError, ERROR_KINDS};

/// The fields a case of one op may hold (CASE-4, CASE-9): the params and
/// inputs its executor reads, and the outputs it returns.
#[derive(Debug, Clone, Copy)]
pub struct OpFields {
    pub params: &'static [&'static str],
    pub inputs: &'static [&'static str],
    /// What a successful run returns; an `expect` without `error` gives all of them.
    pub outputs: &'static [&'static str],
    /// Outputs returned only beside an error (`kv_cache`'s `failed_step`).
    pub error_outputs: &'static [&'static str],
}

/// Params every op accepts.
const COMMON_PARAMS: [&str; 1] = ["tolerance"];

/// Checks a parsed case against its op (CASE-9): the op is known, every
/// param and input is one the op reads, `expect` gives every output or an
/// error whose kind is a known `ErrorKind` name.
pub fn validate(case: &Case) -> Result<(), CaseError> {
    let fields = match specdec_backend::Op::from_name(&case.op) {
        Some(specdec_backend::Op::RejectionVerifySeeded) | None if !HOST_OPS.contains(&case.op.as_str()) => {
            return case_op(case).map(|_| ());
        }
        Some(op) => op_fields(op),
        None => host_fields(case)?,
    };
    let unknown = |section: &str, map: &Map<String, Value>, allowed: &[&str]| match map.keys().find(|k| !allowed.contains(&k.as_str())) {
        Some(k) => Err(case.error(section, k, format!("unknown field; `{}` reads {section} {}", case.op, list(allowed)))),
        None => Ok(()),
    };
    let params: Vec<&str> = fields.params.iter().chain(&COMMON_PARAMS).copied().collect();
    unknown("params", &case.params, &params)?;
    unknown("inputs", &case.inputs, fields.inputs)?;
    match case.expect.get("error") {
        Some(kind) => {
            serde_json::from_value::<specdec_backend::ErrorKind>(kind.clone()).map_err(|_| case.error("expect", "error", format!("{kind} is not an error kind; known: {}", ERROR_KINDS.join(", "))))?;
            if let Some(arg) = case.expect.get("arg").filter(|a| !a.is_string()) {
                return Err(case.error("expect", "arg", format!("{arg} is not an argument name (a string)")));
            }
            let allowed: Vec<&str> = ["error", "arg"].iter().chain(fields.outputs).chain(fields.error_outputs).copied().collect();
            unknown("expect", &case.expect, &allowed)
        }
        None => {
            unknown("expect", &case.expect, fields.outputs)?;
            match fields.outputs.iter().find(|o| !case.expect.contains_key(**o)) {
                Some(missing) => Err(case.error("expect", missing, format!("is missing; `expect` gives every output of `{}` ({}) or an `error`", case.op, list(fields.outputs)))),
                None => Ok(()),
            }
        }
    }
}

fn list(names: &[&str]) -> String {
    if names.is_empty() { "nothing".into() } else { names.join(", ") }
}

/// The ops case files may use: every contract op with deterministic output.
pub fn case_op(case: &Case) -> Result<Op, CaseError> {
    match Op::from_name(&case.op) {
        Some(Op::RejectionVerifySeeded) => Err(CaseError::new(format!("case {} field op", case.id), "rejection_verify_seeded is checked statistically, not by golden cases")),
        Some(op) => Ok(op),
        None => Err(CaseError::new(
            format!("case {} field op", case.id),
            format!(
                "unknown op \"{}\"; backend ops: {}; host ops (run on the reference): {}",
                case.op,
                Op::ALL.into_iter().filter(|op| *op != Op::RejectionVerifySeeded).map(Op::name).collect::<Vec<_>>().join(", "),
                HOST_OPS.join(", ")
            ),
        )),
    }
}

/// What a case of `op` may hold (CASE-9); kept beside [`execute`], which reads exactly these.
pub fn op_fields(op: Op) -> OpFields {
    const VERIFY_OUT: &[&str] = &["tokens", "num_accepted"];
    let f = |params, inputs, outputs| OpFields { params, inputs, outputs, error_outputs: &[] };
    match op {
        Op::GreedyVerify => f(&[], &["target_scores", "draft_tokens", "proposal_lens"], VERIFY_OUT),
        Op::DflashAccept => f(&["vocab"], &["candidates", "target_predict"], &["accept_len", "bonus"]),
        Op::RejectionVerify => f(&["comparator"], &["target_probs", "draft_probs", "draft_tokens", "proposal_lens", "accept_uniforms", "draw_uniforms", "draw_exponentials"], VERIFY_OUT),
        Op::Residual => f(&[], &["target_probs", "draft_probs", "drafted"], &["residual"]),
        Op::ProcessLogits => f(&[], &["logits", "temperature", "top_k", "top_p", "min_p", "penalty_counts", "repetition_penalty", "presence_penalty", "frequency_penalty", "logit_bias"], &["probs"]),
        Op::Draw => f(&[], &["weights", "draw_uniforms", "draw_exponentials"], &["tokens"]),
        Op::NgramPropose => f(&["vocab", "config"], &["contexts", "context_lens"], &["drafts", "proposal_lens"]),
        Op::PagedGather => f(&[], &["pages", "block_table", "context_lens"], &["gathered"]),
        Op::KvCache => OpFields { params: &["batch", "heads", "head_dim", "capacity"], inputs: &["steps"], outputs: &["lens", "keys", "values", "trimmed"], error_outputs: &["failed_step"] },
        // GLUE-1 .. GLUE-5: `params.dtype` picks the upload of float-or-id inputs.
        Op::Reshape => f(&["dtype", "shape"], &["t"], &["out"]),
        Op::GatherRows => f(&["dtype"], &["t", "rows"], &["out"]),
        Op::ConcatRows => f(&["dtype"], &["parts"], &["out"]),
        Op::AddI64 | Op::SubI64 => f(&[], &["a", "b"], &["out"]),
        // Not a case op (`case_op` rejects it before its fields are asked for).
        Op::RejectionVerifySeeded => f(&[], &[], &[]),
    }
}

/// The host ops case files in `fixtures/host/` may use.
pub const HOST_OPS: &[&str] = &[
    "speculative_accept",
    "lossy_threshold_verify",
    "lossy_typical_verify",
    "ngram_lookup",
    "ngram_index",
    "controller",
    "spec_config",
    "unmask_order",
    "mask_ratio",
    "select_unmask",
    "block_input",
    "rollback_amounts",
    "min_accepted_plan",
    "theory",
];

/// What a case of a host op may hold (CASE-9), read exactly by [`execute_host`].
pub fn host_fields(case: &Case) -> Result<OpFields, CaseError> {
    const VERIFY_OUT: &[&str] = &["tokens", "num_accepted"];
    let f = |params, inputs, outputs| Ok(OpFields { params, inputs, outputs, error_outputs: &[] });
    match case.op.as_str() {
        "speculative_accept" => f(&["comparator"], &["draft_tokens", "p", "q", "r"], &["accepted"]),
        "lossy_threshold_verify" => f(&["threshold"], &["target_probs", "draft_tokens", "proposal_lens"], VERIFY_OUT),
        "lossy_typical_verify" => f(&["epsilon", "delta"], &["target_probs", "draft_tokens", "proposal_lens", "draw_uniforms"], VERIFY_OUT),
        "ngram_lookup" => f(&["prompt_lookup", "vocab", "config"], &["prompt", "generated"], &["proposal"]),
        "ngram_index" => f(&["vocab", "config"], &["chunks"], &["index_proposals", "linear_proposals"]),
        "controller" => f(&["config"], &["events"], &["should_speculate", "k", "ema_after_updates", "acceptance_rate", "tokens_per_sequence_step", "counters"]),
        "spec_config" => f(&["config"], &[], &["valid"]),
        "unmask_order" => f(&["positions", "steps", "schedule"], &[], &["order"]),
        "mask_ratio" => f(&["schedule", "t"], &[], &["ratio"]),
        "select_unmask" => f(&["count"], &["confidence", "masked"], &["positions"]),
        "block_input" => f(&["block", "mask_id", "vocab", "embed_rows"], &["verified"], &["block"]),
        "rollback_amounts" => f(&["proposal_lens", "num_accepted"], &[], &["trim"]),
        "min_accepted_plan" => f(&["num_accepted", "width"], &[], &["emit", "uniform_trim"]),
        "theory" => {
            let fun: String = case.param("fn", None)?;
            let (params, inputs, outputs): (&'static [&'static str], &'static [&'static str], &'static [&'static str]) = match fun.as_str() {
                "acceptance" | "kl_divergence" => (&["fn"], &["p", "q"], &["value"]),
                "one_position_output_law" => (&["fn"], &["p", "q"], &["law"]),
                "accepted_length_law" => (&["fn", "betas"], &[], &["law"]),
                "expected_tokens" => (&["fn", "betas"], &[], &["value"]),
                "expected_tokens_geometric" => (&["fn", "beta", "gamma"], &[], &["value"]),
                "expected_speedup" => (&["fn", "beta", "gamma", "cost_ratio"], &[], &["value"]),
                "seed003_speedup_approximation" => (&["fn", "beta", "gamma", "rho"], &[], &["value"]),
                "best_draft_length" => (&["fn", "beta", "cost_ratio", "max_gamma"], &[], &["gamma", "speedup"]),
                "pinsker_acceptance_bound" | "bretagnolle_huber_acceptance_bound" => (&["fn", "kl"], &[], &["value"]),
                other => return Err(case.error("params", "fn", format!("unknown theory function \"{other}\""))),
            };
            f(params, inputs, outputs)
        }
        other => Err(case.error("", "op", format!("unknown host op \"{other}\"; known: {}", HOST_OPS.join(", ")))),
    }
}
