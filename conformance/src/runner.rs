//! The one runner of the suite: its sections in order, on one backend, into
//! one report. The test harness (`harness.rs`), `specdec conform` and
//! `specdec check` build their runs here.

use specdec_backend::{Backend, ModelBackend};

use crate::check::{CheckResult, SuiteConfig};
use crate::e2e_section::EndToEndSection;
use crate::engine_section::DecoderEngineSection;
use crate::host::HostSection;
use crate::model_section::{ModelFiles, ModelSection};
use crate::report::Report;
use crate::section::Section;
use crate::suite::KernelSection;

/// Sections run in the order they were added.
pub struct Runner<'a, B: Backend> {
    sections: Vec<Box<dyn Section<B> + 'a>>,
}

impl<B: Backend> Default for Runner<'_, B> {
    fn default() -> Self {
        Runner { sections: Vec::new() }
    }
}

impl<'a, B: Backend> Runner<'a, B> {
    pub fn with(mut self, section: impl Section<B> + 'a) -> Self {
        self.sections.push(Box::new(section));
        self
    }

    /// Every check's name, in run order.
    pub fn names(&self) -> Vec<String> {
        self.sections.iter().flat_map(|s| s.names()).collect()
    }

    /// Runs every section on `backend`.
    pub fn run(&self, backend: &B, cfg: &SuiteConfig, progress: &mut dyn FnMut(&CheckResult)) -> Report {
        let results = self.sections.iter().flat_map(|s| s.run(backend, cfg, progress)).collect();
        Report { shard: cfg.shard, ..Report::new(backend, cfg.seed, results) }
    }
}

impl<'a, B: ModelBackend> Runner<'a, B> {
    /// The whole suite of a backend: the kernel checks, the host cases (in
    /// the reference's run only: they check reference-only algorithms), the
    /// model section, the end-to-end section and the engine section (the
    /// decoder on the backend as an engine under test).
    pub fn standard(cfg: &SuiteConfig, files: ModelFiles, backend_name: &str) -> Self {
        let runner = Runner::default().with(KernelSection::new(cfg));
        let runner = if backend_name == specdec_backend::ReferenceBackend.name() { runner.with(HostSection::shipped()) } else { runner };
        runner.with(ModelSection { files: files.clone() }).with(EndToEndSection::new(files)).with(DecoderEngineSection)
    }
}
