//! STAT-1: the seed of a run comes from SPECDEC_SEED when set, else the
//! fixed default. (Its own test binary: it sets a process variable.)

use specdec_conformance::suite::{DEFAULT_SEED, seed_from_env};

#[test]
fn seed_comes_from_the_environment_or_the_default() {
    // SAFETY: this test binary has a single test, so no other thread reads the environment.
    unsafe { std::env::remove_var("SPECDEC_SEED") };
    assert_eq!(seed_from_env(), Ok(DEFAULT_SEED));
    unsafe { std::env::set_var("SPECDEC_SEED", "42") };
    assert_eq!(seed_from_env(), Ok(42));
    unsafe { std::env::set_var("SPECDEC_SEED", "forty-two") };
    assert!(seed_from_env().is_err());
    unsafe { std::env::remove_var("SPECDEC_SEED") };
}
