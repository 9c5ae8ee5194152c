//! Writing expected outputs from the reference (CASE-3): `specdec bless`
//! for `expected_by: reference` files, and in memory for differential cases.

use serde_json::{Map, Value};
use specdec_backend::{BackendError, Op, ReferenceBackend};

use crate::case::{Case, CaseError, CaseFile, ExpectedBy, FORMAT, encode_f64, encode_i64};
use crate::execute::{Observed, OutValue, execute};
use crate::{diff, host};

/// The `expect` block that describes `observed`.
pub fn expect_block(observed: &Observed) -> Map<String, Value> {
    let mut expect = Map::new();
    if let Some(e) = &observed.error {
        if let BackendError::Invalid(e) = e {
            expect.insert("error".into(), serde_json::to_value(e.kind()).expect("kinds serialize"));
            if let Some(arg) = e.arg() {
                expect.insert("arg".into(), Value::from(arg));
            }
        } else {
            expect.insert("error".into(), Value::from(e.to_string()));
        }
    }
    for (name, value) in &observed.outputs {
        let v = match value {
            OutValue::Ints(t) => encode_i64(t),
            OutValue::Floats(t) => encode_f64(t),
        };
        expect.insert(name.clone(), v);
    }
    expect
}

/// Recomputes the expectation of a `reference` case; `hand` cases are returned unchanged.
pub fn bless(case: &Case) -> Result<Case, CaseError> {
    if case.expected_by == ExpectedBy::Hand {
        return Ok(case.clone());
    }
    let observed = execute(&ReferenceBackend, case)?;
    Ok(Case { expect: expect_block(&observed), ..case.clone() })
}

/// The seed of the blessed differential cases.
pub const BLESS_SEED: u64 = 1;
/// Blessed cases per operation.
pub const BLESSED_PER_OP: usize = 12;

/// The rules a blessed case of `op` exercises.
fn rules(op: Op) -> Vec<String> {
    let r: &[&str] = match op {
        Op::GreedyVerify => &["GREEDY-2", "GREEDY-3", "GREEDY-4", "CONV-7"],
        Op::DflashAccept => &["DFLASH-2", "DFLASH-3"],
        Op::RejectionVerify => &["REJECT-2", "REJECT-3", "REJECT-4", "RESID-1", "RESID-2", "SAMPLE-1", "SAMPLE-2"],
        Op::Residual => &["RESID-1", "RESID-2", "RESID-3"],
        Op::ProcessLogits => &["LOGITS-4", "LOGITS-5", "LOGITS-6"],
        Op::Draw => &["SAMPLE-1", "SAMPLE-2"],
        Op::NgramPropose => &["NGRAM-2", "NGRAM-5", "NGRAM-7"],
        Op::KvCache => &["KV-2", "KV-4", "KV-5"],
        Op::PagedGather => &["KV-8"],
        // No generator, so never blessed (`diff::ops` leaves them out).
        Op::RejectionVerifySeeded | Op::Reshape | Op::GatherRows | Op::ConcatRows | Op::AddI64 | Op::SubI64 => &[],
    };
    r.iter().map(|s| s.to_string()).collect()
}

/// The blessed file for `op`, as it should be.
pub fn blessed_file(op: Op) -> Result<CaseFile, String> {
    let mut cases = Vec::new();
    for i in 0..BLESSED_PER_OP {
        let mut c = diff::case(op, i, BLESS_SEED).map_err(|e| e.to_string())?;
        c.id = format!("seed{BLESS_SEED}-{i:03}");
        c.rules = rules(op);
        cases.push(c);
    }
    Ok(CaseFile {
        format: FORMAT.into(),
        title: format!("`{}` cases generated at seed {BLESS_SEED}, expected outputs from the reference", op.name()),
        description: "Written by `specdec bless`; do not edit by hand.".into(),
        cases,
    })
}

/// A case with its expectation recomputed (host ops by the host runner).
pub fn rebless(c: &Case) -> Result<Case, String> {
    if c.expected_by == ExpectedBy::Hand {
        return Ok(c.clone());
    }
    if host::HOST_OPS.contains(&c.op.as_str()) {
        let observed = host::execute_host(c).map_err(|e| e.to_string())?;
        return Ok(Case { expect: expect_block(&observed), ..c.clone() });
    }
    bless(c).map_err(|e| e.to_string())
}
