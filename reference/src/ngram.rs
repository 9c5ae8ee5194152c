//! The n-gram (prompt lookup) proposer, NGRAM-1 .. NGRAM-7: a linear search
//! that defines the answer, and an incremental index that must return
//! exactly the same answer in O(1) amortised time per token.

use std::collections::HashMap;
use std::collections::hash_map::Entry;

use serde::{Deserialize, Serialize};

use crate::PAD;
use crate::error::{Result, SpecError};
use crate::tensor::Tensor;
use crate::validate;

/// Which occurrence of the matched n-gram is used (NGRAM-2). Both prefer
/// the largest n first.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum NgramPolicy {
    /// Seed 001: the most recent (rightmost) occurrence.
    #[default]
    LargestNMostRecent,
    /// vLLM: the earliest (leftmost) occurrence.
    LargestNEarliest,
}

/// N-gram proposer settings (NGRAM-1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct NgramConfig {
    pub ngram_min: usize,
    pub ngram_max: usize,
    /// Maximum number of draft tokens proposed.
    pub k: usize,
    pub policy: NgramPolicy,
    /// NGRAM-5: if set, the proposal leaves room for itself and one bonus token.
    pub max_model_len: Option<usize>,
}

impl Default for NgramConfig {
    /// Seed 001's defaults: n in 1..=4, k = 5.
    fn default() -> Self {
        NgramConfig { ngram_min: 1, ngram_max: 4, k: 5, policy: NgramPolicy::default(), max_model_len: None }
    }
}

/// The largest draft count and n-gram size NGRAM-1 accepts: far beyond any
/// useful value, small enough that no size computation can overflow.
pub const MAX_NGRAM_PARAMETER: usize = 1 << 16;

impl NgramConfig {
    /// NGRAM-1: `1 <= ngram_min <= ngram_max <= 2^16`, `1 <= k <= 2^16`,
    /// `max_model_len >= 1`.
    pub fn validate(&self) -> Result<()> {
        if self.ngram_max > MAX_NGRAM_PARAMETER {
            return Err(SpecError::param("ngram_max", self.ngram_max, "must be <= 65536"));
        }
        if self.k > MAX_NGRAM_PARAMETER {
            return Err(SpecError::param("k", self.k, "must be <= 65536"));
        }
        if self.ngram_min < 1 {
            return Err(SpecError::param("ngram_min", self.ngram_min, "must be >= 1"));
        }
        if self.ngram_max < self.ngram_min {
            return Err(SpecError::param("ngram_max", self.ngram_max, "must be >= ngram_min"));
        }
        if self.k < 1 {
            return Err(SpecError::param("k", self.k, "must be >= 1"));
        }
        if self.max_model_len == Some(0) {
            return Err(SpecError::param("max_model_len", 0, "must be >= 1"));
        }
        Ok(())
    }

    /// NGRAM-5: the number of drafts allowed for a context of `len` tokens.
    fn capped_k(&self, arg: &'static str, seq: usize, len: usize) -> Result<usize> {
        match self.max_model_len {
            None => Ok(self.k),
            Some(max) if len > max => Err(SpecError::ContextTooLong { arg, seq, len, max_model_len: max }),
            Some(max) => Ok(self.k.min(max.saturating_sub(len + 1))),
        }
    }
}

/// The search context of seed 001: prompt and generated tokens, or only the
/// generated ones when `prompt_lookup` is off.
pub fn lookup_context(prompt: &[i64], generated: &[i64], prompt_lookup: bool) -> Vec<i64> {
    if prompt_lookup { prompt.iter().chain(generated).copied().collect() } else { generated.to_vec() }
}

/// NGRAM-4: a context must be non-empty and hold valid ids.
fn validate_context(arg: &'static str, seq: usize, context: &[i64], vocab: usize) -> Result<()> {
    if context.is_empty() {
        return Err(SpecError::EmptyContext { arg, seq });
    }
    for (i, &t) in context.iter().enumerate() {
        validate::token(arg, || vec![seq, i], t, vocab)?;
    }
    Ok(())
}

