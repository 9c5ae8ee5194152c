//! The fault injection list on ndarray (`fixtures/faults.json`,
//! `specdec_conformance::fault_list`): every listed decoder or proposer
//! fault fails its named end-to-end check on this port too, on the tiny
//! model and (where `SPECDEC_SMOLLM2_GGUF` gives it) on SmolLM2.

use specdec_conformance::fault_list;
use specdec_conformance::model_section::ModelFiles;
use specdec_ndarray::NdarrayBackend;

#[test]
fn every_listed_fault_fails_its_check_on_ndarray() {
    let list = fault_list::shipped().unwrap();
    match list.run(&NdarrayBackend::new(), &ModelFiles::from_env()) {
        Ok(lines) => println!("{}", lines.join("\n")),
        Err(blinded) => panic!("checks that no longer catch their fault:\n{blinded}"),
    }
}
