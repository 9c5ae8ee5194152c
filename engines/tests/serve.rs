//! The adapter side of the exec transport (`serve_exec`, PROTO-9) with
//! specdec's decoder behind it: every request line gets one reply line, a
//! bad one an error naming the problem, and the loop goes on.

use std::sync::Arc;

use serde_json::Value;
use specdec_backend::ReferenceBackend;
use specdec_decoder::{EngineConfig, NgramProposer};
use specdec_engines::{DecoderEngine, serve_exec};
use specdec_models::tiny::TinySpec;

#[test]
fn every_line_gets_one_reply_and_bad_ones_say_why() {
    let w = Arc::new(TinySpec::preset("tiny-v12-l2").unwrap().weights().unwrap());
    let ngram = NgramProposer::new(specdec_backend::NgramConfig { k: 3, ..Default::default() }, 12).unwrap();
    let mut engine = DecoderEngine::new(&ReferenceBackend, w, Box::new(ngram), EngineConfig { k: 3, ..EngineConfig::default() }, None).unwrap();
    let request = r#"{"prompt":[1,2,3,1,2,3],"temperature":0.0,"top_k":0,"top_p":1.0,"seed":0,"max_new_tokens":5,"speculation":true}"#;
    let lines = [
        r#"{"id":0,"op":"handshake","protocol":"specdec-exec/1"}"#.to_string(),
        format!(r#"{{"id":1,"op":"generate","inputs":{{}},"params":{{"requests":[{request}]}}}}"#),
        r#"{"id":2,"op":"generate","params":{"requests":[{"prompt":[1],"temperature":0.0,"top_k":0,"top_p":1.0,"seed":0,"max_new_tokens":5,"speculation":true,"beam":4}]}}"#.to_string(),
        r#"{"id":3,"op":"generate","params":{"requests":[{"prompt":[],"temperature":0.0,"top_k":0,"top_p":1.0,"seed":0,"max_new_tokens":5,"speculation":true}]}}"#.to_string(),
        r#"{"id":4,"op":"generate","params":{"requests":[{"prompt":[1],"temperature":0.0,"top_k":0,"top_p":1.0,"seed":0,"max_new_tokens":5,"stop":["Ab"],"speculation":true}]}}"#.to_string(),
        r#"{"id":5,"op":"residual"}"#.to_string(),
        "{oops".to_string(),
    ];
    let mut out = Vec::new();
    serve_exec(&mut engine, lines.join("\n").as_bytes(), &mut out).unwrap();
    let replies: Vec<Value> = String::from_utf8(out).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(replies.len(), lines.len());
    assert_eq!(replies[0]["ops"][0], "generate");
    assert_eq!(replies[0]["engine"]["vocab"], 12);
    assert_eq!(replies[0]["engine"]["stop_strings"], false);
    assert_eq!(replies[1]["outputs"]["generations"][0]["tokens"].as_array().unwrap().len(), 5);
    assert_eq!(replies[1]["outputs"]["generations"][0]["finish"], "length");
    let message = |r: &Value| r["error"]["message"].as_str().unwrap_or_default().to_string();
    assert!(message(&replies[2]).contains("unknown field `beam`"), "{}", replies[2]);
    assert_eq!(replies[3]["error"]["kind"], "NotSupported", "{}", replies[3]);
    assert_eq!(replies[3]["error"]["index"][0], 0, "{}", replies[3]);
    assert!(message(&replies[3]).contains("empty"), "{}", replies[3]);
    assert!(message(&replies[4]).contains("detokenizer") && replies[4]["error"]["kind"] == "NotSupported", "{}", replies[4]);
    assert_eq!(replies[5]["error"]["kind"], "NotSupported");
    assert!(message(&replies[6]).contains("not JSON"), "{}", replies[6]);
}
