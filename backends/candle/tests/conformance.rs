//! The whole suite through the three-line adapter (SUITE-4): golden, differential
//! and statistical checks of the contract (BACKEND-1 .. BACKEND-5; the seeded
//! verify is judged statistically, BACKEND-5).
//! The conformance suite on candle's CPU device.
specdec_conformance::conformance_main!(specdec_candle::CandleBackend::cpu(), "tests/conformance.toml");
