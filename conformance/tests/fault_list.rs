//! The fault injection list on the reference (`fixtures/faults.json`,
//! `specdec_conformance::fault_list`): every listed fault fails its named
//! check, and the list covers every (fault, proposer) pair.

use specdec_backend::ReferenceBackend;
use specdec_conformance::fault_list;
use specdec_conformance::model_section::ModelFiles;

#[test]
fn the_fault_list_is_complete() {
    fault_list::shipped().unwrap().check_complete().unwrap();
}

#[test]
fn every_listed_fault_fails_its_check_on_the_reference() {
    let list = fault_list::shipped().unwrap();
    match list.run(&ReferenceBackend, &ModelFiles::from_env()) {
        Ok(lines) => println!("{}", lines.join("\n")),
        Err(blinded) => panic!("checks that no longer catch their fault:\n{blinded}"),
    }
}

/// The negative control of completeness: a list that drops a pair, or lists
/// one twice, is refused.
#[test]
fn an_incomplete_fault_list_is_refused() {
    let shipped = fault_list::shipped().unwrap();
    let pair = shipped.caught[0].clone();
    let mut list = shipped.clone();
    list.caught.retain(|c| (&c.fault, &c.proposer) != (&pair.fault, &pair.proposer));
    assert!(list.check_complete().unwrap_err().contains(&format!("{} with {}: neither", pair.fault, pair.proposer)));
    let mut list = shipped;
    list.blind.push(fault_list::Blind { fault: pair.fault.clone(), proposer: pair.proposer.clone(), why: "x".into() });
    assert!(list.check_complete().unwrap_err().contains("both caught and blind"));
    let mut list = fault_list::shipped().unwrap();
    let dropped = list.caught_on_smollm2.pop().unwrap();
    assert!(list.check_complete().unwrap_err().contains(&format!("{} with {} on", dropped.fault, dropped.proposer)));
}
