//! The protocol itself (PROTO-1, PROTO-2, PROTO-3, PROTO-4, PROTO-5, PROTO-6,
//! PROTO-7, PROTO-8): tensor encoding in both forms,
//! the handshake, and adapters that misbehave: a liar, garbage, wrong
//! fields, a crash, a hang. Each defect must fail its check (never pass,
//! never be excused as not supported), name the field or carry the stderr
//! tail, and leave the run going. The broken NumPy port (`<=` instead of
//! `<`, ACCEPT-1) must be caught by the suite.

use std::time::{Duration, Instant};

use serde_json::json;
use specdec_backend::{Backend, BackendError, HostTensor, RefTensor};
use specdec_conformance::suite::{self, Status, SuiteConfig};
use specdec_exec::protocol::{ReplyError, Want, b64_decode, b64_encode, decode_tensor, encode_tensor, parse_error};
use specdec_exec::{ExecBackend, ExecError};

const FAKE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/fake_adapter.py");

fn fake(mode: &str, timeout: Duration) -> ExecBackend {
    ExecBackend::with_timeout(&format!("exec python3 '{FAKE}' {mode}"), timeout).expect("the fake adapter starts")
}

/// PROTO-4: plain arrays for small finite tensors, base64 otherwise; both decode back exactly.
#[test]
fn tensors_round_trip_in_both_forms() {
    let small = RefTensor::F64(HostTensor::new(vec![2, 2], vec![0.1, -2.5, 1e-300, 3.0]).unwrap());
    let enc = encode_tensor(&small);
    assert!(enc["data"].is_array(), "PROTO-4: a small finite tensor travels as a plain array: {enc}");
    assert_eq!(decode_tensor(&enc, "t", Want::Float).unwrap(), small, "PROTO-4: a plain array decodes back exactly");

    let nan = RefTensor::F64(HostTensor::new(vec![3], vec![f64::NAN, f64::INFINITY, 0.5]).unwrap());
    let enc = encode_tensor(&nan);
    assert!(enc["data"].is_string(), "PROTO-4: non-finite values travel as base64: {enc}");
    let RefTensor::F64(back) = decode_tensor(&enc, "t", Want::Float).unwrap() else { panic!("float") };
    assert!(back.data()[0].is_nan() && back.data()[1] == f64::INFINITY && back.data()[2] == 0.5);

    let big = RefTensor::I64(HostTensor::new(vec![10, 10], (0..100).map(|i| i * 1_000_000_007 - 5).collect()).unwrap());
    let enc = encode_tensor(&big);
    assert!(enc["data"].is_string(), "PROTO-4: a large tensor travels as base64");
    assert_eq!(decode_tensor(&enc, "t", Want::Int).unwrap(), big, "PROTO-4: base64 of little-endian values decodes back exactly");

    // f32 and the case-file spellings of non-finite floats are accepted.
    let f32s = json!({"shape": [2], "dtype": "f32", "data": b64_encode(&[1.5f32.to_le_bytes(), (-2.0f32).to_le_bytes()].concat())});
    assert_eq!(decode_tensor(&f32s, "t", Want::Float).unwrap(), RefTensor::F64(HostTensor::from_vec(vec![1.5, -2.0])));
    let strs = json!({"shape": [2], "dtype": "f64", "data": ["-inf", 2.0]});
    assert_eq!(decode_tensor(&strs, "t", Want::Float).unwrap(), RefTensor::F64(HostTensor::from_vec(vec![f64::NEG_INFINITY, 2.0])));

    for (text, bytes) in [("", &b""[..]), ("Zg==", b"f"), ("Zm8=", b"fo"), ("Zm9v", b"foo"), ("Zm9vYmFy", b"foobar")] {
        assert_eq!(b64_encode(bytes), text);
        assert_eq!(b64_decode(text).unwrap(), bytes);
    }
    assert!(b64_decode("Zm9").is_err() && b64_decode("Z=9v").is_err() && b64_decode("Zm9*").is_err());
}

