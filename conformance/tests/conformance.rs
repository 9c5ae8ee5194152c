//! The whole suite through the three-line adapter (SUITE-4): golden, differential
//! and statistical checks of the contract (BACKEND-1 .. BACKEND-5; the seeded
//! verify is judged statistically, BACKEND-5).
//! The reference itself through the vendor adapter: every golden case must
//! reproduce, and every differential and statistical check must pass.
specdec_conformance::conformance_main!(specdec_backend::ReferenceBackend, "tests/conformance.toml");
