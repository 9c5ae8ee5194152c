//! `cargo xtask cuda`: builds `specdec` with both GPU backends, candle's
//! `cuda` feature and tch against a CUDA libtorch, on a machine with no GPU
//! and no system CUDA, from PyPI and crates.io alone, so that the binaries
//! can be carried to a GPU machine and run there (`specdec conform --backend
//! candle-cuda`, `--backend tch-cuda`). Beside `specdec` it builds
//! `specdec-train` (DFlash training on `--device cuda`) and the speedup
//! report's bench binary.
//!
//! What the build needs and where it comes from:
//! - `nvcc` (candle's kernels are compiled to PTX at build time, and
//!   cudarc asks `nvcc --version` for the CUDA version): the
//!   `cuda-toolkit` wheels, in a cached venv in the git-ignored cache folder.
//! - Link-time libraries: candle turns on cudarc's `dynamic-linking`, so the
//!   binary links `-lcuda -lnvrtc -lcurand -lcublas -lcublasLt -lcudart`.
//!   All but `libcuda` come with the same wheels; they are linked through
//!   unversioned names made in the cached link root (`lib64` under `cuda/root` in the cache folder).
//! - `libcuda.so` ships only with a GPU driver. A stub with the soname
//!   `libcuda.so.1` stands in for it at link time: it defines every driver
//!   entry point cudarc's bindings name (read from cudarc's own source), so
//!   the link resolves, and the binary then loads the driver's real
//!   `libcuda.so.1` where it runs. The stub is never run.
//! - tch: the binary links libtorch 2.11, the release of the GPU machines'
//!   PyTorch, from PyPI's torch wheel of that version (`libtorch::CUDA`),
//!   and loads that PyTorch's own `torch/lib` where it runs (put it on
//!   `LD_LIBRARY_PATH`): `libtorch_cuda.so` and the CUDA libraries it needs
//!   are far larger than what can be carried there. tch stays at 0.26 with a
//!   patched torch-sys (`torch_sys.rs`); the patch exists for this build only
//!   (a `--config` patch; `Cargo.lock`, which it would rewrite, is restored).
//!
//! Everything is cached and idempotent; the binaries go to
//! `target/cuda/release/` (`specdec`, `specdec-train`, `deps/report-*`). At
//! run time they need the driver, PyTorch 2.11's `torch/lib` and the CUDA 13
//! runtime libraries (cuBLAS, cuRAND, NVRTC, cudart: PyTorch's `nvidia/*/lib`)
//! on the library path.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::{libtorch, run_command, torch_sys};

/// The toolkit release the kernels are built with (its nvcc is 13.0.88).
pub const TOOLKIT_PIN: &str = "cuda-toolkit[nvcc,cccl,cudart,cublas,curand,nvrtc]==13.0.3";

/// The libraries cudarc links besides the driver, by the name the linker
/// looks for.
const LINKED: [&str; 5] = ["cudart", "nvrtc", "curand", "cublas", "cublasLt"];

/// The packages, targets and features of the GPU build.
const BUILD_ARGS: [&str; 14] = [
    "build",
    "--release",
    "--target-dir",
    "target/cuda",
    "-p",
    "specdec-cli",
    "-p",
    "specdec-train",
    "-p",
    "specdec-benches",
    "--bins",
    "--bench",
    "report",
    "--features=specdec-cli/tch,specdec-cli/cuda,specdec-train/libtorch,specdec-benches/libtorch,specdec-benches/cuda",
];

