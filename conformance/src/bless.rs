//! Writing expected outputs from the reference (CASE-3): `specdec bless`
//! for `expected_by: reference` files, and in memory for differential cases.

use serde_json::{Map, Value};
use specdec_backend::{BackendError, ReferenceBackend};

use crate::case::{Case, CaseError, ExpectedBy, encode_f64, encode_i64};
use crate::execute::{OutValue, Observed, execute};

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