/// PROTO-4, PROTO-6: every defect of a tensor or an error object is named by its field.
#[test]
fn malformed_tensors_and_errors_name_the_field() {
    let cases = [
        (json!({"shape": [2], "dtype": "i64", "data": [1]}), "out.data"),
        (json!({"shape": [2], "dtype": "f64", "data": [1.0, 2.0]}), "out.dtype"),
        (json!({"shape": [-1], "dtype": "i64", "data": []}), "out.shape[0]"),
        (json!({"dtype": "i64", "data": []}), "out.shape"),
        (json!({"shape": [1], "dtype": "i64", "data": ["x"]}), "out.data[0]"),
        (json!({"shape": [1], "dtype": "i64", "data": "AAA"}), "out.data"),
        (json!([1, 2]), "out"),
    ];
    for (value, field) in cases {
        let e = decode_tensor(&value, "out", Want::Int).unwrap_err();
        assert_eq!(e.field, field, "PROTO-4: a malformed tensor names its field: {value}: {e:?}");
    }
    let e = parse_error(&json!({"kind": "Oops", "arg": "x"})).unwrap_err();
    assert_eq!(e.field, "error.kind", "PROTO-6: an error reply carries a spec error kind");
    let e = parse_error(&json!({"kind": "ShapeMismatch"})).unwrap_err();
    assert_eq!(e.field, "error.arg", "PROTO-6: a spec error reply carries its argument");
    let ok = parse_error(&json!({"kind": "TokenOutOfRange", "arg": "draft_tokens", "index": [0, 1], "value": 9, "vocab": 4})).unwrap();
    let ReplyError::Spec(e) = ok else { panic!("PROTO-6: a spec error") };
    assert_eq!((e.kind(), e.arg()), (specdec_backend::ErrorKind::TokenOutOfRange, Some("draft_tokens")), "PROTO-6: the kind and the argument");
}

fn greedy_inputs(b: &ExecBackend) -> (RefTensor, RefTensor, RefTensor) {
    let s = HostTensor::new(vec![1, 2, 3], vec![0.1, 0.7, 0.2, 0.5, 0.3, 0.2]).unwrap();
    (b.upload_f64(&s).unwrap(), b.upload_i64(&HostTensor::new(vec![1, 1], vec![1]).unwrap()).unwrap(), b.upload_i64(&HostTensor::from_vec(vec![1])).unwrap())
}

fn device_message(r: Result<specdec_backend::Verified<RefTensor>, BackendError>) -> String {
    match r {
        Err(BackendError::Device { message, .. }) => message,
        other => panic!("expected a device error, got {other:?}"),
    }
}

/// Runs the golden greedy checks on `b`: (statuses, messages).
fn greedy_checks(b: &ExecBackend) -> Vec<(Status, String)> {
    let cfg = SuiteConfig { filter: Some("golden/greedy/*".into()), statistical: false, diff_cases_per_op: 0, ..SuiteConfig::default() };
    let results = suite::run(b, &suite::all_items(&cfg), &cfg, &mut |_| {});
    results.into_iter().filter(|r| r.status != Status::Skipped).map(|r| (r.status, r.message)).collect()
}

