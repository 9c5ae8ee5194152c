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
/// Positions are `u32` ([`MAX_INDEXED_TOKENS`]), so a table entry is 12
/// bytes with its key ([`Key`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Occurrences {
    first: u32,
    last: u32,
}

/// The most tokens an [`NgramIndex`] holds (32 GB of context ids).
pub const MAX_INDEXED_TOKENS: usize = u32::MAX as usize;

/// NGRAM-6: appending `appended` tokens to `len` stays within [`MAX_INDEXED_TOKENS`].
fn within_index_cap(len: usize, appended: usize) -> Result<()> {
    let len = len.saturating_add(appended);
    if len > MAX_INDEXED_TOKENS {
        return Err(SpecError::ContextTooLong { arg: "n-gram index", seq: 0, len, max_model_len: MAX_INDEXED_TOKENS });
    }
    Ok(())
}

/// Whether `gram` is the n-gram `o` holds (told by its tokens at its first start).
fn spells(tokens: &[i64], o: &Occurrences, gram: &[i64]) -> bool {
    let first = o.first as usize;
    &tokens[first..first + gram.len()] == gram
}

/// The tables key an n-gram by 32 bits of its mixed hash ([`finish`]), so
/// an entry is 12 bytes; the rarer collisions this makes land in
/// [`Table`]'s `collided` like any other.
type Key = u32;

/// The key of an n-gram's mixed hash.
fn key(h: u64, mask: u64) -> Key {
    (h & mask) as Key
}

/// Spreads a key over the 64 bits the hash map reads (its slot from the low
/// bits, a tag from the top seven): the key's bits are already mixed, so one
/// odd multiplication does.
#[derive(Debug, Clone, Copy, Default)]
struct Spread(u64);

impl std::hash::Hasher for Spread {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        // Only `write_u32` is used; this keeps the hasher total anyway.
        self.0 = bytes.iter().fold(self.0, |h, &b| absorb(h, i64::from(b)));
    }
    fn write_u32(&mut self, k: u32) {
        self.0 = u64::from(k).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }
}

type ByHash<V> = HashMap<Key, V, std::hash::BuildHasherDefault<Spread>>;

/// The admissible starts of the n-grams of one size. `by_hash` maps a key to
/// the first n-gram seen with it, nearly always the only one; the rare
/// others sharing its key wait in `collided`, told apart by their tokens
/// (at their first start), so the index stays exact while the common entry
/// stays 12 bytes, its key and its two starts (a long context's build is
/// bound by the tables' memory).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct Table {
    by_hash: ByHash<Occurrences>,
    collided: ByHash<Vec<Occurrences>>,
}

impl Table {
    /// Records that the n-gram `tokens[start..end]`, keyed `h`, starts at
    /// `start`, the largest start recorded so far.
    fn record(&mut self, tokens: &[i64], h: Key, start: usize, end: usize) {
        let gram = &tokens[start..end];
        let start = u32::try_from(start).expect("extend keeps every position within MAX_INDEXED_TOKENS");
        let here = Occurrences { first: start, last: start };
        match self.by_hash.entry(h) {
            Entry::Vacant(e) => {
                e.insert(here);
            }
            Entry::Occupied(e) => {
                let o = e.into_mut();
                if spells(tokens, o, gram) {
                    o.last = start;
                } else {
                    let others = self.collided.entry(h).or_default();
                    match others.iter_mut().find(|o| spells(tokens, o, gram)) {
                        Some(o) => o.last = start,
                        None => others.push(here),
                    }
                }
            }
        }
    }

    /// Where `gram`, keyed `h`, has started, if it has.
    fn find(&self, tokens: &[i64], h: Key, gram: &[i64]) -> Option<&Occurrences> {
        let o = self.by_hash.get(&h)?;
        if spells(tokens, o, gram) {
            return Some(o);
        }
        self.collided.get(&h)?.iter().find(|o| spells(tokens, o, gram))
    }
}

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

/// Appends of at least this many tokens fill the tables on several
/// threads; shorter ones (a decode step's few tokens) would spend more on
/// the threads than they save.
const PARALLEL_APPEND: usize = 1 << 14;

/// Indexes, in each table of `run` (the tables of consecutive sizes from
/// `lowest`), the n-gram that ends just before each position in `ends`: its
/// start `end - n` has stopped being a suffix and became admissible (it is
/// < len - n). The n-grams ending at one position are hashed in one
/// backward pass.
fn index_ends(tokens: &[i64], ends: std::ops::Range<usize>, mask: u64, lowest: usize, run: &mut [Table]) {
    let Some(highest) = (lowest + run.len()).checked_sub(1) else { return };
    for end in ends {
        let mut h = 0;
        for n in 1..=highest.min(end) {
            h = absorb(h, tokens[end - n]);
            if n >= lowest {
                run[n - lowest].record(tokens, key(finish(h), mask), end - n, end);
            }
        }
    }
}

