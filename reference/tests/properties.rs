//! Property tests of the reference: relations between algorithms that must
//! hold for every input, not just for the worked examples in `fixtures/`.

use proptest::prelude::*;
use specdec_reference::kvcache::{self, BatchKvCache};
use specdec_reference::ngram::{self, NgramConfig, NgramIndex, NgramPolicy};
use specdec_reference::{Comparator, DrawNoise, PAD, RejectionInputs, SamplingParams, Tensor, dflash_accept, greedy_verify, process_logits, rejection_verify, sampling, theory};

/// A probability row over `v` ids, with some exact zeros.
fn prob_row(v: usize) -> impl Strategy<Value = Vec<f64>> {
    prop::collection::vec(prop_oneof![1 => Just(0.0), 3 => 0.01f64..1.0], v).prop_map(|mut w| {
        if w.iter().all(|&x| x == 0.0) {
            w[0] = 1.0;
        }
        let s: f64 = w.iter().sum();
        w.iter().map(|x| x / s).collect()
    })
}

/// A padded greedy batch: scores `[B, k+1, V]`, drafts `[B, k]`, lengths `[B]`.
/// Drafts copy the argmax often, so long accepted prefixes occur.
fn greedy_batch() -> impl Strategy<Value = (Tensor<f64>, Tensor<i64>, Tensor<i64>)> {
    (1usize..4, 1usize..5, 1usize..6).prop_flat_map(|(b, k, v)| {
        (
            prop::collection::vec(prop::collection::vec(0i32..4, v), b * (k + 1)),
            prop::collection::vec(0usize..=k, b),
            prop::collection::vec(prop::bool::weighted(0.7), b * k),
            prop::collection::vec(0..v as i64, b * k),
        )
            .prop_map(move |(scores, lens, copy, random)| {
                let flat: Vec<f64> = scores.into_iter().flatten().map(f64::from).collect();
                let scores = Tensor::new(vec![b, k + 1, v], flat).unwrap();
                let mut drafts = vec![PAD; b * k];
                for s in 0..b {
                    for j in 0..lens[s] {
                        let row = scores.lane(&[s, j]).unwrap();
                        let top = (0..v).fold(0, |best, i| if row[i] > row[best] { i } else { best });
                        drafts[s * k + j] = if copy[s * k + j] { top as i64 } else { random[s * k + j] };
                    }
                }
                let lens = Tensor::from_vec(lens.into_iter().map(|l| l as i64).collect());
                (scores, Tensor::new(vec![b, k], drafts).unwrap(), lens)
            })
    })
}

