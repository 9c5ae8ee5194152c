//! The engine on the reference backend (exact f64) and tiny seeded models:
//! greedy losslessness for every proposer against an independent plain
//! greedy loop, and one named test per decoder bug peers have shipped
//! (seed 001 section 9.2 scenarios 1-15, DECODE-1 .. DECODE-8).

use rand_pcg::Pcg64;
use specdec_backend::model::{ForwardRequest, LlamaWeights, ModelBackend, RefModel};
use specdec_backend::{NgramConfig, PenaltyScope, ReferenceBackend, SamplingParams};
use specdec_decoder::proposer::{Observed, SeqView};
use specdec_decoder::{DecodeError, DraftModelProposer, Engine, EngineConfig, FinishReason, NgramProposer, NoProposer, NoSink, OnProposerError, Proposal, Proposer, Request, Rollback, RunOutput};
use specdec_decoder::{DflashMode, DflashProposer};
use specdec_models::DflashSpec;
use specdec_models::tiny::TinySpec;
use specdec_reference::controller::{SpecConfig, SpecMode};

const B: ReferenceBackend = ReferenceBackend;

fn tiny(name: &str) -> LlamaWeights {
    TinySpec::preset(name).expect("a preset").weights().expect("tiny weights")
}

/// A second model on `target`'s vocabulary, for drafting.
fn other_draft(target: &LlamaWeights, seed: u64) -> LlamaWeights {
    specdec_models::tiny::seeded(target.config.clone(), seed).expect("seeded draft")
}

/// Plain greedy decoding written independently of the engine: one token at a
/// time through the reference forward, argmax with ties to the lowest id.
fn plain_greedy(w: &LlamaWeights, prompt: &[u32], n: usize, eos: &[u32]) -> Vec<u32> {
    let model = RefModel::new(w.clone());
    let mut cache = model.new_cache(1, prompt.len() + n + 1).unwrap();
    let mut input = prompt.to_vec();
    let mut out = Vec::new();
    while out.len() < n {
        let o = model.forward(&mut cache, &ForwardRequest::last_logits(std::slice::from_ref(&input))).unwrap();
        let mut best = 0;
        for (i, &x) in o.logits.iter().enumerate() {
            if x > o.logits[best] {
                best = i;
            }
        }
        out.push(best as u32);
        if eos.contains(&(best as u32)) {
            break;
        }
        input = vec![best as u32];
    }
    out
}

fn run(w: &LlamaWeights, config: EngineConfig, reqs: &[Request], proposer: &mut dyn Proposer<ReferenceBackend>) -> RunOutput {
    let model = B.load_model(w).unwrap();
    let engine = Engine::new(&B, &model, &w.config, config).unwrap();
    engine.generate(reqs, proposer, None, &mut NoSink).unwrap()
}

fn k(k: usize) -> EngineConfig {
    EngineConfig { k, ..EngineConfig::default() }
}

/// The proposers of the greedy check, by name.
fn proposer(name: &str, w: &LlamaWeights) -> Box<dyn Proposer<ReferenceBackend>> {
    match name {
        "none" => Box::new(NoProposer),
        "ngram" => Box::new(NgramProposer::new(NgramConfig { k: 8, ..NgramConfig::default() }, w.config.vocab_size).unwrap()),
        "draft" => Box::new(DraftModelProposer::new(&B, "draft", &other_draft(w, 77), w.config.vocab_size).unwrap()),
        "self" => Box::new(DraftModelProposer::new(&B, "self", w, w.config.vocab_size).unwrap()),
        "early-exit:1" => Box::new(DraftModelProposer::early_exit(&B, w, 1).unwrap()),
        "dflash" | "dflash-iter" => {
            let c = &w.config;
            let spec = DflashSpec { target_layer_ids: (0..c.num_hidden_layers).rev().collect(), ..DflashSpec::one_layer(c, 5, 0) };
            let draft = specdec_models::seeded_dflash(c, spec, 5).unwrap();
            let mode = if name == "dflash" { DflashMode::Parallel } else { DflashMode::Iterative { steps: 3, schedule: specdec_models::dflash::Schedule::Linear } };
            Box::new(DflashProposer::new(name, draft, std::sync::Arc::new(w.clone()), mode).unwrap())
        }
        other => panic!("unknown proposer {other}"),
    }
}

const PROMPTS: [&[u32]; 4] = [&[1, 2, 3, 1, 2, 3, 1, 2], &[5], &[7, 7, 7, 7, 7, 7], &[0, 4, 9, 2, 4, 9, 2, 4]];

/// DECODE-2, DECODE-4, GREEDY-5: every proposer (n-gram, draft model, self-draft, early exit,
/// DFlash parallel and iterative), every k, batched: the tokens of plain greedy decoding.
#[test]
fn greedy_output_equals_plain_greedy_for_every_proposer() {
    for model in ["tiny-v12-l2", "tiny-v32-l2"] {
        let w = tiny(model);
        let reqs: Vec<Request> = PROMPTS.iter().map(|p| Request::greedy(p.iter().map(|&t| t % w.config.vocab_size as u32).collect(), 12)).collect();
        let want: Vec<Vec<u32>> = reqs.iter().map(|r| plain_greedy(&w, &r.prompt, 12, &[])).collect();
        for name in ["none", "ngram", "draft", "self", "early-exit:1", "dflash", "dflash-iter"] {
            for kk in [1, 3, 5] {
                let out = run(&w, k(kk), &reqs, proposer(name, &w).as_mut());
                for (i, o) in out.outputs.iter().enumerate() {
                    assert_eq!(o.tokens, want[i], "DECODE-2, DECODE-4: {model} {name} k={kk} request {i}");
                    assert_eq!(o.finish, FinishReason::Length);
                }
            }
        }
    }
}

