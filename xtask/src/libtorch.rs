//! Obtain a `libtorch` for the `tch` crate from `PyPI` wheels: [`CPU`], the one every build
//! of the workspace uses (torch-sys 0.26's libtorch 2.13, without its CUDA library), and
//! [`CUDA`], the libtorch of a GPU machine's PyTorch (see `cuda.rs`).
//!
//! There is no CPU-only torch wheel on `PyPI`: the Linux `x86_64` `torch==2.13.0` wheel is the
//! CUDA 13 build. Its `libtorch_cpu.so` works on machines without a GPU, but needs
//! `libcudart.so.13` and `libcupti.so.13` at load time, so those two are taken from the
//! `nvidia-cuda-runtime` and `nvidia-cuda-cupti` wheels (the versions the torch wheel pins
//! through `cuda-toolkit==13.0.3`). `libtorch_cuda.so` is deliberately left out: torch-sys
//! links it whenever it is present, and it would drag in cuBLAS, cuDNN, NCCL, ...
//!
//! Layout produced under `<repo_root>/.cache/libtorch` (about 486 MB):
//!
//! ```text
//! build-version            "2.13.0" (torch-sys checks it against its own version)
//! include/...              torch/include/* from the torch wheel
//! lib/libtorch_cpu.so      from the torch wheel
//! lib/libc10.so            from the torch wheel
//! lib/libgomp.so.1         from the torch wheel
//! lib/libcudart.so.13      nvidia/cu13/lib/ from nvidia-cuda-runtime 13.0.96
//! lib/libcupti.so.13       nvidia/cu13/lib/ from nvidia-cuda-cupti 13.0.85
//! lib/libtorch.so   -> libtorch_cpu.so   (torch-sys always passes -ltorch)
//! lib/libgomp.so    -> libgomp.so.1      (torch-sys passes -lgomp; use torch's copy)
//! ```
//!
//! The torch libraries carry `RPATH=$ORIGIN`, so the CUDA runtime libraries are found beside
//! them. The final test/bench binaries, however, get no search path for `lib/` from torch-sys:
//! run them with `LD_LIBRARY_PATH` from [`libtorch_env`], or add
//! `cargo:rustc-link-arg=-Wl,-rpath,<LIBTORCH>/lib` from a build script.
//!
//! Downloading and unpacking are `wheel.rs`'s (`pip download` and `zipfile`).

use std::ffi::OsStr;
use std::fs;
use std::path::{Path, PathBuf};

use crate::wheel::{self, Wheel, clean_stale_temps, python, remove_any};

/// The libtorch version torch-sys 0.26 expects.
pub const TORCH_VERSION: &str = "2.13.0";

/// One libtorch folder assembled from wheels, under `.cache/<dir>`.
pub struct Flavor {
    dir: &'static str,
    /// What `build-version` says (torch-sys compares it with its own version).
    pub version: &'static str,
    wheels: &'static [Wheel<'static>],
    /// Regular files that must exist (non-empty) in a ready folder.
    required: &'static [&'static str],
    /// Symlinks created in `lib/` (link name, target).
    symlinks: &'static [(&'static str, &'static str)],
    /// Whether `lib/libtorch_cuda.so` must be there (it makes torch-sys link CUDA) or must not.
    cuda: bool,
}

/// Environment variables that make torch-sys ignore or override `LIBTORCH`, or force an
/// unneeded rebuild of its C++ wrapper; remove them from cargo invocations
/// (`Command::env_remove`) that use [`libtorch_env`].
pub const LIBTORCH_ENV_REMOVE: &[&str] = &["LIBTORCH_USE_PYTORCH", "LIBTORCH_INCLUDE", "LIBTORCH_LIB", "LIBTORCH_STATIC", "LIBTORCH_CXX11_ABI", "LIBTORCH_BYPASS_VERSION_CHECK"];

const CPU_WHEELS: [Wheel<'static>; 3] = [
    Wheel {
        requirement: "torch==2.13.0",
        file: "torch-2.13.0-cp311-cp311-manylinux_2_28_x86_64.whl",
        sha256: "60fcdcb2f3876e21146cb4524ef06397d727ca9ad5f020818547e25075fe3cb7",
        members: &[
            ("torch/include/", "include/", None),
            ("torch/lib/libtorch_cpu.so", "lib/libtorch_cpu.so", None),
            ("torch/lib/libc10.so", "lib/libc10.so", None),
            ("torch/lib/libgomp.so.1", "lib/libgomp.so.1", None),
        ],
    },
    Wheel {
        requirement: "nvidia-cuda-runtime==13.0.96",
        file: "nvidia_cuda_runtime-13.0.96-py3-none-manylinux2014_x86_64.manylinux_2_17_x86_64.whl",
        sha256: "7f82250d7782aa23b6cfe765ecc7db554bd3c2870c43f3d1821f1d18aebf0548",
        members: &[("nvidia/cu13/lib/libcudart.so.13", "lib/libcudart.so.13", None)],
    },
    Wheel {
        requirement: "nvidia-cuda-cupti==13.0.85",
        file: "nvidia_cuda_cupti-13.0.85-py3-none-manylinux_2_25_x86_64.whl",
        sha256: "4eb01c08e859bf924d222250d2e8f8b8ff6d3db4721288cf35d14252a4d933c8",
        members: &[("nvidia/cu13/lib/libcupti.so.13", "lib/libcupti.so.13", None)],
    },
];