/// NGRAM-2/3 by linear search over a validated context.
fn search(context: &[i64], cfg: &NgramConfig, k: usize) -> Vec<i64> {
    let len = context.len();
    if k == 0 {
        return Vec::new();
    }
    for n in (cfg.ngram_min..=cfg.ngram_max).rev() {
        if len < n + 1 {
            continue;
        }
        let key = &context[len - n..];
        // Candidate starts exclude the suffix itself: i in [0, len - n).
        let hit = |i: &usize| &context[*i..*i + n] == key;
        let found = match cfg.policy {
            NgramPolicy::LargestNMostRecent => (0..len - n).rev().find(hit),
            NgramPolicy::LargestNEarliest => (0..len - n).find(hit),
        };
        if let Some(i) = found {
            return continuation(context, i + n, k);
        }
    }
    Vec::new()
}

/// NGRAM-3: the (possibly shorter than k) continuation after a match.
fn continuation(context: &[i64], start: usize, k: usize) -> Vec<i64> {
    context[start..(start + k).min(context.len())].to_vec()
}

/// Proposes up to `k` drafts for one context by linear search (NGRAM-2 .. NGRAM-5).
pub fn propose(context: &[i64], vocab: usize, cfg: &NgramConfig) -> Result<Vec<i64>> {
    cfg.validate()?;
    validate_context("context", 0, context, vocab)?;
    let k = cfg.capped_k("context", 0, context.len())?;
    Ok(search(context, cfg, k))
}

/// Batched proposal (NGRAM-7).
///
/// * `contexts` `[B, L]`, PAD beyond each length; `context_lens` `[B]` in `[1, L]`.
///
/// Returns the drafts `[B, k]` (PAD-padded) and the proposal lengths `[B]`.
pub fn propose_batch(contexts: &Tensor<i64>, context_lens: &Tensor<i64>, vocab: usize, cfg: &NgramConfig) -> Result<(Tensor<i64>, Vec<usize>)> {
    cfg.validate()?;
    let dims = validate::rank("contexts", contexts.shape(), 2, "[B, L]")?;
    let (batch, width) = (dims[0], dims[1]);
    if batch == 0 {
        return Err(SpecError::EmptyBatch { arg: "contexts" });
    }
    validate::shape("context_lens", context_lens.shape(), &[batch], "[B]")?;
    let mut lens = Vec::with_capacity(batch);
    for (b, &len) in context_lens.data().iter().enumerate() {
        if len == 0 {
            return Err(SpecError::EmptyContext { arg: "contexts", seq: b });
        }
        if len < 0 || len as u64 > width as u64 {
            return Err(SpecError::LengthOutOfRange { arg: "context_lens", seq: b, len, max: width });
        }
        let row = contexts.lane_at(&[b]);
        let len = len as usize;
        validate_context("contexts", b, &row[..len], vocab)?;
        if let Some(j) = row[len..].iter().position(|&t| t != PAD) {
            return Err(SpecError::PaddingMismatch { arg: "contexts", index: vec![b, len + j], token: row[len + j], expected: "PAD (-1) beyond the context length" });
        }
        cfg.capped_k("contexts", b, len)?;
        lens.push(len);
    }

    let mut drafts = Tensor::full(vec![batch, cfg.k], PAD);
    let mut proposal_lens = Vec::with_capacity(batch);
    for (b, &len) in lens.iter().enumerate() {
        let context = &contexts.lane_at(&[b])[..len];
        let proposal = search(context, cfg, cfg.capped_k("contexts", b, len)?);
        drafts.data_mut()[b * cfg.k..b * cfg.k + proposal.len()].copy_from_slice(&proposal);
        proposal_lens.push(proposal.len());
    }
    Ok((drafts, proposal_lens))
}

/// Where an n-gram has started so far (only starts that exclude the suffix).
#[derive(Debug, Clone, Copy)]
struct Occurrences {
    first: usize,
    last: usize,
}

