// Shared by the build scripts of every package whose binaries link libtorch
// (`include!`d, so it is one file, not a crate): `cli`, `backends/tch`,
// `train`, `benches`. Only where `LIBTORCH` is given (`cargo xtask` sets it):
// without it the tch backend is not built and nothing of libtorch is linked.
//
// - The run path: binaries built against libtorch start without
//   `LD_LIBRARY_PATH` (a library's link arguments do not reach the binaries
//   of the packages that depend on it, so each package says it itself).
// - A CUDA libtorch (`lib/libtorch_cuda.so`, `cargo xtask cuda`): no symbol
//   of `libtorch_cuda` is named by tch, so the linker's default
//   `--as-needed` would drop it, and without its static initialisers libtorch
//   sees no GPU (`tch::Cuda::is_available()` is false). It is linked as needed
//   regardless. Its own dependencies (cuDNN, NCCL, cuBLAS, ...) are the GPU
//   machine's PyTorch's and need not be on the building machine: the linker
//   is told not to resolve them.
fn libtorch_link_args() {
    println!("cargo:rerun-if-env-changed=LIBTORCH");
    let Some(libtorch) = std::env::var_os("LIBTORCH") else { return };
    if std::env::var("CARGO_CFG_TARGET_FAMILY").as_deref() != Ok("unix") {
        return;
    }
    let lib = std::path::Path::new(&libtorch).join("lib");
    println!("cargo:rustc-link-arg=-Wl,-rpath,{}", lib.display());
    if lib.join("libtorch_cuda.so").exists() {
        println!("cargo:rustc-link-arg=-L{}", lib.display());
        println!("cargo:rustc-link-arg=-Wl,--no-as-needed,-ltorch_cuda,--as-needed");
        println!("cargo:rustc-link-arg=-Wl,--allow-shlib-undefined");
    }
}
