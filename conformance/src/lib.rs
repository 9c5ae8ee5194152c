//! The conformance suite every specdec backend must pass: golden cases read
//! from language-neutral JSON files, differential cases generated from a
//! seed and judged against the reference, and calibrated statistical checks
//! of a backend's own random generator.
//!
//! Invariants: the reference is the oracle (expected outputs come from hand
//! calculations checked against it, or from the reference itself); a
//! difference is excused only where the reference's own decision margin is
//! below the backend's stated epsilon, and every excuse is counted; a
//! malformed case fails alone and never stops the run; statistical checks
//! state their power before sampling and are never retried; `NotSupported`
//! is reported and never counted as a pass.

pub mod bless;
pub mod blessed;
pub mod case;
pub mod check;
pub mod compare;
pub mod diff;
pub mod e2e_section;
pub mod engine_section;
pub mod exact;
pub mod execute;
pub mod fixtures;
pub mod format;
pub mod harness;
pub mod host;
pub mod lossless;
pub mod model;
pub mod model_section;
pub mod mutants;
pub mod ops;
pub mod report;
pub mod runner;
pub mod section;
pub mod shard;
pub mod stat;
pub mod suite;
pub mod unchecked;
