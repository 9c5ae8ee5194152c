//! torch-sys 0.26 for libtorch 2.11: the `tch` crate the workspace pins (0.26) against the
//! libtorch of the GPU machines' PyTorch (2.11), for `cargo xtask cuda`.
//!
//! torch-sys compiles a C++ wrapper, `libtch`, whose generated half
//! (`torch_api_generated.{h,cpp}`) names every ATen op of its libtorch release; 0.26's names
//! sixteen ops that 2.11 lacks (`_philox_*`, `_upsample_lanczos2d_aa*`, ...), so it does not
//! compile against 2.11's headers. torch-sys 0.24 is the release for 2.11. The patched crate
//! is 0.26 (its Rust side, which tch 0.26 calls) with 0.24's generated wrapper, plus a stub
//! for each of the sixteen that raises "not in libtorch 2.11" as a torch error (tch returns
//! it as `Err`); every other function has the same C signature in both releases (checked here:
//! a difference is an error, not a silent mismatch). Nothing in specdec calls the sixteen.
//!
//! Both crates come from crates.io, pinned by sha256, into `.cache/tch-cuda/` (git-ignored);
//! `cargo build --config patch.crates-io.torch-sys.path=...` then uses the result.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::run_command;
use crate::wheel::python;

/// (version, sha256) of the two releases, from crates.io.
const BASE: (&str, &str) = ("0.26.0", "5ae60ab95333c42adcc1a9e74057357e4324a1f344c403e48712a144ab731019");
const WRAPPER: (&str, &str) = ("0.24.0", "f4ba78777379cf09aaa79708c63e477cf0f95e021d04360c6821f1a9f56173f7");

/// Downloads a crate from crates.io, checks its sha256 and unpacks it.
/// argv: name version sha256 dest   (dest/<name>-<version>/ afterwards)
const FETCH_PY: &str = r#"
import hashlib, io, sys, tarfile, urllib.request
name, version, sha, dest = sys.argv[1:5]
url = f"https://static.crates.io/crates/{name}/{name}-{version}.crate"
data = urllib.request.urlopen(url, timeout=120).read()
if hashlib.sha256(data).hexdigest() != sha:
    sys.exit(f"{url}: sha256 {hashlib.sha256(data).hexdigest()}, expected {sha}")
with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as t:
    t.extractall(dest, filter="data")
"#;

/// Merges the wrapper of `old` (for the older libtorch) into `new`'s crate.
/// argv: old_libtch new_libtch libtorch_version
const MERGE_PY: &str = r#"
import re, sys
old, new, version = sys.argv[1:4]
decl = re.compile(r"^([\w \*]+?)\b(atg_\w+)\(([^;]*)\);$", re.M)
def decls(path):
    return {m.group(2): (m.group(1).strip(), m.group(3)) for m in decl.finditer(open(path).read())}
have, want = decls(old + "/torch_api_generated.h"), decls(new + "/torch_api_generated.h")
missing = [n for n in want if n not in have]
# MPS-only ops may change; any other signature change would make a silent ABI mismatch.
changed = [n for n in want if n in have and have[n] != want[n] and "mps" not in n]
if changed:
    sys.exit(f"signatures differ between the two wrappers: {changed}")
header = open(old + "/torch_api_generated.h").read().rstrip()
assert header.endswith("}"), "unexpected end of torch_api_generated.h"
stubs, decls_added = "", ""
for n in missing:
    ret, params = want[n]
    decls_added += f"{ret} {n}({params});\n"
    value = "" if ret == "void" else " return 0;"
    stubs += f'{ret} {n}({params}) {{\n  PROTECT(throw std::runtime_error("{n}: not in libtorch {version}");)\n {value}}}\n\n'
open(new + "/torch_api_generated.h", "w").write(header[:-1] + decls_added + "}\n")
open(new + "/torch_api_generated.cpp", "w").write(open(old + "/torch_api_generated.cpp").read() + "\n" + stubs)
print(f"torch-sys: {len(missing)} ops stubbed: {', '.join(missing)}")
"#;

/// The patched crate's folder, made once.
pub fn ensure_for_libtorch_2_11(repo: &Path) -> Result<PathBuf, String> {
    let cache = repo.join(".cache/tch-cuda");
    let done = cache.join(format!("torch-sys-{}-libtorch-2.11", BASE.0));
    if done.join(".specdec-ready").is_file() {
        return Ok(done);
    }
    let tmp = cache.join(format!("tmp-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&tmp);
    std::fs::create_dir_all(&tmp).map_err(|e| format!("cannot create {}: {e}", tmp.display()))?;
    let result = (|| {
        for (version, sha) in [BASE, WRAPPER] {
            eprintln!("xtask: fetching torch-sys {version} from crates.io");
            run_command(Command::new(python()).arg("-c").arg(FETCH_PY).args(["torch-sys", version, sha]).arg(&tmp))?;
        }
        let (old, new) = (tmp.join(format!("torch-sys-{}/libtch", WRAPPER.0)), tmp.join(format!("torch-sys-{}", BASE.0)));
        run_command(Command::new(python()).arg("-c").arg(MERGE_PY).arg(&old).arg(new.join("libtch")).arg("2.11"))?;
        std::fs::write(new.join(".specdec-ready"), "torch-sys 0.26.0 with 0.24.0's generated wrapper\n").map_err(|e| e.to_string())?;
        let _ = std::fs::remove_dir_all(&done);
        std::fs::rename(&new, &done).map_err(|e| format!("cannot move {} to {}: {e}", new.display(), done.display()))
    })();
    let _ = std::fs::remove_dir_all(&tmp);
    result.map(|()| done)
}
