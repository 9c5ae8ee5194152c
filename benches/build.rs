//! The link arguments of this package's binaries when they link libtorch
//! (see the included file).

include!("../backends/tch/libtorch_link.rs");

fn main() {
    libtorch_link_args();
}
