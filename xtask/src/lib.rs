//! The parts of xtask that its tests use: spec-rule coverage and the
//! crates' module graphs.
pub mod coverage;
pub mod modgraph;
