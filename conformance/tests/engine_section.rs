//! The engine section (spec section 21) on specdec's own decoder, and its
//! negative controls: engines with one bug each, which its checks must fail.

use std::sync::Arc;

use specdec_backend::ReferenceBackend;
use specdec_conformance::e2e_section::{self, TINY, tiny_text};
use specdec_conformance::engine_section;
use specdec_conformance::suite::{Status, SuiteConfig};
use specdec_decoder::{DraftModelProposer, EngineConfig, Fault, Proposer};
use specdec_engines::{DecoderEngine, EngineError, EngineInfo, Finish, Generation, GenerationEngine, GenerationRequest};
use specdec_models::tiny::TinySpec;

fn weights() -> Arc<specdec_backend::model::LlamaWeights> {
    Arc::new(TinySpec::preset(TINY).unwrap().weights().unwrap())
}

/// Runs the section on the decoder with `proposer` and `config`; returns (name, status, message).
fn section(proposer: &str, config: EngineConfig, filter: Option<&str>) -> Vec<(String, Status, String)> {
    let w = weights();
    let p = e2e_section::build_proposer(&ReferenceBackend, proposer, &w).unwrap();
    section_with(proposer, p, config, filter)
}

fn section_with(label: &str, p: Box<dyn Proposer<ReferenceBackend>>, config: EngineConfig, filter: Option<&str>) -> Vec<(String, Status, String)> {
    let w = weights();
    let mut engine = DecoderEngine::new(&ReferenceBackend, Arc::clone(&w), p, config, Some(Box::new(tiny_text))).unwrap().with_constraints(specdec_decoder::TokenTable::tiny(w.config.vocab_size));
    let cfg = SuiteConfig { filter: filter.map(str::to_string), ..SuiteConfig::default() };
    engine_section::run(&mut engine, label, &w, &cfg, &mut |_| {}).into_iter().filter(|r| r.status != Status::Skipped).map(|r| (r.name, r.status, r.message)).collect()
}

fn k3() -> EngineConfig {
    EngineConfig { k: 3, checked: true, ..EngineConfig::default() }
}

#[test]
fn the_decoder_passes_every_engine_check() {
    for proposer in ["ngram", "draft:self"] {
        let r = section(proposer, k3(), None);
        assert_eq!(r.len(), engine_section::engine_items(proposer).len(), "{r:?}");
        assert!(r.iter().all(|(_, s, _)| *s == Status::Pass), "{proposer}: {r:#?}");
    }
}

fn failed(r: &[(String, Status, String)]) -> Vec<&str> {
    r.iter().filter(|(_, s, _)| *s == Status::Fail).map(|(n, _, _)| n.as_str()).collect()
}

fn with_fault(f: Fault) -> EngineConfig {
    EngineConfig { fault: Some(f), ..k3() }
}

/// HF transformers #47912 (and #31301 before it, for prompt lookup): tokens
/// emitted past an eos accepted mid-run, by a model drafter and by a copying one.
#[test]
fn an_engine_that_emits_past_an_eos_fails_the_eos_check() {
    let r = section("ngram", with_fault(Fault::AcceptPastEos), Some("/eos"));
    assert_eq!(failed(&r), ["engine/ngram/eos"], "{r:#?}");
    let r = section("draft:self", with_fault(Fault::AcceptPastEos), None);
    let failed = failed(&r);
    assert!(failed.contains(&"engine/draft:self/eos"), "{r:#?}");
    // The sampled law (whose eos the law reaches) sees it too, with speculation on only,
    // and so do the constrained greedy outputs, which end at an eos.
    assert!(failed.iter().all(|n| n.ends_with("/eos") || n.ends_with("/on") || n.ends_with("/on-vs-off") || (n.contains("/constrained/") && n.ends_with("/greedy"))), "{r:#?}");
}

/// SGLang #31599: the length cap checked before the stop strings, so the
/// token between a stop and the cap leaks.
#[test]
fn an_engine_that_checks_the_length_before_the_stop_fails_the_stop_check() {
    let r = section("draft:self", with_fault(Fault::LengthBeforeStop), Some("/stop"));
    assert_eq!(failed(&r), ["engine/draft:self/stop"], "{r:#?}");
}

