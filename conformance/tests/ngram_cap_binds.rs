//! NGRAM-5 is exercised, not just present: in the differential n-gram cases the
//! `max_model_len` cap changes what the reference proposes (or makes it reject a
//! context as too long) in a good share of cases, for every seed tried. A cap
//! placed far above every context, as the generator once did, would let a port
//! that ignores it pass.

use serde_json::Value;
use specdec_backend::{Op, ReferenceBackend};
use specdec_conformance::diff::{self, DEFAULT_CASES_PER_OP};
use specdec_conformance::execute::execute;

#[test]
fn the_max_model_len_cap_binds_in_generated_ngram_cases() {
    for seed in [20261122, 1, 7, 99, 12345] {
        let mut binding = 0;
        for index in 0..DEFAULT_CASES_PER_OP {
            let case = diff::case(Op::NgramPropose, index, seed).expect("generated");
            let mut uncapped = case.clone();
            uncapped.params.get_mut("config").and_then(Value::as_object_mut).expect("a config").insert("max_model_len".into(), Value::Null);
            let (capped, free) = (execute(&ReferenceBackend, &case).expect("runs"), execute(&ReferenceBackend, &uncapped).expect("runs"));
            if format!("{:?}{:?}", capped.outputs, capped.error) != format!("{:?}{:?}", free.outputs, free.error) {
                binding += 1;
            }
        }
        assert!(binding * 6 >= DEFAULT_CASES_PER_OP, "seed {seed}: the cap changed the outcome of only {binding} of {DEFAULT_CASES_PER_OP} n-gram cases");
    }
}