proptest! {
    /// DFLASH-4: the DFlash rule and greedy verification agree.
    #[test]
    fn dflash_agrees_with_greedy((scores, drafts, _) in greedy_batch()) {
        let (b, k, v) = (scores.shape()[0], scores.shape()[1] - 1, scores.shape()[2]);
        // DFlash verifies full blocks: every proposal has length k, PAD-free.
        let drafts = drafts.map(|&t| if t == PAD { 0 } else { t });
        let lens = Tensor::from_vec(vec![k as i64; b]);
        let greedy = greedy_verify(&scores, &drafts, &lens).unwrap();
        let mut candidates = Vec::new();
        let mut predict = Vec::new();
        for s in 0..b {
            candidates.push(7 % v as i64); // the current token: any valid id
            candidates.extend_from_slice(drafts.lane(&[s]).unwrap());
            for j in 0..=k {
                let row = scores.lane(&[s, j]).unwrap();
                predict.push((0..v).fold(0, |best, i| if row[i] > row[best] { i } else { best }) as i64);
            }
        }
        let candidates = Tensor::new(vec![b, k + 1], candidates).unwrap();
        let predict = Tensor::new(vec![b, k + 1], predict).unwrap();
        let dflash = dflash_accept(&candidates, &predict, v).unwrap();
        for s in 0..b {
            prop_assert_eq!(dflash.accept_len[s], greedy.num_accepted[s], "DFLASH-4: accept_len is GREEDY's accepted count");
            prop_assert_eq!(Some(dflash.bonus[s]), greedy.next_token(s), "DFLASH-4: the bonus is GREEDY's next token");
        }
    }

    /// REJECT-6: a one-hot target row turns rejection sampling into greedy
    /// verification, whatever the noise and the draft probabilities.
    #[test]
    fn one_hot_target_reduces_rejection_to_greedy(
        (scores, drafts, lens) in greedy_batch(),
        noise in prop::collection::vec(0.0f64..1.0, 64),
        q_rows in prop::collection::vec(prob_row(8), 16),
    ) {
        let (b, k1, v) = (scores.shape()[0], scores.shape()[1], scores.shape()[2]);
        let k = k1 - 1;
        let greedy = greedy_verify(&scores, &drafts, &lens).unwrap();
        let one_hot = Tensor::new(vec![b, k1, v], (0..b * k1).flat_map(|r| {
            let row = &scores.data()[r * v..(r + 1) * v];
            let top = (0..v).fold(0, |best, i| if row[i] > row[best] { i } else { best });
            (0..v).map(move |i| if i == top { 1.0 } else { 0.0 })
        }).collect()).unwrap();
        // Draft rows that give every drafted token positive probability.
        let q = Tensor::new(vec![b, k, v], (0..b * k).flat_map(|r| {
            let row = &q_rows[r % q_rows.len()][..v];
            let s: f64 = row.iter().sum();
            row.iter().map(move |x| if s > 0.0 { 0.5 * x / s + 0.5 / v as f64 } else { 1.0 / v as f64 }).collect::<Vec<_>>()
        }).collect()).unwrap();
        let u = Tensor::new(vec![b, k], (0..b * k).map(|i| noise[i % 64]).collect()).unwrap();
        let draw = DrawNoise::InverseCdf(Tensor::new(vec![b, k1], (0..b * k1).map(|i| noise[(i + 7) % 64]).collect()).unwrap());
        for draft_probs in [Some(&q), None] {
            let inputs = RejectionInputs {
                target_probs: &one_hot, draft_probs, draft_tokens: &drafts, proposal_lens: &lens,
                accept_uniforms: &u, draw: &draw,
            };
            let out = rejection_verify(&inputs, Comparator::Strict).unwrap();
            prop_assert_eq!(&out.tokens, &greedy.tokens);
        }
    }

    /// GREEDY-5: speculative greedy decoding with any drafts emits exactly
    /// what plain greedy decoding emits.
    #[test]
    fn greedy_speculation_is_lossless(
        table in prop::collection::vec(prop::collection::vec(0i32..5, 5), 25),
        drafts in prop::collection::vec(0i64..5, 60),
        k in 1usize..5,
    ) {
        // A deterministic order-2 "model": scores of the next token given the last two.
        let scores = |a: i64, b: i64| -> Vec<f64> { table[(a * 5 + b) as usize].iter().map(|&x| f64::from(x)).collect() };
        let argmax = |row: &[f64]| (0..row.len()).fold(0, |best, i| if row[i] > row[best] { i } else { best }) as i64;
        let plain: Vec<i64> = (0..20).fold(vec![1, 2], |mut seq, _| {
            let n = seq.len();
            seq.push(argmax(&scores(seq[n - 2], seq[n - 1])));
            seq
        });
        let mut seq = vec![1i64, 2];
        let mut d = drafts.iter().copied().cycle();
        while seq.len() < plain.len() {
            let proposal: Vec<i64> = (0..k).map(|_| d.next().unwrap()).collect();
            // Target rows on the prefix extended by the drafts.
            let mut ext = seq.clone();
            let mut rows = Vec::new();
            for &d in &proposal {
                let n = ext.len();
                rows.extend(scores(ext[n - 2], ext[n - 1]));
                ext.push(d);
            }
            let n = ext.len();
            rows.extend(scores(ext[n - 2], ext[n - 1]));
            let out = greedy_verify(
                &Tensor::new(vec![1, k + 1, 5], rows).unwrap(),
                &Tensor::new(vec![1, k], proposal).unwrap(),
                &Tensor::from_vec(vec![k as i64]),
            ).unwrap();
            seq.extend_from_slice(out.emitted(0).expect("one sequence"));
        }
        prop_assert_eq!(&seq[..plain.len()], &plain[..]);
    }

    /// NGRAM-6: after any sequence of appends the incremental index returns
    /// exactly the linear search's proposal, for both policies.
    #[test]
    fn ngram_index_equals_linear_search(
        chunks in prop::collection::vec(prop::collection::vec(0i64..3, 1..6), 1..12),
        ngram_min in 1usize..3, extra in 0usize..3, k in 1usize..6,
        most_recent in any::<bool>(), cap in prop::option::of(1usize..40),
    ) {
        let policy = if most_recent { NgramPolicy::LargestNMostRecent } else { NgramPolicy::LargestNEarliest };
        let cfg = NgramConfig { ngram_min, ngram_max: ngram_min + extra, k, policy, max_model_len: cap };
        let mut index = NgramIndex::new(cfg, 3).unwrap();
        for chunk in &chunks {
            index.extend(chunk).unwrap();
            let linear = ngram::propose(index.context(), 3, &cfg);
            prop_assert_eq!(index.propose(), linear);
        }
    }

    /// KV-2/KV-4/KV-6: a verify step's append plus rollback leaves the same
    /// cache as appending only the kept positions.
    #[test]
    fn rollback_equals_appending_only_kept_positions(
        prefix in prop::collection::vec(0usize..4, 3),
        lens in prop::collection::vec(0usize..4, 3),
        accept in prop::collection::vec(0usize..4, 3),
        values in prop::collection::vec(-4.0f64..4.0, 3 * 2 * 5 * 2),
    ) {
        let (b, h, d, t) = (3, 2, 2, 5);
        let new = Tensor::new(vec![b, h, t, d], values.clone()).unwrap();
        let n: Vec<usize> = (0..b).map(|s| accept[s].min(lens[s])).collect();
        let counts = |c: &[usize]| Tensor::from_vec(c.iter().map(|&x| x as i64).collect());
        let mut spec = BatchKvCache::new(b, h, d, 16).unwrap();
        let mut plain = BatchKvCache::new(b, h, d, 16).unwrap();
        let pre = Tensor::new(vec![b, h, t, d], values.iter().map(|x| x * 0.5).collect()).unwrap();
        spec.append(&pre, &pre, &counts(&prefix)).unwrap();
        plain.append(&pre, &pre, &counts(&prefix)).unwrap();
        // The verify forward appends the last token plus len_b drafts ...
        let verify: Vec<usize> = lens.iter().map(|l| l + 1).collect();
        spec.append(&new, &new, &counts(&verify)).unwrap();
        let rollback = kvcache::rollback_amounts(&lens, &n).unwrap();
        spec.trim_variable(&counts(&rollback)).unwrap();
        // ... which must equal appending the last token and the accepted drafts.
        let kept: Vec<usize> = n.iter().map(|x| x + 1).collect();
        plain.append(&new, &new, &counts(&kept)).unwrap();
        prop_assert_eq!(spec.lens(), plain.lens());
        for s in 0..b {
            prop_assert_eq!(spec.sequence(s), plain.sequence(s));
        }
    }

    /// SAMPLE-1/SAMPLE-2: zero-weight ids are never drawn.
    #[test]
    fn draws_never_pick_zero_weight(w in prob_row(6), v in 0.0f64..1.0, e in prop::collection::vec(1e-9f64..20.0, 6)) {
        let a = sampling::sample_inverse_cdf(&w, v).unwrap();
        let b = sampling::sample_exponential_race(&w, &e).unwrap();
        prop_assert!(w[a.token] > 0.0 && w[b.token] > 0.0);
    }

    /// LOGITS-5/6: the top-p survivors are the shortest prefix (by probability)
    /// reaching top_p, and the output is a distribution.
    #[test]
    fn top_p_keeps_the_minimal_prefix(logits in prop::collection::vec(-5.0f64..5.0, 2..9), top_p in 0.05f64..1.0, t in 0.2f64..3.0) {
        let full = process_logits(&logits, SamplingParams::new(t, 0, 1.0)).unwrap();
        let cut = process_logits(&logits, SamplingParams::new(t, 0, top_p)).unwrap();
        prop_assert!((cut.iter().sum::<f64>() - 1.0).abs() < 1e-12);
        let kept_mass: f64 = full.iter().zip(&cut).filter(|&(_, &c)| c > 0.0).map(|(f, _)| f).sum();
        let smallest_kept = full.iter().zip(&cut).filter(|&(_, &c)| c > 0.0).map(|(f, _)| *f).fold(f64::INFINITY, f64::min);
        prop_assert!(kept_mass >= top_p - 1e-12, "kept mass {} < top_p {}", kept_mass, top_p);
        prop_assert!(kept_mass - smallest_kept < top_p + 1e-12, "a smaller prefix already reached top_p");
    }

    /// THEORY-2: the product form and the geometric closed form agree.
    #[test]
    fn expected_tokens_forms_agree(beta in 0.0f64..=1.0, gamma in 0usize..12) {
        let product = theory::expected_tokens(&vec![beta; gamma]).unwrap();
        let closed = theory::expected_tokens_geometric(beta, gamma).unwrap();
        prop_assert!((product - closed).abs() < 1e-9 * closed);
    }

    /// THEORY-6: the one-position output law is exactly the target.
    #[test]
    fn one_position_output_law_is_the_target(p in prob_row(7), q in prob_row(7)) {
        let law = theory::one_position_output_law(&p, &q).unwrap();
        for (a, b) in law.iter().zip(&p) {
            prop_assert!((a - b).abs() < 1e-12);
        }
    }

    /// THEORY-7: Pinsker and Bretagnolle-Huber hold; seed 003's bound need not.
    #[test]
    fn acceptance_bounds_hold(p in prob_row(5), q in prob_row(5)) {
        let beta = theory::acceptance(&p, &q).unwrap();
        let kl = theory::kl_divergence(&p, &q).unwrap();
        prop_assert!(beta >= theory::pinsker_acceptance_bound(kl).unwrap() - 1e-12);
        prop_assert!(beta >= theory::bretagnolle_huber_acceptance_bound(kl).unwrap() - 1e-12);
    }
}

/// THEORY-7: seed 003's claimed bound `beta >= 1 / (1 + KL)` fails on
/// p = (1, 0), q = (0.01, 0.99): beta = 0.01 but 1 / (1 + ln 100) = 0.178.
#[test]
fn seed003_kl_bound_counterexample() {
    let (p, q) = ([1.0, 0.0], [0.01, 0.99]);
    let beta = theory::acceptance(&p, &q).unwrap();
    let kl = theory::kl_divergence(&p, &q).unwrap();
    assert!((beta - 0.01).abs() < 1e-15);
    assert!((kl - 100f64.ln()).abs() < 1e-12);
    assert!(beta < 1.0 / (1.0 + kl), "the seed's bound would hold here");
    // Seed 003's intermediate claim KL <= 1 - beta fails too.
    assert!(kl > 1.0 - beta);
}