/// PROTO-2, PROTO-3: the handshake is read; an op it does not list is NotSupported
/// without a call; an op it lists and then refuses is a lie, and fails.
#[test]
fn a_liar_fails_and_unlisted_ops_are_not_supported() {
    let b = fake("liar", Duration::from_secs(10));
    assert_eq!(b.handshake().name, "fake-liar", "PROTO-2: the handshake names the adapter");
    assert_eq!(b.name(), "exec-fake-liar", "PROTO-2");
    let x = b.upload_f64(&HostTensor::new(vec![1, 2], vec![0.5, 0.5]).unwrap()).unwrap();
    let d = b.upload_i64(&HostTensor::from_vec(vec![0])).unwrap();
    assert!(matches!(b.residual(&x, None, &d), Err(BackendError::NotSupported { .. })), "PROTO-3: an unlisted operation is NotSupported");
    let (s, dr, l) = greedy_inputs(&b);
    let msg = device_message(b.greedy_verify(&s, &dr, &l));
    assert!(msg.contains("lied") && msg.contains("greedy_verify"), "PROTO-3: a listed operation answered with NotSupported is a failure: {msg}");
    let checks = greedy_checks(&b);
    assert!(!checks.is_empty() && checks.iter().all(|(s, _)| *s == Status::Fail), "PROTO-3: its checks fail, never NotSupported: {checks:?}");
}

/// PROTO-5: a reply that is not JSON, a wrong field, a wrong id: typed
/// errors naming the field; each check fails and the next call gets a fresh adapter.
#[test]
fn garbage_and_wrong_fields_are_typed_errors_naming_the_field() {
    for (mode, field) in [("garbage", "(line)"), ("wrong-field", "outputs.tokens.data"), ("wrong-id", "id")] {
        let b = fake(mode, Duration::from_secs(10));
        let (s, d, l) = greedy_inputs(&b);
        let msg = device_message(b.greedy_verify(&s, &d, &l));
        assert!(msg.contains(&format!("field `{field}`")), "PROTO-5: a malformed reply is a typed error naming the field: {mode}: {msg}");
        let checks = greedy_checks(&b);
        assert!(!checks.is_empty() && checks.iter().all(|(s, _)| *s == Status::Fail), "PROTO-5: {mode}: {checks:?}");
        if mode != "wrong-field" {
            // Out of step (unparseable line, stale id): a fresh process per call.
            assert!(b.restarts() >= checks.len() as u64, "PROTO-7: {mode}: the adapter is restarted after each malformed reply");
        }
    }
    let e = ExecError::Malformed { op: "draw".into(), field: "outputs.tokens".into(), reason: "is missing".into() };
    assert_eq!(e.to_string(), "malformed reply to `draw`: field `outputs.tokens`: is missing", "PROTO-5");
}

/// PROTO-7: a crash fails the call with the adapter's stderr tail; the next call restarts it.
#[test]
fn a_crash_fails_the_check_with_its_stderr_and_is_restarted() {
    let b = fake("crash", Duration::from_secs(10));
    let (s, d, l) = greedy_inputs(&b);
    let msg = device_message(b.greedy_verify(&s, &d, &l));
    assert!(msg.contains("exited") && msg.contains("segfaulted (simulated)"), "PROTO-7: a crash fails the call with the adapter's stderr tail: {msg}");
    let msg = device_message(b.greedy_verify(&s, &d, &l));
    assert!(msg.contains("segfaulted"), "PROTO-7: {msg}");
    assert_eq!(b.restarts(), 1, "PROTO-7: the adapter is restarted");
}

/// PROTO-7: a hang past the per-call timeout is killed and fails that check
/// alone; the restarted adapter answers the rest of the run.
#[test]
fn a_hang_times_out_and_the_run_goes_on() {
    let marker = std::env::temp_dir().join(format!("specdec-exec-hang-{}", std::process::id()));
    let _ = std::fs::remove_file(&marker);
    let b = fake(&format!("hang-once '{}'", marker.display()), Duration::from_millis(1500));
    let start = Instant::now();
    let checks = greedy_checks(&b);
    let _ = std::fs::remove_file(&marker);
    assert!(start.elapsed() < Duration::from_secs(60), "PROTO-7: the hang was not cut short by the per-call timeout");
    let (first, msg) = &checks[0];
    assert_eq!(*first, Status::Fail, "PROTO-7: a hang fails that call");
    assert!(msg.contains("timed out") && msg.contains("about to hang"), "PROTO-7: with the adapter's stderr tail: {msg}");
    assert!(checks.iter().skip(1).any(|(s, _)| *s == Status::Pass), "PROTO-7: the restarted adapter answers the rest: {checks:?}");
    // At least the restart after the hang (the fake does not validate, so
    // error cases may crash it too).
    assert!(b.restarts() >= 1);
}

