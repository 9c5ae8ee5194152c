//! GLUE-6: the unchecked verify variants give the checked ops' results.
//!
//! A decoder's hot path calls `greedy_verify_unchecked` and
//! `rejection_verify_unchecked` on input it has validated itself, to skip the
//! device read-back of the value check. This check runs every golden case
//! of the op and the run's differential cases both ways on the same backend
//! and requires identical downloaded outputs on every case the checked op
//! accepts (invalid input is outside the unchecked contract and is not
//! compared). It compares the backend with itself, not with the reference:
//! the golden and differential checks already judge the checked op.

use specdec_backend::{Backend, BackendError, Op};

use crate::check::SuiteConfig;
use crate::compare::Verdict;
use crate::execute::{Checked, execute_with};
use crate::fixtures::golden_cases_of;
use crate::format::Case;

/// The ops with an unchecked variant.
pub const OPS: [Op; 2] = [Op::GreedyVerify, Op::RejectionVerify];

/// Runs `op`'s golden cases and `cfg`'s differential cases checked and unchecked.
pub fn check<B: Backend>(backend: &B, op: Op, cfg: &SuiteConfig) -> Verdict {
    let mut cases: Vec<Case> = golden_cases_of(op.name());
    for i in 0..cfg.diff_cases_per_op {
        match crate::diff::case(op, i, cfg.seed) {
            Ok(case) => cases.push(case),
            Err(e) => return Verdict::Fail(format!("generator defect: {e}")),
        }
    }
    let mut compared = 0usize;
    for case in &cases {
        // Malformed golden cases fail their own golden check; skip them here.
        let Ok(checked) = execute_with(backend, case, Checked::Yes) else { continue };
        match &checked.error {
            Some(BackendError::NotSupported { op, .. }) => return Verdict::NotSupported(format!("`{op}` is not supported")),
            Some(_) => continue, // invalid input: outside the unchecked contract
            None => {}
        }
        let unchecked = match execute_with(backend, case, Checked::No) {
            Ok(o) => o,
            Err(e) => return Verdict::Fail(format!("case {}: {e}", case.id)),
        };
        if let Some(e) = unchecked.error {
            return Verdict::Fail(format!("case {}: the checked op succeeded, the unchecked one failed: {e}", case.id));
        }
        if unchecked.outputs != checked.outputs {
            return Verdict::Fail(format!("case {}: unchecked outputs {:?} differ from checked outputs {:?}", case.id, unchecked.outputs, checked.outputs));
        }
        compared += 1;
    }
    if compared == 0 {
        return Verdict::Fail(format!("no valid `{op}` case to compare"));
    }
    Verdict::Pass { excused: 0, max_abs_err: 0.0 }
}
