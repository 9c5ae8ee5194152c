//! Writing expected outputs from the reference (CASE-3): for `expected_by:
//! reference` files (`specdec bless`), and in memory for differential cases.

use serde_json::{Map, Value};
use specdec_backend::{BackendError, ReferenceBackend};

use crate::execute::{Observed, OutValue, execute};
use crate::format::{Case, CaseError, ExpectedBy, encode_f64, encode_i64};
use crate::host;
use crate::ops::HOST_OPS;

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

/// A case with its expectation recomputed (host ops by the host runner).
pub fn rebless(c: &Case) -> Result<Case, String> {
    if c.expected_by == ExpectedBy::Hand {
        return Ok(c.clone());
    }
    if HOST_OPS.contains(&c.op.as_str()) {
        let observed = host::execute_host(c).map_err(|e| e.to_string())?;
        return Ok(Case { expect: expect_block(&observed), ..c.clone() });
    }
    bless(c).map_err(|e| e.to_string())
}
