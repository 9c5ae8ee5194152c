//! Continuous batching (DECODE-3 and DECODE-5 for a server): requests that
//! join a running session at any step, and requests admitted into a slot
//! an earlier request left (finished or cancelled), give exactly the output
//! they give alone, for every proposer kind, greedy and sampled; a session
//! refuses what it cannot hold with a typed error.

use specdec_backend::model::{LlamaWeights, ModelBackend};
use specdec_backend::{NgramConfig, ReferenceBackend, SamplingParams};
use specdec_decoder::{DecodeError, DraftModelProposer, Engine, EngineConfig, NgramProposer, NoProposer, NoSink, Output, Proposer, Request};
use specdec_models::tiny::TinySpec;

const B: ReferenceBackend = ReferenceBackend;

fn tiny() -> LlamaWeights {
    TinySpec::preset("tiny-v12-l2").expect("a preset").weights().expect("tiny weights")
}

fn proposer(name: &str, w: &LlamaWeights) -> Box<dyn Proposer<ReferenceBackend>> {
    match name {
        "none" => Box::new(NoProposer),
        "ngram" => Box::new(NgramProposer::new(NgramConfig { k: 3, ..NgramConfig::default() }, w.config.vocab_size).unwrap()),
        "draft" => Box::new(DraftModelProposer::new(&B, "draft", &specdec_models::tiny::seeded(w.config.clone(), 77).unwrap(), w.config.vocab_size).unwrap()),
        "early-exit:1" => Box::new(DraftModelProposer::early_exit(&B, w, 1).unwrap()),
        "dflash" => {
            let c = &w.config;
            let spec = specdec_models::DflashSpec::one_layer(c, 4, (c.vocab_size - 1) as u32);
            let draft = specdec_models::seeded_dflash(c, spec, 5).unwrap();
            Box::new(specdec_decoder::DflashProposer::new("dflash", draft, std::sync::Arc::new(w.clone()), specdec_decoder::DflashMode::Parallel).unwrap())
        }
        other => panic!("no proposer {other}"),
    }
}

/// Eight requests: repeating and plain prompts, greedy and sampled, one
/// that never speculates, two with every sampling processor on.
fn requests() -> Vec<Request> {
    let prompts: [&[u32]; 4] = [&[1, 2, 3, 1, 2, 3, 1, 2], &[4, 5, 4, 5], &[7], &[2, 9, 2, 9, 2]];
    (0..8usize)
        .map(|i| {
            let mut sampling = if i.is_multiple_of(2) { SamplingParams::new(0.0, 0, 1.0) } else { SamplingParams::new(0.9, 6, 0.95) };
            // Two requests with every processor on (LOGITS-7 .. LOGITS-13), batched with the rest.
            let processed = i % 4 == 3;
            if processed {
                sampling = SamplingParams { min_p: 0.05, repetition_penalty: 1.5, presence_penalty: 0.3, frequency_penalty: 0.2, ..sampling };
            }
            let logit_bias = if processed { vec![(2, 0.6), (9, -1.0)] } else { Vec::new() };
            Request { sampling, logit_bias, seed: 100 + i as u64, speculate: i != 5, ..Request::greedy(prompts[i % 4].to_vec(), 8 + i) }
        })
        .collect()
}

/// Each request alone, in a run of its own.
fn alone(w: &LlamaWeights, name: &str, reqs: &[Request]) -> Vec<Vec<u32>> {
    let model = B.load_model(w).unwrap();
    let engine = Engine::new(&B, &model, &w.config, EngineConfig { k: 3, ..EngineConfig::default() }).unwrap();
    reqs.iter().map(|r| engine.generate(std::slice::from_ref(r), proposer(name, w).as_mut(), None, &mut NoSink).unwrap().outputs[0].tokens.clone()).collect()
}

/// Runs `reqs` through a session of `slots` slots: request `i` is admitted
/// at step `arrive[i]` (or later, when no slot is free); `cancel` lists
/// requests cancelled at that step after admission (their outputs are
/// `None`). Returns each request's output.
fn staggered(w: &LlamaWeights, name: &str, reqs: &[Request], slots: usize, arrive: &[usize], cancel: &[(usize, usize)]) -> Vec<Option<Output>> {
    staggered_with(w, name, EngineConfig { k: 3, ..EngineConfig::default() }, reqs, slots, arrive, cancel)
}

fn staggered_with(w: &LlamaWeights, name: &str, config: EngineConfig, reqs: &[Request], slots: usize, arrive: &[usize], cancel: &[(usize, usize)]) -> Vec<Option<Output>> {
    staggered_chunked(w, name, config, reqs, slots, arrive, cancel, None)
}

