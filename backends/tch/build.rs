//! The run path of this crate's own test binaries, as in the `specdec`
//! binary's build script: built against libtorch, they start without
//! `LD_LIBRARY_PATH`.

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
