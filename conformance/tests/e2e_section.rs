//! Negative controls of the end-to-end section (DECODE-2 .. DECODE-5): the
//! section's own checks, run on decoders with one injected bug each, must
//! fail. A check that
//! cannot fail would pass here and fail this file.

use specdec_backend::ReferenceBackend;
use specdec_backend::model::ModelBackend;
use specdec_conformance::e2e_section::{self, GreedyPrompts, PENALISED, SAMPLED_PARAMS, Setting, TINY, engine_config, run_with, sampled_law_check};
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
    tiny_checks(engine, &format!("e2e/{TINY}/"))
}

/// The tiny model's checks whose names match `filter`; the penalised
/// checks only where a control is about them ([`with_penalties`]).
fn tiny_checks(engine: &EngineConfig, filter: &str) -> Vec<(String, Status)> {
    tiny_checks_excluding(engine, filter, &["e2e/*dflash*/sampled*", "e2e/*/sampled-penalised"])
}

/// The tiny model's checks with the penalised ones (DFlash's host drafter included).
fn with_penalties(engine: &EngineConfig) -> Vec<(String, Status)> {
    tiny_checks_excluding(engine, &format!("e2e/{TINY}/"), &["e2e/*dflash*/sampled"])
}

fn tiny_checks_excluding(engine: &EngineConfig, filter: &str, exclude: &[&str]) -> Vec<(String, Status)> {
    let selection = Selection { exclude: exclude.iter().map(|x| x.to_string()).collect(), ..Selection::default() };
    let cfg = SuiteConfig { filter: Some(filter.into()), selection, ..SuiteConfig::default() };
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
        let mut report = sampled_law_check(&b, &w, &m, &mut p, &engine_config(), specdec_conformance::suite::DEFAULT_SEED, &Setting::plain(SAMPLED_PARAMS)).unwrap();
        report.judge(FAMILY_ALPHA / sampled_family() as f64).unwrap();
        assert_eq!(report.decision, Decision::Reject, "{name}: {report}");
    }
}

/// The Holm family of the section's statistical checks.
fn sampled_family() -> usize {
    e2e_section::e2e_items().iter().filter(|i| i.check.starts_with("sampled")).count()
}

/// LOGITS-13, HF transformers #47932's penalty form: drafts drawn with the
/// request's penalties and bias, `q` reported without them. The
/// penalised sampled check rejects it; the unpenalised one cannot see it.
#[test]
fn draft_q_without_penalties_is_rejected() {
    let w = TinySpec::preset(TINY).unwrap().weights().unwrap();
    let b = ReferenceBackend;
    let m = b.load_model(&w).unwrap();
    for (name, draft) in [("early-exit:1", w.truncated(1).unwrap()), ("draft:seeded", e2e_section::seeded_draft(&w).unwrap())] {
        let mut p = DraftModelProposer::new(&b, name, &draft, w.config.vocab_size).unwrap().with_unpenalised_q();
        let mut report = sampled_law_check(&b, &w, &m, &mut p, &engine_config(), specdec_conformance::suite::DEFAULT_SEED, &PENALISED).unwrap();
        report.judge(FAMILY_ALPHA / sampled_family() as f64).unwrap();
        assert_eq!(report.decision, Decision::Reject, "{name}: {report}");
    }
}

/// LOGITS-13: every verify row's penalties count the context alone, so a
/// draft that repeats an earlier draft of its window goes unpenalised. The
/// exact step law (with the drafts given) fails it for every proposer, the
/// penalised sampled check too; the checks without penalties pass.
#[test]
fn penalties_that_ignore_the_window_drafts_are_rejected() {
    let r = with_penalties(&with_fault(Fault::PenaltyIgnoresDrafts));
    let proposers_with_step_law = r.iter().filter(|(n, _)| n.ends_with("/step-law")).count();
    assert!(proposers_with_step_law > 0, "{r:?}");
    assert_eq!(failed(&r, "/step-law").len(), proposers_with_step_law, "{r:?}");
    assert!(!failed(&r, "/sampled-penalised").is_empty(), "{r:?}");
    assert!(failed(&r, "/sampled").is_empty() && failed(&r, "/greedy").is_empty(), "{r:?}");
}

/// DECODE-6: drafts emitted past `max_tokens` inside an accepted run. The
/// tiny prompts include one whose greedy output never reaches the eos, so a
/// run crosses the length cap.
#[test]
fn accepting_past_the_length_cap_is_rejected() {
    let r = tiny_section(&with_fault(Fault::AcceptPastLength));
    assert!(failed(&r, "/greedy").contains(&format!("e2e/{TINY}/draft:self/greedy")), "{r:?}");
}

/// DECODE-7: a stop string looked for only at the end of each emitted run
/// cuts the run late wherever the string completes inside it.
#[test]
fn stop_strings_checked_at_run_ends_only_are_rejected() {
    let r = tiny_section(&with_fault(Fault::StopAtRunEndOnly));
    assert!(failed(&r, "/stop").contains(&format!("e2e/{TINY}/draft:self/stop")), "{r:?}");
    // Without the fault every stop check passes (the same run, no fault).
    let clean = tiny_section(&engine_config());
    assert!(failed(&clean, "/stop").is_empty() && failed(&clean, "/fidelity").is_empty(), "{clean:?}");
}