/// Plain greedy decoding with bias and penalties (LOGITS-2, LOGITS-7 ..
/// LOGITS-9, LOGITS-12), written independently of the engine: the counts of
/// the whole context (or of the generated tokens alone) kept by hand, the
/// processors applied one by one, argmax with ties to the lowest id.
fn plain_penalised_greedy(w: &LlamaWeights, prompt: &[u32], n: usize, p: &SamplingParams, bias: &[(u32, f64)]) -> Vec<u32> {
    let model = RefModel::new(w.clone());
    let mut cache = model.new_cache(1, prompt.len() + n + 1).unwrap();
    let mut counts = vec![0.0f64; w.config.vocab_size];
    if p.penalty_scope == PenaltyScope::Context {
        prompt.iter().for_each(|&t| counts[t as usize] += 1.0);
    }
    let (mut input, mut out) = (prompt.to_vec(), Vec::new());
    while out.len() < n {
        let o = model.forward(&mut cache, &ForwardRequest::last_logits(std::slice::from_ref(&input))).unwrap();
        let mut z = o.logits.clone();
        for &(id, b) in bias {
            z[id as usize] += b;
        }
        for (i, l) in z.iter_mut().enumerate() {
            if counts[i] > 0.0 {
                *l = if *l > 0.0 { *l / p.repetition_penalty } else { *l * p.repetition_penalty };
                *l -= counts[i] * p.frequency_penalty + p.presence_penalty;
            }
        }
        let best = (0..z.len()).fold(0, |best, i| if z[i] > z[best] { i } else { best }) as u32;
        out.push(best);
        counts[best as usize] += 1.0;
        input = vec![best];
    }
    out
}

/// DECODE-2, LOGITS-13: greedy with bias and penalties, every proposer and
/// k: the tokens of the hand-written penalised loop. A window row that
/// forgot the drafts before it would pick another argmax where a draft
/// repeats one before it (the repetitive prompts make n-gram drafts do so).
#[test]
fn penalised_greedy_equals_the_penalised_loop_for_every_proposer() {
    let w = tiny("tiny-v12-l2");
    let bias: &[(u32, f64)] = &[(3, 0.7), (5, -0.4)];
    for scope in [PenaltyScope::Context, PenaltyScope::Generated] {
        let p = SamplingParams { repetition_penalty: 1.6, presence_penalty: 0.3, frequency_penalty: 0.2, penalty_scope: scope, min_p: 0.5, ..SamplingParams::greedy() };
        let reqs: Vec<Request> = PROMPTS.iter().map(|pr| Request { sampling: p, logit_bias: bias.to_vec(), ..Request::greedy(pr.to_vec(), 12) }).collect();
        let want: Vec<Vec<u32>> = reqs.iter().map(|r| plain_penalised_greedy(&w, &r.prompt, 12, &p, bias)).collect();
        let unpenalised: Vec<Vec<u32>> = reqs.iter().map(|r| plain_greedy(&w, &r.prompt, 12, &[])).collect();
        assert_ne!(want, unpenalised, "the penalties must change the output for this test to mean anything");
        for name in ["none", "ngram", "draft", "self", "early-exit:1", "dflash", "dflash-iter"] {
            for kk in [1, 4] {
                let out = run(&w, k(kk), &reqs, proposer(name, &w).as_mut());
                for (i, o) in out.outputs.iter().enumerate() {
                    assert_eq!(o.tokens, want[i], "{scope:?} {name} k={kk} request {i}");
                }
            }
        }
    }
}

/// LOGPROB-4 on the reference backend (a batch-invariant forward): every
/// proposer reports, at each position, exactly the entries plain decoding
/// reports there, in both modes, greedy with every processor and sampled
/// (positions up to where the sampled outputs part); one entry per token.
#[test]
fn logprobs_with_speculation_equal_plain_decodings_for_every_proposer() {
    use specdec_decoder::{LogprobMode, LogprobRequest};
    let w = tiny("tiny-v12-l2");
    let bias: &[(u32, f64)] = &[(3, 0.7), (5, -0.4)];
    let greedy = SamplingParams { repetition_penalty: 1.6, presence_penalty: 0.3, frequency_penalty: 0.2, min_p: 0.5, ..SamplingParams::greedy() };
    let sampled = SamplingParams { temperature: 0.8, top_k: 6, ..greedy };
    for mode in [LogprobMode::Raw, LogprobMode::Processed] {
        for params in [greedy, sampled] {
            let ask = Some(LogprobRequest { top: 4, mode });
            let reqs: Vec<Request> = PROMPTS.iter().map(|pr| Request { sampling: params, logit_bias: bias.to_vec(), logprobs: ask, seed: 9, ..Request::greedy(pr.to_vec(), 12) }).collect();
            let plain = run(&w, k(1), &reqs, &mut NoProposer);
            for name in ["ngram", "draft", "self", "early-exit:1", "dflash", "dflash-iter"] {
                let out = run(&w, k(4), &reqs, proposer(name, &w).as_mut());
                assert!(out.acceptance.proposed > 0, "{name} must draft for the test to mean anything");
                for (i, (o, p)) in out.outputs.iter().zip(&plain.outputs).enumerate() {
                    let (lo, lp) = (o.logprobs.as_ref().unwrap(), p.logprobs.as_ref().unwrap());
                    assert_eq!((lo.len(), lp.len()), (o.tokens.len(), p.tokens.len()), "{mode:?} {name} request {i}: one entry per token");
                    let same = o.tokens.iter().zip(&p.tokens).take_while(|(a, b)| a == b).count();
                    assert_eq!(lo[..same], lp[..same], "{mode:?} {params:?} {name} request {i}");
                    if params.temperature == 0.0 {
                        assert_eq!(same, o.tokens.len(), "{name}: greedy tokens differ");
                    }
                }
            }
        }
    }
}

