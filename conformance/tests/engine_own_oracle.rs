//! The engine as its own oracle (ENGINE-10) on specdec's decoder serving the
//! tiny model, known to the checks through its text alone; and the negative
//! control: an engine whose output changes only under concurrency.

use std::sync::Arc;

use specdec_backend::ReferenceBackend;
use specdec_conformance::e2e_section::{self, TINY, tiny_text};
use specdec_conformance::engine_section::{self, OwnModel, SWEEP};
use specdec_conformance::suite::{Status, SuiteConfig};
use specdec_decoder::{EngineConfig, Fault, TokenTable};
use specdec_engines::{DecoderEngine, EngineError, EngineInfo, Generation, GenerationEngine, GenerationRequest};
use specdec_models::tiny::TinySpec;

fn decoder(proposer: &str) -> DecoderEngine<'static, ReferenceBackend> {
    faulty(proposer, None)
}

fn faulty(proposer: &str, fault: Option<Fault>) -> DecoderEngine<'static, ReferenceBackend> {
    let w = Arc::new(TinySpec::preset(TINY).unwrap().weights().unwrap());
    let p = e2e_section::build_proposer(&ReferenceBackend, proposer, &w).unwrap();
    let tokens = TokenTable::tiny(w.config.vocab_size);
    DecoderEngine::new(&ReferenceBackend, w, p, EngineConfig { k: 3, checked: true, fault, ..EngineConfig::default() }, Some(Box::new(tiny_text))).unwrap().with_constraints(tokens)
}

/// Runs every check on `engine`; returns (name, status, message) of those that ran.
fn own(engine: &mut dyn GenerationEngine, label: &str) -> Vec<(String, Status, String)> {
    let r = engine_section::run_own(engine, label, &OwnModel::tiny(), &SuiteConfig::default(), &mut |_| {});
    r.into_iter().filter(|r| r.status != Status::Skipped).map(|r| (r.name, r.status, r.message)).collect()
}

#[test]
fn the_decoder_passes_every_check_with_its_own_plain_decoding_as_oracle() {
    for proposer in ["ngram", "draft:self"] {
        let r = own(&mut decoder(proposer), proposer);
        assert_eq!(r.len(), engine_section::own_items(proposer, TINY).len(), "{r:#?}");
        assert!(r.iter().all(|(_, s, _)| *s == Status::Pass), "ENGINE-10, {proposer}: {r:#?}");
        // The acceptance counts are reported beside the verdict.
        let greedy = r.iter().find(|(n, _, _)| n.ends_with("/own/greedy")).unwrap();
        assert!(greedy.2.contains("speculation accepted"), "{greedy:?}");
    }
}

/// An engine whose batched verify goes wrong: with more than one request in
/// flight and speculation on, the sixth generated token of each output is
/// another id (a batch-variant kernel in the verify pass only, the class of
/// vLLM #41758 and TRT-LLM #9208). One request at a time it is the decoder.
struct WrongUnderLoad(DecoderEngine<'static, ReferenceBackend>);

impl GenerationEngine for WrongUnderLoad {
    fn info(&self) -> &EngineInfo {
        self.0.info()
    }

    fn generate(&mut self, requests: &[GenerationRequest]) -> Result<Vec<Generation>, EngineError> {
        let mut out = self.0.generate(requests)?;
        if requests.len() > 1 {
            for (r, g) in requests.iter().zip(&mut out) {
                if let (true, Some(t)) = (r.speculation, g.tokens.get_mut(5)) {
                    *t = (*t + 1) % 12;
                    if let Some(entry) = g.logprobs.as_mut().and_then(|l| l.get_mut(5)) {
                        entry.id = *t;
                    }
                }
            }
        }
        Ok(out)
    }
}

#[test]
fn an_engine_wrong_only_under_concurrency_fails_the_sweep_alone() {
    let r = own(&mut WrongUnderLoad(decoder("ngram")), "ngram");
    let failed: Vec<&str> = r.iter().filter(|(_, s, _)| *s == Status::Fail).map(|(n, _, _)| n.as_str()).collect();
    let want: Vec<String> = SWEEP.iter().filter(|&&n| n > 1).map(|n| format!("engine/ngram/{TINY}/own/concurrency/{n}")).collect();
    assert_eq!(failed, want, "ENGINE-10's negative control: {r:#?}");
    let (_, _, message) = r.iter().find(|(n, _, _)| n.ends_with("/concurrency/4")).unwrap();
    assert!(message.contains("first divergence at token 5") && message.contains("speculation's under load"), "the report names the divergence and its cause: {message}");
}

/// The decoder under another statement: `greedy_epsilon` and batch
/// invariance as given.
struct Stated(DecoderEngine<'static, ReferenceBackend>, EngineInfo);

impl GenerationEngine for Stated {
    fn info(&self) -> &EngineInfo {
        &self.1
    }

    fn generate(&mut self, requests: &[GenerationRequest]) -> Result<Vec<Generation>, EngineError> {
        self.0.generate(requests)
    }
}

fn stated(greedy_epsilon: f64, batch_invariant: bool) -> Vec<(String, Status, String)> {
    let d = decoder("ngram");
    let mut info = EngineInfo { greedy_epsilon, batch_invariant, ..d.info().clone() };
    if let Some(l) = info.logprobs.as_mut() {
        l.epsilon = 0.5;
    }
    own(&mut Stated(d, info), "ngram")
}

/// ENGINE-10: a batch-invariant engine (a quantized port whose windows equal
/// its decodes, `ndarray-q8_0`) is checked whatever its greedy and logprob
/// epsilons against the reference, and excuses nothing; a batch-variant one
/// with such epsilons is ruled out, naming the first.
#[test]
fn a_batch_invariant_engine_is_checked_exactly_whatever_its_epsilon() {
    let r = stated(15.0, true);
    assert!(r.iter().all(|(_, s, _)| *s == Status::Pass), "{r:#?}");
    let r = stated(15.0, false);
    assert!(r.iter().filter(|(n, _, _)| !n.contains("sampled")).all(|(_, s, m)| *s == Status::Fail && m.contains("greedy epsilon of 1.5e1")), "{r:#?}");
}

/// ENGINE-10's `constrained` check, negative controls: each constraint fault
/// of the decoder that moves a greedy output fails it against the engine's
/// own plain decoding, with nothing from the reference; no other check
/// fails. (`DraftQWithoutMask` moves only the sampled law, ENGINE-9's `on`.)
#[test]
fn constraint_faults_fail_the_constrained_check_alone() {
    for fault in [Fault::ConstraintNotRolledBack, Fault::MaskFirstRowOnly, Fault::MaskFromCommittedState, Fault::EosOutsideAccept] {
        let r = own(&mut faulty("ngram", Some(fault)), "ngram");
        let failed: Vec<&str> = r.iter().filter(|(_, s, _)| *s == Status::Fail).map(|(n, _, _)| n.as_str()).collect();
        assert_eq!(failed, [format!("engine/ngram/{TINY}/own/constrained")], "{fault:?}: {r:#?}");
    }
}
