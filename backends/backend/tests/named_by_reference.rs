//! The one helper every port uses when its fast device check says no
//! (ERR-1): the reference's error is passed through unchanged, and a reference
//! that accepts the input makes a device error naming the port.

use specdec_backend::{Backend, BackendError, RefTensor, ReferenceBackend};
use specdec_reference::Tensor;

#[test]
fn the_reference_error_names_the_defect() {
    let scores = RefTensor::F64(Tensor::new(vec![1, 2, 3], vec![0.0, 1.0, 0.5, 0.0, 0.0, 1.0]).expect("shape"));
    let drafts = RefTensor::I64(Tensor::new(vec![1, 1], vec![9]).expect("shape"));
    let lens = RefTensor::I64(Tensor::new(vec![1], vec![1]).expect("shape"));
    let reference = ReferenceBackend.greedy_verify(&scores, &drafts, &lens);
    let expected = reference.clone().expect_err("draft id 9 is outside a vocabulary of 3");
    let named = BackendError::named_by_reference("port", reference);
    assert!(matches!(&named, BackendError::Invalid(e) if e.to_string().contains("draft_tokens")), "{named}");
    assert_eq!(named, expected);
}

#[test]
fn a_check_stricter_than_the_reference_is_the_ports_bug() {
    let named = BackendError::named_by_reference("port-x", Ok::<_, BackendError>(()));
    assert!(matches!(&named, BackendError::Device { backend, message } if backend == "port-x" && message.contains("reference accepts")), "{named}");
}