/// HF transformers #47932: the draft's `q` taken before top-k while its
/// tokens were drawn after; and `q` at another temperature. The sampled
/// checks with speculation on fail; off, the engine is plain and passes.
#[test]
fn an_engine_whose_draft_q_is_not_its_draft_law_fails_the_sampled_checks() {
    let w = weights();
    let draft = e2e_section::seeded_draft(&w).unwrap();
    let unprocessed = DraftModelProposer::new(&ReferenceBackend, "draft:seeded", &draft, w.config.vocab_size).unwrap().with_unprocessed_q();
    let r = section_with("unprocessed-q", Box::new(unprocessed), k3(), Some("/sampled/"));
    // Top-k 4 truncates the draft's law; top-p 0.9 at T = 0.7 barely does.
    assert!(failed(&r).contains(&"engine/unprocessed-q/sampled/t1-topk4/on"), "{r:#?}");
    assert!(failed(&r).iter().all(|n| n.ends_with("/on") || n.ends_with("/on-vs-off")), "{r:#?}");
    let hot = DraftModelProposer::new(&ReferenceBackend, "draft:seeded", &draft, w.config.vocab_size).unwrap().with_wrong_q_temperature(0.5);
    // ENGINE-4 (b): speculation on against off, with no law at all, sees it too.
    assert!(failed(&r).contains(&"engine/unprocessed-q/sampled/t1-topk4/on-vs-off"), "{r:#?}");
    let r = section_with("q-temperature", Box::new(hot), k3(), Some("/sampled/"));
    assert!(failed(&r).contains(&"engine/q-temperature/sampled/t1-topk4/on"), "{r:#?}");
    assert!(failed(&r).contains(&"engine/q-temperature/sampled/t1-topk4/on-vs-off"), "{r:#?}");
}

/// TensorRT-LLM #19487: every request of a batch drawing from one noise
/// stream. Pairs of requests with different seeds come out equal.
#[test]
fn an_engine_whose_requests_share_one_noise_stream_fails_the_seed_pairs_check() {
    let r = section("ngram", with_fault(Fault::SharedNoiseAcrossRequests), Some("/seed-pairs"));
    assert_eq!(failed(&r), ["engine/ngram/seed-pairs"], "{r:#?}");
}

/// ENGINE-7, vLLM #34497's class: the logprob of a drafted position read
/// from the draft's `q` (a draft model of other weights than the target's).
#[test]
fn an_engine_that_reports_the_drafts_logprobs_fails_the_logprobs_check() {
    let r = section("draft:seeded", with_fault(Fault::LogprobsFromDraft), Some("/logprobs/"));
    assert_eq!(failed(&r), ["engine/draft:seeded/logprobs/on"], "{r:#?}");
}

/// ENGINE-7, llama.cpp #27972: logprob 0.0 for every token with speculation on.
#[test]
fn an_engine_that_reports_zero_logprobs_under_speculation_fails_the_logprobs_check() {
    let r = section("ngram", with_fault(Fault::LogprobsZeroWhenSpeculating), Some("/logprobs/"));
    assert_eq!(failed(&r), ["engine/ngram/logprobs/on"], "{r:#?}");
}

/// ENGINE-7, vLLM #47616: a stop string matched inside an accepted run, the
/// entries of the whole run reported.
#[test]
fn an_engine_that_reports_logprobs_past_a_stop_fails_the_logprobs_check() {
    let r = section("ngram", with_fault(Fault::LogprobsPastStop), Some("/logprobs/"));
    assert_eq!(failed(&r), ["engine/ngram/logprobs/on"], "{r:#?}");
    assert!(r.iter().any(|(_, _, m)| m.contains("entries end where the output ends")), "{r:#?}");
}

/// ENGINE-8, SGLang #10617: a logit bias applied to row 0 of a verify window
/// only, so a banned id still appears under speculation.
#[test]
fn an_engine_that_biases_the_first_window_row_only_fails_the_bias_checks() {
    let r = section("ngram", with_fault(Fault::BiasOnFirstRowOnly), Some("/processors/bias-"));
    let failed = failed(&r);
    assert!(failed.contains(&"engine/ngram/processors/bias-ban/greedy"), "{r:#?}");
    assert!(failed.iter().all(|n| n.ends_with("/greedy") || n.ends_with("/on")), "speculation off is plain decoding and passes: {r:#?}");
}

/// ENGINE-8, SGLang #10617: min-p skipped on the rows that verify drafts.
#[test]
fn an_engine_that_skips_min_p_on_verified_rows_fails_the_min_p_check() {
    let r = section("ngram", with_fault(Fault::MinPSkippedOnVerify), Some("/processors/min-p/"));
    assert_eq!(failed(&r), ["engine/ngram/processors/min-p/on"], "{r:#?}");
}

/// ENGINE-9, CONSTRAIN-4, vLLM #56077's class: the constraint's state fed a
/// step's drafts and never rolled back after a rejection.
#[test]
fn an_engine_whose_constraint_state_is_not_rolled_back_fails_the_constrained_checks() {
    let r = section("ngram", with_fault(Fault::ConstraintNotRolledBack), Some("/constrained/"));
    assert!(failed(&r).iter().any(|n| n.ends_with("/greedy")), "{r:#?}");
    assert!(failed(&r).iter().any(|n| n.contains("/nested/")), "the recursive grammar's chart too: {r:#?}");
}

