//! Lets `specdec` start anywhere when it is built against libtorch, and see
//! the GPU when that libtorch has CUDA (see the included file).

include!("../backends/tch/libtorch_link.rs");

fn main() {
    libtorch_link_args();
}
