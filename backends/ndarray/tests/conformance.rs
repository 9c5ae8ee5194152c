//! The whole conformance suite (golden, differential, statistical) on the ndarray backend.
specdec_conformance::conformance_main!(specdec_ndarray::NdarrayBackend::new(), "tests/conformance.toml");
