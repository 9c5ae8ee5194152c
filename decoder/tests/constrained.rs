//! Structured outputs under speculation (CONSTRAIN-1 .. CONSTRAIN-4) on the
//! reference backend (exact f64) and the tiny seeded models: the fast mask
//! equals the plain definition on every state met; greedy output equals an
//! independent plain constrained greedy loop for every proposer and `k`;
//! sampled outputs keep the constraint and the first two tokens have the
//! exact law of constrained plain sampling (chi-squared, stated size and
//! power, no retry); and each grammar bug peers ship fails one of these.

use std::sync::Arc;

use specdec_backend::model::{ForwardRequest, LlamaWeights, ModelBackend, RefModel};
use specdec_backend::{NgramConfig, ReferenceBackend, SamplingParams};
use specdec_constraint::{Constraint, ConstraintSpec, Vocabulary, allowed, mask_scores, output_matches, state_after};
use specdec_decoder::{Constrained, DflashMode, DflashProposer, DraftModelProposer, Engine, EngineConfig, Fault, FinishReason, NgramProposer, NoProposer, NoSink, Proposer, Request, TokenTable};
use specdec_models::DflashSpec;
use specdec_models::tiny::{TinySpec, tiny_text};
use specdec_reference::process_logits;

const B: ReferenceBackend = ReferenceBackend;
const EOS: u32 = 11;

/// Regexes over the tiny models' text (`Aa`, `Bb`, ..; eos is `Ll`, id 11):
/// a class of tokens; tokens straddling the pattern's elements, no token
/// twice in a row (a repeating prompt makes the n-gram drafts break it); a
/// forced middle and a bounded tail.
const PATTERNS: [&str; 3] = ["([A-F][a-f])+", "A(a[BC]|b[AC]|c[AB])*[abc]", "(AaBb|CcDd|Ee)*Ff(Gg|Hh){2,4}"];

/// A recursive grammar over the tiny text (context-free, CONSTRAIN-5): n
/// openers (`Aa`, `Bb` or `Cc`), one `Ff`, then exactly n closers (`Dd` or
/// `Ee`); eos only once every opener is closed. Greedy decoding of the tiny
/// model nests it five deep (`Cc`x5 `Ff` `Ee`x5), which no DFA counts.
const GRAMMAR: &str = r#"root ::= ("Aa" | "Bb" | "Cc") root ("Dd" | "Ee") | "Ff""#;

/// Every constraint the checks run: the regexes, then the grammar.
fn specs() -> Vec<ConstraintSpec> {
    let grammar = ConstraintSpec::grammar(GRAMMAR).unwrap();
    assert!(matches!(grammar, ConstraintSpec::Grammar(_)), "the grammar recurses");
    PATTERNS.iter().map(|p| ConstraintSpec::Regex(p.to_string())).chain([grammar]).collect()
}

/// A spec as a check names it.
fn label(spec: &ConstraintSpec) -> String {
    match spec {
        ConstraintSpec::Regex(r) => r.clone(),
        other => format!("{} {other:?}", other.kind()),
    }
}

fn tiny() -> LlamaWeights {
    TinySpec::preset("tiny-v12-l2").unwrap().weights().unwrap()
}

fn table(vocab: usize) -> Arc<TokenTable> {
    Arc::new(TokenTable::new(Vocabulary::new((0..vocab as u32).map(|i| Some(tiny_text(&[i]).into_bytes())).collect()).unwrap()))
}

fn constrained(pattern: &str, table: &Arc<TokenTable>) -> Constrained {
    compiled(&ConstraintSpec::Regex(pattern.into()), table)
}

fn compiled(spec: &ConstraintSpec, table: &Arc<TokenTable>) -> Constrained {
    Constrained::new(spec.clone(), table.clone()).unwrap()
}

