//! The link arguments of this crate's own test binaries (see the included file).

include!("libtorch_link.rs");

fn main() {
    libtorch_link_args();
}
