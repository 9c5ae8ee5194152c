//! The AFL++ driver: `specdec-fuzz TARGET` runs one target of
//! `specdec_fuzz::TARGETS` in AFL's persistent loop. Built by `cargo xtask
//! fuzz` through `cargo afl build` (the `afl` feature), never in normal builds.

fn main() {
    let name = std::env::args().nth(1).unwrap_or_default();
    let Some(target) = specdec_fuzz::target(&name) else {
        let names: Vec<&str> = specdec_fuzz::TARGETS.iter().map(|(n, _)| *n).collect();
        eprintln!("usage: specdec-fuzz TARGET, one of {names:?}");
        std::process::exit(2);
    };
    // `fuzz_nohook`: `fuzz!` would abort on every panic, even one a loader
    // catches on purpose (the tokenizers crate panics on some hostile files;
    // `specdec_models::Tokenizer` turns that into an error). A panic that
    // reaches this closure still aborts, and AFL records it as a crash.
    afl::fuzz_nohook!(|data: &[u8]| target(data));
}