/// The occurrences of the n-grams that share one hash: nearly always one
/// n-gram; after a collision each distinct n-gram keeps its own entry, told
/// apart by its tokens (at its first start), so the index stays exact.
#[derive(Debug, Clone)]
enum Bucket {
    One(Occurrences),
    Many(Vec<Occurrences>),
}

impl Bucket {
    fn occurrences(&self) -> &[Occurrences] {
        match self {
            Bucket::One(o) => std::slice::from_ref(o),
            Bucket::Many(v) => v,
        }
    }

    fn occurrences_mut(&mut self) -> &mut [Occurrences] {
        match self {
            Bucket::One(o) => std::slice::from_mut(o),
            Bucket::Many(v) => v,
        }
    }

    fn push(&mut self, o: Occurrences) {
        match self {
            Bucket::One(first) => *self = Bucket::Many(vec![*first, o]),
            Bucket::Many(v) => v.push(o),
        }
    }
}

/// Whether `o` records the n-gram `gram` (told by its tokens at its first start).
fn records(tokens: &[i64], o: &Occurrences, gram: &[i64]) -> bool {
    &tokens[o.first..o.first + gram.len()] == gram
}

/// The hashes are already mixed ([`finish`]): the tables use them as they are.
#[derive(Debug, Clone, Copy, Default)]
struct PassThrough(u64);

impl std::hash::Hasher for PassThrough {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        // Only `write_u64` is used; this keeps the hasher total anyway.
        self.0 = bytes.iter().fold(self.0, |h, &b| absorb(h, i64::from(b)));
    }
    fn write_u64(&mut self, h: u64) {
        self.0 = h;
    }
}

type Table = HashMap<u64, Bucket, std::hash::BuildHasherDefault<PassThrough>>;

/// One step of an n-gram's hash, fed its tokens from the last to the first,
/// so the hashes of the n-grams ending at one position come in one pass.
fn absorb(h: u64, token: i64) -> u64 {
    (h.rotate_left(5) ^ token as u64).wrapping_mul(0x517c_c1b7_2722_0a95)
}