/// [`staggered_with`], prompts fed `Some(budget)` tokens per forward
/// between steps (chunked prefill), or at admission (`None`).
#[allow(clippy::too_many_arguments)]
fn staggered_chunked(w: &LlamaWeights, name: &str, config: EngineConfig, reqs: &[Request], slots: usize, arrive: &[usize], cancel: &[(usize, usize)], prefill: Option<usize>) -> Vec<Option<Output>> {
    let model = B.load_model(w).unwrap();
    let engine = Engine::new(&B, &model, &w.config, config).unwrap();
    let mut p = proposer(name, w);
    let mut session = engine.session(slots, 48, p.as_mut()).unwrap();
    let mut outputs: Vec<Option<Output>> = vec![None; reqs.len()];
    let mut slot_of = vec![None; reqs.len()];
    let mut next = 0;
    for step in 0.. {
        while next < reqs.len() && arrive[next] <= step && session.free_slots() > 0 {
            let admitted = match prefill {
                Some(_) => session.admit_unfed(vec![reqs[next].clone()], None),
                None => session.admit(vec![reqs[next].clone()], None),
            };
            slot_of[next] = Some(admitted.unwrap()[0]);
            next += 1;
        }
        if let Some(budget) = prefill
            && session.prefilling() > 0
        {
            session.prefill_some(budget).unwrap();
        }
        for &(i, at) in cancel {
            if at == step
                && let Some(slot) = slot_of[i].take()
            {
                assert!(session.cancel(slot).unwrap(), "the slot held request {i}");
            }
        }
        if next == reqs.len() && session.active() == 0 && session.prefilling() == 0 {
            break;
        }
        for slot in session.step(None, &mut NoSink).unwrap() {
            let i = slot_of.iter().position(|s| *s == Some(slot)).expect("a finished slot belongs to a request");
            outputs[i] = session.take(slot);
            slot_of[i] = None;
        }
    }
    outputs
}

#[test]
fn requests_joining_a_running_session_give_their_output_alone() {
    let w = tiny();
    let reqs = requests();
    for name in ["none", "ngram", "draft", "early-exit:1"] {
        let want = alone(&w, name, &reqs);
        // Three slots: later requests wait and then reuse slots earlier ones left.
        let got = staggered(&w, name, &reqs, 3, &[0, 0, 1, 2, 3, 3, 5, 9], &[]);
        for (i, (g, want)) in got.iter().zip(&want).enumerate() {
            assert_eq!(&g.as_ref().expect("finished").tokens, want, "DECODE-3: {name}, request {i} joined mid-run");
        }
    }
}

/// [`requests`] with request 2's prompt longer than every prefill budget
/// of the chunked tests (fed over many slices), and their arrival steps.
fn with_a_long_prompt() -> (Vec<Request>, [usize; 8]) {
    let mut reqs = requests();
    reqs[2].prompt = (0..20).map(|i| (i * 7 % 11) as u32).collect();
    (reqs, [0, 0, 1, 2, 3, 3, 5, 9])
}

/// Chunked prefill: prompts fed a few tokens per forward between the steps
/// of the requests already generating give every request the tokens and
/// the draft counts of a whole prefill (the drafters' state included: a
/// DFlash context grows slice by slice), for every proposer kind; a
/// request cancelled mid-prefill frees its slot. Negative control: a slice
/// that starts one token early (`Fault::PrefillSliceRefed`) changes outputs.
#[test]
fn chunked_prefill_gives_the_output_of_a_whole_one() {
    let w = tiny();
    let (reqs, arrive) = with_a_long_prompt();
    let config = EngineConfig { k: 3, ..EngineConfig::default() };
    for name in ["none", "ngram", "draft", "early-exit:1", "dflash"] {
        let whole = staggered_chunked(&w, name, config.clone(), &reqs, 3, &arrive, &[], None);
        for budget in [1, 3, 7] {
            let got = staggered_chunked(&w, name, config.clone(), &reqs, 3, &arrive, &[], Some(budget));
            for (i, (g, want)) in got.iter().zip(&whole).enumerate() {
                let (g, want) = (g.as_ref().expect("finished"), want.as_ref().expect("finished"));
                assert_eq!(g.tokens, want.tokens, "{name}, budget {budget}, request {i}: tokens");
                assert_eq!(g.acceptance, want.acceptance, "{name}, budget {budget}, request {i}: draft counts");
            }
        }
        // Cancelled at step 1, while its 20-token prompt is still being fed 3 at a time.
        let got = staggered_chunked(&w, name, config.clone(), &reqs, 3, &arrive, &[(2, 1)], Some(3));
        assert!(got[2].is_none());
        for i in [0, 1, 3, 4, 5, 6, 7] {
            assert_eq!(got[i].as_ref().expect("finished").tokens, whole[i].as_ref().unwrap().tokens, "{name}: request {i} beside a request cancelled mid-prefill");
        }
    }
}

