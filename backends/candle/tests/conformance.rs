//! The conformance suite on candle's CPU device.
specdec_conformance::conformance_main!(specdec_candle::CandleBackend::cpu(), "tests/conformance.toml");