/// splitmix64's finaliser: every key bit reaches the bits the table uses.
fn finish(h: u64) -> u64 {
    let h = (h ^ (h >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    let h = (h ^ (h >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    h ^ (h >> 31)
}

/// Incremental n-gram index (NGRAM-6): `propose()` equals [`propose`] on
/// the same tokens after any sequence of appends.
///
/// Each append inserts one start per n (the n-gram that has just stopped
/// being the suffix), so positions arrive in increasing order and keeping
/// the first and last start per n-gram is enough for both policies. The
/// n-grams ending at one position are hashed in one backward pass and
/// compared token by token only on a hash match, so a token costs
/// `O(ngram_max)` hashing plus the comparisons, independent of the context
/// length, and no key is allocated.
#[derive(Debug, Clone)]
pub struct NgramIndex {
    cfg: NgramConfig,
    vocab: usize,
    tokens: Vec<i64>,
    /// `tables[n - ngram_min]` maps an n-gram's hash to its admissible starts.
    tables: Vec<Table>,
    /// The hash bits kept: all of them, except in the unit tests that force
    /// collisions to exercise the buckets that hold several n-grams.
    hash_mask: u64,
}

impl NgramIndex {
    pub fn new(cfg: NgramConfig, vocab: usize) -> Result<Self> {
        cfg.validate()?;
        if vocab == 0 {
            return Err(SpecError::EmptyVocab { arg: "vocab" });
        }
        let tables = vec![Table::default(); cfg.ngram_max - cfg.ngram_min + 1];
        Ok(NgramIndex { cfg, vocab, tokens: Vec::new(), tables, hash_mask: u64::MAX })
    }

    /// The tokens indexed so far.
    pub fn context(&self) -> &[i64] {
        &self.tokens
    }

    /// Appends tokens; all are validated before any is indexed.
    pub fn extend(&mut self, tokens: &[i64]) -> Result<()> {
        for (i, &t) in tokens.iter().enumerate() {
            validate::token("tokens", || vec![self.tokens.len() + i], t, self.vocab)?;
        }
        self.tokens.reserve(tokens.len());
        for &t in tokens {
            self.tokens.push(t);
            // The n-grams ending just before the new token stopped being suffixes:
            // each start `len - 1 - n` became admissible (it is < len - n).
            let end = self.tokens.len() - 1;
            let mut h = 0;
            for n in 1..=self.cfg.ngram_max.min(end) {
                h = absorb(h, self.tokens[end - n]);
                if n >= self.cfg.ngram_min {
                    let start = end - n;
                    let (tokens, table) = (&self.tokens, &mut self.tables[n - self.cfg.ngram_min]);
                    let (gram, here) = (&tokens[start..end], Occurrences { first: start, last: start });
                    match table.entry(finish(h) & self.hash_mask) {
                        Entry::Vacant(e) => {
                            e.insert(Bucket::One(here));
                        }
                        Entry::Occupied(e) => {
                            let bucket = e.into_mut();
                            match bucket.occurrences_mut().iter_mut().find(|o| records(tokens, o, gram)) {
                                Some(o) => o.last = start,
                                None => bucket.push(here),
                            }
                        }
                    }
                }
            }
        }
        Ok(())
    }

    /// The proposal for the current context (NGRAM-2 .. NGRAM-5).
    pub fn propose(&self) -> Result<Vec<i64>> {
        let len = self.tokens.len();
        if len == 0 {
            return Err(SpecError::EmptyContext { arg: "context", seq: 0 });
        }
        let k = self.cfg.capped_k("context", 0, len)?;
        if k == 0 {
            return Ok(Vec::new());
        }
        // The suffixes' hashes, shortest first, in one backward pass; a
        // suffix needs an earlier start, so n < len.
        let longest = self.cfg.ngram_max.min(len - 1);
        let mut hashes = Vec::with_capacity(longest);
        let mut h = 0;
        for n in 1..=longest {
            h = absorb(h, self.tokens[len - n]);
            hashes.push(finish(h) & self.hash_mask);
        }
        for n in (self.cfg.ngram_min..=longest).rev() {
            let suffix = &self.tokens[len - n..];
            let bucket = self.tables[n - self.cfg.ngram_min].get(&hashes[n - 1]);
            let found = bucket.and_then(|b| b.occurrences().iter().find(|o| records(&self.tokens, o, suffix)));
            if let Some(o) = found {
                let start = match self.cfg.policy {
                    NgramPolicy::LargestNMostRecent => o.last,
                    NgramPolicy::LargestNEarliest => o.first,
                };
                return Ok(continuation(&self.tokens, start + n, k));
            }
        }
        Ok(Vec::new())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A small deterministic generator (xorshift64*): values in `0..n`.
    struct Draws(u64);

    impl Draws {
        fn below(&mut self, n: usize) -> usize {
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            (self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 33) as usize % n
        }
    }

    /// NGRAM-6 with the hash cut to two bits, so nearly every n-gram shares a
    /// bucket with others: the index must still tell them apart by their
    /// tokens and agree with the linear search after every append.
    #[test]
    fn colliding_hashes_still_give_the_linear_search_answer() {
        let mut rng = Draws(0x9e37_79b9_7f4a_7c15);
        for policy in [NgramPolicy::LargestNMostRecent, NgramPolicy::LargestNEarliest] {
            for _ in 0..40 {
                let cfg = NgramConfig { ngram_min: 1 + rng.below(2), ngram_max: 3 + rng.below(3), k: 4, policy, max_model_len: None };
                let mut index = NgramIndex::new(cfg, 4).unwrap();
                index.hash_mask = 0b11;
                let mut context = Vec::new();
                for _ in 0..60 {
                    let t = rng.below(4) as i64;
                    context.push(t);
                    index.extend(&[t]).unwrap();
                    assert_eq!(index.propose().unwrap(), search(&context, &cfg, 4), "context {context:?}, {cfg:?}");
                }
                assert!(index.tables.iter().flat_map(|t| t.values()).any(|b| matches!(b, Bucket::Many(_))), "the masked hash made no collision");
            }
        }
    }
}
