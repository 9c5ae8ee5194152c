//! The conformance suite's model and end-to-end sections on the CPU device
//! with Q8_0 model weights (`candle-cpu-q8_0`), judged by the precision that
//! format states; the kernel checks are the same code as `candle-cpu`'s and
//! run in `conformance`.
specdec_conformance::conformance_main!(specdec_candle::CandleBackend::cpu_q8_0(), "tests/conformance_q8_0.toml");
