//! STAT-1: the seed of a run comes from SPECDEC_SEED when set, else the
//! fixed default. (Its own test binary: it sets a process variable.)

use specdec_conformance::suite::{DEFAULT_SEED, seed_from_env};

#[test]
fn seed_comes_from_the_environment_or_the_default() {
    // SAFETY: this test binary has a single test, so no other thread reads the environment.
    unsafe { std::env::remove_var("SPECDEC_SEED") };
    assert_eq!(seed_from_env(), Ok(DEFAULT_SEED), "STAT-1: without SPECDEC_SEED the run seed is the fixed default");
    assert_eq!(DEFAULT_SEED, 20_261_122, "STAT-1: the default seed");
    unsafe { std::env::set_var("SPECDEC_SEED", "42") };
    assert_eq!(seed_from_env(), Ok(42), "STAT-1: SPECDEC_SEED overrides the default");
    unsafe { std::env::set_var("SPECDEC_SEED", "forty-two") };
    assert!(seed_from_env().is_err(), "STAT-1: a SPECDEC_SEED that is not a u64 is an error, not the default");
    unsafe { std::env::remove_var("SPECDEC_SEED") };
}