/// Builds the GPU binaries for GPUs of compute capability `compute_cap`
/// (90 for the H100 and H200) and returns the `specdec` binary's path.
pub fn build(root: &Path, compute_cap: u32) -> Result<PathBuf, String> {
    let cuda = root.join(".cache/cuda");
    let toolkit = ensure_toolkit(&cuda)?;
    let link_root = ensure_link_root(root, &cuda, &toolkit)?;
    let libtorch = libtorch::ensure(root, &libtorch::CUDA)?;
    let torch_sys = torch_sys::ensure_for_libtorch_2_11(root)?;
    let path = std::env::var_os("PATH").unwrap_or_default();
    let mut paths = vec![link_root.join("bin")];
    paths.extend(std::env::split_paths(&path));
    let mut cmd = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
    cmd.current_dir(root)
        .args(BUILD_ARGS)
        .arg("--config")
        .arg(format!("patch.crates-io.torch-sys.path={:?}", torch_sys.display().to_string()))
        .env("CUDA_HOME", &link_root)
        .env("CUDA_COMPUTE_CAP", compute_cap.to_string())
        .env("PATH", std::env::join_paths(paths).map_err(|e| format!("PATH: {e}"))?);
    for var in libtorch::LIBTORCH_ENV_REMOVE {
        cmd.env_remove(var);
    }
    // build-version says 2.11.0, which torch-sys 0.26 would refuse.
    cmd.env("LIBTORCH", &libtorch).env("LIBTORCH_BYPASS_VERSION_CHECK", "1");
    // The patch rewrites torch-sys's entry in Cargo.lock; the lock stays the workspace's.
    let lock_path = root.join("Cargo.lock");
    let lock = std::fs::read(&lock_path).map_err(|e| format!("cannot read {}: {e}", lock_path.display()))?;
    let built = run_command(&mut cmd);
    std::fs::write(&lock_path, lock).map_err(|e| format!("cannot restore {}: {e}", lock_path.display()))?;
    built?;
    let release = root.join("target/cuda/release");
    eprintln!(
        "xtask: built {}, {} and the bench {}; where they run, put PyTorch 2.11's torch/lib and its nvidia/*/lib folders on LD_LIBRARY_PATH",
        release.join("specdec").display(),
        release.join("specdec-train").display(),
        newest_bench(&release.join("deps")).map_or_else(|| "(not found)".into(), |p| p.display().to_string())
    );
    Ok(release.join("specdec"))
}

/// The most recently built `report-*` bench binary in `deps`.
fn newest_bench(deps: &Path) -> Option<PathBuf> {
    std::fs::read_dir(deps)
        .ok()?
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .filter(|p| p.file_name().and_then(|f| f.to_str()).is_some_and(|f| f.starts_with("report-") && !f.contains('.')))
        .max_by_key(|p| p.metadata().and_then(|m| m.modified()).ok())
}

/// The wheels' CUDA tree (`bin/nvcc`, `include`, `lib`, `nvvm`).
fn ensure_toolkit(cuda: &Path) -> Result<PathBuf, String> {
    let venv = cuda.join("venv");
    let stamp = venv.join(".specdec-cuda");
    let python = venv.join("bin/python");
    if !std::fs::read_to_string(&stamp).is_ok_and(|s| s.trim() == TOOLKIT_PIN) {
        std::fs::create_dir_all(cuda).map_err(|e| format!("cannot create {}: {e}", cuda.display()))?;
        run_command(Command::new("python3").args(["-m", "venv", "--clear"]).arg(&venv))?;
        run_command(Command::new(&python).args(["-m", "pip", "install", "--quiet", "--disable-pip-version-check", TOOLKIT_PIN]))?;
        std::fs::write(&stamp, TOOLKIT_PIN).map_err(|e| format!("cannot write {}: {e}", stamp.display()))?;
    }
    let out = Command::new(&python).args(["-c", "import nvidia, os; print(os.path.join(list(nvidia.__path__)[0], 'cu13'))"]).output().map_err(|e| format!("cannot run {}: {e}", python.display()))?;
    let tree = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
    if !tree.join("bin/nvcc").is_file() {
        return Err(format!("no nvcc under {} after installing {TOOLKIT_PIN}", tree.display()));
    }
    Ok(tree)
}

