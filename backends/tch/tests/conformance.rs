//! The whole suite through the three-line adapter (SUITE-4): golden, differential
//! and statistical checks of the contract (BACKEND-1 .. BACKEND-5; the seeded
//! verify is judged statistically, BACKEND-5).
//! The conformance suite on the CPU libtorch backend. Without the `libtorch` feature the
//! constructor fails, and every check is reported as ignored with the reason.
specdec_conformance::conformance_main!(try specdec_tch::TchBackend::try_cpu(), "tests/conformance.toml");
