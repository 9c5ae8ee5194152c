//! The parts of xtask that its tests use: spec-rule coverage.
pub mod coverage;
