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
//!
//! The machinery, read bottom up (its modules form no import circle,
//! `xtask/tests/module_circles.rs`): [`format`] (the case file types and
//! tensor encoding), [`ops`] (the op table: what each op, backend or host,
//! reads and returns), [`case`] (loading a file), [`execute`] (one executor
//! per op, checked or unchecked), [`compare`] (the judge, with margins),
//! [`host`] (host cases on the reference), [`bless`], [`diff`] (differential
//! generators), [`blessed`] (the seeded files `specdec bless` writes),
//! [`stat`] (statistical checks), [`model`] (table models), [`mutants`],
//! [`lossless`], [`exact`] (exact integration over the noise), [`unchecked`]
//! (GLUE-6). [`fixtures`] embeds the case files, host cases and table
//! models of `fixtures/` at build time (`build.rs`), and the model section
//! embeds SmolLM2's prompts, so a vendor's test binary needs no path to this
//! repository; only the trained DFlash draft (`fixtures/dflash/`) is read at
//! run time, through the path of the repository the binary was built in
//! (`CARGO_MANIFEST_DIR`): a binary carried to another machine finds it only
//! at that same path. [`check`] holds what a check is (kind, status,
//! selection, config, result).
//!
//! On top, the sections, each a [`section::Section`]: the kernel checks
//! ([`suite`]), the host cases, the model section ([`model_section`]), the
//! end-to-end section ([`e2e_section`]: the speculative decoder on the
//! backend, with its stop, fidelity, full-blocks and step-law checks;
//! `fault_list` (with the `negative-controls` feature) names, for each
//! fault `fixtures/faults.json` lists and each proposer, the check that
//! catches it or why it cannot show) and the engine
//! section ([`engine_section`]: any `GenerationEngine`, and specdec's
//! decoder on the backend as one). [`runner`] runs them in order into a
//! [`report::Report`] for the `cargo test` adapter ([`harness`],
//! `conformance_main!`), `specdec conform` and `specdec check` alike;
//! [`shard`] splits a run's checks into shards by name and merges shard
//! reports back, judging each Holm family over all shards. A new section is
//! one `Section` impl and one line in `Runner::standard`.

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
#[cfg(feature = "negative-controls")]
pub mod fault_list;
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
pub mod run_share;
pub mod runner;
pub mod section;
pub mod shard;
pub mod stat;
pub mod suite;
pub mod unchecked;