/// Incremental n-gram index (NGRAM-6): `propose()` equals [`propose`] on
/// the same tokens after any sequence of appends.
///
/// Each appended token inserts one start per n (the n-gram that has just
/// stopped being the suffix), so positions arrive in increasing order and
/// keeping the first and last start per n-gram is enough for both policies.
/// The n-grams ending at one position are hashed in one backward pass and
/// compared token by token only on a hash match, so a token costs
/// `O(ngram_max)` hashing plus the comparisons, independent of the context
/// length, and no key is allocated. A long append spreads the sizes of n
/// over the cores (each run of sizes hashes from n = 1 again). The index
/// holds at most [`MAX_INDEXED_TOKENS`].
#[derive(Debug, Clone)]
pub struct NgramIndex {
    cfg: NgramConfig,
    vocab: usize,
    tokens: Vec<i64>,
    /// `tables[n - ngram_min]` maps an n-gram's hash to its admissible starts.
    tables: Vec<Table>,
    /// The hash bits kept: all of them, except in the unit tests that force
    /// collisions to exercise [`Table`]'s `collided`.
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
    ///
    /// The tables of different n are independent, so a long append (building
    /// the index over an existing context) fills them on separate threads.
    /// Every table receives its starts in increasing order either way, so the
    /// tables come out as they would one token at a time.
    pub fn extend(&mut self, tokens: &[i64]) -> Result<()> {
        within_index_cap(self.tokens.len(), tokens.len())?;
        for (i, &t) in tokens.iter().enumerate() {
            validate::token("tokens", || vec![self.tokens.len() + i], t, self.vocab)?;
        }
        self.tokens.extend_from_slice(tokens);
        let threads = if tokens.len() >= PARALLEL_APPEND { crate::parallel::cores() } else { 1 };
        self.index_appended(tokens.len(), threads);
        Ok(())
    }