/// A CUDA root in the layout cudarc's build script searches (`CUDA_HOME`
/// with `bin`, `include` and `lib64`), made of links into the wheels and
/// the driver stub.
fn ensure_link_root(repo: &Path, cuda: &Path, toolkit: &Path) -> Result<PathBuf, String> {
    let link_root = cuda.join("root");
    let lib64 = link_root.join("lib64");
    std::fs::create_dir_all(&lib64).map_err(|e| format!("cannot create {}: {e}", lib64.display()))?;
    for dir in ["bin", "include", "nvvm"] {
        relink(&toolkit.join(dir), &link_root.join(dir))?;
    }
    for name in LINKED {
        let versioned = versioned_library(&toolkit.join("lib"), name)?;
        relink(&versioned, &lib64.join(format!("lib{name}.so")))?;
    }
    let stub = lib64.join("libcuda.so");
    if !stub.is_file() {
        let source = cuda.join("libcuda-stub.c");
        let names = driver_entry_points(repo)?;
        let body: String = names.iter().map(|n| format!("void {n}(void) {{}}\n")).collect();
        std::fs::write(&source, body).map_err(|e| format!("cannot write {}: {e}", source.display()))?;
        run_command(Command::new("cc").args(["-shared", "-fPIC", "-Wl,-soname,libcuda.so.1", "-o"]).arg(&stub).arg(&source))?;
    }
    Ok(link_root)
}

/// `lib{name}.so.<major>` in `lib` (not the `.alt` variants).
fn versioned_library(lib: &Path, name: &str) -> Result<PathBuf, String> {
    let prefix = format!("lib{name}.so.");
    let entries = std::fs::read_dir(lib).map_err(|e| format!("cannot read {}: {e}", lib.display()))?;
    let mut found: Vec<PathBuf> = entries.filter_map(|e| e.ok()).map(|e| e.path()).filter(|p| p.file_name().and_then(|f| f.to_str()).is_some_and(|f| f.starts_with(&prefix))).collect();
    found.sort();
    found.into_iter().next().ok_or_else(|| format!("no {prefix}* in {}", lib.display()))
}

fn relink(target: &Path, link: &Path) -> Result<(), String> {
    if std::fs::read_link(link).is_ok_and(|t| t == target) {
        return Ok(());
    }
    let _ = std::fs::remove_file(link);
    std::os::unix::fs::symlink(target, link).map_err(|e| format!("cannot link {} -> {}: {e}", link.display(), target.display()))
}

/// Every driver function cudarc's bindings load by name, read from the
/// cudarc source cargo has fetched (its version from `Cargo.lock`).
fn driver_entry_points(repo: &Path) -> Result<Vec<String>, String> {
    let lock = std::fs::read_to_string(repo.join("Cargo.lock")).map_err(|e| format!("cannot read Cargo.lock: {e}"))?;
    let version = lock
        .split("[[package]]")
        .find(|p| p.contains("name = \"cudarc\""))
        .and_then(|p| p.lines().find_map(|l| l.strip_prefix("version = \"")).map(|v| v.trim_end_matches('"').to_string()))
        .ok_or("Cargo.lock has no cudarc package")?;
    let cargo_home = std::env::var_os("CARGO_HOME").map(PathBuf::from).or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cargo"))).ok_or("neither CARGO_HOME nor HOME is set")?;
    let registry = cargo_home.join("registry/src");
    run_command(Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into())).current_dir(repo).arg("fetch"))?;
    let sources = std::fs::read_dir(&registry).map_err(|e| format!("cannot read {}: {e}", registry.display()))?;
    let bindings = sources
        .filter_map(|e| e.ok())
        .map(|e| e.path().join(format!("cudarc-{version}/src/driver/sys/mod.rs")))
        .find(|p| p.is_file())
        .ok_or_else(|| format!("cudarc {version} is not in {}", registry.display()))?;
    let text = std::fs::read_to_string(&bindings).map_err(|e| format!("cannot read {}: {e}", bindings.display()))?;
    let mut names: Vec<String> = text
        .split("load::<_F>(\"")
        .skip(1)
        .filter_map(|s| s.split('"').next())
        .filter(|n| n.starts_with("cu") && n.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'))
        .map(str::to_string)
        .collect();
    names.sort();
    names.dedup();
    if names.is_empty() {
        return Err(format!("no driver entry points found in {}", bindings.display()));
    }
    Ok(names)
}