/// A handshake from another protocol version is refused, naming the field.
#[test]
fn a_wrong_handshake_is_refused() {
    let cmd = r#"read line; echo '{"id": 0, "protocol": "specdec-exec/0", "name": "old", "device": "cpu", "ops": [], "precision": {}}'"#;
    let e = ExecBackend::with_timeout(cmd, Duration::from_secs(5)).unwrap_err();
    assert!(matches!(&e, ExecError::Malformed { field, .. } if field == "protocol"), "PROTO-2: the handshake names the protocol version: {e}");
    let e = ExecBackend::with_timeout("exit 3", Duration::from_secs(5)).unwrap_err();
    assert!(matches!(e, ExecError::Crashed { .. }), "{e}");
}

/// An adapter written as a shell loop (no interpreter but `sh`): it answers
/// the handshake listing `ops`, then appends each request line to `log` and
/// answers it with `outputs` under the request's id.
fn logging_adapter(log: &std::path::Path, ops: &[&str], outputs: &serde_json::Value) -> ExecBackend {
    let hello = json!({"id": 0, "protocol": "specdec-exec/1", "name": "sh-loop", "device": "pipe", "ops": ops,
        "precision": {"float_dtype": "f32", "accumulate_dtype": "f64", "margin_epsilon": 1e-6, "value_tolerance": 1e-5}});
    let _ = std::fs::remove_file(log);
    let cmd = format!(
        r#"read -r hello; printf '%s\n' '{hello}'; i=1; while read -r req; do printf '%s\n' "$req" >> '{}'; printf '{{"id": %d, "outputs": %s}}\n' "$i" '{outputs}'; i=$((i + 1)); done"#,
        log.display()
    );
    ExecBackend::with_timeout(&cmd, Duration::from_secs(10)).expect("the shell adapter starts")
}

/// The request lines `logging_adapter` received, parsed.
fn logged(log: &std::path::Path) -> Vec<serde_json::Value> {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    text.lines().map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("PROTO-1: a request line is one JSON object: {e}: {l}"))).collect()
}

fn verified_outputs(tokens: &[i64], accepted: i64) -> serde_json::Value {
    json!({"tokens": {"shape": [1, tokens.len()], "dtype": "i64", "data": tokens}, "num_accepted": {"shape": [1], "dtype": "i64", "data": [accepted]}})
}

/// PROTO-1, PROTO-2, PROTO-3: any `sh -c` command line is an adapter: one
/// request per stdin line, one reply per stdout line; the handshake's name,
/// device, operations and precision are the backend's; an unlisted
/// operation is NotSupported without a request.
#[test]
fn a_shell_loop_speaking_json_lines_is_an_adapter() {
    let log = std::env::temp_dir().join(format!("specdec-exec-lines-{}", std::process::id()));
    let b = logging_adapter(&log, &["greedy_verify"], &verified_outputs(&[1, 0], 1));
    assert_eq!(b.name(), "exec-sh-loop", "PROTO-2: the handshake names the adapter");
    assert_eq!(b.device(), "pipe", "PROTO-2: the handshake names the device");
    assert_eq!(b.handshake().ops, ["greedy_verify"], "PROTO-2: the handshake lists the operations");
    let p = b.precision();
    assert_eq!((p.float_dtype, p.accumulate_dtype, p.margin_epsilon, p.value_tolerance), ("f32", "f64", 1e-6, 1e-5), "PROTO-2: the handshake states the precision");
    let (s, d, l) = greedy_inputs(&b);
    for _ in 0..2 {
        let v = b.greedy_verify(&s, &d, &l).expect("PROTO-1: the reply line is read");
        assert_eq!(b.download_i64(&v.tokens).unwrap().data(), [1, 0], "PROTO-1: the outputs of the reply line");
    }
    let x = b.upload_f64(&HostTensor::new(vec![1, 2], vec![0.5, 0.5]).unwrap()).unwrap();
    assert!(matches!(b.residual(&x, None, &d), Err(BackendError::NotSupported { .. })), "PROTO-3: an unlisted operation is NotSupported");
    let requests = logged(&log);
    let _ = std::fs::remove_file(&log);
    assert_eq!(requests.len(), 2, "PROTO-1, PROTO-3: one request line per listed call, none for the unlisted one: {requests:?}");
    for (i, r) in requests.iter().enumerate() {
        assert_eq!((r["id"].as_u64(), r["op"].as_str()), (Some(i as u64 + 1), Some("greedy_verify")), "PROTO-5: one request per operation call, with its id: {r}");
        assert!(r["inputs"]["target_scores"]["shape"].is_array(), "PROTO-4: inputs are {{shape, dtype, data}} tensors: {r}");
    }
    assert_eq!(b.restarts(), 0, "PROTO-1: one process answered every line");
}

