//! ERR-1, KV-1: the candle cache holds a write-sink slot (`capacity + 1`);
//! a shape whose size overflows, `capacity = usize::MAX` included, is a
//! typed error naming `capacity`, never an arithmetic overflow or a panic.

use specdec_backend::{Backend, BackendError, ErrorKind};
use specdec_candle::CandleBackend;

#[test]
fn kv_new_overflow_is_a_typed_error() {
    for (b, h, d, c) in [(1, 1, 1, usize::MAX), (usize::MAX, 2, 1, 1), (1 << 20, 1 << 20, 1 << 20, 1 << 20)] {
        match CandleBackend::cpu().kv_new(b, h, d, c).map(|_| ()) {
            Err(BackendError::Invalid(e)) => {
                assert_eq!(e.kind(), ErrorKind::InvalidParameter);
                assert_eq!(e.arg(), Some("capacity"), "{e}");
            }
            other => panic!("({b}, {h}, {d}, {c}): {other:?}"),
        }
    }
}