/// Seed 001 scenario 1 (all accepted): a draft equal to the target accepts
/// every draft; each step emits k + 1 tokens (CTRL-5, erratum E6).
#[test]
fn scenario_01_all_accepted_emits_k_plus_one_per_step() {
    let w = tiny("tiny-v12-l2");
    let out = run(&w, k(3), &[Request::greedy(vec![1, 2], 12)], proposer("self", &w).as_mut());
    let a = &out.outputs[0].acceptance;
    assert_eq!(a.accepted, a.proposed, "DECODE-8: proposed and accepted drafts are counted");
    assert_eq!(a.steps, 3, "DECODE-8: 12 tokens in steps of 4");
    assert_eq!(a.tokens_per_step(), 4.0, "DECODE-8: tokens per step is (accepted + steps) / steps");
}

/// A scripted proposer: drafts from a function of the context, recording each step's cap.
struct Scripted<F: FnMut(&SeqView<'_>) -> Vec<u32>> {
    f: F,
    caps: Vec<usize>,
    fail_every: Option<usize>,
    calls: usize,
}

fn scripted<F: FnMut(&SeqView<'_>) -> Vec<u32>>(f: F) -> Scripted<F> {
    Scripted { f, caps: Vec::new(), fail_every: None, calls: 0 }
}

impl<F: FnMut(&SeqView<'_>) -> Vec<u32>> Proposer<ReferenceBackend> for Scripted<F> {
    fn name(&self) -> String {
        "scripted".into()
    }
    fn begin(&mut self, _: &ReferenceBackend, _: usize, _: usize, _: usize) -> Result<(), DecodeError> {
        Ok(())
    }
    fn propose(&mut self, _: &ReferenceBackend, seqs: &[SeqView<'_>], _: &mut [Pcg64]) -> Result<Proposal<specdec_backend::RefTensor>, DecodeError> {
        self.calls += 1;
        if self.fail_every.is_some_and(|n| self.calls.is_multiple_of(n)) {
            return Err(DecodeError::proposer("scripted", "injected failure"));
        }
        self.caps.push(seqs.iter().map(|s| s.max_drafts).max().unwrap_or(0));
        let drafts = seqs.iter().map(|s| (self.f)(s).into_iter().take(s.max_drafts).collect()).collect();
        Ok(Proposal { drafts, draft_probs: None, rule: specdec_decoder::VerifyRule::Standard })
    }
    fn observe(&mut self, _: &ReferenceBackend, _: &Observed<'_, specdec_backend::RefTensor>) -> Result<(), DecodeError> {
        Ok(())
    }
    fn release(&mut self, _: &ReferenceBackend, _: usize) -> Result<(), DecodeError> {
        Ok(())
    }
}

/// Drafts the plain greedy continuation right for `m` tokens, then wrong ones.
fn oracle_then_wrong(want: Vec<u32>, prompt_len: usize, m: usize, vocab: u32) -> impl FnMut(&SeqView<'_>) -> Vec<u32> {
    move |s| {
        let done = s.context.len() - prompt_len;
        let mut d: Vec<u32> = want[done.min(want.len())..].iter().take(m).copied().collect();
        let next = want.get(done + d.len()).copied().unwrap_or(0);
        d.extend(std::iter::repeat_n((next + 1) % vocab, 8));
        d
    }
}

/// Seed 001 scenarios 2-4: none, partial and mixed acceptance give the
/// plain greedy tokens with exactly the scripted accepted counts.
#[test]
fn scenarios_02_to_04_none_partial_and_mixed_acceptance() {
    let w = tiny("tiny-v12-l2");
    let v = w.config.vocab_size as u32;
    let prompts: [Vec<u32>; 3] = [vec![1, 2, 3], vec![4, 5], vec![6]];
    // The oracle knows 20 tokens, so even the last step's drafts are right for m.
    let want: Vec<Vec<u32>> = prompts.iter().map(|p| plain_greedy(&w, p, 20, &[])).collect();
    for m in [0, 2] {
        let (w0, l0) = (want[0].clone(), prompts[0].len());
        let out = run(&w, k(4), &[Request::greedy(prompts[0].clone(), 10)], &mut scripted(oracle_then_wrong(w0, l0, m, v)));
        let a = &out.outputs[0].acceptance;
        assert_eq!(out.outputs[0].tokens, want[0][..10], "m = {m}");
        assert_eq!(a.accepted, m as u64 * a.steps, "every step accepts exactly {m}");
    }
    // Mixed: each sequence accepts its own count in the same batch.
    let reqs: Vec<Request> = prompts.iter().map(|p| Request::greedy(p.clone(), 10)).collect();
    let table: Vec<(Vec<u32>, usize, usize)> = (0..3).map(|i| (want[i].clone(), prompts[i].len(), i)).collect();
    let mut p = scripted(move |s: &SeqView<'_>| {
        let (want, len, m) = &table[s.slot];
        oracle_then_wrong(want.clone(), *len, *m, v)(s)
    });
    let out = run(&w, k(4), &reqs, &mut p);
    for (i, o) in out.outputs.iter().enumerate() {
        assert_eq!(o.tokens, want[i][..10]);
        assert_eq!(o.acceptance.accepted, i as u64 * o.acceptance.steps, "sequence {i} accepts {i} per step");
    }
}

