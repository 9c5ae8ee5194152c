//! The HTTP transport's llama.cpp dialect (ENGINE-2) against scripted
//! servers on 127.0.0.1: what it sends (token ids, every sampler the contract
//! does not name neutral, the seed in llama.cpp's 32 bits), where it sends it
//! (speculation off to the plain server), and how it reads the reply (ids,
//! finish, draft counts, the cut after an eos), with the errors it must give.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{Value, json};
use specdec_backend::PenaltyScope;
use specdec_decoder::{ConstraintSpec, LogprobMode, LogprobRequest, TokenLogprob};
use specdec_engines::{DraftCounts, EngineError, EngineInfo, Finish, GenerationEngine, GenerationRequest, HttpEngine};

/// A server that answers `/v1/models` with no statement, `/slots` with
/// whether it speculates, and every `/completion` with `reply`, recording
/// the bodies it was sent.
struct Scripted {
    url: String,
    bodies: Arc<Mutex<Vec<Value>>>,
}

impl Scripted {
    fn start(reply: Value) -> Scripted {
        Scripted::serving(reply, true)
    }

    /// `speculative`: what its `/slots` say.
    fn serving(reply: Value, speculative: bool) -> Scripted {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("llama-cpp+http://{}", listener.local_addr().unwrap());
        let bodies = Arc::new(Mutex::new(Vec::new()));
        let seen = Arc::clone(&bodies);
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(mut stream) = stream else { return };
                let mut reader = BufReader::new(stream.try_clone().unwrap());
                let mut line = String::new();
                reader.read_line(&mut line).unwrap();
                let path = line.split_whitespace().nth(1).unwrap_or_default().to_string();
                let mut length = 0;
                loop {
                    let mut header = String::new();
                    reader.read_line(&mut header).unwrap();
                    if header.trim().is_empty() {
                        break;
                    }
                    if let Some((name, value)) = header.split_once(':')
                        && name.eq_ignore_ascii_case("content-length")
                    {
                        length = value.trim().parse().unwrap();
                    }
                }
                let mut body = vec![0; length];
                reader.read_exact(&mut body).unwrap();
                let answer = match path.as_str() {
                    "/v1/models" => json!({"data": [{"id": "tiny"}]}),
                    "/slots" => json!([{"id": 0, "speculative": speculative}]),
                    "/completion" => {
                        seen.lock().unwrap().push(serde_json::from_slice(&body).unwrap());
                        reply.clone()
                    }
                    _ => json!({"error": {"message": "no such path"}}),
                }
                .to_string();
                let _ = write!(stream, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{answer}", answer.len());
            }
        });
        Scripted { url, bodies }
    }

    fn bodies(&self) -> Vec<Value> {
        self.bodies.lock().unwrap().clone()
    }
}

fn statement() -> EngineInfo {
    EngineInfo {
        name: "llama-server".into(),
        version: "0".into(),
        speculation: "ngram-simple".into(),
        vocab: 12,
        greedy_epsilon: 1e-4,
        batch_invariant: false,
        stop_strings: true,
        eos_ids: true,
        processors: Vec::new(),
        penalty_scopes: Vec::new(),
        logprobs: None,
        constraints: Vec::new(),
    }
}

fn connect(spec: &str) -> HttpEngine {
    HttpEngine::connect(spec, Some(statement()), Duration::from_secs(10)).unwrap()
}

fn request(speculation: bool) -> GenerationRequest {
    GenerationRequest { top_k: 4, temperature: 0.7, top_p: 0.9, seed: (1 << 40) + 7, eos: vec![5], stop: vec!["Ab".into()], ..GenerationRequest::greedy(vec![1, 2, 3], 6, speculation) }
}

#[test]
fn requests_carry_ids_and_neutral_samplers_and_go_to_the_server_of_their_speculation() {
    let reply = json!({"tokens": [1, 2, 3], "stop_type": "limit", "timings": {"draft_n": 4, "draft_n_accepted": 3}});
    let (spec, plain) = (Scripted::start(reply.clone()), Scripted::serving(reply, false));
    let mut engine = connect(&format!("{},plain={}", spec.url, plain.url));
    assert!(!engine.info().eos_ids, "the dialect takes no eos ids, whatever the statement says");
    let out = engine.generate(&[request(true), request(false)]).unwrap();
    assert_eq!(out[0].drafts, Some(DraftCounts { proposed: 4, accepted: 3 }));
    assert_eq!(out[1].drafts, None, "a plain request has no draft counts");
    let (on, off) = (spec.bodies(), plain.bodies());
    assert_eq!((on.len(), off.len()), (1, 1), "one request to each server");
    let body = &on[0];
    for (field, want) in [
        ("prompt", json!([1, 2, 3])),
        ("n_predict", json!(6)),
        ("top_k", json!(4)),
        ("min_p", json!(0.0)),
        ("typical_p", json!(1.0)),
        ("repeat_penalty", json!(1.0)),
        ("ignore_eos", json!(true)),
        ("return_tokens", json!(true)),
        ("stop", json!(["Ab"])),
        ("seed", json!(((1u64 << 40) + 7) % 0xFFFF_FFFF)),
    ] {
        assert_eq!(body[field], want, "{field} in {body}");
    }
}

