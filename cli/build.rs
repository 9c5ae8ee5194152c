//! Lets `specdec` start anywhere when it is built against libtorch: the
//! library directory goes into the binary's run path, so neither
//! `LD_LIBRARY_PATH` nor an install step is needed to run it. (A library's
//! link arguments do not reach the binaries of crates that depend on it, so
//! this must live in the binary's own package.)

fn main() {
    println!("cargo:rerun-if-env-changed=LIBTORCH");
    // Only where libtorch is given (`cargo xtask` sets it): without it the tch
    // backend is not built and nothing of libtorch is linked.
    let Some(libtorch) = std::env::var_os("LIBTORCH") else { return };
    if std::env::var("CARGO_CFG_TARGET_FAMILY").as_deref() == Ok("unix") {
        let lib = std::path::Path::new(&libtorch).join("lib");
        println!("cargo:rustc-link-arg=-Wl,-rpath,{}", lib.display());
    }
}