fn proposer(name: &str, w: &LlamaWeights) -> Box<dyn Proposer<ReferenceBackend>> {
    let v = w.config.vocab_size;
    match name {
        "none" => Box::new(NoProposer),
        "ngram" => Box::new(NgramProposer::new(NgramConfig { k: 8, ..NgramConfig::default() }, v).unwrap()),
        "draft" => Box::new(DraftModelProposer::new(&B, "draft", &specdec_models::tiny::seeded(w.config.clone(), 77).unwrap(), v).unwrap()),
        "self" => Box::new(DraftModelProposer::new(&B, "self", w, v).unwrap()),
        "early-exit:1" => Box::new(DraftModelProposer::early_exit(&B, w, 1).unwrap()),
        "dflash" => {
            let c = &w.config;
            let spec = DflashSpec { target_layer_ids: (0..c.num_hidden_layers).rev().collect(), ..DflashSpec::one_layer(c, 5, 0) };
            Box::new(DflashProposer::new(name, specdec_models::seeded_dflash(c, spec, 5).unwrap(), Arc::new(w.clone()), DflashMode::Parallel).unwrap())
        }
        other => panic!("unknown proposer {other}"),
    }
}

const PROPOSERS: [&str; 6] = ["none", "ngram", "draft", "self", "early-exit:1", "dflash"];
const PROMPTS: [&[u32]; 3] = [&[0, 1, 0, 1, 0, 1, 0], &[5], &[2, 2, 2, 2, 2]];

/// The logits after `context`, from the reference forward.
fn logits(w: &LlamaWeights, context: &[u32]) -> Vec<f64> {
    let model = RefModel::new(w.clone());
    let mut cache = model.new_cache(1, context.len() + 1).unwrap();
    model.forward(&mut cache, &ForwardRequest::last_logits(std::slice::from_ref(&context.to_vec()))).unwrap().logits
}

/// Plain constrained greedy decoding written independently of the engine:
/// the plain mask of `specdec_constraint`, argmax of the masked logits with
/// ties to the lowest id, one token at a time, until eos or `n`.
fn plain_constrained_greedy(w: &LlamaWeights, prompt: &[u32], n: usize, spec: &ConstraintSpec) -> Vec<u32> {
    let c = Constraint::new(spec).unwrap();
    let vocab = table(w.config.vocab_size).vocabulary().clone();
    let mut out: Vec<u32> = Vec::new();
    while out.len() < n {
        let state = state_after(&c, &out, &vocab, &[EOS]).unwrap();
        let z = mask_scores(&logits(w, &[prompt, &out].concat()), &allowed(&c, state, &vocab, &[EOS]));
        let best = (0..z.len()).fold(0, |b, i| if z[i] > z[b] { i } else { b }) as u32;
        out.push(best);
        if best == EOS {
            break;
        }
    }
    out
}

fn generate(w: &LlamaWeights, config: EngineConfig, reqs: &[Request], proposer: &mut dyn Proposer<ReferenceBackend>) -> Vec<specdec_decoder::Output> {
    let model = B.load_model(w).unwrap();
    Engine::new(&B, &model, &w.config, config).unwrap().generate(reqs, proposer, None, &mut NoSink).unwrap().outputs
}

fn request(prompt: &[u32], max_tokens: usize, c: &Constrained) -> Request {
    Request { eos: vec![EOS], constraint: Some(c.clone()), ..Request::greedy(prompt.to_vec(), max_tokens) }
}

