//! The blessed case files (`fixtures/cases/blessed/`): differential cases at a
//! fixed seed with the reference's outputs, written by `specdec bless` and
//! checked for drift by the tests.

use specdec_backend::Op;

use crate::diff;
use crate::format::{CaseFile, FORMAT};

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
