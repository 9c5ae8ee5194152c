//! The conformance machinery itself: case files, judging, excuses,
//! statuses, and the contract's accounting rules.

use std::path::Path;

use specdec_backend::{Backend, ErrorKind, HostTensor, Precision, RefTensor, ReferenceBackend, RejectionArgs, RejectionNoise, Result, Verified};
use specdec_conformance::case::{decode_f64, parse};
use specdec_conformance::compare::Verdict;
use specdec_conformance::mutants::{Defect, Mutant};
use specdec_conformance::suite::{self, Selection, Status, SuiteConfig, check_case, glob};
use specdec_reference::kvcache::BatchKvCache;

/// The header every host test double shares: reference tensors, the
/// reference cache, a name and the host device.
macro_rules! host_double {
    ($name:literal) => {
        type Tensor = RefTensor;
        type KvCache = BatchKvCache;
        fn name(&self) -> String {
            $name.into()
        }
        fn device(&self) -> String {
            "host".into()
        }
    };
}

fn file(cases: &str) -> String {
    format!(r#"{{"format": "specdec-cases/1", "title": "t", "cases": [{cases}]}}"#)
}

const GOOD: &str = r#"{"id": "ok", "op": "draw", "expected_by": "hand",
    "inputs": {"weights": [[0.5, 0.5]], "draw_uniforms": [0.75]}, "expect": {"tokens": [1]}}"#;