/// Seed 001 scenario 5, DECODE-6: an eos inside an accepted run ends the
/// output there: nothing after it, no bonus.
#[test]
fn scenario_05_eos_inside_an_accepted_run_stops_there() {
    let w = tiny("tiny-v12-l2");
    let full = plain_greedy(&w, &[3, 1], 12, &[]);
    // An eos the greedy output reaches mid-run (not as a step's last token).
    let eos = full[5];
    let first = full.iter().position(|&t| t == eos).unwrap();
    let mut req = Request::greedy(vec![3, 1], 12);
    req.eos = vec![eos];
    let out = run(&w, k(4), std::slice::from_ref(&req), proposer("self", &w).as_mut());
    assert_eq!(out.outputs[0].tokens, full[..=first].to_vec(), "DECODE-6: the eos is the last token, nothing after it");
    assert_eq!(out.outputs[0].finish, FinishReason::Eos, "DECODE-6");
}

/// Seed 001 scenario 6: `max_tokens` cuts an accepted run.
#[test]
fn scenario_06_max_tokens_cuts_an_accepted_run() {
    let w = tiny("tiny-v12-l2");
    let full = plain_greedy(&w, &[2, 2, 5], 3, &[]);
    let out = run(&w, k(5), &[Request::greedy(vec![2, 2, 5], 3)], proposer("self", &w).as_mut());
    assert_eq!(out.outputs[0].tokens, full, "DECODE-6: `max_tokens` cuts an accepted run");
    assert_eq!(out.outputs[0].acceptance.steps, 1, "DECODE-6: one step of 5 accepted drafts, cut to 3");
}

/// Seed 001 scenario 7, DECODE-5: after a speculative run with rejections,
/// the target cache equals a fresh prefill of the prompt and emitted tokens
/// but the last, exactly (the reference is bit-exact).
#[test]
fn scenario_07_rollback_leaves_the_cache_of_a_fresh_prefill() {
    let w = tiny("tiny-v32-l2");
    let model = B.load_model(&w).unwrap();
    let engine = Engine::new(&B, &model, &w.config, k(4)).unwrap();
    let reqs = vec![Request::greedy(vec![1, 2, 3, 1, 2], 9), Request::greedy(vec![4], 13)];
    for rollback in [Rollback::PerSequence, Rollback::MinAccepted] {
        let engine = Engine::new(&B, &model, &w.config, EngineConfig { rollback, ..k(4) }).unwrap();
        let (out, cache) = engine.run(&reqs, proposer("draft", &w).as_mut(), None, &mut NoSink).unwrap();
        assert!(out.acceptance.proposed > out.acceptance.accepted, "the check needs rejections");
        for (i, (r, o)) in reqs.iter().zip(&out.outputs).enumerate() {
            let kept: Vec<u32> = r.prompt.iter().chain(&o.tokens[..o.tokens.len() - 1]).copied().collect();
            let mut fresh = model.new_cache(1, 64).unwrap();
            model.forward(&mut fresh, &ForwardRequest::last_logits(std::slice::from_ref(&kept))).unwrap();
            assert_eq!(B.cache_lens(&cache)[i], kept.len(), "{rollback:?} request {i}");
            for layer in 0..w.config.num_hidden_layers {
                assert_eq!(B.cache_contents(&cache, layer, i).unwrap(), B.cache_contents(&fresh, layer, 0).unwrap(), "{rollback:?} request {i} layer {layer}");
            }
        }
    }
    drop(engine);
}

/// Seed 001 scenario 8, DECODE-1: the stream carries every token once, in order.
#[test]
fn scenario_08_stream_emits_every_token_once_in_order() {
    let w = tiny("tiny-v12-l2");
    let model = B.load_model(&w).unwrap();
    let engine = Engine::new(&B, &model, &w.config, k(3)).unwrap();
    let reqs: Vec<Request> = PROMPTS.iter().map(|p| Request::greedy(p.iter().map(|t| t % 12).collect(), 11)).collect();
    let mut streams = vec![Vec::new(); reqs.len()];
    let mut sink = |slot: usize, ids: &[u32]| streams[slot].extend_from_slice(ids);
    let out = engine.generate(&reqs, proposer("early-exit:1", &w).as_mut(), None, &mut sink).unwrap();
    for (s, o) in streams.iter().zip(&out.outputs) {
        assert_eq!(s, &o.tokens, "DECODE-1: each emitted token reaches the stream once, in order");
    }
}

/// Seed 001 scenario 9: no proposal is a plain decode step.
#[test]
fn scenario_09_no_proposal_is_a_plain_decode_step() {
    let w = tiny("tiny-v12-l2");
    let want = plain_greedy(&w, &[9], 6, &[]);
    let out = run(&w, k(4), &[Request::greedy(vec![9], 6)], &mut scripted(|_| Vec::new()));
    assert_eq!(out.outputs[0].tokens, want, "DECODE-1: a step where no sequence has a draft is a plain decode step");
    assert_eq!(out.outputs[0].acceptance.plain_steps, 6, "DECODE-8: plain steps are counted");
    assert_eq!(out.outputs[0].acceptance.proposed, 0, "DECODE-8");
}

fn controller(k: usize, disable_by_batch_size: usize) -> EngineConfig {
    let spec = SpecConfig { mode: SpecMode::Ngram, num_speculative_tokens: k, disable_by_batch_size, ..SpecConfig::default() };
    EngineConfig { controller: Some(spec), ..EngineConfig::default() }
}

