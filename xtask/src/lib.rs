//! The parts of xtask that its tests use: spec-rule coverage
//! ([`coverage`]: a rule counts as tested only where a running test, a case
//! or a suite check names it in code, read as tokens), the crates' module
//! graphs ([`modgraph`]: `tests/module_circles.rs`), and the checks that
//! keep README and ARCHITECTURE true to the tree ([`docs`]:
//! `tests/architecture_map.rs`), and the runner behind `cargo xtask test`
//! ([`test_pool`]: every test binary of one build, as many at once as there
//! are cores).
pub mod coverage;
pub mod docs;
pub mod modgraph;
pub mod test_pool;