/// Chunked prefill starves no prompt: short prompts that keep arriving
/// beside a long one are fed first, yet the longest-waiting prompt gets half
/// of every budget (without that, the long one below would be fed 2 tokens
/// every other call and take 20 calls).
#[test]
fn a_long_prompt_is_fed_while_short_ones_keep_arriving() {
    let w = tiny();
    let model = B.load_model(&w).unwrap();
    let engine = Engine::new(&B, &model, &w.config, EngineConfig { k: 3, ..EngineConfig::default() }).unwrap();
    let mut p = NoProposer;
    let mut session = engine.session(2, 48, &mut p).unwrap();
    let long = session.admit_unfed(vec![Request::greedy((0..21).map(|i| i % 11).collect(), 2)], None).unwrap()[0];
    for call in 1.. {
        if session.free_slots() > 0 {
            session.admit_unfed(vec![Request::greedy(vec![1, 2, 3, 4, 5, 6, 7], 1)], None).unwrap();
        }
        session.prefill_some(4).unwrap();
        if !session.is_prefilling(long) {
            assert!(call <= 10, "20 prompt tokens at half a budget of 4 a call: 10 calls, not {call}");
            break;
        }
        assert!(call < 10, "the long prompt still waits after {call} calls");
        for slot in session.step(None, &mut NoSink).unwrap() {
            if slot != long {
                session.take(slot);
            }
        }
    }
}

/// The negative control of the chunked-prefill test: a slice that starts
/// one token early caches the boundary token twice, and the long prompt's
/// output changes.
#[cfg(feature = "negative-controls")]
#[test]
fn a_prefill_slice_fed_from_one_token_early_is_caught() {
    let w = tiny();
    let (reqs, arrive) = with_a_long_prompt();
    let config = EngineConfig { k: 3, ..EngineConfig::default() };
    let faulty = EngineConfig { fault: Some(specdec_decoder::Fault::PrefillSliceRefed), ..config.clone() };
    let whole = staggered_chunked(&w, "ngram", config, &reqs, 3, &arrive, &[], None);
    let got = staggered_chunked(&w, "ngram", faulty, &reqs, 3, &arrive, &[], Some(3));
    assert_ne!(got[2].as_ref().unwrap().tokens, whole[2].as_ref().unwrap().tokens, "a slice boundary token fed twice must change the output");
}

#[test]
fn a_cancelled_request_frees_its_slot_for_a_fresh_one() {
    let w = tiny();
    let reqs = requests();
    for name in ["ngram", "draft"] {
        let want = alone(&w, name, &reqs);
        // One slot: request 0 is cancelled mid-run, the rest run after it in the same slot.
        let got = staggered(&w, name, &reqs, 1, &[0; 8], &[(0, 2)]);
        assert!(got[0].is_none(), "a cancelled request has no output");
        for i in 1..reqs.len() {
            assert_eq!(got[i].as_ref().expect("finished").tokens, want[i], "DECODE-5: {name}, request {i} in a slot a cancelled request left");
        }
    }
}

#[test]
fn a_session_refuses_what_it_cannot_hold() {
    let w = tiny();
    let model = B.load_model(&w).unwrap();
    let engine = Engine::new(&B, &model, &w.config, EngineConfig { k: 3, ..EngineConfig::default() }).unwrap();
    let mut p = NoProposer;
    assert!(matches!(engine.session(0, 16, &mut p), Err(DecodeError::Config(_))), "no slots");
    let mut p = NoProposer;
    assert!(matches!(engine.session(1, 100_000, &mut p), Err(DecodeError::Config(_))), "past the model's positions");
    let mut p = NoProposer;
    let mut session = engine.session(1, 16, &mut p).unwrap();
    let long = Request::greedy(vec![1; 16], 2);
    assert!(matches!(session.admit(vec![long], None), Err(DecodeError::Request { index: 0, .. })), "a prompt that fills the slot");
    session.admit(vec![Request::greedy(vec![1], 2)], None).unwrap();
    assert!(matches!(session.admit(vec![Request::greedy(vec![1], 2)], None), Err(DecodeError::Config(_))), "no free slot");
    assert!(session.take(0).is_none(), "a running request has no output yet");
    assert!(!session.cancel(5).unwrap(), "no such slot");
    assert!(matches!(session.prefill_some(0), Err(DecodeError::Config(_))), "a prefill budget of 0");
}

/// The negative control (built with `negative-controls`, as the workspace
/// test run builds the decoder): a session that hands a slot on without
/// clearing its cache gives the next requests other outputs, and the
/// checks above would fail it.
#[cfg(feature = "negative-controls")]
#[test]
fn a_slot_handed_on_uncleared_is_caught() {
    let w = tiny();
    let reqs = requests();
    let want = alone(&w, "ngram", &reqs);
    let config = EngineConfig { k: 3, fault: Some(specdec_decoder::Fault::SlotNotCleared), ..EngineConfig::default() };
    let got = staggered_with(&w, "ngram", config, &reqs, 3, &[0, 0, 1, 2, 3, 3, 5, 9], &[]);
    let differ = got.iter().zip(&want).filter(|(g, w)| g.as_ref().is_none_or(|g| &g.tokens != *w)).count();
    assert!(differ > 0, "an uncleared slot went unnoticed");
}