/// DECODE-3: one accept uniform tests every draft of a step, or a rejected
/// row's correction is drawn with its accept uniform. The step-law checks
/// fail both deterministically wherever a draft can be rejected (the target
/// drafting for itself has every draft accepted: neither bug shows there).
#[test]
fn a_shared_or_misindexed_verify_uniform_is_rejected() {
    let filter = format!("e2e/{TINY}/*/step-law");
    for fault in [Fault::SharedAcceptUniform, Fault::DrawReadsAcceptRow] {
        let r = tiny_checks(&with_fault(fault), &filter);
        for p in ["ngram", "draft:seeded", "early-exit:1", "dflash:seeded", "dflash-iter:seeded"] {
            assert!(failed(&r, "/step-law").contains(&format!("e2e/{TINY}/{p}/step-law")), "{fault:?}, {p}: {r:?}");
        }
        // Where every draft is accepted the law is right, and the check says so.
        assert!(!failed(&r, "/step-law").contains(&format!("e2e/{TINY}/draft:self/step-law")), "{fault:?}: {r:?}");
    }
    let clean = tiny_checks(&engine_config(), &filter);
    assert_eq!(clean.iter().filter(|(_, s)| *s == Status::Pass).count(), 6, "{clean:?}");
}

/// The tiny greedy setup reaches what the checks claim: an eos first seen
/// mid-output in some prompt, and the length cap in another.
#[test]
fn the_tiny_greedy_prompts_reach_an_eos_mid_output_and_the_length_cap() {
    let w = TinySpec::preset(TINY).unwrap().weights().unwrap();
    let prompts = vec![vec![1, 2, 3, 1, 2, 3, 1], vec![5], vec![7, 7, 7, 7], vec![0, 4, 9, 2, 4, 9, 2, 4, 11, 10]];
    let eos = e2e_section::tiny_eos(&w, &prompts).unwrap();
    let m = specdec_models::RefModel::new(w.clone());
    let runs = specdec_conformance::model_section::greedy(&ReferenceBackend, &m, &prompts, e2e_section::TINY_TOKENS, &[eos], w.config.vocab_size).unwrap();
    let lens: Vec<usize> = runs.iter().map(|r| r.tokens.len()).collect();
    assert!(lens.contains(&e2e_section::TINY_TOKENS), "some prompt reaches the cap: {lens:?}");
    assert!(lens.iter().any(|&n| n > e2e_section::TINY_TOKENS / 3 && n < e2e_section::TINY_TOKENS), "some prompt reaches the eos mid-output: {lens:?}");
    assert!(lens.iter().all(|&n| n > 4), "no prompt stops at once: {lens:?}");
}

/// NGRAM-2: an n-gram proposer drafting from a stale context
/// (`Fault::NgramIndexedAfterProposing`) stays lossless but fails the
/// fidelity check, with the message naming the rule.
#[test]
fn an_ngram_proposer_with_a_stale_context_is_rejected() {
    let w = TinySpec::preset(TINY).unwrap().weights().unwrap();
    let b = ReferenceBackend;
    let m = b.load_model(&w).unwrap();
    let set = GreedyPrompts { prompts: vec![vec![1, 2, 3, 1, 2, 3, 1], vec![0, 4, 9, 2, 4, 9, 2, 4, 11, 10]], max_tokens: 16, eos: vec![] };
    let cfg = specdec_backend::NgramConfig { k: e2e_section::K, ..Default::default() };
    let check = |engine: &EngineConfig| e2e_section::ngram_fidelity(&b, &w, &m, &set, &mut specdec_decoder::NgramProposer::new(cfg, w.config.vocab_size).unwrap(), engine);
    check(&engine_config()).unwrap();
    let stale = check(&with_fault(Fault::NgramIndexedAfterProposing)).unwrap_err();
    assert!(stale.contains("the n-gram rule gives"), "{stale}");
}

/// DECODE-4: a draft model that forgets rejected tokens without trimming its
/// cache (`Fault::DraftCacheNotTrimmed`) stays lossless but fails the
/// fidelity check, with the message naming the cache.
#[test]
fn a_draft_model_without_cache_rollback_is_rejected() {
    let w = TinySpec::preset(TINY).unwrap().weights().unwrap();
    let b = ReferenceBackend;
    let m = b.load_model(&w).unwrap();
    let draft = e2e_section::seeded_draft(&w).unwrap();
    let set = GreedyPrompts { prompts: vec![vec![1, 2, 3, 1, 2, 3, 1], vec![0, 4, 9, 2, 4, 9, 2, 4, 11, 10]], max_tokens: 16, eos: vec![] };
    let check = |engine: &EngineConfig| {
        let mut p = DraftModelProposer::new(&b, "draft:seeded", &draft, w.config.vocab_size).unwrap();
        e2e_section::draft_cache_fidelity(&b, &w, &m, &set, &mut p, draft.config.num_hidden_layers, engine)
    };
    check(&engine_config()).unwrap();
    let broken = check(&with_fault(Fault::DraftCacheNotTrimmed)).unwrap_err();
    assert!(broken.contains("the draft cache holds"), "{broken}");
}
