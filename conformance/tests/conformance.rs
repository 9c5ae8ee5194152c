//! The reference itself through the vendor adapter: every golden case must
//! reproduce, and every differential and statistical check must pass.
specdec_conformance::conformance_main!(specdec_backend::ReferenceBackend, "tests/conformance.toml");
