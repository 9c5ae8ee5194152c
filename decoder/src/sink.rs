//! Where a stream of emitted tokens goes, as the engine decides them.

/// Where a stream of emitted tokens goes, as they are decided.
pub trait Sink {
    /// `ids` are request `slot`'s next tokens, in order, each exactly once.
    fn emit(&mut self, slot: usize, ids: &[u32]);
}

impl<F: FnMut(usize, &[u32])> Sink for F {
    fn emit(&mut self, slot: usize, ids: &[u32]) {
        self(slot, ids)
    }
}

/// Discards the stream.
pub struct NoSink;

impl Sink for NoSink {
    fn emit(&mut self, _: usize, _: &[u32]) {}
}