/// PROTO-3, PROTO-5: the processor inputs (LOGITS-7 .. LOGITS-10) reach only
/// an adapter whose handshake lists `logits_processors`; one that lists
/// `process_logits` alone answers the basic call, and a call with processors
/// is NotSupported without a request (it could ignore them and answer another law).
#[test]
fn processor_inputs_go_only_to_an_adapter_that_claims_them() {
    let probs = json!({"probs": {"shape": [1, 2], "dtype": "f64", "data": [0.5, 0.5]}});
    let t = |v: Vec<f64>, shape: Vec<usize>| RefTensor::F64(HostTensor::new(shape, v).unwrap());
    let (z, temp, top_p, min_p) = (t(vec![0.0, 0.0], vec![1, 2]), t(vec![1.0], vec![1]), t(vec![1.0], vec![1]), t(vec![0.1], vec![1]));
    let top_k = RefTensor::I64(HostTensor::new(vec![1], vec![0]).unwrap());
    let with_min_p = |b: &ExecBackend| {
        let mut p = specdec_backend::LogitsParams::new(&temp, &top_k, &top_p);
        p.min_p = Some(&min_p);
        b.process_logits(&z, p)
    };
    for (ops, claims) in [(&["process_logits"][..], false), (&["process_logits", "logits_processors"][..], true)] {
        let log = std::env::temp_dir().join(format!("specdec-exec-processors-{}-{claims}", std::process::id()));
        let b = logging_adapter(&log, ops, &probs);
        b.process_logits(&z, specdec_backend::LogitsParams::new(&temp, &top_k, &top_p)).expect("the basic call is answered");
        let second = with_min_p(&b);
        let requests = logged(&log);
        let _ = std::fs::remove_file(&log);
        if claims {
            second.expect("an adapter that claims the processors is sent them");
            assert_eq!(requests.len(), 2, "{requests:?}");
            assert!(requests[1]["inputs"]["min_p"]["shape"].is_array(), "PROTO-5: min_p is sent: {}", requests[1]);
        } else {
            assert!(matches!(second, Err(BackendError::NotSupported { .. })), "{second:?}");
            assert_eq!(requests.len(), 1, "no request for the unclaimed processors: {requests:?}");
            assert!(requests[0]["inputs"].get("min_p").is_none(), "{}", requests[0]);
        }
    }
}

