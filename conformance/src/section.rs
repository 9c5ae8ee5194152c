//! A section of the suite: a named set of checks and how to run them on one
//! backend. The kernel suite (`suite.rs`), the host cases (`host.rs`), the
//! model section and the end-to-end section implement it; the `Runner`
//! (`runner.rs`) runs them in order for `cargo test` and `specdec conform`
//! alike, so a new section (engine checks, say) is added in one place.

use specdec_backend::Backend;

use crate::check::{CheckResult, SuiteConfig};

pub trait Section<B: Backend> {
    /// Every check's name, before selection: what `--list` shows, what a
    /// progress bar counts, and what an unavailable backend reports as not
    /// supported.
    fn names(&self) -> Vec<String>;

    /// Runs the section's selected checks on `backend`, calling `progress`
    /// after each; unselected checks come back `Skipped`.
    fn run(&self, backend: &B, cfg: &SuiteConfig, progress: &mut dyn FnMut(&CheckResult)) -> Vec<CheckResult>;
}
