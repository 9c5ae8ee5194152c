//! The conformance suite's model and end-to-end sections on the CPU device
//! with f16 model weights (`candle-cpu-f16`), judged by the precision that
//! format states; the kernel checks are the same code as `candle-cpu`'s and
//! run in `conformance`.
specdec_conformance::conformance_main!(specdec_candle::CandleBackend::cpu_f16(), "tests/conformance_f16.toml");