/// PROTO-8: `rejection_verify_seeded` sends the seed to the adapter, and no
/// noise: the adapter's own generator draws it.
#[test]
fn the_seeded_verify_sends_the_seed() {
    let log = std::env::temp_dir().join(format!("specdec-exec-seed-{}", std::process::id()));
    let b = logging_adapter(&log, &["rejection_verify_seeded"], &verified_outputs(&[2, 0], 1));
    let p = b.upload_f64(&HostTensor::new(vec![1, 2, 3], vec![0.2, 0.3, 0.5, 0.2, 0.3, 0.5]).unwrap()).unwrap();
    let d = b.upload_i64(&HostTensor::new(vec![1, 1], vec![2]).unwrap()).unwrap();
    let l = b.upload_i64(&HostTensor::from_vec(vec![1])).unwrap();
    let args = specdec_backend::RejectionArgs { target_probs: &p, draft_probs: None, draft_tokens: &d, proposal_lens: &l };
    b.rejection_verify_seeded(args, specdec_backend::DrawMethod::InverseCdf, Default::default(), 20_261_122).expect("the reply is read");
    let requests = logged(&log);
    let _ = std::fs::remove_file(&log);
    assert_eq!(requests.len(), 1, "{requests:?}");
    let r = &requests[0];
    assert_eq!(r["op"], "rejection_verify_seeded", "PROTO-8: {r}");
    assert_eq!(r["params"]["seed"], 20_261_122, "PROTO-8: the seed goes to the adapter's own generator: {r}");
    let inputs: Vec<&str> = r["inputs"].as_object().expect("named inputs").keys().map(String::as_str).collect();
    assert!(!inputs.iter().any(|n| n.contains("uniforms") || n.contains("exponentials")), "PROTO-8: no noise is sent: {inputs:?}");
}

fn numpy_command(env: &str) -> Option<String> {
    let python = std::env::var("SPECDEC_PYTHON").ok()?;
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/../..");
    Some(format!("cd '{root}' && {env} exec '{python}' adapters/python/numpy_backend.py"))
}

/// The suite catches a broken port: the NumPy adapter with `u * q <= p`
/// instead of the strict `<` (ACCEPT-1, REJECT-2) fails rejection checks,
/// and the seeded verify sends the seed to the adapter's own generator (PROTO-8).
#[test]
fn the_suite_catches_the_lesseq_mutant() {
    let Some(cmd) = numpy_command("SPECDEC_NUMPY_MUTANT=lesseq") else {
        eprintln!("ignored: SPECDEC_PYTHON is unset (`cargo xtask test` sets it)");
        return;
    };
    let b = ExecBackend::new(&cmd).expect("the mutant adapter starts");
    let cfg = SuiteConfig { filter: Some("rejection".into()), statistical: false, ..SuiteConfig::default() };
    let results = suite::run(&b, &suite::all_items(&cfg), &cfg, &mut |_| {});
    let failed: Vec<_> = results.iter().filter(|r| r.status == Status::Fail).map(|r| r.name.as_str()).collect();
    assert!(!failed.is_empty(), "the `<=` mutant went undetected");
    assert!(failed.iter().all(|n| n.contains("rejection")), "{failed:?}");

    // Same seed, same draw from the adapter's generator; the noise is its own.
    let good = ExecBackend::new(&numpy_command("").expect("set above")).expect("the adapter starts");
    let p = good.upload_f64(&HostTensor::new(vec![64, 2, 3], (0..64).flat_map(|_| [0.2, 0.3, 0.5, 0.2, 0.3, 0.5]).collect()).unwrap()).unwrap();
    let d = good.upload_i64(&HostTensor::new(vec![64, 1], vec![-1; 64]).unwrap()).unwrap();
    let l = good.upload_i64(&HostTensor::from_vec(vec![0; 64])).unwrap();
    let args = specdec_backend::RejectionArgs { target_probs: &p, draft_probs: None, draft_tokens: &d, proposal_lens: &l };
    let run = |seed| good.download_i64(&good.rejection_verify_seeded(args, specdec_backend::DrawMethod::InverseCdf, Default::default(), seed).unwrap().tokens).unwrap();
    assert_eq!(run(7), run(7), "PROTO-8: the same seed gives the same draw from the adapter's generator");
    assert_ne!(run(7), run(8), "PROTO-8: the seed reaches the adapter's generator");
}