/// ENGINE-2: min-p, the bias pairs, the repetition penalty over the whole
/// context (prompt and cap: its server refuses -1), and `n_probs` go out; raw logprobs (`top_logprobs`) and
/// processed ones (`top_probs`, read as their logarithms) come back in
/// LOGPROB-3's order, cut to the alternatives asked; a penalty over the
/// generated tokens alone is refused by index (llama.cpp counts the prompt).
#[test]
fn processors_and_logprobs_are_carried_and_read() {
    let reply = json!({"tokens": [1, 2], "stop_type": "limit", "timings": {}, "completion_probabilities": [
        {"id": 1, "logprob": -0.5, "top_logprobs": [{"id": 1, "logprob": -0.5}, {"id": 4, "logprob": -1.5}, {"id": 7, "logprob": -1.0}]},
        {"id": 2, "logprob": -0.1, "top_logprobs": [{"id": 2, "logprob": -0.1}]},
    ]});
    let server = Scripted::start(reply);
    let mut engine = connect(&server.url);
    let ask = |mode| Some(LogprobRequest { top: 2, mode });
    let r = GenerationRequest { min_p: 0.2, logit_bias: vec![(3, -100.0)], repetition_penalty: 1.3, logprobs: ask(LogprobMode::Raw), ..request(true) };
    let out = engine.generate(&[r]).unwrap();
    let want = vec![TokenLogprob { id: 1, logprob: -0.5, top: vec![(1, -0.5), (7, -1.0)] }, TokenLogprob { id: 2, logprob: -0.1, top: vec![(2, -0.1)] }];
    assert_eq!(out[0].logprobs, Some(want));
    let body = &server.bodies()[0];
    for (field, want) in
        [("min_p", json!(0.2)), ("logit_bias", json!([[3, -100.0]])), ("repeat_penalty", json!(1.3)), ("repeat_last_n", json!(3 + 6)), ("n_probs", json!(2)), ("post_sampling_probs", json!(false))]
    {
        assert_eq!(body[field], want, "{field} in {body}");
    }
    let r = GenerationRequest { presence_penalty: 0.5, penalty_scope: PenaltyScope::Generated, ..request(true) };
    assert!(matches!(engine.generate(&[r]), Err(EngineError::Request { index: 0, .. })));

    let reply = json!({"tokens": [1], "stop_type": "limit", "timings": {}, "completion_probabilities": [{"id": 1, "prob": 0.5, "top_probs": [{"id": 1, "prob": 0.5}]}]});
    let server = Scripted::start(reply);
    let out = connect(&server.url).generate(&[GenerationRequest { logprobs: ask(LogprobMode::Processed), ..request(true) }]).unwrap();
    assert_eq!(out[0].logprobs, Some(vec![TokenLogprob { id: 1, logprob: 0.5f64.ln(), top: vec![(1, 0.5f64.ln())] }]));
    assert_eq!(server.bodies()[0]["post_sampling_probs"], json!(true));
}

