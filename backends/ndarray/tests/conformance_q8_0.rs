//! `ndarray-q8_0` through the conformance suite: the model and end-to-end
//! sections (the speculative decoder on its Q8_0 forward must equal plain
//! decoding on it, MODEL-13 exactly), with the shared harness.

specdec_conformance::conformance_main!(specdec_ndarray::NdarrayBackend::q8_0(), "tests/conformance_q8_0.toml");
