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
    afl::fuzz!(|data: &[u8]| target(data));
}
