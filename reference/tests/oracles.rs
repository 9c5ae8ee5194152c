//! Property tests against independent oracles, each written from the spec text
//! alone and sharing no code with the reference: the batched KV cache (KV-1 ..
//! KV-5) against a list-of-positions model under random operation sequences,
//! the verify-step rollbacks (KV-6, KV-7) against token bookkeeping, and the
//! dynamic controller (CTRL-2 .. CTRL-5) against a transcription of its rules.

use proptest::prelude::*;
use specdec_reference::controller::{DynamicController, SpecConfig, SpecMode, StepCounts};
use specdec_reference::kvcache::{self, BatchKvCache};
use specdec_reference::{ErrorKind, Tensor};

const B: usize = 3;
const H: usize = 2;
const D: usize = 2;
const CAP: usize = 6;

#[derive(Debug, Clone)]
enum KvOp {
    Append { t: usize, counts: Vec<i64>, tag: u16 },
    TrimUniform(i64),
    TrimVariable(Vec<i64>),
    TrimClamped(Vec<i64>),
}

fn kv_op() -> impl Strategy<Value = KvOp> {
    prop_oneof![
        3 => (0usize..4, prop::collection::vec(prop_oneof![1 => Just(-1i64), 8 => 0i64..4, 1 => Just(9i64)], B), any::<u16>())
            .prop_map(|(t, counts, tag)| KvOp::Append { t, counts, tag }),
        1 => (-1i64..4).prop_map(KvOp::TrimUniform),
        2 => prop::collection::vec(-1i64..5, B).prop_map(KvOp::TrimVariable),
        1 => prop::collection::vec(-1i64..9, B).prop_map(KvOp::TrimClamped),
    ]
}

/// The key written at `[b, h, t, d]` by an append tagged `tag` (values are its negation).
fn key(tag: u16, b: usize, h: usize, t: usize, d: usize) -> f64 {
    f64::from(tag) * 1e4 + (b * 1000 + h * 100 + t * 10 + d) as f64
}

/// The oracle: per sequence, its positions in order, each the `(key, value)` of every `(h, d)`.
struct Oracle(Vec<Vec<Vec<(f64, f64)>>>);

impl Oracle {
    /// KV-2, with the first defect in sequence order as the error.
    fn append(&mut self, t: usize, counts: &[i64], tag: u16) -> Result<(), ErrorKind> {
        for (b, &c) in counts.iter().enumerate() {
            if c < 0 || c as usize > t {
                return Err(ErrorKind::LengthOutOfRange);
            }
            if self.0[b].len() + c as usize > CAP {
                return Err(ErrorKind::CapacityExceeded);
            }
        }
        for (b, &c) in counts.iter().enumerate() {
            for tt in 0..c as usize {
                let pos = (0..H).flat_map(|h| (0..D).map(move |d| (h, d))).map(|(h, d)| (key(tag, b, h, tt, d), -key(tag, b, h, tt, d))).collect();
                self.0[b].push(pos);
            }
        }
        Ok(())
    }

    /// KV-3/KV-4: strict; nothing changes on an error.
    fn trim(&mut self, amounts: &[i64]) -> Result<(), ErrorKind> {
        if amounts.iter().zip(&self.0).any(|(&a, seq)| a < 0 || a as usize > seq.len()) {
            return Err(ErrorKind::TrimBeyondLength);
        }
        for (&a, seq) in amounts.iter().zip(self.0.iter_mut()) {
            seq.truncate(seq.len() - a as usize);
        }
        Ok(())
    }

    /// KV-5: `min(amount, len)`, reported.
    fn trim_clamped(&mut self, amounts: &[i64]) -> Result<Vec<usize>, ErrorKind> {
        if amounts.iter().any(|&a| a < 0) {
            return Err(ErrorKind::TrimBeyondLength);
        }
        Ok(amounts
            .iter()
            .zip(self.0.iter_mut())
            .map(|(&a, seq)| {
                let cut = (a as usize).min(seq.len());
                seq.truncate(seq.len() - cut);
                cut
            })
            .collect())
    }

    /// What `BatchKvCache::sequence` must return: keys and values `[H, len, D]`.
    fn sequence(&self, b: usize) -> (Vec<f64>, Vec<f64>) {
        let seq = &self.0[b];
        let at = |h: usize, p: usize, d: usize| seq[p][h * D + d];
        let keys = (0..H).flat_map(|h| (0..seq.len()).flat_map(move |p| (0..D).map(move |d| (h, p, d)))).map(|(h, p, d)| at(h, p, d).0).collect();
        let values = (0..H).flat_map(|h| (0..seq.len()).flat_map(move |p| (0..D).map(move |d| (h, p, d)))).map(|(h, p, d)| at(h, p, d).1).collect();
        (keys, values)
    }
}

