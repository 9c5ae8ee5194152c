//! The exec transport of engines (PROTO-9) against scripted adapters: a
//! well-formed engine, and hostile replies that must become typed errors.

use std::time::Duration;

use specdec_engines::{EngineError, ExecEngine, GenerationEngine, GenerationRequest};

const HELLO: &str = r#"{"id":0,"protocol":"specdec-exec/1","name":"scripted","device":"cpu","ops":["generate"],"engine":{"name":"scripted","version":"0","speculation":"none","vocab":12,"greedy_epsilon":0.0,"batch_invariant":true,"stop_strings":false}}"#;

/// An adapter that answers the handshake with `hello` and the first
/// `generate` with `reply` (single-quoted for `sh`).
fn scripted(hello: &str, reply: &str) -> Result<ExecEngine, EngineError> {
    ExecEngine::spawn(&format!("read l; echo '{hello}'; read l; echo '{reply}'; sleep 5"), Duration::from_secs(5))
}

fn one() -> Vec<GenerationRequest> {
    vec![GenerationRequest::greedy(vec![1, 2], 3, true)]
}

#[test]
fn a_well_formed_engine_is_read() {
    let mut e = scripted(HELLO, r#"{"id":1,"outputs":{"generations":[{"tokens":[3,4,5],"finish":"length","drafts":{"proposed":3,"accepted":2}}]}}"#).unwrap();
    assert_eq!(e.info().vocab, 12);
    let out = e.generate(&one()).unwrap();
    assert_eq!(out[0].tokens, [3, 4, 5]);
    assert_eq!(out[0].drafts.unwrap().accepted, 2);
}

/// ENGINE-1, PROTO-9: every malformed or hostile reply is a typed error naming the problem.
#[test]
fn hostile_replies_are_typed_errors() {
    let cases = [
        (r#"{"id":1,"outputs":{"generations":[{"tokens":[12],"finish":"length"}]}}"#, "outside the vocabulary of 12"),
        (r#"{"id":1,"outputs":{"generations":[]}}"#, "0 outputs for 1 requests"),
        (r#"{"id":1,"outputs":{"generations":[{"tokens":[1],"finish":"done"}]}}"#, "unknown variant"),
        (r#"{"id":1,"outputs":{"generations":[{"tokens":[1],"finish":"eos","extra":1}]}}"#, "unknown field"),
        (r#"{"id":1,"outputs":{"generations":[{"tokens":[-1],"finish":"eos"}]}}"#, "invalid value"),
        (r#"{"id":1,"outputs":{}}"#, "`outputs.generations` is missing"),
        (r#"{"id":7,"outputs":{"generations":[]}}"#, "id"),
        (r#"{"id":1,"error":{"kind":"Device","arg":"generate","message":"request 0: out of memory"}}"#, "out of memory"),
        ("not json", "not JSON"),
        (r#"{"id":1,"error":{"kind":"NotSupported","arg":"generate","message":"x"}}"#, "not supported"),
        (r#"{"id":1,"outputs":{"generations":[{"tokens":[],"finish":"eos"}]}}"#, "no token generated"),
        (r#"{"id":1,"outputs":{"generations":[{"tokens":[1],"finish":"eos","drafts":{"proposed":1,"accepted":2}}]}}"#, "2 drafts accepted of 1 proposed"),
    ];
    for (reply, want) in cases {
        let mut e = scripted(HELLO, reply).unwrap();
        let err = e.generate(&one()).unwrap_err();
        assert!(err.to_string().contains(want), "PROTO-9, ENGINE-1: {reply}: {err}");
    }
}

/// PROTO-9: a refusal names the request, and is not a failure of the engine.
#[test]
fn a_refused_request_is_named() {
    let mut e = scripted(HELLO, r#"{"id":1,"error":{"kind":"NotSupported","arg":"requests","index":[0],"message":"stop strings"}}"#).unwrap();
    assert_eq!(e.generate(&one()).unwrap_err(), EngineError::Request { index: 0, reason: "stop strings".into() }, "PROTO-9");
}

#[test]
fn a_bad_handshake_is_refused_naming_the_field() {
    let cases = [
        (HELLO.replace("specdec-exec/1", "specdec-exec/0"), "protocol"),
        (HELLO.replace(r#"["generate"]"#, r#"["greedy_verify"]"#), "does not list `generate`"),
        (HELLO.replace(r#""vocab":12"#, r#""vocab":0"#), "vocab"),
        (HELLO.replace(r#","stop_strings":false"#, ""), "stop_strings"),
    ];
    for (hello, want) in cases {
        let err = scripted(&hello, "{}").err().expect("refused");
        assert!(matches!(err, EngineError::Contract(_)) && err.to_string().contains(want), "PROTO-9: {hello}: {err}");
    }
    let err = ExecEngine::spawn("exit 3", Duration::from_secs(5)).err().expect("refused");
    assert!(matches!(err, EngineError::Failed(_)), "{err}");
}