/// ENGINE-9, CONSTRAIN-3: the mask on a window's first row only.
#[test]
fn an_engine_that_masks_the_first_window_row_only_fails_the_constrained_checks() {
    let r = section("ngram", with_fault(Fault::MaskFirstRowOnly), Some("/constrained/"));
    let failed = failed(&r);
    assert!(failed.iter().any(|n| n.ends_with("/greedy")), "{r:#?}");
    assert!(failed.iter().any(|n| n.contains("/nested/")), "the recursive grammar too: {r:#?}");
    assert!(failed.iter().all(|n| !n.ends_with("/off")), "speculation off is plain decoding and passes: {r:#?}");
}

/// ENGINE-9, CONSTRAIN-3: every row of a window masked with the committed state.
#[test]
fn an_engine_that_masks_every_row_with_the_committed_state_fails_the_constrained_checks() {
    let r = section("ngram", with_fault(Fault::MaskFromCommittedState), Some("/constrained/"));
    let failed = failed(&r);
    assert!(failed.iter().any(|n| n.ends_with("/greedy")), "{r:#?}");
    assert!(failed.iter().all(|n| !n.ends_with("/off")), "speculation off is plain decoding and passes: {r:#?}");
}

/// ENGINE-9, CONSTRAIN-3, HF #47932's class: a draft model drawing under the
/// mask but reporting its `q` without it; only the law with speculation on sees it.
#[test]
fn an_engine_whose_draft_q_lacks_the_mask_fails_the_constrained_law() {
    let r = section("draft:seeded", with_fault(Fault::DraftQWithoutMask), Some("/constrained/"));
    let failed = failed(&r);
    assert!(!failed.is_empty() && failed.iter().all(|n| n.ends_with("/on")), "{r:#?}");
}

/// ENGINE-9, CONSTRAIN-2: eos allowed where the output does not match.
#[test]
fn an_engine_that_allows_eos_outside_a_match_fails_the_constrained_checks() {
    let r = section("ngram", with_fault(Fault::EosOutsideAccept), Some("/constrained/"));
    assert!(failed(&r).iter().any(|n| n.ends_with("/greedy")), "{r:#?}");
    assert!(failed(&r).iter().any(|n| n.contains("/nested/")), "the recursive grammar too: {r:#?}");
}

/// An engine that answers every request with `max_new_tokens` copies of id 0.
struct Constant(EngineInfo);

impl GenerationEngine for Constant {
    fn info(&self) -> &EngineInfo {
        &self.0
    }

    fn generate(&mut self, requests: &[GenerationRequest]) -> Result<Vec<Generation>, EngineError> {
        Ok(requests.iter().map(|r| Generation { tokens: vec![0; r.max_new_tokens], finish: Finish::Length, drafts: None, logprobs: None }).collect())
    }
}

fn constant(vocab: usize, greedy_epsilon: f64) -> Constant {
    Constant(EngineInfo {
        name: "constant".into(),
        version: "0".into(),
        speculation: "none".into(),
        vocab,
        greedy_epsilon,
        batch_invariant: true,
        stop_strings: false,
        eos_ids: true,
        processors: Vec::new(),
        penalty_scopes: Vec::new(),
        logprobs: None,
        constraints: Vec::new(),
    })
}

/// ENGINE-1: an engine cannot excuse itself. A greedy epsilon above the cap,
/// or a vocabulary other than the model's, fails every check; with an honest
/// statement a wrong engine fails the checks on their merits.
#[test]
fn an_engine_that_states_too_much_fails_every_check() {
    let w = weights();
    let cfg = SuiteConfig::default();
    for (engine, want) in [(constant(12, 1e9), "greedy epsilon"), (constant(13, 0.0), "vocabulary of 13")] {
        let mut engine = engine;
        let r = engine_section::run(&mut engine, "constant", &w, &cfg, &mut |_| {});
        assert!(r.iter().all(|c| c.status == Status::Fail && c.message.contains(want)), "ENGINE-1: {r:#?}");
    }
    let r = engine_section::run(&mut constant(12, 1e-6), "constant", &w, &cfg, &mut |_| {});
    let failed: Vec<&str> = r.iter().filter(|c| c.status == Status::Fail).map(|c| c.name.as_str()).collect();
    for check in ["greedy-identity", "eos", "length"] {
        assert!(failed.contains(&format!("engine/constant/{check}").as_str()), "ENGINE-3: {failed:?}");
    }
}