/// The first greedy check that fails, over every pattern, proposer, k and
/// prompt, or `None`: the outputs equal plain constrained greedy decoding
/// (DECODE-2 with CONSTRAIN-3) and each finished output matches.
fn greedy_failure(fault: Option<Fault>, proposers: &[&str], specs: &[ConstraintSpec]) -> Option<String> {
    let w = tiny();
    let t = table(w.config.vocab_size);
    for spec in specs {
        let (c, pattern) = (compiled(spec, &t), label(spec));
        let reqs: Vec<Request> = PROMPTS.iter().map(|p| request(p, 14, &c)).collect();
        let want: Vec<Vec<u32>> = PROMPTS.iter().map(|p| plain_constrained_greedy(&w, p, 14, spec)).collect();
        for name in proposers {
            for k in [1, 3, 5] {
                let out = generate(&w, EngineConfig { k, fault, ..EngineConfig::default() }, &reqs, proposer(name, &w).as_mut());
                for (i, o) in out.iter().enumerate() {
                    if o.tokens != want[i] {
                        return Some(format!("{pattern} {name} k={k} prompt {i}: {:?}, plain {:?}", o.tokens, want[i]));
                    }
                    if o.finish == FinishReason::Eos && !output_matches(c.constraint(), &o.tokens, t.vocabulary(), &[EOS]) {
                        return Some(format!("{pattern} {name} k={k} prompt {i}: {:?} does not match", o.tokens));
                    }
                }
            }
        }
    }
    None
}

/// CONSTRAIN-3, DECODE-2: greedy identity for every proposer and k.
#[test]
fn constrained_greedy_equals_plain_constrained_greedy_for_every_proposer() {
    // The check is not empty: the patterns end some outputs with eos and
    // the constraint changes what plain greedy decoding says.
    let w = tiny();
    let free = |p: &[u32]| {
        let model = B.load_model(&w).unwrap();
        let engine = Engine::new(&B, &model, &w.config, EngineConfig::default()).unwrap();
        engine.generate(&[Request::greedy(p.to_vec(), 14)], &mut NoProposer, None, &mut NoSink).unwrap().outputs[0].tokens.clone()
    };
    let ended = specs().iter().flat_map(|spec| PROMPTS.iter().map(|p| plain_constrained_greedy(&w, p, 14, spec)).collect::<Vec<_>>()).filter(|o| o.last() == Some(&EOS)).count();
    assert!(ended > 0, "some constrained output ends at eos");
    for spec in [ConstraintSpec::Regex(PATTERNS[1].into()), ConstraintSpec::grammar(GRAMMAR).unwrap()] {
        assert!(PROMPTS.iter().any(|p| free(p) != plain_constrained_greedy(&w, p, 14, &spec)), "the constraint changes the output: {}", label(&spec));
    }
    // The grammar's outputs nest: some greedy output opens a bracket.
    let grammar = ConstraintSpec::grammar(GRAMMAR).unwrap();
    let nested = PROMPTS.iter().map(|p| plain_constrained_greedy(&w, p, 14, &grammar)).filter(|o| o.len() > 6 && o.last() == Some(&EOS)).count();
    assert!(nested > 0, "no greedy output nests the grammar three deep and closes it");
    if let Some(failure) = greedy_failure(None, &PROPOSERS, &specs()) {
        panic!("CONSTRAIN-3: {failure}");
    }
}

