//! Case files are strict (CASE-9): a typo is an error naming the case and
//! the field, never a default; and float judging scales with magnitude
//! (CASE-10).

use std::path::Path;

use specdec_backend::{Backend, ErrorKind, Precision, RefTensor, ReferenceBackend, Result};
use specdec_conformance::case::{ERROR_KINDS, Loaded, parse};
use specdec_conformance::compare::Verdict;
use specdec_conformance::suite::{check_case, check_case_measured};
use specdec_reference::kvcache::BatchKvCache;

fn file(cases: &str) -> String {
    format!(r#"{{"format": "specdec-cases/1", "title": "t", "cases": [{cases}]}}"#)
}

fn load(cases: &str) -> Loaded {
    parse(&file(cases), Path::new("f.json")).expect("the file itself parses")
}

/// The one error of a file holding one bad case: its location and message.
fn only_error(cases: &str) -> String {
    let loaded = load(cases);
    assert!(loaded.cases.is_empty(), "the case must not load: {:?}", loaded.cases);
    assert_eq!(loaded.errors.len(), 1, "{:?}", loaded.errors);
    loaded.errors[0].to_string()
}

const DRAW_INPUTS: &str = r#""weights": [[0.5, 0.5]], "draw_uniforms": [0.75]"#;

/// CASE-9: an unknown field anywhere in a case names the case and the field.
#[test]
fn unknown_fields_are_errors() {
    // A misspelt param would otherwise fall back to the default comparator.
    let e = only_error(
        r#"{"id": "typo-param", "op": "rejection_verify", "expected_by": "hand", "params": {"comparater": "Seed004LessEq"},
        "inputs": {"target_probs": [[[0.5, 0.5], [1.0, 0.0]]], "draft_tokens": [[0]], "proposal_lens": [1],
                   "accept_uniforms": [[0.5]], "draw_uniforms": [[0.5, 0.5]]},
        "expect": {"tokens": [[0, 0]], "num_accepted": [1]}}"#,
    );
    assert!(e.contains("typo-param") && e.contains("params.comparater") && e.contains("unknown field"), "CASE-9: an unknown param names the case and the field: {e}");
    // A misspelt optional input would otherwise be absent (q = one-hot).
    let e = only_error(
        r#"{"id": "typo-input", "op": "residual", "expected_by": "hand",
        "inputs": {"target_probs": [[0.5, 0.5]], "draft_prob": [[0.5, 0.5]], "drafted": [0]}, "expect": {"residual": [[0.0, 1.0]]}}"#,
    );
    assert!(e.contains("typo-input") && e.contains("inputs.draft_prob"), "CASE-9: an unknown input: {e}");
    // At the case's top level, in an object tensor, and at the file's top level.
    let e = only_error(&format!(r#"{{"id": "typo-top", "op": "draw", "expected_by": "hand", "descripton": "x", "inputs": {{{DRAW_INPUTS}}}, "expect": {{"tokens": [1]}}}}"#));
    assert!(e.contains("typo-top") && e.contains("descripton"), "CASE-9: an unknown field of the case: {e}");
    let e = only_error(&format!(r#"{{"id": "typo-expect", "op": "draw", "expected_by": "hand", "inputs": {{{DRAW_INPUTS}}}, "expect": {{"tokens": [1], "token": [1]}}}}"#));
    assert!(e.contains("typo-expect") && e.contains("expect.token"), "CASE-9: an unknown output: {e}");
    let loaded = load(
        r#"{"id": "typo-tensor", "op": "draw", "expected_by": "hand",
        "inputs": {"weights": {"shape": [1, 2], "data": [0.5, 0.5], "dtype": "f32"}, "draw_uniforms": [0.75]}, "expect": {"tokens": [1]}}"#,
    );
    match check_case(&ReferenceBackend, &loaded.cases[0]) {
        Verdict::Fail(m) => assert!(m.contains("typo-tensor") && m.contains("inputs.weights") && m.contains("dtype"), "CASE-9: an unknown field of an object tensor: {m}"),
        other => panic!("{other:?}"),
    }
    let e = parse(r#"{"format": "specdec-cases/1", "title": "t", "case": [], "cases": []}"#, Path::new("f.json")).unwrap_err();
    assert!(e.message.contains("unknown field `case`"), "CASE-9: an unknown field of the file: {e}");
    // Nested configs are strict too (the reference's serde types).
    let loaded = load(
        r#"{"id": "typo-config", "op": "ngram_propose", "expected_by": "hand", "params": {"vocab": 4, "config": {"ngram_min": 1, "ngram_max": 2, "k": 2, "polcy": "LargestNEarliest"}},
        "inputs": {"contexts": [[1, 2, 1]], "context_lens": [3]}, "expect": {"drafts": [[2, 1]], "proposal_lens": [2]}}"#,
    );
    match check_case(&ReferenceBackend, &loaded.cases[0]) {
        Verdict::Fail(m) => assert!(m.contains("typo-config") && m.contains("params.config") && m.contains("polcy"), "CASE-9: an unknown field of a nested config: {m}"),
        other => panic!("{other:?}"),
    }
}

/// CASE-9: `expect` gives every output of the op, or an error; `{}` is malformed, not a pass.
#[test]
fn expectations_are_complete() {
    let e = only_error(&format!(r#"{{"id": "empty", "op": "draw", "expected_by": "hand", "inputs": {{{DRAW_INPUTS}}}, "expect": {{}}}}"#));
    assert!(e.contains("empty") && e.contains("expect.tokens") && e.contains("is missing"), "CASE-9: `expect: {{}}` is malformed: {e}");
    let e = only_error(
        r#"{"id": "half", "op": "greedy_verify", "expected_by": "hand",
        "inputs": {"target_scores": [[[1.0, 0.0], [0.0, 1.0]]], "draft_tokens": [[0]], "proposal_lens": [1]}, "expect": {"tokens": [[0, 1]]}}"#,
    );
    assert!(e.contains("half") && e.contains("expect.num_accepted"), "CASE-9: `expect` gives every output: {e}");
    // An error expectation needs no outputs.
    let loaded = load(
        r#"{"id": "err", "op": "draw", "expected_by": "hand", "description": "a uniform of 1 is out of range", "inputs": {"weights": [[0.5, 0.5]], "draw_uniforms": [1.0]}, "expect": {"error": "UniformOutOfRange", "arg": "draw_uniforms"}}"#,
    );
    assert!(loaded.errors.is_empty(), "CASE-9: an error expectation needs no outputs: {:?}", loaded.errors);
    assert_eq!(loaded.cases[0].description, "a uniform of 1 is out of range", "CASE-9: a case may carry a description");
    assert!(matches!(check_case(&ReferenceBackend, &loaded.cases[0]), Verdict::Pass { .. }));
}

/// CASE-9: error kinds are checked when the file is read.
#[test]
fn error_kinds_are_checked_on_parse() {
    let e = only_error(&format!(r#"{{"id": "kind", "op": "draw", "expected_by": "hand", "inputs": {{{DRAW_INPUTS}}}, "expect": {{"error": "ShapeMissmatch"}}}}"#));
    assert!(e.contains("kind") && e.contains("expect.error") && e.contains("ShapeMissmatch") && e.contains("ShapeMismatch"), "CASE-9: an unknown error kind is refused on read: {e}");
    for name in ERROR_KINDS {
        serde_json::from_value::<ErrorKind>(serde_json::Value::from(name)).unwrap_or_else(|e| panic!("{name}: {e}"));
    }
}

/// CASE-9: an unknown op names every op a case may use, host ops included.
#[test]
fn unknown_op_lists_host_ops() {
    let e = only_error(&format!(r#"{{"id": "op", "op": "drwa", "expected_by": "hand", "inputs": {{{DRAW_INPUTS}}}, "expect": {{"tokens": [1]}}}}"#));
    assert!(e.contains("drwa") && e.contains("draw") && e.contains("controller") && e.contains("theory"), "CASE-9: an unknown op lists the backend and the host ops: {e}");
}

/// CASE-9: a `kv_cache` step holds exactly one of `append` and `trim`; any
/// other shape is a case error naming the step, never a panic.
#[test]
fn kv_steps_are_strict() {
    let append = r#"{"keys": {"shape": [1, 1, 1, 1], "data": [1.0]}, "values": {"shape": [1, 1, 1, 1], "data": [2.0]}, "counts": [1]}"#;
    for (label, step) in [
        ("both", format!(r#"{{"append": {append}, "trim": {{"amounts": [1]}}}}"#)),
        ("neither", r#"{"append or trim": {}}"#.to_string()),
        ("not-object", "3".to_string()),
        ("extra", format!(r#"{{"append": {append}, "note": 1}}"#)),
        ("extra-in-trim", r#"{"trim": {"amounts": [0], "mdoe": "clamped"}}"#.to_string()),
    ] {
        let loaded = load(&format!(
            r#"{{"id": "{label}", "op": "kv_cache", "expected_by": "hand", "params": {{"batch": 1, "heads": 1, "head_dim": 1, "capacity": 4}},
            "inputs": {{"steps": [{step}]}}, "expect": {{"lens": [1], "keys": [[[[1.0]]]], "values": [[[[2.0]]]], "trimmed": {{"shape": [0, 1], "data": []}}}}}}"#
        ));
        match check_case(&ReferenceBackend, &loaded.cases[0]) {
            Verdict::Fail(m) => assert!(m.contains("case file defect") && m.contains(label) && m.contains("inputs.steps[0]"), "CASE-9: a `kv_cache` step `{label}`: {m}"),
            other => panic!("{label}: {other:?}"),
        }
    }
}

/// The reference, claiming binary32 values with an absolute tolerance of
/// 1e-5, returning every float output scaled by `1 + rel`.
struct F32Like {
    rel: f64,
}

impl Backend for F32Like {
    type Tensor = RefTensor;
    type KvCache = BatchKvCache;
    fn name(&self) -> String {
        "f32-like".into()
    }
    fn device(&self) -> String {
        "host".into()
    }
    fn precision(&self) -> Precision {
        Precision { float_dtype: "f32", accumulate_dtype: "f64", margin_epsilon: 1e-6, value_tolerance: 1e-5 }
    }
    specdec_backend::reference_transfers!();
    fn paged_gather(&self, pages: &RefTensor, table: &RefTensor, lens: &RefTensor) -> Result<RefTensor> {
        let RefTensor::F64(g) = ReferenceBackend.paged_gather(pages, table, lens)? else { unreachable!("floats") };
        Ok(RefTensor::F64(g.map(|x| x * (1.0 + self.rel))))
    }
}

/// CASE-10: float outputs are judged by `|got - want| <= atol + rtol |want|`:
/// a value of 1000 off by 5e-5 (under one binary32 ulp there) passes an f32
/// backend with atol 1e-5, a relative error of 1e-4 does not, and the
/// largest difference is reported whether the case passes or fails.
#[test]
fn float_tolerance_scales_with_magnitude() {
    let loaded = load(
        r#"{"id": "big", "op": "paged_gather", "expected_by": "reference",
        "inputs": {"pages": {"shape": [1, 2, 1, 1], "data": [1000.0, 0.5]}, "block_table": [[0]], "context_lens": [2]},
        "expect": {"gathered": {"shape": [1, 2, 1, 1], "data": [1000.0, 0.5]}}}"#,
    );
    let case = &loaded.cases[0];
    let (v, err) = check_case_measured(&F32Like { rel: 5e-8 }, case);
    assert!(matches!(v, Verdict::Pass { .. }), "CASE-10: within atol + rtol |want|: {v:?}");
    assert!((err - 5e-5).abs() < 1e-9, "CASE-10: the largest difference of a passing check is reported: {err}");
    let (v, err) = check_case_measured(&F32Like { rel: 1e-4 }, case);
    assert!(matches!(v, Verdict::Fail(ref m) if m.contains("gathered")), "CASE-10: beyond atol + rtol |want|: {v:?}");
    assert!((err - 0.1).abs() < 1e-9, "CASE-10: a failing case reports its difference too: {err}");
    // A backend claiming tolerance 0 must match reference-written values bit for bit.
    assert!(matches!(check_case(&ReferenceBackend, case), Verdict::Pass { .. }), "CASE-10: a backend stating tolerance 0 matches reference-written values exactly");
}
