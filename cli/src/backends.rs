//! The backends this build knows, and generic dispatch to them.

use specdec_backend::{ModelBackend, ReferenceBackend};

/// The backends of `all`, in report order (`candle` and `tch` are accepted
/// as aliases of their CPU devices; `exec:COMMAND` runs an external adapter
/// and is never part of `all`).
pub const NAMES: [&str; 6] = ["reference", "ndarray", "candle-cpu", "candle-cuda", "tch-cpu", "tch-cuda"];

/// Backends `--backend` accepts by name that are not part of `all`: the
/// reduced-precision weight formats, whose verify windows and one-token
/// decodes take different kernels in candle and round apart, so their
/// speculative greedy output can leave plain greedy output (the model
/// section's window check fails on both, the end-to-end section on Q8_0).
/// They are here to be timed and to show the suite catching that.
pub const OPT_IN: [&str; 2] = ["candle-cpu-f16", "candle-cpu-q8_0"];

/// Work that runs on any backend (every backend of this build also runs models).
pub trait Job {
    type Out;
    fn run<B: ModelBackend>(&self, backend: &B) -> Self::Out;
}

/// Runs `job` on the backend called `name`; `Err` says why it is unavailable
/// in this build or on this machine.
pub fn with_backend<J: Job>(name: &str, job: &J) -> Result<J::Out, String> {
    match name {
        "reference" => Ok(job.run(&ReferenceBackend)),
        "ndarray" => Ok(job.run(&specdec_ndarray::NdarrayBackend::new())),
        "candle-cpu" | "candle" => Ok(job.run(&specdec_candle::CandleBackend::cpu())),
        // Reduced-precision model weights, opt-in (`OPT_IN`): not lossless, see there.
        "candle-cpu-f16" => Ok(job.run(&specdec_candle::CandleBackend::cpu_f16())),
        "candle-cpu-q8_0" => Ok(job.run(&specdec_candle::CandleBackend::cpu_q8_0())),
        "candle-cuda" => specdec_candle::CandleBackend::cuda(0).map(|b| job.run(&b)),
        "tch-cpu" | "tch" => specdec_tch::TchBackend::try_cpu().map(|b| job.run(&b)),
        "tch-cuda" => specdec_tch::TchBackend::cuda_if_available().map(|b| job.run(&b)),
        // An external adapter in any language (spec/PROTOCOL.md), run with `sh -c`.
        other if other.starts_with("exec:") => {
            let timeout = specdec_exec::timeout_from_env()?;
            specdec_exec::ExecBackend::with_timeout(&other["exec:".len()..], timeout).map(|b| job.run(&b)).map_err(|e| e.to_string())
        }
        other => Err(format!("unknown backend `{other}`; known: {}, {}, exec:COMMAND", NAMES.join(", "), OPT_IN.join(", "))),
    }
}

/// One line describing a backend: its device and precision.
pub struct Describe;

impl Job for Describe {
    type Out = String;
    fn run<B: ModelBackend>(&self, b: &B) -> String {
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
