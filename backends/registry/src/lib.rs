//! The one registry of backends: every backend this workspace builds, by
//! name, with what `all` means, and generic dispatch to it. The CLI
//! (`specdec --backend`), the speedup report and `specdec conform` read it;
//! a new backend is one entry in [`ENTRIES`] and one arm in [`with_backend`].
//!
//! Invariants: [`with_backend`] is the only place that constructs a backend
//! by name; a backend unavailable in this build or on this machine (tch
//! without libtorch, CUDA without a GPU) is an `Err` naming why, never a
//! panic; `exec:COMMAND` (an external adapter, `spec/PROTOCOL.md`) is
//! accepted by name and never part of `all`. Each entry has a role
//! ([`Role`]: the reference, a host port, an accelerator port, or a
//! by-name-only variant outside `all`); the unit test
//! `every_name_reaches_its_backend` resolves every name and alias (only an
//! accelerator or an unbuilt tch may be unavailable) and pins `all`.

use specdec_backend::{ModelBackend, ReferenceBackend};

/// What a backend is for, which decides where it appears.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// The f64 reference behind the trait: the kernels' yardstick, too slow for a real model.
    Reference,
    /// A port on the host.
    Host,
    /// A port on an accelerator (unavailable without one).
    Accelerator,
    /// A reduced-precision weight format of a port: by name only, outside `all`.
    /// Their verify windows and one-token decodes take different kernels and
    /// round apart, so speculative greedy output can leave plain greedy output
    /// (the model section's window check fails on both, the end-to-end section
    /// on Q8_0); they are here to be timed and to show the suite catching that.
    Variant,
}

/// One backend of the build.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Entry {
    pub name: &'static str,
    /// Other names `--backend` accepts for it.
    pub aliases: &'static [&'static str],
    pub role: Role,
}

impl Entry {
    /// Whether `--backend all` runs it.
    pub fn in_all(&self) -> bool {
        self.role != Role::Variant
    }
}

/// Every backend, in report order.
pub const ENTRIES: [Entry; 10] = [
    Entry { name: "reference", aliases: &[], role: Role::Reference },
    Entry { name: "ndarray", aliases: &[], role: Role::Host },
    // Lossless Q8_0: batch-invariant products, so windows equal decodes.
    Entry { name: "ndarray-q8_0", aliases: &[], role: Role::Host },
    // The vectorised f32 softmax, within a stated tolerance of the reference.
    Entry { name: "ndarray-f32", aliases: &[], role: Role::Host },
    Entry { name: "candle-cpu", aliases: &["candle"], role: Role::Host },
    Entry { name: "candle-cuda", aliases: &[], role: Role::Accelerator },
    Entry { name: "tch-cpu", aliases: &["tch"], role: Role::Host },
    Entry { name: "tch-cuda", aliases: &[], role: Role::Accelerator },
    Entry { name: "candle-cpu-f16", aliases: &[], role: Role::Variant },
    Entry { name: "candle-cpu-q8_0", aliases: &[], role: Role::Variant },
];

/// The names `all` stands for, in report order.
pub fn all_names() -> Vec<&'static str> {
    ENTRIES.iter().filter(|e| e.in_all()).map(|e| e.name).collect()
}

/// The names accepted by name only.
pub fn opt_in_names() -> Vec<&'static str> {
    ENTRIES.iter().filter(|e| !e.in_all()).map(|e| e.name).collect()
}

/// Work that runs on any backend (every backend of this build also runs models).
pub trait Job {
    type Out;
    /// `name` is the registry's name of `backend`.
    fn run<B: ModelBackend>(&mut self, name: &str, backend: &B) -> Self::Out;
}

