//! Negative controls of the end-to-end section (DECODE-2 .. DECODE-5): the
//! section's own checks, run on decoders with one injected bug each, must
//! fail. A check that
//! cannot fail would pass here and fail this file.

use specdec_backend::ReferenceBackend;
use specdec_backend::model::ModelBackend;
use specdec_conformance::e2e_section::{self, TINY, engine_config, run_with, sampled_law_check};
use specdec_conformance::model_section::ModelFiles;
use specdec_conformance::stat::FAMILY_ALPHA;
use specdec_conformance::suite::{Selection, Status, SuiteConfig};
use specdec_decoder::{DraftModelProposer, EngineConfig, Fault};
use specdec_models::tiny::TinySpec;
use specdec_stats::Decision;

/// Runs the tiny model's checks on the reference with `engine`; returns
/// (name, status). The DFlash drafts' sampled checks are left out (their
/// host drafter is slow, and no control here is about drafting); the
/// section without a fault runs whole in the reference's conformance binary.
fn tiny_section(engine: &EngineConfig) -> Vec<(String, Status)> {
    let selection = Selection { exclude: vec!["e2e/*dflash*/sampled".into()], ..Selection::default() };
    let cfg = SuiteConfig { filter: Some(format!("e2e/{TINY}/")), selection, ..SuiteConfig::default() };
    run_with(&ReferenceBackend, &cfg, &ModelFiles::default(), engine, &mut |_| {}).into_iter().filter(|r| r.status != Status::Skipped).map(|r| (r.name, r.status)).collect()
}

fn failed(results: &[(String, Status)], check: &str) -> Vec<String> {
    results.iter().filter(|(n, s)| n.ends_with(check) && *s == Status::Fail).map(|(n, _)| n.clone()).collect()
}

fn with_fault(f: Fault) -> EngineConfig {
    EngineConfig { fault: Some(f), ..engine_config() }
}

/// Erratum E5's extra trim: the cache no longer matches a fresh prefill, and
/// the tokens and the law change.
#[test]
fn rollback_off_by_one_is_rejected() {
    let r = tiny_section(&with_fault(Fault::RollbackOffByOne));
    assert_eq!(failed(&r, "/rollback").len(), e2e_section::proposers(TINY).len(), "{r:?}");
    assert!(!failed(&r, "/greedy").is_empty(), "{r:?}");
    assert!(!failed(&r, "/sampled").is_empty(), "{r:?}");
}

/// Erratum E11: the bonus drawn from the last draft's row.
#[test]
fn bonus_from_the_wrong_row_is_rejected() {
    let r = tiny_section(&with_fault(Fault::BonusFromWrongRow));
    // Every draft accepted (the self-draft): every step's last token is a bonus.
    assert!(failed(&r, "/sampled").contains(&format!("e2e/{TINY}/draft:self/sampled")), "{r:?}");
    assert!(failed(&r, "/greedy").contains(&format!("e2e/{TINY}/draft:self/greedy")), "{r:?}");
}

/// DECODE-6: drafts emitted after an eos inside an accepted run.
#[test]
fn accepting_past_eos_is_rejected() {
    let r = tiny_section(&with_fault(Fault::AcceptPastEos));
    assert!(failed(&r, "/greedy").contains(&format!("e2e/{TINY}/draft:self/greedy")), "{r:?}");
    assert!(failed(&r, "/sampled").contains(&format!("e2e/{TINY}/draft:self/sampled")), "{r:?}");
}

/// LOGITS-6: drafts drawn at half the temperature while `q` is reported at
/// the request's: the sampled law check rejects it at the family's level.
#[test]
fn draft_q_at_another_temperature_is_rejected() {
    let w = TinySpec::preset(TINY).unwrap().weights().unwrap();
    let b = ReferenceBackend;
    let m = b.load_model(&w).unwrap();
    for (name, draft) in [("early-exit:1", w.truncated(1).unwrap()), ("draft:seeded", e2e_section::seeded_draft(&w).unwrap())] {
        let mut p = DraftModelProposer::new(&b, name, &draft, w.config.vocab_size).unwrap().with_wrong_q_temperature(0.5);
        let mut report = sampled_law_check(&b, &w, &m, &mut p, &engine_config(), specdec_conformance::suite::DEFAULT_SEED).unwrap();
        let family = e2e_section::e2e_items().iter().filter(|i| i.check == "sampled").count();
        report.judge(FAMILY_ALPHA / family as f64).unwrap();
        assert_eq!(report.decision, Decision::Reject, "{name}: {report}");
    }
}