/// Seed 001 scenarios 10-12, CTRL-2 .. CTRL-4: the dynamic controller steers k.
#[test]
fn scenarios_10_to_12_the_controller_steers_k() {
    let w = tiny("tiny-v12-l2");
    // 10: a batch at the threshold never speculates.
    let reqs = vec![Request::greedy(vec![1], 5), Request::greedy(vec![2], 5)];
    let mut p = scripted(|_| vec![0; 8]);
    let out = run(&w, controller(5, 2), &reqs, &mut p);
    assert!(p.caps.is_empty(), "the proposer was never asked");
    assert_eq!(out.acceptance.proposed, 0);
    // 11, 12: drafts that are always wrong drive the EMA down. By CTRL-2/4
    // with k = 5, alpha = 0.1 from 0.7: 0.7 .. 0.51 give k = 3 (four
    // steps), 0.459 .. 0.301 give k = 1 (five), then 0.271 < 0.3 disables.
    let want = plain_greedy(&w, &[1, 2], 14, &[]);
    let wrong = want.clone();
    let mut p = scripted(move |s: &SeqView<'_>| {
        let next = wrong.get(s.context.len() - 2).copied().unwrap_or(0);
        vec![(next + 1) % 12; 8]
    });
    let out = run(&w, controller(5, 0), &[Request::greedy(vec![1, 2], 14)], &mut p);
    assert_eq!(p.caps, vec![3, 3, 3, 3, 1, 1, 1, 1, 1]);
    assert_eq!(out.outputs[0].tokens, want);
    assert_eq!(out.outputs[0].acceptance.plain_steps, 14 - 9);
}

/// CTRL-7 .. CTRL-10: the pay-off controller picks each step's k from what
/// it measured; whatever it picks, greedy output is plain greedy output, and
/// every step is counted under the k it ran with. It cannot be combined
/// with seed 001's controller.
#[test]
fn the_payoff_controller_keeps_greedy_output() {
    for model in ["tiny-v12-l2", "tiny-v32-l2"] {
        let w = tiny(model);
        let reqs: Vec<Request> = PROMPTS.iter().map(|p| Request::greedy(p.iter().map(|&t| t % w.config.vocab_size as u32).collect(), 24)).collect();
        let want: Vec<Vec<u32>> = reqs.iter().map(|r| plain_greedy(&w, &r.prompt, 24, &[])).collect();
        for name in ["ngram", "draft", "dflash"] {
            let out = run(&w, EngineConfig { k: 4, payoff: true, ..EngineConfig::default() }, &reqs, proposer(name, &w).as_mut());
            for (i, o) in out.outputs.iter().enumerate() {
                assert_eq!(o.tokens, want[i], "CTRL-10: {model} {name} request {i}");
            }
            assert_eq!(out.steps_by_k.len(), 5);
            assert_eq!(out.steps_by_k.iter().sum::<u64>(), out.batch_steps, "{model} {name}: every step counted once");
            assert!(out.steps_by_k[0] >= 1, "{model} {name}: the first step is plain (it times a plain step)");
        }
    }
    let w = tiny("tiny-v12-l2");
    let model = B.load_model(&w).unwrap();
    let both = EngineConfig { payoff: true, ..controller(4, 0) };
    assert!(matches!(Engine::new(&B, &model, &w.config, both), Err(DecodeError::Config(m)) if m.contains("set one")));
}

