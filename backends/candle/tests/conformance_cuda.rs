//! The conformance suite on CUDA device 0. Without the `cuda` feature, or
//! without a GPU, the constructor fails and every check is reported as not
//! supported (ignored) with the reason.
specdec_conformance::conformance_main!(try specdec_candle::CandleBackend::cuda(0), "tests/conformance.toml");