    /// Indexes the last `appended` tokens of the context on up to `threads` threads.
    fn index_appended(&mut self, appended: usize, threads: usize) {
        let NgramIndex { cfg, vocab, tokens, tables, hash_mask: mask } = self;
        let (ngram_min, mask, tokens) = (cfg.ngram_min, *mask, &*tokens);
        let ends = tokens.len() - appended..tokens.len();
        if appended > 1 {
            for (i, table) in tables.iter_mut().enumerate() {
                // The table gains at most one n-gram per new end at or beyond
                // n, and no more than the vocabulary can spell; it is sized for
                // half of that, since text repeats its n-grams: the bench's
                // 1 M-token context puts 0.49 M to 0.72 M in each table, which
                // the power-of-two size reserved for 0.5 M holds. A table that
                // needs more doubles once; sizing for the worst case would
                // double the memory a build touches, and memory is what a
                // build costs (on the bench's context, 1.4x the time).
                let n = ngram_min + i;
                let gains = ends.end.saturating_sub(ends.start.max(n));
                let spellable = u32::try_from(n).ok().and_then(|n| vocab.checked_pow(n)).unwrap_or(usize::MAX);
                table.by_hash.reserve(gains.min(spellable) / 2);
            }
        }
        if threads <= 1 {
            index_ends(tokens, ends, mask, ngram_min, tables);
            return;
        }
        // Runs of consecutive sizes, so a run's hashes come in one backward
        // pass; a few runs per thread, taken largest n first (the largest
        // tables) from a shared queue, so the threads finish close together
        // and a thread the OS refuses leaves its runs to the others.
        let per_run = tables.len().div_ceil(tables.len().min(4 * threads));
        let runs: Vec<(usize, &mut [Table])> = tables.chunks_mut(per_run).enumerate().map(|(i, run)| (ngram_min + i * per_run, run)).collect();
        let spawned = threads.min(runs.len()) - 1;
        let queue = std::sync::Mutex::new(runs);
        // The lock is released before the run is indexed (not held by a
        // `while let` scrutinee's temporary for the loop body).
        let next_run = || queue.lock().unwrap_or_else(std::sync::PoisonError::into_inner).pop();
        let work = || {
            while let Some((lowest, run)) = next_run() {
                index_ends(tokens, ends.clone(), mask, lowest, run);
            }
        };
        std::thread::scope(|scope| {
            for _ in 0..spawned {
                let _ = std::thread::Builder::new().spawn_scoped(scope, work);
            }
            work();
        });
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
            hashes.push(key(finish(h), self.hash_mask));
        }
        for n in (self.cfg.ngram_min..=longest).rev() {
            let suffix = &self.tokens[len - n..];
            if let Some(o) = self.tables[n - self.cfg.ngram_min].find(&self.tokens, hashes[n - 1], suffix) {
                let start = match self.cfg.policy {
                    NgramPolicy::LargestNMostRecent => o.last,
                    NgramPolicy::LargestNEarliest => o.first,
                };
                return Ok(continuation(&self.tokens, start as usize + n, k));
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
                assert!(index.tables.iter().any(|t| !t.collided.is_empty()), "the masked hash made no collision");
            }
        }
    }

    /// NGRAM-6: one long append, its tables filled by several threads taking
    /// runs of n from the queue, leaves every table exactly as appending the
    /// same tokens one at a time does, collisions included (two hash bits),
    /// for a few n and for more n than runs.
    #[test]
    fn threaded_bulk_append_fills_the_tables_as_single_appends_do() {
        let mut rng = Draws(0x2545_f491_4f6c_dd1d);
        for (ngram_min, ngram_max, mask) in [(1, 4, u64::MAX), (2, 5, 0b11), (1, 20, 0b1111)] {
            let cfg = NgramConfig { ngram_min, ngram_max, k: 3, policy: NgramPolicy::LargestNMostRecent, max_model_len: None };
            let context: Vec<i64> = (0..3000).map(|_| rng.below(6) as i64).collect();
            let mut one_by_one = NgramIndex::new(cfg, 6).unwrap();
            one_by_one.hash_mask = mask;
            context.iter().for_each(|t| one_by_one.extend(std::slice::from_ref(t)).unwrap());
            for threads in [2, 3] {
                let mut bulk = NgramIndex::new(cfg, 6).unwrap();
                bulk.hash_mask = mask;
                // A prefix one token at a time, then the rest in one threaded pass.
                bulk.extend(&context[..7]).unwrap();
                bulk.tokens.extend_from_slice(&context[7..]);
                bulk.index_appended(context.len() - 7, threads);
                assert_eq!(bulk.tables, one_by_one.tables, "n in {ngram_min}..={ngram_max}, {threads} threads");
                assert_eq!(bulk.propose().unwrap(), search(&context, &cfg, 3));
            }
        }
    }

    /// NGRAM-6: the index's cap on positions (`u32`) is a typed error, also
    /// where the length would overflow, and exactly the cap is allowed.
    #[test]
    fn appends_beyond_the_position_cap_are_context_too_long() {
        assert!(within_index_cap(MAX_INDEXED_TOKENS - 5, 5).is_ok());
        for (len, appended) in [(MAX_INDEXED_TOKENS - 5, 6), (1, MAX_INDEXED_TOKENS), (usize::MAX, 1)] {
            let err = within_index_cap(len, appended).unwrap_err();
            assert!(matches!(err, SpecError::ContextTooLong { arg: "n-gram index", max_model_len: MAX_INDEXED_TOKENS, .. }), "{len} + {appended}: {err}");
        }
    }

    /// NGRAM-6 through `extend`'s own dispatch: an append long enough to be
    /// threaded (colliding hashes), then single appends on the tables it
    /// sized, agree with the linear search after each, under both policies.
    #[test]
    fn a_threaded_extend_then_single_appends_match_the_linear_search() {
        let mut rng = Draws(0x94d0_49bb_1331_11eb);
        for policy in [NgramPolicy::LargestNMostRecent, NgramPolicy::LargestNEarliest] {
            let cfg = NgramConfig { ngram_min: 1, ngram_max: 4, k: 3, policy, max_model_len: None };
            let mut context: Vec<i64> = (0..PARALLEL_APPEND + 100).map(|_| rng.below(4) as i64).collect();
            let mut index = NgramIndex::new(cfg, 4).unwrap();
            index.hash_mask = 0b11;
            index.extend(&context).unwrap();
            assert_eq!(index.propose().unwrap(), search(&context, &cfg, 3), "{policy:?} after the bulk append");
            for _ in 0..50 {
                let t = rng.below(4) as i64;
                context.push(t);
                index.extend(&[t]).unwrap();
                assert_eq!(index.propose().unwrap(), search(&context, &cfg, 3), "{policy:?}, {} tokens", context.len());
            }
        }
    }
}
