//! `ndarray-f32` through the conformance suite: every section its vectorised
//! f32 softmax reaches, judged at its stated tolerance, with the shared
//! harness.

specdec_conformance::conformance_main!(specdec_ndarray::NdarrayBackend::f32_softmax(), "tests/conformance_f32.toml");
