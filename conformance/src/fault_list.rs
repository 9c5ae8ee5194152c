//! The fault injection list (`fixtures/faults.json`): each injected decoder
//! or proposer bug ([`Fault`]), on each proposer of the tiny model where it
//! can show, must fail a named end-to-end check; where it cannot show, the
//! list says why. A change that blinds a check fails the test command
//! (`conformance/tests/fault_list.rs` on the reference,
//! `backends/ndarray/tests/fault_list.rs` on ndarray).
//!
//! Invariants: every `(fault, proposer)` pair of the list's faults and the
//! tiny model's proposers is either caught (with its check) or blind (with
//! the reason), never both and never neither; each caught pair's check
//! fails with the fault injected (the same checks pass without it: the
//! suite's clean run). The SmolLM2 part (`caught_on_smollm2`) names, for
//! every SmolLM2 proposer, the check that catches a bonus read from the
//! wrong row; it runs where SmolLM2 is given and the backend runs its
//! end-to-end section (ndarray in the test command; not the reference).

use serde::Deserialize;
use specdec_backend::model::ModelBackend;
use specdec_decoder::{EngineConfig, Fault};

use crate::check::{Status, SuiteConfig};
use crate::e2e_section::{self, TINY};
use crate::model_section::{ModelFiles, SMOLLM2};

/// A fault that must fail `check` when `proposer` runs on the tiny model.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Caught {
    pub fault: String,
    pub proposer: String,
    pub check: String,
}

/// A fault that cannot show with `proposer`, and why.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Blind {
    pub fault: String,
    pub proposer: String,
    pub why: String,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FaultList {
    #[allow(dead_code)]
    about: String,
    pub caught: Vec<Caught>,
    pub blind: Vec<Blind>,
    /// Faults caught on SmolLM2, by the check named.
    pub caught_on_smollm2: Vec<Caught>,
}

/// The faults every SmolLM2 proposer must have a `caught_on_smollm2` entry for.
const SMOLLM2_FAULTS: [Fault; 1] = [Fault::BonusFromWrongRow];

/// The shipped list.
pub fn shipped() -> Result<FaultList, String> {
    let text = include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/../fixtures/faults.json"));
    serde_json::from_str(text).map_err(|e| format!("fixtures/faults.json: {e}"))
}

impl FaultList {
    /// Every `(fault, proposer)` pair of the list's faults is caught or blind, once.
    pub fn check_complete(&self) -> Result<(), String> {
        let mut problems = Vec::new();
        let faults: std::collections::BTreeSet<&str> = self.caught.iter().map(|c| c.fault.as_str()).chain(self.blind.iter().map(|b| b.fault.as_str())).collect();
        for fault in &faults {
            if let Err(e) = fault.parse::<Fault>() {
                problems.push(e);
            }
            for p in e2e_section::proposers(TINY) {
                let caught = self.caught.iter().filter(|c| c.fault == *fault && c.proposer == p).count();
                let blind = self.blind.iter().filter(|b| b.fault == *fault && b.proposer == p).count();
                match (caught, blind) {
                    (0, 0) => problems.push(format!("{fault} with {p}: neither caught nor blind")),
                    (_, 1..) if caught > 0 => problems.push(format!("{fault} with {p}: both caught and blind")),
                    (0, 2..) => problems.push(format!("{fault} with {p}: blind twice")),
                    _ => {}
                }
            }
        }
        for (p, what) in self.caught.iter().map(|c| (&c.proposer, "caught")).chain(self.blind.iter().map(|b| (&b.proposer, "blind"))) {
            if !e2e_section::proposers(TINY).contains(&p.as_str()) {
                problems.push(format!("a {what} entry names `{p}`, which is not a proposer of {TINY}"));
            }
        }
        for fault in SMOLLM2_FAULTS {
            for p in e2e_section::proposers(SMOLLM2) {
                let n = self.caught_on_smollm2.iter().filter(|c| c.fault == format!("{fault:?}") && c.proposer == p).count();
                if n != 1 {
                    problems.push(format!("{fault:?} with {p} on {SMOLLM2}: caught {n} times, expected once"));
                }
            }
        }
        for c in &self.caught_on_smollm2 {
            if !e2e_section::proposers(SMOLLM2).contains(&c.proposer.as_str()) {
                problems.push(format!("a {SMOLLM2} entry names `{}`, which is not a proposer of {SMOLLM2}", c.proposer));
            }
        }
        if problems.is_empty() { Ok(()) } else { Err(problems.join("\n")) }
    }

    /// Runs every caught entry on `backend`: its check must fail with its
    /// fault injected. Returns one line per entry, or every entry that passed.
    /// The SmolLM2 entries run when `files` gives SmolLM2 and the backend
    /// runs that section; a line says so where they do not.
    pub fn run<B: ModelBackend>(&self, backend: &B, files: &ModelFiles) -> Result<Vec<String>, String> {
        let mut lines = Vec::new();
        let mut blinded = Vec::new();
        let tiny = self.caught.iter().map(|c| (TINY, c));
        let smollm2 = self.caught_on_smollm2.iter().map(|c| (SMOLLM2, c));
        for (model, c) in tiny.chain(smollm2) {
            if model == SMOLLM2 && files.smollm2_gguf.is_none() {
                lines.push(format!("{} x {} on {SMOLLM2}: not run, SmolLM2 not given", c.fault, c.proposer));
                continue;
            }
            let fault: Fault = c.fault.parse()?;
            let name = format!("e2e/{model}/{}/{}", c.proposer, c.check);
            let cfg = SuiteConfig { filter: Some(name.clone()), ..SuiteConfig::default() };
            let engine = EngineConfig { fault: Some(fault), ..e2e_section::engine_config() };
            let results = e2e_section::run_with(backend, &cfg, files, &engine, &mut |_| {});
            let result = results.iter().find(|r| r.name == name).ok_or_else(|| format!("{name}: no such check"))?;
            match result.status {
                Status::Fail => lines.push(format!("{fault:?} x {} on {model} -> {} fails: {}", c.proposer, c.check, result.message.lines().next().unwrap_or(""))),
                Status::NotSupported if model == SMOLLM2 => lines.push(format!("{fault:?} x {} on {SMOLLM2}: not run, {}", c.proposer, result.message)),
                other => blinded.push(format!("{fault:?} x {} on {model} -> {}: {other:?}, expected Fail ({})", c.proposer, c.check, result.message)),
            }
        }
        if blinded.is_empty() { Ok(lines) } else { Err(blinded.join("\n")) }
    }
}
