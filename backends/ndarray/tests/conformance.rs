//! The whole suite through the three-line adapter (SUITE-4): golden, differential
//! and statistical checks of the contract (BACKEND-1 .. BACKEND-5; the seeded
//! verify is judged statistically, BACKEND-5).
//! The whole conformance suite (golden, differential, statistical) on the ndarray backend.
specdec_conformance::conformance_main!(specdec_ndarray::NdarrayBackend::new(), "tests/conformance.toml");