/// Seed 001 scenario 13: a failing proposer either fails the run with its
/// typed error, or (by choice) turns the step into a plain decode step.
#[test]
fn scenario_13_a_failing_proposer_falls_back_or_fails() {
    let w = tiny("tiny-v12-l2");
    let want = plain_greedy(&w, &[4, 4], 10, &[]);
    let model = B.load_model(&w).unwrap();
    let wanted = want.clone();
    let make = || {
        let w2 = wanted.clone();
        let mut p = scripted(move |s: &SeqView<'_>| w2[s.context.len() - 2..].iter().take(2).copied().collect());
        p.fail_every = Some(2);
        p
    };
    let engine = Engine::new(&B, &model, &w.config, k(2)).unwrap();
    let err = engine.generate(&[Request::greedy(vec![4, 4], 10)], &mut make(), None, &mut NoSink).unwrap_err();
    assert!(matches!(err, DecodeError::Proposer { .. }), "DECODE-8: a failing proposer fails the run with its typed error: {err}");
    let engine = Engine::new(&B, &model, &w.config, EngineConfig { on_proposer_error: OnProposerError::PlainStep, ..k(2) }).unwrap();
    let out = engine.generate(&[Request::greedy(vec![4, 4], 10)], &mut make(), None, &mut NoSink).unwrap();
    assert_eq!(out.outputs[0].tokens, want, "DECODE-8: by choice, the failed step is a plain decode step");
    assert!(out.proposer_errors > 0, "DECODE-8: the failed proposer steps are counted");
}

/// Seed 001 scenarios 14-15: an empty batch is a no-op; a single sequence works.
#[test]
fn scenarios_14_15_empty_batch_and_single_sequence() {
    let w = tiny("tiny-v16-l1");
    let out = run(&w, k(3), &[], &mut NoProposer);
    assert!(out.outputs.is_empty());
    let want = plain_greedy(&w, &[3], 7, &[]);
    let out = run(&w, k(3), &[Request::greedy(vec![3], 7)], proposer("self", &w).as_mut());
    assert_eq!(out.outputs[0].tokens, want);
}

/// DECODE-7: a stop string split across two tokens ends the output at the
/// token that completes it.
#[test]
fn stop_string_straddling_tokens_ends_the_output() {
    let w = tiny("tiny-v12-l2");
    let full = plain_greedy(&w, &[5, 6], 12, &[]);
    // Token i reads as the two letters `a+i`, `A+i`: a stop string made of the
    // last letter of output token 3 and the first of token 4 straddles them.
    let text = |ids: &[u32]| ids.iter().flat_map(|&i| [char::from(b'a' + i as u8), char::from(b'A' + i as u8)]).collect::<String>();
    let stop = format!("{}{}", char::from(b'A' + full[3] as u8), char::from(b'a' + full[4] as u8));
    let first_end = (0..full.len()).find(|&n| text(&full[..=n]).contains(&stop)).unwrap();
    let mut req = Request::greedy(vec![5, 6], 12);
    req.stop_strings = vec![stop];
    let model = B.load_model(&w).unwrap();
    let engine = Engine::new(&B, &model, &w.config, k(4)).unwrap();
    let out = engine.generate(&[req], proposer("self", &w).as_mut(), Some(&text), &mut NoSink).unwrap();
    assert_eq!(out.outputs[0].tokens, full[..=first_end].to_vec(), "DECODE-7: the output ends at the token completing the straddling stop string");
    assert_eq!(out.outputs[0].finish, FinishReason::Stop, "DECODE-7");
}

/// DECODE-3: a sampled request's output is the same alone and in a batch
/// (its own seed, its own noise streams).
#[test]
fn a_request_is_the_same_alone_and_in_a_batch() {
    let w = tiny("tiny-v16-l1");
    let sampled = |prompt: Vec<u32>, seed| Request { sampling: SamplingParams::new(0.9, 0, 0.95), seed, ..Request::greedy(prompt, 10) };
    let me = sampled(vec![1, 2, 3], 42);
    let others = [sampled(vec![4], 1), sampled(vec![5, 5, 5, 5, 5], 2), Request::greedy(vec![7, 8], 6)];
    for name in ["none", "ngram", "draft", "self", "dflash", "dflash-iter"] {
        let alone = run(&w, k(3), std::slice::from_ref(&me), proposer(name, &w).as_mut());
        let batch: Vec<Request> = [others[0].clone(), me.clone(), others[1].clone(), others[2].clone()].into();
        let together = run(&w, k(3), &batch, proposer(name, &w).as_mut());
        assert_eq!(alone.outputs[0].tokens, together.outputs[1].tokens, "{name}");
    }
}

/// DECODE-3: given verify uniforms are read in the stream's order, so the
/// seed's own stream given explicitly reproduces the seeded run token for
/// token; a run that needs more than it was given is a typed error.
#[test]
fn explicit_verify_uniforms_are_read_in_the_streams_order() {
    use rand::RngExt;
    let w = tiny("tiny-v12-l2");
    let sampled = |seed| Request { sampling: SamplingParams::new(1.0, 0, 1.0), seed, ..Request::greedy(vec![3, 1, 4, 1, 5, 3, 1, 4], 12) };
    let mut changed = 0;
    for name in ["none", "ngram", "draft", "self"] {
        for seed in [1, 2, 3] {
            let seeded = run(&w, k(3), &[sampled(seed)], proposer(name, &w).as_mut());
            let mut stream = specdec_decoder::noise_streams(seed).0;
            let given = Request { verify_uniforms: Some((0..64).map(|_| stream.random::<f64>()).collect()), ..sampled(seed) };
            let explicit = run(&w, k(3), &[given], proposer(name, &w).as_mut());
            assert_eq!(seeded.outputs[0].tokens, explicit.outputs[0].tokens, "{name}, seed {seed}");
            // Another stream's uniforms change some run: the given ones are read.
            let mut other = specdec_decoder::noise_streams(seed + 100).0;
            let moved = Request { verify_uniforms: Some((0..64).map(|_| other.random::<f64>()).collect()), ..sampled(seed) };
            changed += usize::from(run(&w, k(3), &[moved], proposer(name, &w).as_mut()).outputs[0].tokens != seeded.outputs[0].tokens);
            let short = Request { verify_uniforms: Some(vec![0.25; 2]), ..sampled(seed) };
            let model = B.load_model(&w).unwrap();
            let err = Engine::new(&B, &model, &w.config, k(3)).unwrap().generate(&[Request::greedy(vec![1], 2), short], proposer(name, &w).as_mut(), None, &mut NoSink).unwrap_err();
            assert!(matches!(&err, DecodeError::Request { index: 1, reason } if reason.contains("ran out")), "{name}: {err}");
        }
    }
    assert!(changed >= 6, "only {changed} of 12 runs moved with other uniforms");
}

/// ERR-1: bad requests get typed errors naming the request.
#[test]
fn bad_requests_are_typed_errors() {
    let w = tiny("tiny-v12-l2");
    let model = B.load_model(&w).unwrap();
    let engine = Engine::new(&B, &model, &w.config, k(2)).unwrap();
    let bad = [
        Request::greedy(vec![], 3),
        Request::greedy(vec![12], 3),
        Request::greedy(vec![1], 0),
        Request { sampling: SamplingParams::new(f64::NAN, 0, 1.0), ..Request::greedy(vec![1], 3) },
        Request { eos: vec![99], ..Request::greedy(vec![1], 3) },
        Request { stop_strings: vec!["x".into()], ..Request::greedy(vec![1], 3) },
        Request { verify_uniforms: Some(vec![0.5, 1.0]), ..Request::greedy(vec![1], 3) },
        Request { verify_uniforms: Some(vec![f64::NAN]), ..Request::greedy(vec![1], 3) },
        Request { verify_uniforms: Some(vec![0.1, -1e-300]), ..Request::greedy(vec![1], 3) },
        Request { sampling: SamplingParams { min_p: 1.5, ..SamplingParams::greedy() }, ..Request::greedy(vec![1], 3) },
        Request { sampling: SamplingParams { repetition_penalty: 0.0, ..SamplingParams::greedy() }, ..Request::greedy(vec![1], 3) },
        Request { sampling: SamplingParams { frequency_penalty: f64::INFINITY, ..SamplingParams::greedy() }, ..Request::greedy(vec![1], 3) },
        Request { logit_bias: vec![(12, 1.0)], ..Request::greedy(vec![1], 3) },
        Request { logit_bias: vec![(2, 1.0), (2, -1.0)], ..Request::greedy(vec![1], 3) },
        Request { logit_bias: vec![(2, f64::NAN)], ..Request::greedy(vec![1], 3) },
    ];
    for (i, r) in bad.into_iter().enumerate() {
        let err = engine.generate(&[Request::greedy(vec![1], 2), r], &mut NoProposer, None, &mut NoSink).unwrap_err();
        assert!(matches!(err, DecodeError::Request { index: 1, .. }), "case {i}: {err}");
    }
    assert!(Engine::new(&B, &model, &w.config, k(65)).is_err());
}

/// The decoder's fast loop against the faults of `fault.rs`: each test
/// passes without its fault and fails with it (the end-to-end section and
/// `fixtures/faults.json` hold the same faults against the suite's checks).
mod faults {
    use super::*;
    use specdec_decoder::Fault;

    fn with(fault: Option<Fault>, k: usize) -> EngineConfig {
        EngineConfig { k, fault, ..EngineConfig::default() }
    }

    /// Token i reads as the two letters `a+i`, `A+i`.
    fn text(ids: &[u32]) -> String {
        ids.iter().flat_map(|&i| [char::from(b'a' + i as u8), char::from(b'A' + i as u8)]).collect()
    }

    /// A stop string completed by token 2 of the output, inside the first
    /// accepted run of the target drafting for itself (k = 4): the tokens and
    /// the finish reason it gives.
    fn stop_inside_a_run(fault: Option<Fault>) -> (Vec<u32>, FinishReason, Vec<u32>) {
        let w = tiny("tiny-v12-l2");
        let full = plain_greedy(&w, &[5, 6], 12, &[]);
        let stop = format!("{}{}", char::from(b'A' + full[1] as u8), char::from(b'a' + full[2] as u8));
        let first_end = (0..full.len()).find(|&n| text(&full[..=n]).contains(&stop)).unwrap();
        assert!(first_end < 4, "the stop completes inside the first run of 5 tokens");
        let req = Request { stop_strings: vec![stop], ..Request::greedy(vec![5, 6], 12) };
        let model = B.load_model(&w).unwrap();
        let out = Engine::new(&B, &model, &w.config, with(fault, 4)).unwrap().generate(&[req], proposer("self", &w).as_mut(), Some(&text), &mut NoSink).unwrap();
        (out.outputs[0].tokens.clone(), out.outputs[0].finish, full[..=first_end].to_vec())
    }

    /// DECODE-7: a stop string looked for only at a run's last token.
    #[test]
    fn stop_at_run_end_only_is_caught() {
        let (tokens, finish, want) = stop_inside_a_run(None);
        assert_eq!((tokens, finish), (want.clone(), FinishReason::Stop));
        let (tokens, _, _) = stop_inside_a_run(Some(Fault::StopAtRunEndOnly));
        assert_ne!(tokens, want, "the fault emits past the stop");
    }

    /// DECODE-7: a stop reported as `length`.
    #[test]
    fn stop_reported_as_length_is_caught() {
        let (_, finish, _) = stop_inside_a_run(Some(Fault::StopReportedAsLength));
        assert_eq!(finish, FinishReason::Length, "the fault misreports the finish");
        assert_eq!(stop_inside_a_run(None).1, FinishReason::Stop);
    }

    /// REJECT-4, erratum E11: the bonus token from the row before its own.
    /// The target drafting for itself accepts every draft, so every step
    /// ends with a bonus.
    #[test]
    fn bonus_from_the_wrong_row_is_caught() {
        let w = tiny("tiny-v12-l2");
        let req = Request::greedy(vec![1, 2], 12);
        let want = plain_greedy(&w, &[1, 2], 12, &[]);
        let got = |fault| run(&w, with(fault, 3), std::slice::from_ref(&req), proposer("self", &w).as_mut()).outputs[0].tokens.clone();
        assert_eq!(got(None), want);
        assert_ne!(got(Some(Fault::BonusFromWrongRow)), want);
    }

    /// One proposal: the context it was drafted from, its room, its drafts.
    type Proposed = (Vec<u32>, usize, Vec<u32>);

    /// A proposer that records each step's proposals, and checks the draft
    /// cache of a draft model after every step.
    struct Watched<'p> {
        inner: &'p mut DraftOrNgram,
        proposals: Vec<Proposed>,
        stale_cache: Option<String>,
    }

    enum DraftOrNgram {
        Draft(Box<DraftModelProposer<ReferenceBackend>>),
        Ngram(NgramProposer),
    }

    impl DraftOrNgram {
        fn get(&mut self) -> &mut dyn Proposer<ReferenceBackend> {
            match self {
                DraftOrNgram::Draft(p) => p.as_mut(),
                DraftOrNgram::Ngram(p) => p,
            }
        }
    }

    impl Proposer<ReferenceBackend> for Watched<'_> {
        fn name(&self) -> String {
            "watched".into()
        }
        fn inject(&mut self, fault: Fault) {
            self.inner.get().inject(fault);
        }
        fn begin(&mut self, b: &ReferenceBackend, batch: usize, capacity: usize, max_k: usize) -> Result<(), DecodeError> {
            self.inner.get().begin(b, batch, capacity, max_k)
        }
        fn propose(&mut self, b: &ReferenceBackend, seqs: &[SeqView<'_>], rngs: &mut [Pcg64]) -> Result<Proposal<specdec_backend::RefTensor>, DecodeError> {
            let p = self.inner.get().propose(b, seqs, rngs)?;
            self.proposals.extend(seqs.iter().zip(&p.drafts).map(|(s, d)| (s.context.to_vec(), s.max_drafts, d.clone())));
            Ok(p)
        }
        fn observe(&mut self, b: &ReferenceBackend, o: &Observed<'_, specdec_backend::RefTensor>) -> Result<(), DecodeError> {
            self.inner.get().observe(b, o)?;
            if let DraftOrNgram::Draft(d) = &*self.inner
                && let Some((cache, fed)) = d.cache_and_fed()
            {
                let lens = b.cache_lens(cache);
                if let Some(slot) = (0..fed.len()).find(|&s| lens[s] != fed[s].len()) {
                    self.stale_cache.get_or_insert(format!("slot {slot}: {} cached positions for {} kept tokens", lens[slot], fed[slot].len()));
                }
            }
            Ok(())
        }
        fn release(&mut self, b: &ReferenceBackend, slot: usize) -> Result<(), DecodeError> {
            self.inner.get().release(b, slot)
        }
    }

    fn watched_run(w: &LlamaWeights, fault: Option<Fault>, mut p: DraftOrNgram) -> (RunOutput, Vec<Proposed>, Option<String>) {
        let reqs: Vec<Request> = PROMPTS.iter().map(|p| Request::greedy(p.to_vec(), 12)).collect();
        let mut watched = Watched { inner: &mut p, proposals: Vec::new(), stale_cache: None };
        let out = run(w, with(fault, 3), &reqs, &mut watched);
        (out, watched.proposals, watched.stale_cache)
    }

    /// DECODE-4, KV-6: a draft model that forgets rejected drafts without
    /// trimming its cache.
    #[test]
    fn draft_cache_not_trimmed_is_caught() {
        let w = tiny("tiny-v12-l2");
        let early_exit = || DraftOrNgram::Draft(Box::new(DraftModelProposer::early_exit(&B, &w, 1).unwrap()));
        let (out, _, stale) = watched_run(&w, None, early_exit());
        assert!(out.acceptance.accepted < out.acceptance.proposed, "some draft is rejected");
        assert_eq!(stale, None);
        let (_, _, stale) = watched_run(&w, Some(Fault::DraftCacheNotTrimmed), early_exit());
        assert!(stale.is_some(), "the fault leaves rejected positions in the draft cache");
    }

    /// NGRAM-2: the n-gram index extended after proposing drafts from a
    /// stale context: its drafts are not the rule's.
    #[test]
    fn ngram_indexed_after_proposing_is_caught() {
        let w = tiny("tiny-v12-l2");
        let cfg = NgramConfig { k: 3, ..NgramConfig::default() };
        let rule_breaks = |fault| {
            let (_, proposals, _) = watched_run(&w, fault, DraftOrNgram::Ngram(NgramProposer::new(cfg, w.config.vocab_size).unwrap()));
            assert!(proposals.iter().any(|(_, _, d)| !d.is_empty()), "the prompts make the n-gram rule draft");
            proposals
                .iter()
                .filter(|(context, max, drafts)| {
                    let ctx: Vec<i64> = context.iter().map(|&t| i64::from(t)).collect();
                    let mut want = specdec_reference::ngram::propose(&ctx, w.config.vocab_size, &cfg).unwrap();
                    want.truncate(*max);
                    drafts.iter().map(|&t| i64::from(t)).collect::<Vec<_>>() != want
                })
                .count()
        };
        assert_eq!(rule_breaks(None), 0);
        assert!(rule_breaks(Some(Fault::NgramIndexedAfterProposing)) > 0);
    }

    /// DECODE-3, REJECT-2: each draft is tested with its own accept uniform.
    /// Two drafts that can be rejected, given uniforms `[0, 1 - 1e-9]`: the
    /// first is accepted and the second rejected; one shared uniform (the
    /// first) accepts both.
    #[test]
    fn a_shared_accept_uniform_is_caught() {
        let w = tiny("tiny-v12-l2");
        let prompt = vec![3, 1, 4, 1, 5];
        let greedy = plain_greedy(&w, &prompt, 2, &[]);
        // Both drafts can go either way at temperature 1 (no q: accepted with p(d), RESID-2).
        let model = RefModel::new(w.clone());
        for j in 0..2 {
            let context: Vec<u32> = prompt.iter().chain(&greedy[..j]).copied().collect();
            let mut cache = model.new_cache(1, context.len()).unwrap();
            let logits = model.forward(&mut cache, &ForwardRequest::last_logits(&[context])).unwrap().logits;
            let p = specdec_reference::process_logits(&logits, SamplingParams::new(1.0, 0, 1.0)).unwrap()[greedy[j] as usize];
            assert!(p > 0.0 && p < 1.0 - 1e-9, "draft {j} has p = {p}");
        }
        let first_step = |fault| {
            let drafts = greedy.clone();
            let mut p = scripted(move |_| drafts.clone());
            let req = Request {
                sampling: SamplingParams::new(1.0, 0, 1.0),
                verify_uniforms: Some([0.0, 1.0 - 1e-9, 0.5].into_iter().chain(std::iter::repeat_n(0.5, 64)).collect()),
                ..Request::greedy(prompt.clone(), 3)
            };
            let model = B.load_model(&w).unwrap();
            let mut first: Option<Vec<u32>> = None;
            let mut sink = |_: usize, ids: &[u32]| {
                first.get_or_insert_with(|| ids.to_vec());
            };
            Engine::new(&B, &model, &w.config, with(fault, 2)).unwrap().generate(&[req], &mut p, None, &mut sink).unwrap();
            first.unwrap()
        };
        let clean = first_step(None);
        assert_eq!((clean.len(), clean[0]), (2, greedy[0]), "draft 0 accepted, draft 1 rejected: {clean:?}");
        let shared = first_step(Some(Fault::SharedAcceptUniform));
        assert_eq!(shared[..2], greedy[..], "one shared uniform of 0 accepts both drafts: {shared:?}");
    }
}