/// A backend whose forward states a quantized format's distance from the
/// reference (argmax epsilon 15): the suite's engine checks of it are not
/// supported, never failed by its own statement nor passed by an epsilon
/// that would excuse anything.
struct Quantized;

impl specdec_backend::Backend for Quantized {
    type Tensor = specdec_backend::RefTensor;
    type KvCache = specdec_reference::kvcache::BatchKvCache;
    specdec_backend::reference_transfers!();
    fn name(&self) -> String {
        "quantized".into()
    }
    fn device(&self) -> String {
        "host".into()
    }
    fn precision(&self) -> specdec_backend::Precision {
        ReferenceBackend.precision()
    }
}

impl specdec_backend::model::ModelBackend for Quantized {
    type Model = specdec_backend::model::RefModel;
    type ModelCache = specdec_backend::model::RefCache;
    fn model_precision(&self) -> specdec_backend::model::ModelPrecision {
        specdec_backend::model::ModelPrecision { logit_rel_tolerance: 0.15, argmax_margin_epsilon: 15.0, ..ReferenceBackend.model_precision() }
    }
    fn load_model(&self, w: &specdec_backend::model::LlamaWeights) -> specdec_backend::Result<Self::Model> {
        ReferenceBackend.load_model(w)
    }
    fn new_model_cache(&self, m: &Self::Model, batch: usize, capacity: usize) -> specdec_backend::Result<Self::ModelCache> {
        ReferenceBackend.new_model_cache(m, batch, capacity)
    }
    fn forward(&self, m: &Self::Model, cache: &mut Self::ModelCache, req: &specdec_backend::model::ForwardRequest<'_>) -> specdec_backend::Result<specdec_backend::model::ForwardOutput<Self::Tensor>> {
        ReferenceBackend.forward(m, cache, req)
    }
    fn cache_lens(&self, cache: &Self::ModelCache) -> Vec<usize> {
        ReferenceBackend.cache_lens(cache)
    }
    fn cache_trim(&self, cache: &mut Self::ModelCache, amounts: &[usize]) -> specdec_backend::Result<()> {
        ReferenceBackend.cache_trim(cache, amounts)
    }
    fn cache_contents(&self, cache: &Self::ModelCache, layer: usize, seq: usize) -> specdec_backend::Result<(Vec<f64>, Vec<f64>)> {
        ReferenceBackend.cache_contents(cache, layer, seq)
    }
}

#[test]
fn a_quantized_backend_is_not_an_engine_the_section_can_judge() {
    use specdec_conformance::section::Section;
    let results = engine_section::DecoderEngineSection.run(&Quantized, &SuiteConfig::default(), &mut |_| {});
    assert!(!results.is_empty());
    for r in &results {
        assert_eq!(r.status, Status::NotSupported, "ENGINE-1: {}: {}", r.name, r.message);
        assert!(r.message.contains("argmax epsilon of 1.5e1"), "{}", r.message);
    }
}

/// ENGINE-8: a penalty is checked in a scope the engine states. An engine
/// that counts penalties over the whole context only (llama.cpp's server)
/// gets presence and frequency in that scope, not a refusal; one that states
/// both, or no penalty at all, keeps each setting's own; the rest of a
/// setting is untouched.
#[test]
fn penalty_settings_take_the_scope_the_engine_states() {
    use specdec_backend::PenaltyScope;
    let mut info = constant(12, 0.0).0;
    let scopes = |info: &EngineInfo| engine_section::PROCESSOR_SETTINGS.map(|s| s.in_scope_of(info).params.penalty_scope);
    let own = engine_section::PROCESSOR_SETTINGS.map(|s| s.params.penalty_scope);
    assert_eq!(own[4..], [PenaltyScope::Generated, PenaltyScope::Generated], "presence and frequency count the generated tokens by default");
    assert_eq!(scopes(&info), own, "no stated scope: each setting's own (and a refusal of the request)");
    info.penalty_scopes = vec![PenaltyScope::Context];
    assert_eq!(scopes(&info), [PenaltyScope::Context; 6]);
    info.penalty_scopes = vec![PenaltyScope::Generated, PenaltyScope::Context];
    assert_eq!(scopes(&info), own);
    for s in engine_section::PROCESSOR_SETTINGS {
        let moved = s.in_scope_of(&EngineInfo { penalty_scopes: vec![PenaltyScope::Context], ..info.clone() });
        assert_eq!((moved.name, moved.bias, moved.params.presence_penalty, moved.params.frequency_penalty), (s.name, s.bias, s.params.presence_penalty, s.params.frequency_penalty));
    }
}