/// The CPU libtorch of every build (layout in the module doc).
pub const CPU: Flavor = Flavor {
    dir: "libtorch",
    version: TORCH_VERSION,
    wheels: &CPU_WHEELS,
    required: &["include/ATen/ATen.h", "include/torch/csrc/api/include/torch/torch.h", "lib/libtorch_cpu.so", "lib/libc10.so", "lib/libgomp.so.1", "lib/libcudart.so.13", "lib/libcupti.so.13"],
    symlinks: &[("libtorch.so", "libtorch_cpu.so"), ("libgomp.so", "libgomp.so.1")],
    cuda: false,
};

/// The libtorch of the GPU machines' PyTorch (2.11, CUDA 13), only to link against: its
/// libraries load from that PyTorch's own `torch/lib` where the binary runs, since
/// `libtorch_cuda.so` (456 MB) and the CUDA libraries it needs are too large to carry there.
/// Its headers and the libraries the binary names; nothing of CUDA beside them.
pub const CUDA: Flavor = Flavor {
    dir: "libtorch-cuda",
    version: "2.11.0",
    wheels: &[Wheel {
        requirement: "torch==2.11.0",
        file: "torch-2.11.0-cp311-cp311-manylinux_2_28_x86_64.whl",
        sha256: "7aa2f9bbc6d4595ba72138026b2074be1233186150e9292865e04b7a63b8c67a",
        members: &[
            ("torch/include/", "include/", None),
            ("torch/lib/libtorch.so", "lib/libtorch.so", None),
            ("torch/lib/libtorch_cpu.so", "lib/libtorch_cpu.so", None),
            ("torch/lib/libtorch_cuda.so", "lib/libtorch_cuda.so", None),
            ("torch/lib/libc10.so", "lib/libc10.so", None),
            ("torch/lib/libc10_cuda.so", "lib/libc10_cuda.so", None),
            ("torch/lib/libgomp.so.1", "lib/libgomp.so.1", None),
        ],
    }],
    required: &[
        "include/ATen/ATen.h",
        "include/torch/csrc/api/include/torch/torch.h",
        "lib/libtorch.so",
        "lib/libtorch_cpu.so",
        "lib/libtorch_cuda.so",
        "lib/libc10.so",
        "lib/libc10_cuda.so",
        "lib/libgomp.so.1",
    ],
    symlinks: &[("libgomp.so", "libgomp.so.1")],
    cuda: true,
};

/// pip needs every manylinux tag the three wheels use; it does not infer older ones.
const PLATFORMS: &[&str] = &["manylinux_2_28_x86_64", "manylinux_2_25_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64"];

fn progress(msg: &str) {
    eprintln!("[libtorch] {msg}");
}

/// Returns the absolute path of the ready [`CPU`] LIBTORCH folder, `<repo_root>/.cache/libtorch`.
pub fn ensure_libtorch(repo_root: &Path) -> Result<PathBuf, String> {
    ensure(repo_root, &CPU)
}