/// Runs `job` on the backend called `name` (or an alias); `Err` says why it
/// is unavailable in this build or on this machine, or that no backend has
/// that name.
pub fn with_backend<J: Job>(name: &str, job: &mut J) -> Result<J::Out, String> {
    let canonical = ENTRIES.iter().find(|e| e.name == name || e.aliases.contains(&name)).map_or(name, |e| e.name);
    match canonical {
        "reference" => Ok(job.run(canonical, &ReferenceBackend)),
        "ndarray" => Ok(job.run(canonical, &specdec_ndarray::NdarrayBackend::new())),
        "ndarray-q8_0" => Ok(job.run(canonical, &specdec_ndarray::NdarrayBackend::q8_0())),
        "ndarray-f32" => Ok(job.run(canonical, &specdec_ndarray::NdarrayBackend::f32_softmax())),
        "candle-cpu" => Ok(job.run(canonical, &specdec_candle::CandleBackend::cpu())),
        "candle-cpu-f16" => Ok(job.run(canonical, &specdec_candle::CandleBackend::cpu_f16())),
        "candle-cpu-q8_0" => Ok(job.run(canonical, &specdec_candle::CandleBackend::cpu_q8_0())),
        "candle-cuda" => specdec_candle::CandleBackend::cuda(0).map(|b| job.run(canonical, &b)),
        "tch-cpu" => specdec_tch::TchBackend::try_cpu().map(|b| job.run(canonical, &b)),
        "tch-cuda" => specdec_tch::TchBackend::cuda_if_available().map(|b| job.run(canonical, &b)),
        // An external adapter in any language (spec/PROTOCOL.md), run with `sh -c`.
        other if other.starts_with("exec:") => {
            let timeout = specdec_exec::timeout_from_env()?;
            specdec_exec::ExecBackend::with_timeout(&other["exec:".len()..], timeout).map(|b| job.run(other, &b)).map_err(|e| e.to_string())
        }
        other => Err(format!("unknown backend `{other}`; known: {}, {}, exec:COMMAND", all_names().join(", "), opt_in_names().join(", "))),
    }
}

/// Runs `job` on every entry `wanted` keeps that is available here, in
/// registry order; returns each entry's name and its outcome (`Err`: why it
/// did not run).
pub fn each<J: Job>(job: &mut J, wanted: impl Fn(&Entry) -> bool) -> Vec<(&'static str, Result<J::Out, String>)> {
    ENTRIES.iter().filter(|e| wanted(e)).map(|e| (e.name, with_backend(e.name, job))).collect()
}

/// One line describing a backend: its device and precision.
pub struct Describe;

impl Job for Describe {
    type Out = String;
    fn run<B: ModelBackend>(&mut self, _name: &str, b: &B) -> String {
        let p = b.precision();
        let m = b.model_precision();
        format!(
            "device {}, {} values, {} accumulation, margin epsilon {:e}, value tolerance {:e}; model: {} weights, {} compute, logit tolerance {:e} (relative), hidden-state tolerance {:e} (relative), argmax epsilon {:e} (against the reference), {:e} (windows against decodes)",
            b.device(),
            p.float_dtype,
            p.accumulate_dtype,
            p.margin_epsilon,
            p.value_tolerance,
            m.weight_dtype,
            m.compute_dtype,
            m.logit_rel_tolerance,
            m.hidden_rel_tolerance,
            m.argmax_margin_epsilon,
            m.window_margin_epsilon
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Name;
    impl Job for Name {
        type Out = String;
        fn run<B: ModelBackend>(&mut self, name: &str, b: &B) -> String {
            format!("{name}={}", b.name())
        }
    }

    /// Every entry and alias dispatches to the backend of that name (or says
    /// why it is unavailable), and an unknown name is refused with the list.
    #[test]
    fn every_name_reaches_its_backend() {
        for e in ENTRIES {
            for name in std::iter::once(e.name).chain(e.aliases.iter().copied()) {
                match with_backend(name, &mut Name) {
                    Ok(s) => assert_eq!(s, format!("{}={}", e.name, e.name), "`{name}`"),
                    Err(why) => assert!(e.role == Role::Accelerator || e.name.starts_with("tch"), "only GPU and unbuilt backends may be unavailable: {name}: {why}"),
                }
            }
        }
        let err = with_backend("nonesuch", &mut Name).unwrap_err();
        assert!(err.contains("unknown backend `nonesuch`") && err.contains("tch-cuda") && err.contains("candle-cpu-q8_0"), "{err}");
        assert_eq!(all_names(), ["reference", "ndarray", "ndarray-q8_0", "ndarray-f32", "candle-cpu", "candle-cuda", "tch-cpu", "tch-cuda"]);
    }
}