fn ids(x: &[i64]) -> Tensor<i64> {
    Tensor::from_vec(x.to_vec())
}

fn new_positions(t: usize, tag: u16, sign: f64) -> Tensor<f64> {
    let data = (0..B).flat_map(|b| (0..H).flat_map(move |h| (0..t).flat_map(move |tt| (0..D).map(move |d| sign * key(tag, b, h, tt, d))))).collect();
    Tensor::new(vec![B, H, t, D], data).expect("shape")
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    /// KV-1 .. KV-5: any sequence of appends and trims leaves the cache exactly
    /// as the oracle: the same lengths, contents, errors and reported trims.
    #[test]
    fn kv_cache_matches_a_list_of_positions(ops in prop::collection::vec(kv_op(), 1..24)) {
        let mut cache = BatchKvCache::new(B, H, D, CAP).unwrap();
        let mut oracle = Oracle(vec![Vec::new(); B]);
        for op in &ops {
            match op {
                KvOp::Append { t, counts, tag } => {
                    let got = cache.append(&new_positions(*t, *tag, 1.0), &new_positions(*t, *tag, -1.0), &ids(counts)).map_err(|e| e.kind());
                    prop_assert_eq!(got, oracle.append(*t, counts, *tag), "{:?}", op);
                }
                KvOp::TrimUniform(n) => prop_assert_eq!(cache.trim_uniform(*n).map_err(|e| e.kind()), oracle.trim(&[*n; B]), "{:?}", op),
                KvOp::TrimVariable(a) => prop_assert_eq!(cache.trim_variable(&ids(a)).map_err(|e| e.kind()), oracle.trim(a), "{:?}", op),
                KvOp::TrimClamped(a) => prop_assert_eq!(cache.trim_clamped(&ids(a)).map_err(|e| e.kind()), oracle.trim_clamped(a), "{:?}", op),
            }
            let lens: Vec<usize> = oracle.0.iter().map(Vec::len).collect();
            prop_assert_eq!(cache.lens(), &lens[..]);
            for b in 0..B {
                let (k, v) = cache.sequence(b).expect("in range");
                prop_assert_eq!((k.data().to_vec(), v.data().to_vec()), oracle.sequence(b));
            }
        }
    }

    /// KV-6 and KV-7 as token bookkeeping: after a verify forward that appended
    /// each sequence's last token and its drafts (padded to width W), the
    /// per-sequence rollback keeps exactly the context, the last token and the
    /// accepted drafts; the min-accepted plan keeps the context and the first
    /// m + 1 verify inputs of every sequence and emits m + 1 tokens, never more
    /// than any sequence accepted plus one.
    #[test]
    fn rollbacks_keep_exactly_the_accepted_tokens(
        context in prop::collection::vec(0usize..3, B),
        lens in prop::collection::vec(0usize..4, B),
        accept in prop::collection::vec(0usize..4, B),
    ) {
        let accepted: Vec<usize> = accept.iter().zip(&lens).map(|(&a, &l)| a.min(l)).collect();
        let width = lens.iter().max().unwrap() + 1;
        // Token identity as the key: context position i of sequence b is 100 b + i,
        // verify input j is 100 b + 50 + j (the last token at j = 0, then the drafts).
        let fill = |per_seq: &dyn Fn(usize) -> Vec<f64>, t: usize| {
            let data = (0..B).flat_map(|b| { let s = per_seq(b); (0..H).flat_map(move |_| { let s = s.clone(); (0..t).flat_map(move |j| std::iter::repeat_n(s.get(j).copied().unwrap_or(-1.0), D)) }) }).collect();
            Tensor::new(vec![B, H, t, D], data).unwrap()
        };
        let ctx_tokens = |b: usize| (0..3).map(|i| (100 * b + i) as f64).collect::<Vec<_>>();
        let verify_tokens = |b: usize| (0..width).map(|j| (100 * b + 50 + j) as f64).collect::<Vec<_>>();
        let expect = |b: usize, keep: usize| -> Vec<f64> { ctx_tokens(b)[..context[b]].iter().chain(&verify_tokens(b)[..keep]).flat_map(|&x| std::iter::repeat_n(x, D)).collect() };
        let counts = |c: &[usize]| ids(&c.iter().map(|&x| x as i64).collect::<Vec<_>>());
        let prefilled = || {
            let mut cache = BatchKvCache::new(B, H, D, 16).unwrap();
            let ctx = fill(&ctx_tokens, 3);
            cache.append(&ctx, &ctx, &counts(&context)).unwrap();
            cache
        };
        let verify = fill(&verify_tokens, width);

        // KV-6: each sequence appended 1 + len_b inputs; the rejected drafts go.
        let mut per_seq = prefilled();
        per_seq.append(&verify, &verify, &counts(&lens.iter().map(|l| l + 1).collect::<Vec<_>>())).unwrap();
        per_seq.trim_variable(&counts(&kvcache::rollback_amounts(&lens, &accepted).unwrap())).unwrap();
        for (b, &n) in accepted.iter().enumerate() {
            let (k, _) = per_seq.sequence(b).unwrap();
            // One head's keys (the heads hold the same tokens).
            prop_assert_eq!(&k.data()[..k.data().len() / H], &expect(b, 1 + n)[..]);
        }

        // KV-7: every sequence appended the full padded width.
        let mut uniform = prefilled();
        uniform.append(&verify, &verify, &counts(&[width; B])).unwrap();
        let plan = kvcache::min_accepted_plan(&accepted, width).unwrap();
        let m = *accepted.iter().min().unwrap();
        prop_assert_eq!(plan.emit, m + 1);
        prop_assert!(accepted.iter().all(|&n| plan.emit <= n + 1));
        uniform.trim_uniform(plan.uniform_trim as i64).unwrap();
        for b in 0..B {
            let (k, _) = uniform.sequence(b).unwrap();
            prop_assert_eq!(&k.data()[..k.data().len() / H], &expect(b, m + 1)[..]);
        }
    }

    /// CTRL-2 .. CTRL-5: after any sequence of steps (some invalid), the
    /// controller's k for any batch size, its EMA and its metrics are the
    /// oracle's.
    #[test]
    fn controller_follows_its_rules(
        mode in prop_oneof![Just(SpecMode::None), Just(SpecMode::Ngram), Just(SpecMode::Draft)],
        k in 1usize..=20,
        disable_by_batch_size in 0usize..6,
        dynamic_enabled in any::<bool>(),
        adaptive_k in any::<bool>(),
        threshold in prop_oneof![Just(0.0), Just(0.3), Just(0.5), Just(0.8), Just(1.0), 0.0f64..=1.0],
        alpha in prop_oneof![Just(1.0), 0.01f64..=1.0],
        steps in prop::collection::vec((0u64..6, 0u64..12, 0u64..14, 0u64..7), 0..30),
    ) {
        let config = SpecConfig {
            mode, num_speculative_tokens: k, disable_by_batch_size, dynamic_enabled, adaptive_k,
            acceptance_rate_threshold: threshold, acceptance_rate_ema_alpha: alpha,
            draft_model_path: Some("draft".into()), ..SpecConfig::default()
        };
        let mut controller = DynamicController::new(config).unwrap();
        let (mut ema, mut seq_steps, mut proposed_total, mut accepted_total) = (0.7f64, 0u64, 0u64, 0u64);
        let oracle_k = |ema: f64, batch: usize| -> usize {
            let speculate = mode != SpecMode::None
                && !(disable_by_batch_size > 0 && batch >= disable_by_batch_size)
                && (!dynamic_enabled || ema >= threshold);
            if !speculate { 0 }
            else if !(dynamic_enabled && adaptive_k) || ema > 0.8 { k }
            else if ema > 0.5 { k.saturating_sub(2).max(1) }
            else { 1 }
        };
        for (sequences, proposed, accepted, bonus) in steps {
            let step = StepCounts { sequences, proposed, accepted, bonus };
            let valid = accepted <= proposed && bonus <= sequences;
            prop_assert_eq!(controller.update(step).is_ok(), valid, "{:?}", step);
            if valid {
                seq_steps += sequences;
                proposed_total += proposed;
                accepted_total += accepted;
                if proposed > 0 {
                    ema = alpha * (accepted as f64 / proposed as f64) + (1.0 - alpha) * ema;
                }
            }
            prop_assert_eq!(controller.acceptance_rate_ema(), ema);
            for batch in 0..8 {
                prop_assert_eq!(controller.k(batch), oracle_k(ema, batch), "batch {} ema {}", batch, ema);
            }
            let stats = controller.stats();
            let rate = if proposed_total == 0 { 0.0 } else { accepted_total as f64 / proposed_total as f64 };
            prop_assert_eq!(stats.acceptance_rate(), rate);
            let per_step = if seq_steps == 0 { 1.0 } else { (accepted_total + seq_steps) as f64 / seq_steps as f64 };
            prop_assert_eq!(stats.tokens_per_sequence_step(), per_step);
        }
    }
}