/// Returns the absolute path of a ready LIBTORCH folder, `<repo_root>/.cache/<flavor dir>`,
/// downloading the wheels into `<repo_root>/.cache/wheels` and assembling the folder if needed.
///
/// The folder is built in a temporary sibling and renamed into place, so an interrupted run
/// never leaves a folder that looks ready. When the folder is already complete this only
/// stats a few files.
pub fn ensure(repo_root: &Path, flavor: &Flavor) -> Result<PathBuf, String> {
    if !(cfg!(target_os = "linux") && cfg!(target_arch = "x86_64")) {
        return Err(format!(
            "libtorch from PyPI wheels is only set up for Linux x86_64; on this host install \
             libtorch {} yourself and set LIBTORCH to it",
            flavor.version
        ));
    }
    for var in LIBTORCH_ENV_REMOVE {
        if std::env::var_os(var).is_some() {
            progress(&format!("warning: {var} is set; torch-sys reads it, remove it from cargo's environment"));
        }
    }
    let repo_root = fs::canonicalize(repo_root).map_err(|e| format!("cannot resolve repository root {}: {e}", repo_root.display()))?;
    let cache = repo_root.join(".cache");
    let name = flavor.dir;
    let target = cache.join(name);

    match check_ready(&target, flavor) {
        Ok(()) => return Ok(target),
        Err(reason) if fs::symlink_metadata(&target).is_ok() => {
            progress(&format!("{} is incomplete ({reason}); rebuilding it", target.display()));
            let stale = cache.join(format!("{name}.stale-{}", std::process::id()));
            fs::rename(&target, &stale).and_then(|()| remove_any(&stale)).map_err(|e| format!("cannot remove incomplete {}: {e}; delete it by hand and rerun", target.display()))?;
        }
        Err(_) => {}
    }

    let wheels_dir = cache.join("wheels");
    fs::create_dir_all(&wheels_dir).map_err(|e| format!("cannot create {}: {e}", wheels_dir.display()))?;
    clean_stale_temps(&cache, &[&format!("{name}.tmp-"), &format!("{name}.stale-")]);
    clean_stale_temps(&wheels_dir, &[".tmp-"]);

    let python = python();
    wheel::download(&python, &wheels_dir, &flavor.wheels.iter().collect::<Vec<_>>(), PLATFORMS, "libtorch")?;

    let tmp = cache.join(format!("{name}.tmp-{}", std::process::id()));
    let _ = remove_any(&tmp);
    let result = assemble(&python, &wheels_dir, &tmp, flavor).and_then(|()| check_ready(&tmp, flavor).map_err(|reason| format!("assembled folder {} is not usable: {reason}", tmp.display())));
    if let Err(e) = result {
        let _ = remove_any(&tmp);
        return Err(e);
    }
    if let Err(e) = fs::rename(&tmp, &target) {
        let _ = remove_any(&tmp);
        // Another process may have finished first.
        if check_ready(&target, flavor).is_ok() {
            return Ok(target);
        }
        return Err(format!("cannot move {} to {}: {e}", tmp.display(), target.display()));
    }
    progress(&format!("ready: {}", target.display()));
    Ok(target)
}

/// Environment for a cargo invocation that builds or runs code linking `tch`:
/// `LIBTORCH` (torch-sys reads it; no download happens) and `LD_LIBRARY_PATH` with
/// `<libtorch>/lib` prepended (the built binaries have no rpath to it).
///
/// `LIBTORCH_BYPASS_VERSION_CHECK` is not needed: `build-version` says `2.13.0`, exactly what
/// torch-sys 0.26 checks for. Also remove [`LIBTORCH_ENV_REMOVE`] from the command.
pub fn libtorch_env(libtorch: &Path) -> Vec<(String, String)> {
    let lib = libtorch.join("lib").to_string_lossy().into_owned();
    let mut ld = vec![lib.clone()];
    if let Some(old) = std::env::var_os("LD_LIBRARY_PATH") {
        ld.extend(old.to_string_lossy().split(':').filter(|p| !p.is_empty() && *p != lib).map(str::to_owned));
    }
    vec![("LIBTORCH".to_owned(), libtorch.to_string_lossy().into_owned()), ("LD_LIBRARY_PATH".to_owned(), ld.join(":"))]
}

/// `Ok(())` if `dir` is a complete libtorch folder, else the first problem found.
fn check_ready(dir: &Path, flavor: &Flavor) -> Result<(), String> {
    let version = fs::read_to_string(dir.join("build-version")).map_err(|_| "no build-version".to_owned())?;
    if version.trim() != flavor.version {
        return Err(format!("build-version is {:?}, want {}", version.trim(), flavor.version));
    }
    for rel in flavor.required {
        match fs::metadata(dir.join(rel)) {
            Ok(m) if m.is_file() && m.len() > 0 => {}
            _ => return Err(format!("missing {rel}")),
        }
    }
    for (link, _) in flavor.symlinks {
        // metadata follows the link, so a dangling link fails here.
        if !fs::metadata(dir.join("lib").join(link)).is_ok_and(|m| m.is_file()) {
            return Err(format!("missing lib/{link}"));
        }
    }
    if !flavor.cuda && fs::symlink_metadata(dir.join("lib/libtorch_cuda.so")).is_ok() {
        return Err("lib/libtorch_cuda.so must not be there (torch-sys would link CUDA)".to_owned());
    }
    Ok(())
}

/// Extracts the needed members of every wheel into `dir` and adds symlinks and build-version.
fn assemble(python: &OsStr, wheels_dir: &Path, dir: &Path, flavor: &Flavor) -> Result<(), String> {
    fs::create_dir_all(dir.join("lib")).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    for w in flavor.wheels {
        progress(&format!("extracting {}", w.file));
        wheel::extract(python, wheels_dir, w, dir, PLATFORMS, "libtorch")?;
    }
    let lib = dir.join("lib");
    for (link, to) in flavor.symlinks {
        std::os::unix::fs::symlink(to, lib.join(link)).map_err(|e| format!("cannot create symlink lib/{link} -> {to}: {e}"))?;
    }
    fs::write(dir.join("build-version"), format!("{}\n", flavor.version)).map_err(|e| format!("cannot write build-version: {e}"))?;
    Ok(())
}
