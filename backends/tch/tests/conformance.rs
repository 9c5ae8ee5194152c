//! The conformance suite on the CPU libtorch backend. Without the `libtorch` feature the
//! constructor fails, and every check is reported as ignored with the reason.
specdec_conformance::conformance_main!(try specdec_tch::TchBackend::try_cpu(), "tests/conformance.toml");
