//! The vendor adapter: the whole suite as `cargo test` trials (SUITE-4).
//!
//! A backend crate adds `tests/conformance.rs` with `harness = false`:
//!
//! ```ignore
//! specdec_conformance::conformance_main!(my_backend::MyBackend::new(), "tests/conformance.toml");
//! ```
//!
//! The suite runs once, in order (a backend may keep global generator
//! state), and each check is then reported as one trial: pass and xfail pass,
//! fail and xpass fail, not-supported and skipped are ignored with the
//! reason. Set `SPECDEC_REPORT_DIR` to also write the JSON, Markdown and
//! JUnit reports there. The sections are the runner's (`Runner::standard`):
//! kernel checks, host cases on the reference, the model section, the
//! end-to-end section; the SmolLM2 checks need `SPECDEC_SMOLLM2_GGUF` (and `SPECDEC_SMOLLM2_HF`
//! for the export check), which `cargo xtask test` sets.

use std::process::ExitCode;

use libtest_mimic::{Arguments, Completion, Failed, Trial};
use specdec_backend::ModelBackend;

use crate::check::{Selection, Status, SuiteConfig, seed_from_env};
use crate::model_section::ModelFiles;
use crate::report::Report;
use crate::runner::Runner;

/// Instantiates the suite for a backend: `conformance_main!(backend_expr, "selection.toml")`.
/// The expression may also be a `Result<Backend, String>`-returning call via
/// [`conformance_main!`]'s `try` form: `conformance_main!(try make(), "...")`,
/// where an `Err` reports every check as not supported with that reason.
#[macro_export]
macro_rules! conformance_main {
    (try $backend:expr, $selection:literal) => {
        fn main() -> ::std::process::ExitCode {
            $crate::harness::main(|| $backend, include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/", $selection)))
        }
    };
    ($backend:expr, $selection:literal) => {
        $crate::conformance_main!(try Ok::<_, String>($backend), $selection);
    };
}

/// The body of [`conformance_main!`].
pub fn main<B: ModelBackend>(make: impl FnOnce() -> Result<B, String>, selection_toml: &str) -> ExitCode {
    let args = Arguments::from_args();
    let selection = match Selection::parse(selection_toml) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::FAILURE;
        }
    };
    let seed = match seed_from_env() {
        Ok(s) => s,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::FAILURE;
        }
    };
    let cfg = SuiteConfig { seed, filter: args.filter.clone().filter(|_| !args.exact), selection, ..SuiteConfig::default() };
    let made = make();
    let name = made.as_ref().map(|b| b.name()).unwrap_or_default();
    let runner = Runner::standard(&cfg, ModelFiles::from_env(), &name);
    if args.list {
        let trials = runner.names().into_iter().map(|n| Trial::test(n, || Ok(()))).collect();
        return libtest_mimic::run(&args, trials).exit_code();
    }

    let backend = match made {
        Ok(b) => b,
        Err(reason) => {
            println!("backend unavailable: {reason}; every check is reported as not supported");
            let trials = runner
                .names()
                .into_iter()
                .map(|n| {
                    let reason = format!("not supported: backend unavailable: {reason}");
                    Trial::ignorable_test(n, move || Ok(Completion::ignored_with(reason)))
                })
                .collect();
            return libtest_mimic::run(&args, trials).exit_code();
        }
    };
    println!("specdec conformance: backend `{}` on `{}`, seed {seed}", backend.name(), backend.device());
    let report = runner.run(&backend, &cfg, &mut |_| {});
    println!("{}", report.summary_line());
    print!("{}", report.coverage_by_op());
    if let Ok(dir) = std::env::var("SPECDEC_REPORT_DIR")
        && let Err(e) = write_reports(&report, std::path::Path::new(&dir))
    {
        eprintln!("cannot write reports to {dir}: {e}");
        return ExitCode::FAILURE;
    }

    let trials = report
        .results
        .into_iter()
        .map(|r| {
            Trial::ignorable_test(r.name.clone(), move || match r.status {
                Status::Pass | Status::XFail => Ok(Completion::Completed),
                Status::Fail | Status::XPass => Err(Failed::from(format!("{:?}: {}\n  repro: {}", r.status, r.message, r.repro))),
                Status::NotSupported => Ok(Completion::ignored_with(format!("not supported: {}", r.message))),
                Status::Skipped => Ok(Completion::ignored_with(r.message)),
            })
            .with_kind(format!("{:?}", r.kind).to_lowercase())
        })
        .collect();
    libtest_mimic::run(&args, trials).exit_code()
}

/// Writes `<backend>.json`, `.md` and `.junit.xml` into `dir` ([`report_stem`]).
pub fn write_reports(report: &Report, dir: &std::path::Path) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    let stem = report_stem(&report.backend);
    std::fs::write(dir.join(format!("{stem}.json")), report.to_json())?;
    std::fs::write(dir.join(format!("{stem}.md")), report.to_markdown())?;
    std::fs::write(dir.join(format!("{stem}.junit.xml")), report.to_junit())
}

/// A report's file name in a folder: its backend's name with every character
/// but letters, digits, `.`, `_` and `-` as `-` (an engine's name, such as
/// `specdec/reference/ngram`, would otherwise name folders).
pub fn report_stem(backend: &str) -> String {
    backend.chars().map(|c| if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') { c } else { '-' }).collect()
}
