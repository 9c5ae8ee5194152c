//! Runs a loop compiled for the widest vector instructions this machine has
//! (AVX-512, else AVX2, else the baseline build), detected once per process.
//!
//! The loops handed to [`widest`] are plain element-wise Rust that the
//! compiler vectorises; inlined into a function built with more features,
//! they run in wider registers. They never fuse a multiply and an add (Rust
//! does not contract them), so every build gives the same bits and only the
//! speed depends on the machine.

use std::sync::OnceLock;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Width {
    Avx512,
    Avx2,
    Baseline,
}

fn width() -> Width {
    static WIDTH: OnceLock<Width> = OnceLock::new();
    *WIDTH.get_or_init(|| {
        #[cfg(target_arch = "x86_64")]
        {
            if std::is_x86_feature_detected!("avx512f") {
                return Width::Avx512;
            }
            if std::is_x86_feature_detected!("avx2") {
                return Width::Avx2;
            }
        }
        Width::Baseline
    })
}

/// `f()`, compiled for the widest instruction set detected. The caller
/// marks the closure `#[inline(always)]`: a closure the compiler declines to
/// inline runs as compiled, for the baseline (the attention's was, at a
/// third of the speed).
#[inline(always)]
pub(crate) fn widest<R>(f: impl FnOnce() -> R) -> R {
    match width() {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: the feature was detected on this machine.
        Width::Avx512 => unsafe { avx512(f) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as above.
        Width::Avx2 => unsafe { avx2(f) },
        _ => f(),
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn avx512<R>(f: impl FnOnce() -> R) -> R {
    f()
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn avx2<R>(f: impl FnOnce() -> R) -> R {
    f()
}