/// CONSTRAIN-1 over llama.cpp's endpoint: a regex goes out as its GBNF
/// with the request's eos ids as tokens after it, a recursive grammar as
/// itself (its `root` renamed) with them after it, a JSON schema as
/// `json_schema`, both letting the model's own end through (a finished
/// grammar allows nothing else); a regex with no eos, or one GBNF cannot
/// say, is refused by index and never sent.
#[test]
fn constraints_go_out_as_grammars_ending_at_an_eos() {
    let server = Scripted::start(json!({"tokens": [1, 5, 11], "stop_type": "eos", "timings": {}}));
    let mut engine = connect(&server.url);
    let regex = |pattern: &str, eos: Vec<u32>| GenerationRequest { constraint: Some(ConstraintSpec::Regex(pattern.into())), eos, ..request(true) };
    let out = engine.generate(&[regex("A(a|b)+", vec![5, 7])]).unwrap();
    assert_eq!((&out[0].tokens, out[0].finish), (&vec![1, 5], Finish::Eos), "cut after the eos the grammar ended on");
    let schema = json!({"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]});
    engine.generate(&[GenerationRequest { constraint: Some(ConstraintSpec::JsonSchema(schema.clone())), ..request(true) }]).unwrap();
    let nested = r#"root ::= "(" root ")" | [a-c]"#;
    engine.generate(&[GenerationRequest { constraint: Some(ConstraintSpec::Grammar(nested.into())), eos: vec![5], ..request(true) }]).unwrap();
    let bodies = server.bodies();
    assert_eq!(bodies[0]["grammar"], json!(r#"root ::= ("A" [a-b]+) (<[5]> | <[7]>)"#));
    assert_eq!(bodies[2]["grammar"], json!("root ::= root-body0 (<[5]>)\nroot-body0 ::= \"(\" root-body0 \")\" | [a-c]\n"));
    assert_eq!(bodies[2]["ignore_eos"], json!(false));
    assert_eq!((&bodies[0]["ignore_eos"], bodies[0].get("json_schema")), (&json!(false), None));
    assert_eq!((&bodies[1]["json_schema"], &bodies[1]["ignore_eos"], bodies[1].get("grammar")), (&schema, &json!(false), None));
    let grammar = |g: &str, eos: Vec<u32>| GenerationRequest { constraint: Some(ConstraintSpec::Grammar(g.into())), eos, ..request(true) };
    for (bad, names) in [
        (regex("a+", Vec::new()), "needs an eos id"),
        (regex("^a", vec![5]), "assertion"),
        (regex("(a", vec![5]), "unclosed group"),
        (grammar(nested, Vec::new()), "needs an eos id"),
        (grammar("root ::= x", vec![5]), "not defined"),
    ] {
        match engine.generate(&[request(true), bad]) {
            Err(EngineError::Request { index: 1, reason }) => assert!(reason.contains(names), "{reason}"),
            other => panic!("{names}: {other:?}"),
        }
    }
    assert_eq!(server.bodies().len(), 3, "a call with a refused request sends none of its requests");
}

#[test]
fn replies_are_read_with_the_finish_and_cut_after_the_first_eos() {
    let cases = [
        (json!({"tokens": [1, 5, 3, 5], "stop_type": "limit", "timings": {}}), vec![1, 5], Finish::Eos),
        (json!({"tokens": [1, 2, 3], "stop_type": "limit", "timings": {}}), vec![1, 2, 3], Finish::Length),
        (json!({"tokens": [1, 2], "stop_type": "word", "stopping_word": "Ab", "timings": {}}), vec![1, 2], Finish::Stop),
    ];
    for (reply, tokens, finish) in cases {
        let server = Scripted::start(reply.clone());
        let mut engine = connect(&format!("{},plain={}", server.url, server.url));
        let out = engine.generate(&[request(true)]).unwrap();
        assert_eq!((&out[0].tokens, out[0].finish), (&tokens, finish), "{reply}");
        assert_eq!(out[0].drafts, Some(DraftCounts { proposed: 0, accepted: 0 }), "timings without `draft_n`: nothing drafted");
    }
    // A server that does not speculate counts no drafts, even for requests with it on.
    let plain = Scripted::serving(json!({"tokens": [1], "stop_type": "limit", "timings": {}}), false);
    let mut engine = connect(&format!("{},plain={}", plain.url, plain.url));
    assert_eq!(engine.generate(&[request(true)]).unwrap()[0].drafts, None);
}

#[test]
fn bad_replies_and_requests_are_typed_errors_naming_the_problem() {
    let cases = [
        (json!({"content": "AbAc", "stop_type": "limit"}), "return_tokens"),
        (json!({"tokens": [1, -2], "stop_type": "limit"}), "not an id"),
        (json!({"tokens": [1, 2], "stop_type": "none"}), "stop_type"),
        (json!({"tokens": [1, 12], "stop_type": "limit"}), "outside the vocabulary"),
        (json!({"tokens": [1], "stop_type": "limit", "timings": {"draft_n": "four"}}), "timings.draft_n"),
        (json!({"tokens": [1], "stop_type": "limit", "timings": {"draft_n": 1, "draft_n_accepted": 2}}), "2 drafts accepted of 1"),
    ];
    for (reply, names) in cases {
        let server = Scripted::start(reply.clone());
        let mut engine = connect(&format!("{},plain={}", server.url, server.url));
        match engine.generate(&[request(true)]) {
            Err(EngineError::Contract(m)) => assert!(m.contains(names), "{reply}: {m}"),
            other => panic!("{reply}: {other:?}"),
        }
    }
    // Speculation off with only a speculating server: not supported, never sent.
    let server = Scripted::start(json!({"tokens": [1], "stop_type": "limit"}));
    let mut engine = connect(&server.url);
    assert!(matches!(engine.generate(&[request(false)]), Err(EngineError::NotSupported(m)) if m.contains("plain=URL")));
    assert!(server.bodies().is_empty());
    for bad in ["llama-cpp+https://127.0.0.1:1", "llama-cpp+http://127.0.0.1:1,http://127.0.0.1:2", "llama-cpp+http://127.0.0.1:1,plain=http://127.0.0.1:2"] {
        assert!(HttpEngine::connect(bad, Some(statement()), Duration::from_secs(1)).is_err(), "{bad}");
    }
}