/// The fast mask (the trie walk, cached) equals the plain definition on
/// every state an output reaches, for the tiny vocabulary and for a
/// byte-level one where tokens split characters and JSON punctuation.
#[test]
fn the_fast_mask_equals_the_plain_definition() {
    let t = table(12);
    for pattern in PATTERNS {
        let c = constrained(pattern, &t);
        let plain = Constraint::regex(pattern).unwrap();
        let mut frontier = vec![Vec::<u32>::new()];
        let mut seen = 0;
        while let Some(out) = frontier.pop() {
            let state = state_after(&plain, &out, t.vocabulary(), &[EOS]).unwrap();
            let mask = c.allowed(state, &[EOS]);
            assert_eq!(mask, allowed(&plain, state, t.vocabulary(), &[EOS]), "CONSTRAIN-2: {pattern} after {out:?}");
            seen += 1;
            if out.len() < 6 {
                frontier.extend((0..12u32).filter(|&i| mask[i as usize] && i != EOS).map(|i| [out.clone(), vec![i]].concat()));
            }
        }
        assert!(seen > 10, "{pattern}: only {seen} outputs walked");
    }
    // The recursive grammar: its states are its own (charts), reached as the
    // decoder reaches them (`advance`), so its masks are llguidance's, moved
    // back and forth along a depth-first walk of every output.
    let c = compiled(&ConstraintSpec::grammar(GRAMMAR).unwrap(), &t);
    let mut frontier = vec![(Vec::<u32>::new(), c.constraint().start())];
    let mut seen = 0;
    while let Some((out, state)) = frontier.pop() {
        let mask = c.allowed(state, &[EOS]);
        assert_eq!(mask, allowed(c.constraint(), state, t.vocabulary(), &[EOS]), "CONSTRAIN-2: {GRAMMAR} after {out:?}");
        seen += 1;
        if out.len() < 6 {
            frontier.extend((0..12u32).filter(|&i| mask[i as usize] && i != EOS).map(|i| ([out.clone(), vec![i]].concat(), c.advance(state, i, &[EOS]).unwrap())));
        }
    }
    assert!(seen > 100, "the grammar: only {seen} outputs walked");
    assert_eq!(c.guided_masks(), seen, "every mask of the walk was llguidance's");
    // Bytes: every single byte, and pieces that straddle JSON tokens and UTF-8.
    let mut pieces: Vec<Option<Vec<u8>>> = (0..=255u8).map(|b| Some(vec![b])).collect();
    for p in ["{\"", "\":", "\",\"", "\"}", "true", "fal", "se", "nu", "ll", "12", "-0", "é", "\u{e9}\"", "\\u00"] {
        pieces.push(Some(p.as_bytes().to_vec()));
    }
    pieces.push(None);
    let eos = [(pieces.len() - 1) as u32];
    let t = Arc::new(TokenTable::new(Vocabulary::new(pieces).unwrap()));
    let schema = serde_json::json!({"type": "object", "properties": {"name": {"type": "string"}, "n": {"type": "integer"}, "ok": {"type": "boolean"}}, "required": ["name"]});
    let c = Constrained::new(ConstraintSpec::JsonSchema(schema.clone()), t.clone()).unwrap();
    let plain = Constraint::new(&ConstraintSpec::JsonSchema(schema)).unwrap();
    for text in [r#"{"name":"é\u00e9","n":-12,"ok":false}"#, r#"{"name":"","ok":true}"#] {
        let mut state = plain.start();
        for &b in text.as_bytes() {
            assert_eq!(c.allowed(state, &eos), allowed(&plain, state, t.vocabulary(), &eos), "{text} at byte {b}");
            state = plain.walk(state, &[b]).unwrap();
        }
        assert!(plain.accepts(state) && c.allowed(state, &eos)[eos[0] as usize], "{text}");
    }
    // A recursive grammar: JSON of any depth, on the same byte-level
    // vocabulary, each text as one-byte tokens through `advance` (llguidance's
    // masks) and as states walked on the grammar alone (the trie walk of
    // Earley sets, which the guide cannot place).
    let c = compiled(&ConstraintSpec::grammar(JSON_GRAMMAR).unwrap(), &t);
    let cfg = c.constraint();
    assert!(cfg.is_context_free());
    for text in [r#"{"a":[1,{"b":null}],"c":"é\u00e9"}"#, r#"{"l":[[[[]],-0.5e3],true]}"#] {
        let (mut guided, mut walked) = (cfg.start(), cfg.start());
        for &b in text.as_bytes() {
            let want = allowed(cfg, guided, t.vocabulary(), &eos);
            assert_eq!(c.allowed(guided, &eos), want, "{text} at byte {b}, llguidance");
            assert_eq!(c.allowed(walked, &eos), want, "{text} at byte {b}, the trie walk");
            guided = c.advance(guided, u32::from(b), &eos).unwrap_or_else(|| panic!("{text}: byte {b} refused"));
            walked = cfg.walk(walked, &[b]).unwrap();
        }
        assert!(cfg.accepts(guided) && c.allowed(guided, &eos)[eos[0] as usize], "{text}");
    }
    // Each text's byte positions and its end, and its start twice (the walked
    // states' first is the start, which the guide places too).
    let guided: usize = [r#"{"a":[1,{"b":null}],"c":"é\u00e9"}"#, r#"{"l":[[[[]],-0.5e3],true]}"#].iter().map(|t| t.len() + 2).sum();
    assert_eq!(c.guided_masks(), guided, "llguidance gave the masks of the states `advance` made, and only those");
}

/// CONSTRAIN-2 on a real vocabulary: SmolLM2's 49,152 byte-level BPE tokens
/// (pieces that straddle JSON punctuation, spaces and UTF-8, specials with
/// no bytes). At every byte of tool calls under the tool-call mix's schema
/// (`fixtures/prompts/tool_calls.json`) and of JSON texts under the
/// recursive grammar, the fast mask equals the plain definition. Runs where
/// `SPECDEC_SMOLLM2_GGUF` names the model (`cargo xtask test` sets it);
/// otherwise it says why and passes.
#[test]
fn the_fast_mask_equals_the_plain_definition_on_smollm2s_vocabulary() {
    let Some(path) = std::env::var_os("SPECDEC_SMOLLM2_GGUF").filter(|p| !p.is_empty()) else {
        eprintln!("skipping: SPECDEC_SMOLLM2_GGUF is not set (`cargo xtask model` fetches SmolLM2 and prints it)");
        return;
    };
    let tok = specdec_models::Tokenizer::open(&path).unwrap();
    let t = TokenTable::of_tokenizer(&tok, tok.vocab_size()).unwrap();
    let eos = tok.end_ids();
    let mix: serde_json::Value = serde_json::from_str(include_str!("../../fixtures/prompts/tool_calls.json")).unwrap();
    let schema = ConstraintSpec::JsonSchema(mix["schema"].clone());
    let check = |c: &Constrained, texts: &[&str]| {
        let plain = c.constraint();
        for text in texts {
            let mut state = plain.start();
            // The comparison is not vacuous: the masks along a text differ, and most allow
            // neither every token nor eos.
            let mut masks = std::collections::HashSet::new();
            for (at, &b) in text.as_bytes().iter().enumerate() {
                let mask = c.allowed(state, &eos);
                assert_eq!(mask, allowed(plain, state, t.vocabulary(), &eos), "CONSTRAIN-2: {text} at byte {at}");
                assert!(!mask[eos[0] as usize] && mask.iter().any(|&a| !a), "{text} at byte {at}: eos or every token allowed inside the text");
                masks.insert(mask);
                state = plain.walk(state, &[b]).unwrap_or_else(|| panic!("{text}: byte {at} refused"));
            }
            assert!(masks.len() >= text.len() / 4, "{text}: {} distinct masks", masks.len());
            let mask = c.allowed(state, &eos);
            assert!(plain.accepts(state) && eos.iter().all(|&e| mask[e as usize]), "{text}: eos allowed at the end");
            assert_eq!(mask, allowed(plain, state, t.vocabulary(), &eos), "CONSTRAIN-2: {text} at its end");
        }
    };
    check(&compiled(&schema, &t), &[r#"{"name":"get_weather","arguments":{"query":"Paris, été \u00e9 \"3\"","days":3}}"#, r#"{"name":"send_email","arguments":{"query":"Bob","urgent":true}}"#]);
    // The recursive grammar, as the decoder meets it: its states made by
    // `advance` along token paths (the tokenizer's own, and one byte a token,
    // SmolLM2 having a token for every byte), so its masks are llguidance's.
    let grammar = compiled(&ConstraintSpec::grammar(JSON_GRAMMAR).unwrap(), &t);
    let cfg = grammar.constraint();
    assert!(cfg.is_context_free());
    let byte_token = |b: u8| (0..t.vocabulary().len() as u32).find(|&i| t.vocabulary().bytes(i) == Some(&[b][..])).unwrap();
    let text = r#"{"name":"get_weather","arguments":{"query":"Paris, été","days":[1,2,{"x":null}]}}"#;
    let mut tokens_walked = 0;
    for tokens in [tok.encode(text, false).unwrap(), text.bytes().map(byte_token).collect::<Vec<u32>>()] {
        tokens_walked += tokens.len() + 1;
        let mut state = cfg.start();
        for (at, &id) in tokens.iter().enumerate() {
            assert_eq!(grammar.allowed(state, &eos), allowed(cfg, state, t.vocabulary(), &eos), "CONSTRAIN-2: {text} at token {at} of {}", tokens.len());
            state = grammar.advance(state, id, &eos).unwrap_or_else(|| panic!("{text}: token {at} refused"));
        }
        let end = grammar.allowed(state, &eos);
        assert!(cfg.accepts(state) && eos.iter().all(|&e| end[e as usize]), "{text}: eos at the end");
    }
    assert_eq!(grammar.guided_masks(), tokens_walked, "every mask asked was llguidance's");
}

/// Any JSON object as a recursive GBNF grammar (compact: no whitespace).
const JSON_GRAMMAR: &str = include_str!("../../fixtures/constraints/json-object.gbnf");

/// The exact law of the first two tokens of constrained plain sampling:
/// each row masked with the state after the tokens before it (CONSTRAIN-1),
/// then processed (LOGITS-11).
fn exact_two_token_law(w: &LlamaWeights, prompt: &[u32], c: &Constraint, vocab: &Vocabulary, p: SamplingParams) -> Vec<f64> {
    let v = w.config.vocab_size;
    let row = |out: &[u32]| {
        let state = state_after(c, out, vocab, &[EOS]).unwrap();
        process_logits(&mask_scores(&logits(w, &[prompt, out].concat()), &allowed(c, state, vocab, &[EOS])), p).unwrap()
    };
    let first = row(&[]);
    let mut law = vec![0.0; v * v];
    for a in 0..v {
        if first[a] > 0.0 && a as u32 != EOS {
            for (b, pb) in row(&[a as u32]).into_iter().enumerate() {
                law[a * v + b] = first[a] * pb;
            }
        } else if a as u32 == EOS {
            law[a * v] = first[a]; // eos ends the output: one cell
        }
    }
    law
}

/// The p-value of the first two tokens of `n` seeded runs against the
/// exact constrained law.
fn two_token_p_value(fault: Option<Fault>, name: &str, n: u64, spec: &ConstraintSpec) -> f64 {
    let w = tiny();
    let t = table(w.config.vocab_size);
    let c = compiled(spec, &t);
    let p = SamplingParams::new(1.0, 0, 1.0);
    let prompt = [0u32, 1, 0, 1];
    let law = exact_two_token_law(&w, &prompt, c.constraint(), t.vocabulary(), p);
    let reqs: Vec<Request> = (0..n).map(|seed| Request { sampling: p, seed, ..request(&prompt, 2, &c) }).collect();
    let v = w.config.vocab_size;
    let mut counts = vec![0u64; v * v];
    for o in generate(&w, EngineConfig { k: 3, fault, ..EngineConfig::default() }, &reqs, proposer(name, &w).as_mut()) {
        let cell = o.tokens[0] as usize * v + o.tokens.get(1).map_or(0, |&b| b as usize);
        counts[cell] += 1;
    }
    let cells: Vec<usize> = (0..law.len()).filter(|&i| law[i] > 0.0 || counts[i] > 0).collect();
    let observed: Vec<u64> = cells.iter().map(|&i| counts[i]).collect();
    let expected: Vec<f64> = cells.iter().map(|&i| law[i]).collect();
    specdec_stats::chi_squared_gof(&observed, &expected).unwrap().p_value().unwrap()
}

/// Level of each law test: the suite runs 4 (two proposers on a regex, a
/// draft model on the grammar, one control), so a clean run fails with
/// probability at most 4e-3, by no retry.
const ALPHA: f64 = 1e-3;

/// Draws enough runs that a law at total variation 0.1 from the exact one
/// is caught with probability 0.99 at ALPHA (the planned power).
fn planned_runs() -> u64 {
    specdec_stats::min_samples(40, 0.1, ALPHA, 0.01).unwrap()
}

/// CONSTRAIN-3 with REJECT-7: sampled with speculation on (a draft model
/// drawing under the mask, and n-gram drafts the mask refuses), the first
/// two tokens have the exact law of constrained plain sampling.
#[test]
fn constrained_sampling_has_the_exact_law_with_speculation() {
    let n = planned_runs();
    let regex = ConstraintSpec::Regex(PATTERNS[1].into());
    for (name, spec) in [("draft", &regex), ("ngram", &regex), ("draft", &ConstraintSpec::grammar(GRAMMAR).unwrap())] {
        let p = two_token_p_value(None, name, n, spec);
        eprintln!("{name} {}: p = {p:.3e} over {n} runs", label(spec));
        assert!(p >= ALPHA, "CONSTRAIN-1, CONSTRAIN-3: {name} {}: p = {p:.2e} over {n} runs", label(spec));
    }
}

/// Sampled outputs, on every proposer, are allowed token by token.
#[test]
fn sampled_outputs_keep_the_constraint_on_every_proposer() {
    let w = tiny();
    let t = table(w.config.vocab_size);
    for spec in specs() {
        let (c, pattern) = (compiled(&spec, &t), label(&spec));
        let reqs: Vec<Request> = (0..12u64).map(|seed| Request { sampling: SamplingParams::new(0.9, 0, 0.95), seed, ..request(PROMPTS[(seed % 3) as usize], 16, &c) }).collect();
        for name in PROPOSERS {
            for o in generate(&w, EngineConfig { k: 4, ..EngineConfig::default() }, &reqs, proposer(name, &w).as_mut()) {
                assert!(state_after(c.constraint(), &o.tokens, t.vocabulary(), &[EOS]).is_some(), "CONSTRAIN-4: {pattern} {name}: {:?}", o.tokens);
                if o.finish == FinishReason::Eos {
                    assert!(output_matches(c.constraint(), &o.tokens, t.vocabulary(), &[EOS]), "{pattern} {name}: {:?}", o.tokens);
                }
            }
        }
    }
}

#[test]
fn constrained_requests_are_checked() {
    let w = tiny();
    let model = B.load_model(&w).unwrap();
    let engine = Engine::new(&B, &model, &w.config, EngineConfig::default()).unwrap();
    let t = table(12);
    let c = constrained(PATTERNS[0], &t);
    let err = |r: Request| engine.generate(&[r], &mut NoProposer, None, &mut NoSink).unwrap_err().to_string();
    assert!(err(Request { eos: vec![], ..request(&[1], 4, &c) }).contains("needs an eos id"));
    assert!(err(request(&[1], 4, &constrained(PATTERNS[0], &table(13)))).contains("13 tokens"));
    // A pattern the tiny text cannot start: `Ab` is no token.
    assert!(err(request(&[1], 4, &constrained("Ab", &t))).contains("allows no first token"));
    // One it can start but not continue: after `Aa` only the byte `x`. The
    // request fails alone (CONSTRAIN-2), after the token it could emit.
    let out = engine.generate(&[request(&[1], 4, &constrained("Aax", &t)), request(&[1], 4, &c)], &mut NoProposer, None, &mut NoSink).unwrap().outputs;
    assert_eq!((out[0].tokens.clone(), out[0].finish), (vec![0], FinishReason::Error), "CONSTRAIN-2: {out:?}");
    assert!(out[0].error.as_deref().is_some_and(|e| e.contains("cannot continue")), "{out:?}");
    assert!(out[1].finish != FinishReason::Error && out[1].error.is_none(), "the other request of the batch goes on: {out:?}");
}

/// CONSTRAIN-2 with speculation: a draft into a state the vocabulary cannot
/// continue (`Bb`, after which only `Cx` would do) fails the request only
/// where plain decoding fails it, after the same tokens; a rejected one
/// costs nothing. n-gram drafts from a prompt of `Aa Bb` pairs propose it.
#[test]
fn a_dead_end_fails_a_request_where_plain_decoding_fails_it() {
    let w = tiny();
    let t = table(w.config.vocab_size);
    let mut ended = [0, 0];
    for pattern in ["Aa(BbCx|Dd|Ee|Ff|Gg)(Hh)*", "Aa(BbCx|Cc)(AaBb)*(Dd)?"] {
        let c = constrained(pattern, &t);
        for prompt in [&[0u32, 1, 0, 1, 0, 1, 0][..], &[0, 1, 3], &[5, 0, 1, 0, 1]] {
            let req = request(prompt, 10, &c);
            let plain = &generate(&w, EngineConfig::default(), std::slice::from_ref(&req), &mut NoProposer)[0];
            ended[usize::from(plain.finish == FinishReason::Error)] += 1;
            for name in ["ngram", "draft", "self"] {
                for k in [1, 3] {
                    let spec = &generate(&w, EngineConfig { k, ..EngineConfig::default() }, std::slice::from_ref(&req), proposer(name, &w).as_mut())[0];
                    assert_eq!((&spec.tokens, spec.finish, &spec.error), (&plain.tokens, plain.finish, &plain.error), "CONSTRAIN-2: {pattern} {name} k={k} prompt {prompt:?}");
                }
            }
        }
    }
    eprintln!("plain runs that avoid and that meet the dead end: {ended:?}");
    assert!(ended[0] > 0, "some plain run avoids the dead end (so speculation must too): {ended:?}");
}

/// The negative controls: each grammar bug peers ship fails a check here.
mod faults {
    use super::*;

    /// The first failure `fault` causes, which it must cause on the regexes
    /// and on the recursive grammar alike.
    fn caught(fault: Fault, proposers: &[&str]) -> Option<String> {
        let all = specs();
        let (regexes, grammar) = all.split_at(PATTERNS.len());
        let on_grammar = greedy_failure(Some(fault), proposers, grammar);
        assert!(on_grammar.is_some(), "{fault:?} passes on the grammar");
        greedy_failure(Some(fault), proposers, regexes).map(|f| format!("{f}; on the grammar: {}", on_grammar.unwrap_or_default()))
    }

    /// vLLM #56077's class: the state fed the drafts and not rolled back.
    #[test]
    fn a_state_not_rolled_back_is_caught() {
        let failure = caught(Fault::ConstraintNotRolledBack, &["ngram"]);
        eprintln!("ConstraintNotRolledBack: {failure:?}");
        assert!(failure.is_some());
    }

    #[test]
    fn a_mask_on_the_first_row_only_is_caught() {
        let failure = caught(Fault::MaskFirstRowOnly, &["ngram"]);
        eprintln!("MaskFirstRowOnly: {failure:?}");
        assert!(failure.is_some());
    }

    #[test]
    fn a_mask_from_the_committed_state_is_caught() {
        let failure = caught(Fault::MaskFromCommittedState, &["ngram"]);
        eprintln!("MaskFromCommittedState: {failure:?}");
        assert!(failure.is_some());
    }

    #[test]
    fn eos_outside_an_accepting_state_is_caught() {
        let failure = caught(Fault::EosOutsideAccept, &["none"]);
        eprintln!("EosOutsideAccept: {failure:?}");
        assert!(failure.is_some());
    }

    /// HF #47932's class for constraints: drafts drawn under the mask, `q` reported without it.
    #[test]
    fn a_draft_q_without_the_mask_is_caught() {
        let p = two_token_p_value(Some(Fault::DraftQWithoutMask), "draft", planned_runs(), &ConstraintSpec::Regex(PATTERNS[1].into()));
        eprintln!("DraftQWithoutMask: p = {p:.3e}");
        assert!(p < ALPHA, "the law check missed a q without the mask: p = {p:.2e}");
    }
}