/// CASE-1: the format tag is required.
#[test]
fn format_tag_is_checked() {
    let e = parse(r#"{"format": "other/1", "title": "t", "cases": []}"#, Path::new("f.json")).unwrap_err();
    assert!(e.message.contains("specdec-cases/1"), "CASE-1: a file without the format tag is refused: {e}");
    assert!(parse("not json", Path::new("f.json")).is_err(), "CASE-1: case files are JSON");
}

/// CASE-8: a malformed case is reported with its id and field; the rest load.
#[test]
fn malformed_cases_fail_alone() {
    let text = file(&format!(r#"{GOOD}, {{"id": "no-expect", "op": "draw", "expected_by": "hand", "inputs": {{}}}}"#));
    let loaded = parse(&text, Path::new("f.json")).unwrap();
    assert_eq!(loaded.cases.len(), 1, "CASE-8: the good case of the file still loads");
    assert_eq!(loaded.errors.len(), 1, "CASE-8: the malformed case fails alone");
    assert!(loaded.errors[0].location.contains("no-expect") && loaded.errors[0].message.contains("expect"), "CASE-8: the error names the case and the field: {:?}", loaded.errors[0]);

    // A case whose input is ragged names the case and the field when run.
    let text = file(
        r#"{"id": "ragged", "op": "draw", "expected_by": "hand",
        "inputs": {"weights": [[0.5, 0.5], [1.0]], "draw_uniforms": [0.1, 0.2]}, "expect": {"tokens": [0, 0]}}"#,
    );
    let case = parse(&text, Path::new("f.json")).unwrap().cases.remove(0);
    match check_case(&ReferenceBackend, &case) {
        Verdict::Fail(m) => assert!(m.contains("ragged") && m.contains("inputs.weights"), "CASE-8: {m}"),
        other => panic!("{other:?}"),
    }
    // An unknown op is named too, and does not stop the suite from running the other items.
    let text = file(&format!(r#"{GOOD}, {{"id": "bad-op", "op": "teleport", "expected_by": "hand", "inputs": {{}}, "expect": {{}}}}"#));
    let items = suite::items_from_text("x.json", &text);
    let cfg = SuiteConfig { statistical: false, diff_cases_per_op: 0, ..SuiteConfig::default() };
    let results = suite::run(&ReferenceBackend, &items, &cfg, &mut |_| {});
    assert_eq!(results.iter().map(|r| r.status).collect::<Vec<_>>(), [Status::Pass, Status::Fail], "CASE-8: the other cases of the file still run");
    assert!(results[1].message.contains("teleport"), "CASE-8: {}", results[1].message);
}

/// CASE-2: tensors as nested arrays or shape/data objects, non-finite floats as strings.
#[test]
fn tensor_encodings() {
    let v: serde_json::Value = serde_json::from_str(r#"[["nan", "-inf"], [1, 2.5]]"#).unwrap();
    let t = decode_f64(&v).unwrap();
    assert_eq!(t.shape(), [2, 2], "CASE-2: a nested array's shape");
    assert!(t.data()[0].is_nan() && t.data()[1] == f64::NEG_INFINITY && t.data()[3] == 2.5, "CASE-2: non-finite floats are the strings `nan`, `inf`, `-inf`");
    let v: serde_json::Value = serde_json::from_str(r#"{"shape": [2, 0], "data": []}"#).unwrap();
    assert_eq!(decode_f64(&v).unwrap().shape(), [2, 0], "CASE-2: a {{shape, data}} object");
    let v: serde_json::Value = serde_json::from_str(r#"["NaNx"]"#).unwrap();
    assert!(decode_f64(&v).unwrap_err().contains("not a number"), "CASE-2: only the three spellings are floats");
}

/// CASE-4, CASE-5, BACKEND-2: one executor runs any case; ids are judged
/// exactly, errors by kind and by the argument they name, so a backend
/// naming another argument than the reference fails.
#[test]
fn judging() {
    let wrong = file(r#"{"id": "w", "op": "draw", "expected_by": "hand", "inputs": {"weights": [[0.5, 0.5]], "draw_uniforms": [0.75]}, "expect": {"tokens": [0]}}"#);
    let case = parse(&wrong, Path::new("f.json")).unwrap().cases.remove(0);
    assert!(matches!(check_case(&ReferenceBackend, &case), Verdict::Fail(m) if m.contains("expected 0, got 1")), "CASE-5: ids are judged exactly");
    let wrong_arg =
        file(r#"{"id": "a", "op": "draw", "expected_by": "hand", "inputs": {"weights": [[0.5, 0.5]], "draw_uniforms": [1.0]}, "expect": {"error": "UniformOutOfRange", "arg": "weights"}}"#);
    let case = parse(&wrong_arg, Path::new("f.json")).unwrap().cases.remove(0);
    assert!(
        matches!(check_case(&ReferenceBackend, &case), Verdict::Fail(m) if m.contains("draw_uniforms")),
        "CASE-5, BACKEND-2: an error of the right kind naming another argument than the reference's fails"
    );
}

/// A port that shifts every accept uniform by 2e-9: it differs from the
/// reference only on decisions closer than that to their boundary.
struct Nudged(f64);

impl Backend for Nudged {
    host_double!("nudged");
    fn precision(&self) -> Precision {
        Precision { float_dtype: "f64", accumulate_dtype: "f64", margin_epsilon: self.0, value_tolerance: 0.0 }
    }
    specdec_backend::reference_transfers!();
    fn rejection_verify(&self, a: RejectionArgs<'_, RefTensor>, n: RejectionNoise<'_, RefTensor>, c: specdec_backend::Comparator) -> Result<Verified<RefTensor>> {
        let RefTensor::F64(u) = n.accept_uniforms else { unreachable!("uniforms are floats") };
        let shifted = RefTensor::F64(u.map(|x| (x + 2e-9).min(0.999_999_999)));
        ReferenceBackend.rejection_verify(a, RejectionNoise { accept_uniforms: &shifted, draw: n.draw }, c)
    }
}

/// BACKEND-4: a decision within the backend's epsilon of its boundary may
/// differ, and is counted; with a smaller epsilon the same difference fails.
#[test]
fn near_boundary_differences_are_excused_and_counted() {
    // u q(x) = 0.5 * 0.8 = 0.4 lies 1e-9 below p(x) = 0.400000001: the
    // reference accepts, the nudged port rejects.
    let text = file(
        r#"{"id": "edge", "op": "rejection_verify", "expected_by": "hand",
        "inputs": {"target_probs": [[[0.400000001, 0.599999999], [1.0, 0.0]]], "draft_probs": [[[0.8, 0.2]]],
                   "draft_tokens": [[0]], "proposal_lens": [1], "accept_uniforms": [[0.5]], "draw_uniforms": [[0.5, 0.5]]},
        "expect": {"tokens": [[0, 0]], "num_accepted": [1]}}"#,
    );
    let case = parse(&text, Path::new("f.json")).unwrap().cases.remove(0);
    assert_eq!(check_case(&ReferenceBackend, &case), Verdict::Pass { excused: 0, max_abs_err: 0.0 });
    assert_eq!(check_case(&Nudged(1e-6), &case), Verdict::Pass { excused: 1, max_abs_err: 0.0 });
    assert!(matches!(check_case(&Nudged(1e-12), &case), Verdict::Fail(_)));
}

/// A backend with only the transfers.
struct Empty;

impl Backend for Empty {
    host_double!("empty");
    fn precision(&self) -> Precision {
        ReferenceBackend.precision()
    }
    specdec_backend::reference_transfers!();
}

/// BACKEND-3 / SUITE-3: not-supported operations are reported, never pass,
/// and do not fail the run.
#[test]
fn not_supported_is_never_a_pass() {
    let cfg = SuiteConfig { diff_cases_per_op: 2, ..SuiteConfig::default() };
    let results = suite::run(&Empty, &suite::all_items(&cfg), &cfg, &mut |_| {});
    // Every operation check is NotSupported; the one check that is not of an
    // operation, the precision statement (BACKEND-6), is judged as stated.
    let (statement, operations): (Vec<_>, Vec<_>) = results.iter().partition(|r| r.name == "precision/within-cap");
    assert_eq!(statement.len(), 1);
    assert_eq!(statement[0].status, Status::Pass, "{}", statement[0].message);
    assert!(
        operations.iter().all(|r| r.status == Status::NotSupported),
        "BACKEND-3: an operation the backend lacks is NotSupported: {:?}",
        operations.iter().find(|r| r.status != Status::NotSupported)
    );
    let report = specdec_conformance::report::Report::new(&Empty, cfg.seed, results);
    assert!(!report.summary.failed, "SUITE-3: NotSupported is reported and does not fail the run");
    assert_eq!(report.count(Status::Pass), 1, "BACKEND-3: NotSupported is never counted as a pass; only the precision statement passes");
}

/// SUITE-1, SUITE-2, SUITE-3: selection globs, xfail and xpass.
#[test]
fn selection_and_expected_failures() {
    assert!(glob("golden/*/err-*", "golden/greedy/err-nan-score"), "SUITE-1: `*` matches any run of characters");
    assert!(!glob("golden/*/err-*", "golden/greedy/all-accepted"), "SUITE-1: the rest of the glob must match");
    assert!(glob("*", "anything") && glob("a*b*c", "a-b-c") && !glob("a*b", "a-c"), "SUITE-1: glob lists");

    let selection = Selection::parse("include = [\"golden/rejection/*\"]\nxfail = [\"golden/rejection/seed004-example-residual\", \"golden/rejection/one-hot-target-is-greedy\"]").unwrap();
    let cfg = SuiteConfig { selection, statistical: false, diff_cases_per_op: 0, ..SuiteConfig::default() };
    // The residual-is-target mutant fails the first listed case: an expected failure.
    let results = suite::run(&Mutant(Defect::ResidualIsTarget), &suite::all_items(&cfg), &cfg, &mut |_| {});
    let status = |name: &str| results.iter().find(|r| r.name == name).map(|r| r.status);
    assert_eq!(status("golden/rejection/seed004-example-residual"), Some(Status::XFail), "SUITE-2: failed and listed is XFail");
    // It does not break the second listed case, whose xfail is stale: a failure.
    assert_eq!(status("golden/rejection/one-hot-target-is-greedy"), Some(Status::XPass), "SUITE-2: passed although listed is XPass");
    assert!(Status::XPass.is_failure() && !Status::XFail.is_failure(), "SUITE-3: a run fails on XPass, not on XFail");
    assert!(results.iter().filter(|r| !r.name.starts_with("golden/rejection/")).all(|r| r.status == Status::Skipped), "SUITE-1, SUITE-2: what `include` leaves out is Skipped");
    assert!(Selection::parse("includ = []").is_err(), "SUITE-1: unknown keys are rejected");
}

/// Case files name error kinds by stable strings.
#[test]
fn error_kinds_are_stable_names() {
    let names: Vec<String> = ErrorKind::ALL.iter().map(|k| serde_json::to_string(k).unwrap()).collect();
    assert!(names.contains(&"\"NotNormalized\"".to_string()) && names.len() == ErrorKind::ALL.len());
}

/// CASE-6: differential cases are a pure function of (op, index, seed), and
/// some carry an injected defect whose error the backend must reproduce.
#[test]
fn differential_cases_are_reproducible_and_include_defects() {
    use specdec_conformance::diff;
    for op in diff::ops() {
        let a = diff::case(op, 3, 11).unwrap();
        assert_eq!(a, diff::case(op, 3, 11).unwrap(), "CASE-6: {op} is not reproducible");
        assert_ne!(a.inputs, diff::case(op, 3, 12).unwrap().inputs, "CASE-6: {op} ignores the run seed");
        let errors = (0..diff::DEFAULT_CASES_PER_OP).filter(|&i| diff::case(op, i, 11).unwrap().expect.contains_key("error")).count();
        assert!(errors > 0, "CASE-6: no `{op}` case exercises an injected defect");
    }
}

/// CASE-4: one executor defines, per op, what a case reads and returns:
/// every differential case holds only the params and inputs the op's
/// executor reads and expects every output it returns (they are checked like
/// a golden or an external case's), and the executor returns exactly the
/// outputs the op's definition lists.
#[test]
fn one_executor_defines_each_ops_inputs_and_outputs() {
    use specdec_conformance::case::validate;
    use specdec_conformance::diff;
    use specdec_conformance::execute::execute;
    use specdec_conformance::ops::op_fields;
    for op in diff::ops() {
        for i in 0..8 {
            let case = diff::case(op, i, 5).unwrap();
            validate(&case).unwrap_or_else(|e| panic!("CASE-4: differential case {} is not a valid `{op}` case: {e}", case.id));
            let observed = execute(&ReferenceBackend, &case).expect("a generated case runs");
            if observed.error.is_none() {
                let mut got: Vec<&str> = observed.outputs.iter().map(|(n, _)| n.as_str()).collect();
                let mut want = op_fields(op).outputs.to_vec();
                got.sort_unstable();
                want.sort_unstable();
                assert_eq!(got, want, "CASE-4: the outputs `{op}` returns are the ones its case definition lists");
            }
        }
    }
    // A golden case of the same op goes through the same definition: an
    // input the executor does not read is refused, not ignored.
    let text = file(r#"{"id": "extra", "op": "draw", "expected_by": "hand", "inputs": {"weights": [[0.5, 0.5]], "draw_uniforms": [0.75], "accept_uniforms": [0.5]}, "expect": {"tokens": [1]}}"#);
    let loaded = parse(&text, Path::new("f.json")).unwrap();
    assert!(loaded.cases.is_empty() && loaded.errors[0].message.contains("draw_uniforms"), "CASE-4: the error lists what `draw` reads: {:?}", loaded.errors);
}

/// CASE-7: host cases (worked examples of the reference-only algorithms)
/// are judged the same way as the golden cases: a right worked example
/// passes, a wrong one fails naming the output.
#[test]
fn host_cases_are_judged_like_golden_cases() {
    use specdec_conformance::host::check_host_case;
    let host = |trim: &str| {
        let text = file(&format!(
            r#"{{"id": "rollback", "op": "rollback_amounts", "expected_by": "hand", "params": {{"proposal_lens": [2, 3], "num_accepted": [1, 3]}}, "inputs": {{}}, "expect": {{"trim": {trim}}}}}"#
        ));
        parse(&text, Path::new("host.json")).unwrap().cases.remove(0)
    };
    assert!(matches!(check_host_case(&host("[1, 0]")), Verdict::Pass { .. }), "CASE-7: the worked example is the reference's result");
    match check_host_case(&host("[1, 1]")) {
        Verdict::Fail(m) => assert!(m.contains("trim"), "CASE-7: the failure names the output: {m}"),
        other => panic!("CASE-7: a wrong worked example must fail, got {other:?}"),
    }
}

/// A backend that counts downloads.
struct Counting(std::cell::Cell<usize>);

impl Backend for Counting {
    host_double!("counting");
    fn precision(&self) -> Precision {
        ReferenceBackend.precision()
    }
    fn upload_f64(&self, t: &HostTensor<f64>) -> Result<RefTensor> {
        ReferenceBackend.upload_f64(t)
    }
    fn upload_i64(&self, t: &HostTensor<i64>) -> Result<RefTensor> {
        ReferenceBackend.upload_i64(t)
    }
    fn download_f64(&self, t: &RefTensor) -> Result<HostTensor<f64>> {
        self.0.set(self.0.get() + 1);
        ReferenceBackend.download_f64(t)
    }
    fn download_i64(&self, t: &RefTensor) -> Result<HostTensor<i64>> {
        self.0.set(self.0.get() + 1);
        ReferenceBackend.download_i64(t)
    }
    fn rejection_verify(&self, a: RejectionArgs<'_, RefTensor>, n: RejectionNoise<'_, RefTensor>, c: specdec_backend::Comparator) -> Result<Verified<RefTensor>> {
        ReferenceBackend.rejection_verify(a, n, c)
    }
}

/// BACKEND-1: a verify step returns device tensors; the caller moves only
/// the accepted tokens and counts to the host (two downloads).
#[test]
fn a_verify_step_downloads_only_tokens_and_counts() {
    let text = file(
        r#"{"id": "v", "op": "rejection_verify", "expected_by": "hand",
        "inputs": {"target_probs": [[[0.5, 0.5], [1.0, 0.0]]], "draft_probs": [[[0.5, 0.5]]], "draft_tokens": [[0]],
                   "proposal_lens": [1], "accept_uniforms": [[0.1]], "draw_uniforms": [[0.5, 0.5]]},
        "expect": {"tokens": [[0, 0]], "num_accepted": [1]}}"#,
    );
    let case = parse(&text, Path::new("f.json")).unwrap().cases.remove(0);
    let backend = Counting(std::cell::Cell::new(0));
    assert!(matches!(check_case(&backend, &case), Verdict::Pass { .. }));
    assert_eq!(backend.0.get(), 2, "BACKEND-1: a verify step downloads only the tokens and the counts");
}

/// A backend whose verify panics.
struct Panicky;

impl Backend for Panicky {
    host_double!("panicky");
    fn precision(&self) -> Precision {
        ReferenceBackend.precision()
    }
    specdec_backend::reference_transfers!();
    fn rejection_verify(&self, _: RejectionArgs<'_, RefTensor>, _: RejectionNoise<'_, RefTensor>, _: specdec_backend::Comparator) -> Result<Verified<RefTensor>> {
        panic!("kernel exploded")
    }
    fn greedy_verify(&self, s: &RefTensor, d: &RefTensor, l: &RefTensor) -> Result<Verified<RefTensor>> {
        ReferenceBackend.greedy_verify(s, d, l)
    }
}

/// SUITE-3: a backend that panics fails the checks that reach the panic,
/// with the message, and every other check still runs.
#[test]
fn a_panic_fails_only_its_own_check() {
    let cfg = SuiteConfig { filter: Some("golden/".into()), statistical: false, diff_cases_per_op: 0, ..SuiteConfig::default() };
    let items: Vec<_> = suite::all_items(&cfg).into_iter().filter(|i| i.name.starts_with("golden/rejection/") || i.name.starts_with("golden/greedy/")).collect();
    let results = suite::run(&Panicky, &items, &cfg, &mut |_| {});
    let greedy: Vec<_> = results.iter().filter(|r| r.name.starts_with("golden/greedy/")).collect();
    assert!(!greedy.is_empty() && greedy.iter().all(|r| r.status == Status::Pass));
    let panicked = results.iter().filter(|r| r.status == Status::Fail && r.message.contains("kernel exploded")).count();
    assert!(panicked > 10, "only {panicked} checks reported the panic");
}

/// A port whose unchecked greedy verify drops every accepted draft.
struct SloppyUnchecked;

impl Backend for SloppyUnchecked {
    host_double!("sloppy-unchecked");
    fn precision(&self) -> Precision {
        ReferenceBackend.precision()
    }
    specdec_backend::reference_transfers!();
    fn greedy_verify(&self, s: &RefTensor, d: &RefTensor, l: &RefTensor) -> Result<Verified<RefTensor>> {
        ReferenceBackend.greedy_verify(s, d, l)
    }
    fn greedy_verify_unchecked(&self, s: &RefTensor, d: &RefTensor, l: &RefTensor) -> Result<Verified<RefTensor>> {
        let v = ReferenceBackend.greedy_verify(s, d, l)?;
        let RefTensor::I64(n) = &v.num_accepted else { unreachable!("counts are ids") };
        Ok(Verified { num_accepted: RefTensor::I64(n.map(|_| 0)), ..v })
    }
}

/// GLUE-6: the unchecked verify must give the checked op's result on every
/// valid golden and differential case; the checked cases alone do not see a
/// broken unchecked path, the `unchecked/*` check does. Default unchecked
/// methods (the checked ops) pass, and a backend without the op is not
/// supported there either.
#[test]
fn unchecked_verify_must_match_the_checked_op() {
    let cfg = SuiteConfig { filter: Some("unchecked/".into()), statistical: false, diff_cases_per_op: 4, ..SuiteConfig::default() };
    let items: Vec<_> = suite::all_items(&cfg).into_iter().filter(|i| i.name.starts_with("unchecked/")).collect();
    assert_eq!(items.len(), 2);
    let status = |results: &[suite::CheckResult], name: &str| results.iter().find(|r| r.name == name).map(|r| r.status);
    let sloppy = suite::run(&SloppyUnchecked, &items, &cfg, &mut |_| {});
    assert_eq!(status(&sloppy, "unchecked/greedy_verify"), Some(Status::Fail));
    assert_eq!(status(&sloppy, "unchecked/rejection_verify"), Some(Status::NotSupported));
    let reference = suite::run(&ReferenceBackend, &items, &cfg, &mut |_| {});
    assert!(reference.iter().all(|r| r.status == Status::Pass), "{reference:?}");
}

/// The runner's standard sections: every check it lists comes back in the
/// report, in order, whichever are selected; the host cases are part of the
/// reference's run (judged there) and of no other backend's.
#[test]
fn the_runner_reports_every_check_it_lists_and_host_cases_run_on_the_reference() {
    use specdec_conformance::check::Kind;
    use specdec_conformance::model_section::ModelFiles;
    use specdec_conformance::runner::Runner;
    let cfg = SuiteConfig { filter: Some("host/".into()), statistical: false, ..SuiteConfig::default() };
    let runner: Runner<'_, ReferenceBackend> = Runner::standard(&cfg, ModelFiles::default(), "reference");
    let report = runner.run(&ReferenceBackend, &cfg, &mut |_| {});
    let names: Vec<String> = report.results.iter().map(|r| r.name.clone()).collect();
    assert_eq!(names, runner.names(), "one result per listed check, in order");
    let host: Vec<_> = report.results.iter().filter(|r| r.name.starts_with("host/")).collect();
    assert!(host.len() > 50, "the shipped host cases run ({} of them)", host.len());
    assert!(host.iter().all(|r| r.kind == Kind::Host && r.status == Status::Pass), "every host case passes on the reference");
    assert!(report.results.iter().filter(|r| !r.name.starts_with("host/")).all(|r| r.status == Status::Skipped), "the filter leaves the rest unselected");
    let other: Runner<'_, ReferenceBackend> = Runner::standard(&cfg, ModelFiles::default(), "ndarray");
    assert!(!other.names().iter().any(|n| n.starts_with("host/")), "another backend's run has no host cases");

    // Negative control: a host case with a wrong expectation fails as itself.
    use specdec_conformance::host::HostSection;
    let wrong = parse(
        &file(r#"{"id": "wrong", "op": "mask_ratio", "rules": ["DRAFT-2"], "expected_by": "hand", "params": {"schedule": "Cosine", "t": 1.0}, "inputs": {}, "expect": {"ratio": [0.5]}}"#),
        Path::new("t.json"),
    )
    .unwrap();
    let runner: Runner<'_, ReferenceBackend> = Runner::default().with(HostSection::from_cases("file/t", wrong.cases));
    let report = runner.run(&ReferenceBackend, &SuiteConfig::default(), &mut |_| {});
    assert_eq!((report.results[0].name.as_str(), report.results[0].status), ("file/t/wrong", Status::Fail), "{}", report.results[0].message);
}
