//! The conformance suite on CUDA: every check is ignored, with the reason, where the
//! `libtorch` feature is off or libtorch sees no CUDA device.
specdec_conformance::conformance_main!(try specdec_tch::TchBackend::cuda_if_available(), "tests/conformance.toml");
