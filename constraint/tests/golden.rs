//! The hand-worked masks of `fixtures/constraints/masks.json` through one
//! `check()` (CONSTRAIN-1 .. CONSTRAIN-4), the JSON-schema subset's
//! translation on worked texts (CONSTRAIN-5), and every refused input.

use serde_json::{Value, json};
use specdec_constraint::{Constraint, ConstraintError, ConstraintSpec, Vocabulary, allowed, output_matches, schema, state_after};

const MASKS: &str = include_str!("../../fixtures/constraints/masks.json");

fn vocabulary(case: &Value) -> Vocabulary {
    let tokens = if let Some(v) = case.get("vocab") {
        v.as_array().unwrap().iter().map(|t| t.as_str().map(|s| s.as_bytes().to_vec())).collect()
    } else {
        case["vocab_bytes"].as_array().unwrap().iter().map(|t| Some(t.as_array().unwrap().iter().map(|b| b.as_u64().unwrap() as u8).collect())).collect()
    };
    Vocabulary::new(tokens).unwrap()
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect()
}

/// One case: at every listed output, the allowed ids and acceptance are the
/// hand-worked ones; every listed bad output is refused.
fn check(case: &Value) {
    let id = case["id"].as_str().unwrap();
    let c = match (case.get("regex"), case.get("gbnf")) {
        (Some(r), None) => Constraint::regex(r.as_str().unwrap()).unwrap(),
        (None, Some(g)) => Constraint::grammar(g.as_str().unwrap()).unwrap(),
        _ => panic!("{id}: a case gives a regex or a grammar"),
    };
    let vocab = vocabulary(case);
    let eos = ids(&case["eos"]);
    let steps = case["steps"].as_array().unwrap();
    assert!(!steps.is_empty(), "{id}: a case with no steps checks nothing");
    for step in steps {
        let after = ids(&step["after"]);
        let state = state_after(&c, &after, &vocab, &eos).unwrap_or_else(|| panic!("{id}: {after:?} is not allowed"));
        let mask = allowed(&c, state, &vocab, &eos);
        let got: Vec<u32> = (0..mask.len() as u32).filter(|&i| mask[i as usize]).collect();
        assert_eq!(got, ids(&step["allowed"]), "{id}: allowed after {after:?}");
        assert_eq!(c.accepts(state), step["accepts"].as_bool().unwrap(), "{id}: accepts after {after:?}");
    }
    for bad in case["not_allowed_outputs"].as_array().unwrap() {
        assert!(state_after(&c, &ids(bad), &vocab, &eos).is_none(), "{id}: {bad} should not be allowed");
    }
}

#[test]
fn hand_worked_masks() {
    let file: Value = serde_json::from_str(MASKS).unwrap();
    let cases = file["cases"].as_array().unwrap();
    assert!(cases.len() >= 9, "CONSTRAIN-2: the fixture lost cases");
    assert!(cases.iter().filter(|c| c.get("gbnf").is_some()).count() >= 3, "CONSTRAIN-2: the fixture lost its context-free cases");
    for case in cases {
        check(case);
    }
}

/// The negative control of `check`: a wrong expectation fails it.
#[test]
#[should_panic(expected = "allowed after")]
fn a_wrong_mask_fails_the_check() {
    let mut case: Value = serde_json::from_str::<Value>(MASKS).unwrap()["cases"][0].clone();
    case["steps"][0]["allowed"] = json!([0, 1]);
    check(&case);
}

#[test]
fn a_finished_output_matches_only_with_eos_at_an_accepting_state() {
    let c = Constraint::regex("(AaBb)+").unwrap();
    let vocab = Vocabulary::new(["Aa", "Bb", "Cc"].iter().map(|s| Some(s.as_bytes().to_vec())).collect()).unwrap();
    assert!(output_matches(&c, &[0, 1, 2], &vocab, &[2]), "CONSTRAIN-4: eos at an accepting state");
    assert!(output_matches(&c, &[0, 1], &vocab, &[2]), "a cap may end a matching output");
    assert!(!output_matches(&c, &[0], &vocab, &[2]), "a cap in a non-accepting state is no match");
    assert!(!output_matches(&c, &[0, 2], &vocab, &[2]));
}

fn schema_matches(s: Value, text: &str) -> bool {
    Constraint::new(&ConstraintSpec::JsonSchema(s)).unwrap().matches(text.as_bytes())
}

#[test]
fn the_json_schema_subset_on_worked_texts() {
    let tool = json!({"type": "object", "properties": {"name": {"type": "string", "maxLength": 8}, "count": {"type": "integer"}, "ok": {"type": "boolean"}}, "required": ["name"]});
    for (text, valid) in [
        (r#"{"name":"ls"}"#, true),
        (r#"{"name":"ls","count":-3}"#, true),
        (r#"{"name":"ls","ok":false}"#, true),
        (r#"{"name":"ls","count":0,"ok":true}"#, true),
        (r#"{"name":"a\"b"}"#, true),
        (r#"{"count":1}"#, false),
        (r#"{"name":"ls","count":01}"#, false),
        (r#"{"name": "ls"}"#, false),
        (r#"{"ok":true,"name":"ls"}"#, false),
        (r#"{"name":"ninechars"}"#, false),
        (r#"{"name":"ls",}"#, false),
    ] {
        assert_eq!(schema_matches(tool.clone(), text), valid, "CONSTRAIN-5: {text}");
    }
    let first_optional = json!({"type": "object", "properties": {"a": {"type": "null"}, "b": {"enum": ["x", 2]}}});
    for (text, valid) in [("{}", true), (r#"{"a":null}"#, true), (r#"{"b":"x"}"#, true), (r#"{"a":null,"b":2}"#, true), (r#"{,"b":2}"#, false), (r#"{"b":3}"#, false)] {
        assert_eq!(schema_matches(first_optional.clone(), text), valid, "{text}");
    }
    let list = json!({"type": "array", "items": {"type": "number"}, "minItems": 1, "maxItems": 2});
    for (text, valid) in [("[1.5]", true), ("[1,-2e3]", true), ("[]", false), ("[1,2,3]", false), ("[.5]", false)] {
        assert_eq!(schema_matches(list.clone(), text), valid, "{text}");
    }
    let either = json!({"anyOf": [{"type": "integer"}, {"const": "none"}]});
    for (text, valid) in [("7", true), (r#""none""#, true), ("none", false)] {
        assert_eq!(schema_matches(either.clone(), text), valid, "{text}");
    }
}

/// CONSTRAIN-5: an object without `properties` (OpenAI's `json_object`) is
/// any compact JSON object whose containers nest at most
/// `FREE_FORM_DEPTH` (5) levels; each text below is checked by hand, and
/// every one `serde_json` reads as an object is, depth aside, valid JSON.
#[test]
fn a_free_form_object_is_any_compact_json_object_five_levels_deep() {
    assert_eq!(schema::FREE_FORM_DEPTH, 5);
    // Built once: the DFA of five levels takes a while in a debug build.
    let any = Constraint::new(&ConstraintSpec::JsonSchema(json!({"type": "object", "description": "any"}))).unwrap();
    let five = r#"{"a":[{"b":[[1]]}]}"#;
    let six = r#"{"a":[{"b":[[[1]]]}]}"#;
    for (text, valid) in [
        ("{}", true),
        (r#"{"a":1}"#, true),
        (r#"{"a":-1.5e3,"b":"x\"y","c":true,"d":false,"e":null,"f":[],"g":{}}"#, true),
        (r#"{"":[1,"2",[3],{"x":null}]}"#, true),
        (five, true),
        (six, false),
        (r#"{"a":1,}"#, false),
        (r#"{"a" :1}"#, false),
        (r#"{a:1}"#, false),
        (r#"{"a":01}"#, false),
        (r#"{"a":[1,]}"#, false),
        (r#"{"a":tru}"#, false),
        ("[]", false),
        ("1", false),
    ] {
        assert_eq!(any.matches(text.as_bytes()), valid, "CONSTRAIN-5: {text}");
        if valid {
            assert!(serde_json::from_str::<Value>(text).unwrap().is_object(), "{text}");
        }
    }
}

/// CONSTRAIN-1: the mask sets refused tokens to -inf and leaves the others bit for bit.
#[test]
fn the_mask_touches_only_refused_tokens() {
    let scores = [0.1f64, -3.0, f64::NEG_INFINITY, 7.25];
    let masked = specdec_constraint::mask_scores(&scores, &[true, false, true, false]);
    assert_eq!(masked, vec![0.1, f64::NEG_INFINITY, f64::NEG_INFINITY, f64::NEG_INFINITY], "CONSTRAIN-1");
    assert_eq!(masked[0].to_bits(), 0.1f64.to_bits(), "CONSTRAIN-1: an allowed score is untouched");
}

#[test]
fn refused_inputs_are_typed_errors() {
    assert!(matches!(Constraint::regex("(Aa"), Err(ConstraintError::Regex { .. })));
    assert!(matches!(Constraint::regex(r"[^\s\S]"), Err(ConstraintError::MatchesNothing { .. })));
    assert!(matches!(Constraint::regex(r"a\bb"), Err(ConstraintError::Regex { .. })), "a Unicode word boundary has no DFA");
    // A hostile pattern whose DFA doubles per repetition: refused at a bound, never built whole.
    assert!(matches!(Constraint::regex("(A|B)*A(A|B){40}"), Err(ConstraintError::Regex { reason, .. }) if reason.contains("size limit")), "past the DFA size limit");
    assert!(matches!(Constraint::regex("(A|B)*A(A|B){14}"), Err(ConstraintError::TooManyStates { .. })), "past the state bound");
    // Small text, a huge NFA (each counted repetition written out): refused at
    // the NFA's bound, never built; its error quotes at most 200 characters.
    let huge = Constraint::regex("((a{256}){256}){256}");
    assert!(matches!(&huge, Err(ConstraintError::Regex { reason, .. }) if reason.contains("exceeded limit")), "past the NFA size limit: {huge:?}");
    let long = format!("{}(", "a".repeat(5000));
    assert!(Constraint::regex(&long).unwrap_err().to_string().contains("(and 4801 more bytes)"));
    for (s, at) in [
        (json!({"$ref": "#/x"}), "#"),
        (json!({"type": "string", "pattern": "a+"}), "#"),
        (json!({"type": "object", "additionalProperties": false}), "#"),
        (json!({"type": "object", "properties": {"a": {"type": "object", "required": ["b"]}}}), "#/properties/a"),
        (json!({"type": "object", "properties": {"a": {"type": "string", "format": "date"}}}), "#/properties/a"),
        (json!({"type": "object", "properties": {}, "required": ["a"]}), "#"),
        (json!({"type": ["string", "null"]}), "#"),
        (json!({"type": "array", "items": {"type": "integer"}, "maxItems": 100000}), "#"),
        (json!({"type": "string", "minLength": 3, "maxLength": 2}), "#"),
        (json!({"enum": []}), "#"),
        (json!("string"), "#"),
    ] {
        match schema::to_regex(&s) {
            Err(ConstraintError::Schema { path, .. }) => assert_eq!(path, at, "{s}"),
            other => panic!("{s}: {other:?}"),
        }
    }
    assert!(Vocabulary::new(vec![]).is_err());
    assert!(Vocabulary::new(vec![Some(vec![])]).is_err(), "an empty text is not a token's text");
}

const GBNF: &str = include_str!("../../fixtures/constraints/gbnf.json");

/// One regex of `fixtures/constraints/gbnf.json`: its GBNF expression is the
/// hand-written one, or it is refused naming what GBNF cannot say.
fn check_gbnf(case: &Value) {
    let (id, regex) = (case["id"].as_str().unwrap(), case["regex"].as_str().unwrap());
    match (specdec_constraint::gbnf::from_regex(regex), case.get("gbnf")) {
        (Ok(got), Some(want)) => assert_eq!(got, want.as_str().unwrap(), "{id}: the GBNF of {regex:?}"),
        (Err(e), None) => {
            let want = case["refused"].as_str().unwrap();
            assert!(matches!(e, ConstraintError::Regex { .. }) && e.to_string().contains(want), "{id}: refused with {e}, not naming {want:?}");
        }
        (got, _) => panic!("{id}: {regex:?} gave {got:?}"),
    }
}

#[test]
fn regexes_are_written_as_gbnf_by_hand() {
    let file: Value = serde_json::from_str(GBNF).unwrap();
    let (cases, refused) = (file["cases"].as_array().unwrap(), file["refused"].as_array().unwrap());
    assert!(cases.len() >= 8 && refused.len() >= 4, "the GBNF fixture lost cases");
    cases.iter().chain(refused).for_each(check_gbnf);
}

/// The negative control of `check_gbnf`: a wrong expression fails it.
#[test]
#[should_panic(expected = "the GBNF of")]
fn a_wrong_gbnf_fails_the_check() {
    check_gbnf(&json!({"id": "wrong", "regex": "ab", "gbnf": "\"a\" \"b\""}));
}

const GRAMMARS: &str = include_str!("../../fixtures/constraints/grammars.json");

/// One grammar of `fixtures/constraints/grammars.json`: it compiles to a
/// constraint matching exactly its hand-listed texts among those listed, or
/// it is refused naming why.
fn check_grammar(case: &Value) {
    let (id, gbnf) = (case["id"].as_str().unwrap(), case["gbnf"].as_str().unwrap());
    let texts = |key: &str| case.get(key).map(|v| v.as_array().unwrap().iter().map(|t| t.as_str().unwrap().to_string()).collect::<Vec<_>>()).unwrap_or_default();
    match (ConstraintSpec::grammar(gbnf), case.get("refused")) {
        (Ok(spec), None) => {
            let c = Constraint::new(&spec).unwrap_or_else(|e| panic!("{id}: {e}"));
            let (yes, no) = (texts("matches"), texts("rejects"));
            assert!(!yes.is_empty() && !no.is_empty(), "{id}: a case must list texts both ways");
            // A grammar that recurses is context-free; one that does not stays a DFA.
            assert_eq!(c.is_context_free(), case.get("context_free").is_some_and(|v| v == true), "{id}: read as the wrong kind");
            for t in &yes {
                assert!(c.matches(t.as_bytes()), "{id}: the grammar should match {t:?} (read as {})", c.pattern());
            }
            for t in &no {
                assert!(!c.matches(t.as_bytes()), "{id}: the grammar should not match {t:?} (read as {})", c.pattern());
            }
        }
        (Err(e), Some(want)) => {
            let want = want.as_str().unwrap();
            assert!(matches!(e, ConstraintError::Grammar { .. }) && e.to_string().contains(want), "{id}: refused with {e}, not naming {want:?}");
        }
        (got, _) => panic!("{id}: {gbnf:?} gave {got:?}"),
    }
}

#[test]
fn grammars_are_read_as_regexes_or_as_context_free_constraints() {
    let file: Value = serde_json::from_str(GRAMMARS).unwrap();
    let (cases, refused) = (file["cases"].as_array().unwrap(), file["refused"].as_array().unwrap());
    assert!(cases.len() >= 12 && refused.len() >= 10, "the grammar fixture lost cases");
    cases.iter().chain(refused).for_each(check_grammar);
}

/// A hostile grammar's nesting is bounded before it can exhaust the stack:
/// groups, and rules each used by the one above.
#[test]
fn deeply_nested_grammars_are_refused_not_overflowed() {
    let n = 100_000;
    let groups = format!("root ::= {}\"a\"{}", "(".repeat(n), ")".repeat(n));
    let chain: String = std::iter::once("root ::= r0\n".to_string()).chain((0..n).map(|i| format!("r{i} ::= r{}\n", i + 1))).chain([format!("r{n} ::= \"a\"\n")]).collect();
    // 64 rules each wrapping the next in 63 groups: each rule alone is within
    // the parser's bound, the inlining is not.
    let wrapped: String =
        std::iter::once("root ::= w0\n".to_string()).chain((0..64).map(|i| format!("w{i} ::= {}w{}{}\n", "(".repeat(63), i + 1, ")".repeat(63)))).chain(["w64 ::= \"a\"\n".to_string()]).collect();
    for (what, gbnf, want) in [("groups", groups, "groups nest more than 64"), ("rules", chain, "nest more than 64"), ("rules and groups", wrapped, "nest more than 64")] {
        match ConstraintSpec::grammar(&gbnf) {
            Err(ConstraintError::Grammar { reason }) => assert!(reason.contains(want), "{what}: {reason}"),
            other => panic!("{what}: {other:?}"),
        }
    }
}

/// The negative control of `check_grammar`: a text listed the wrong way fails it.
#[test]
#[should_panic(expected = "should not match")]
fn a_wrong_grammar_expectation_fails_the_check() {
    let mut case: Value = serde_json::from_str::<Value>(GRAMMARS).unwrap()["cases"][0].clone();
    case["rejects"] = json!(["yes"]);
    check_grammar(&case);
}

/// Whether two constraints match the same texts: a search of their product
/// automaton over every byte, a state pair whose acceptance differs being a
/// text one matches and the other does not (a dead state is `None`).
fn same_language(a: &Constraint, b: &Constraint) -> bool {
    use specdec_constraint::State;
    let accepts = |c: &Constraint, s: Option<State>| s.is_some_and(|s| c.accepts(s));
    let mut seen = std::collections::HashSet::from([(Some(a.start()), Some(b.start()))]);
    let mut queue = vec![(Some(a.start()), Some(b.start()))];
    while let Some((x, y)) = queue.pop() {
        if accepts(a, x) != accepts(b, y) {
            return false;
        }
        for byte in 0..=255u8 {
            let next = (x.and_then(|s| a.walk(s, &[byte])), y.and_then(|s| b.walk(s, &[byte])));
            if next != (None, None) && seen.insert(next) {
                queue.push(next);
            }
        }
    }
    true
}

/// The two directions agree: every regex of `fixtures/constraints/gbnf.json`
/// written as GBNF (the hand-written expression) and read back is the same
/// language as the regex, checked exactly on their product automaton; the
/// control: a grammar one character off is another language.
#[test]
fn a_regex_written_as_gbnf_reads_back_as_the_same_language() {
    let file: Value = serde_json::from_str(GBNF).unwrap();
    let cases = file["cases"].as_array().unwrap();
    assert!(!cases.is_empty());
    for case in cases {
        let (id, regex, gbnf) = (case["id"].as_str().unwrap(), case["regex"].as_str().unwrap(), case["gbnf"].as_str().unwrap());
        let back = Constraint::new(&ConstraintSpec::grammar(&format!("root ::= {gbnf}")).unwrap()).unwrap_or_else(|e| panic!("{id}: {e}"));
        assert!(same_language(&Constraint::regex(regex).unwrap(), &back), "{id}: {gbnf} read back is not {regex}");
    }
    let (x, y) = (Constraint::regex("(ab)+c?").unwrap(), Constraint::new(&ConstraintSpec::grammar("root ::= (\"ab\")* \"c\"?").unwrap()).unwrap());
    assert!(!same_language(&x, &y), "the product search missed the empty text");
}

/// The grammar `gbnf` forced onto the context-free path with its language
/// unchanged: a rule that recurses without end derives no text, so it is
/// dropped, but its recursion sends the grammar to Earley.
fn as_context_free(gbnf: &str) -> Constraint {
    let renamed = gbnf.replace("root ::=", "root0 ::=");
    let c = Constraint::grammar(&format!("{renamed}\nroot ::= root0 | never\nnever ::= \"z\" never\n")).unwrap();
    assert!(c.is_context_free());
    c
}

/// CONSTRAIN-2 on both paths: every regular grammar of the fixture, as its
/// DFA and through Earley, agrees on every byte string up to five bytes long
/// over the bytes of its texts, one byte no text has, and the halves of a
/// two-byte character: live or dead, accepting or not.
#[test]
fn earley_and_the_dfa_agree_on_every_short_text() {
    let file: Value = serde_json::from_str(GRAMMARS).unwrap();
    let mut compared = 0;
    for case in file["cases"].as_array().unwrap().iter().filter(|c| c.get("context_free").is_none()) {
        let (id, gbnf) = (case["id"].as_str().unwrap(), case["gbnf"].as_str().unwrap());
        let (dfa, earley) = (Constraint::grammar(gbnf).unwrap(), as_context_free(gbnf));
        assert!(!dfa.is_context_free(), "{id}");
        let mut alphabet: Vec<u8> = case["matches"].as_array().unwrap().iter().flat_map(|t| t.as_str().unwrap().bytes()).chain([b'#', 0xc3, 0xa9]).collect();
        alphabet.sort_unstable();
        alphabet.dedup();
        alphabet.truncate(7);
        let mut texts: Vec<Vec<u8>> = vec![vec![]];
        for _ in 0..5 {
            let longer: Vec<Vec<u8>> = texts.iter().filter(|t| t.len() == texts.last().unwrap().len()).flat_map(|t| alphabet.iter().map(move |&b| [t.as_slice(), &[b]].concat())).collect();
            texts.extend(longer);
        }
        for t in &texts {
            let (a, b) = (dfa.walk(dfa.start(), t), earley.walk(earley.start(), t));
            assert_eq!(a.is_some(), b.is_some(), "{id}: live after {t:?}");
            if let (Some(a), Some(b)) = (a, b) {
                assert_eq!(dfa.accepts(a), earley.accepts(b), "{id}: accepts after {t:?}");
                assert_eq!(dfa.extends(a, b"x"), earley.extends(b, b"x"), "{id}: extends {t:?} by x");
            }
            compared += 1;
        }
    }
    assert!(compared > 10_000, "compared only {compared} texts");
}

/// The negative control of the comparison: a grammar one character off is
/// told apart on the texts it compares.
#[test]
fn earley_and_the_dfa_differ_where_the_languages_do() {
    let (dfa, earley) = (Constraint::grammar("root ::= \"ab\"+").unwrap(), as_context_free("root ::= \"ab\"* \"a\""));
    assert!(["", "a", "ab", "aba", "abab"].iter().any(|t| dfa.matches(t.as_bytes()) != earley.matches(t.as_bytes())));
}

#[test]
fn a_recursive_grammar_is_a_grammar_spec_and_a_regular_one_a_regex() {
    let spec = ConstraintSpec::grammar("root ::= \"(\" root \")\" | \"x\"").unwrap();
    assert!(matches!(&spec, ConstraintSpec::Grammar(_)) && spec.kind() == "grammar");
    assert_eq!(serde_json::to_value(&spec).unwrap(), json!({"grammar": "root ::= \"(\" root \")\" | \"x\""}), "PROTO-9 carries it as `grammar`");
    assert!(matches!(spec.pattern(), Err(ConstraintError::Grammar { reason }) if reason.contains("recursive")), "a recursive grammar has no regex");
    assert!(matches!(ConstraintSpec::grammar("root ::= \"x\"+").unwrap(), ConstraintSpec::Regex(_)));
    // A regular grammar sent as `grammar` over the protocol compiles to its DFA.
    assert!(!Constraint::new(&ConstraintSpec::Grammar("root ::= \"x\"+".into())).unwrap().is_context_free());
}

/// A grammar whose inlined regex would pass a megabyte (each rule used twice
/// by the one above: one text of 2^31 bytes) is context-free instead, small.
#[test]
fn a_grammar_too_long_to_inline_is_context_free() {
    let gbnf: String = (1..30).map(|i| format!("r{i} ::= r{} r{}\n", i + 1, i + 1)).chain(["root ::= r1 r1\nr30 ::= \"ab\"\n".to_string()]).collect();
    let c = Constraint::grammar(&gbnf).unwrap();
    assert!(c.is_context_free());
    let s = c.walk(c.start(), b"abababab").expect("a prefix of the one match");
    assert!(!c.accepts(s) && !c.extends(s, b"b"));
}

/// A hostile grammar is refused before its symbols take all memory.
#[test]
fn a_grammar_past_the_symbol_bound_is_refused() {
    let gbnf = format!("root ::= \"{}\" root | \"b\"", "a".repeat(specdec_constraint::cfg::MAX_GRAMMAR_SYMBOLS));
    match Constraint::grammar(&gbnf) {
        Err(ConstraintError::Grammar { reason }) => assert!(reason.contains("symbols"), "{reason}"),
        other => panic!("{other:?}"),
    }
}

/// `gbnf::with_end` (llama.cpp's grammar with its end token after the
/// output) writes every fixture grammar again as the same language: read
/// back with a text end, each listed match ends there and nothing else does.
#[test]
fn a_grammar_written_again_with_an_end_is_the_same_language() {
    let file: Value = serde_json::from_str(GRAMMARS).unwrap();
    for case in file["cases"].as_array().unwrap() {
        let (id, gbnf) = (case["id"].as_str().unwrap(), case["gbnf"].as_str().unwrap());
        let written = specdec_constraint::gbnf::with_end(gbnf, "\"#END\"").unwrap();
        let c = Constraint::grammar(&written).unwrap_or_else(|e| panic!("{id}: {e}\n{written}"));
        for (key, want) in [("matches", true), ("rejects", false)] {
            for t in case[key].as_array().unwrap() {
                let t = t.as_str().unwrap();
                assert_eq!(c.matches(format!("{t}#END").as_bytes()), want, "{id}: {t:?}#END\n{written}");
                assert!(!c.matches(t.as_bytes()) || t.ends_with("#END"), "{id}: {t:?} without the end\n{written}");
            }
        }
    }
}

/// A long output's chart (one Earley set per byte) is dropped without
/// recursing per byte: half a million bytes on a thread of 256 KiB of stack.
#[test]
fn a_long_charts_drop_does_not_overflow_the_stack() {
    let walked = std::thread::Builder::new()
        .stack_size(256 << 10)
        .spawn(|| {
            let c = Constraint::grammar(r#"root ::= root "ab" | """#).unwrap();
            let s = c.walk(c.start(), &b"ab".repeat(250_000)).unwrap();
            let accepts = c.accepts(s);
            drop(c);
            accepts
        })
        .unwrap()
        .join();
    assert_eq!(walked.ok(), Some(true));
}

/// A chart's `future_key` (what a fast mask may be cached by) decides its
/// future: along JSON texts, every two positions with one key allow the same
/// byte strings (all of up to three bytes over JSON's punctuation, a digit,
/// a letter and the halves of a two-byte character) and accept alike; and
/// positions inside one string share their key, so the cache is used.
#[test]
fn charts_with_one_future_key_allow_the_same_texts() {
    let c = Constraint::grammar(include_str!("../../fixtures/constraints/json-object.gbnf")).unwrap();
    let text = r#"{"name":"get weather","args":{"days":[1,22,{"x":"é"}],"ok":true},"n":-0.5e3}"#;
    let mut seen: Vec<(specdec_constraint::cfg::FutureKey, specdec_constraint::State)> = Vec::new();
    let mut s = c.start();
    for &b in text.as_bytes() {
        seen.push((c.future_key(s).unwrap(), s));
        s = c.walk(s, &[b]).unwrap();
    }
    let alphabet = b"{}[]:,\"\\1ae\xc3\xa9";
    let mut probes: Vec<Vec<u8>> = vec![vec![]];
    for _ in 0..3 {
        let longer: Vec<Vec<u8>> = probes.iter().filter(|p| p.len() == probes.last().unwrap().len()).flat_map(|p| alphabet.iter().map(move |&b| [p.as_slice(), &[b]].concat())).collect();
        probes.extend(longer);
    }
    let mut pairs = 0;
    for (i, (key, a)) in seen.iter().enumerate() {
        for (other, b) in &seen[i + 1..] {
            if key == other {
                pairs += 1;
                assert_eq!(c.accepts(*a), c.accepts(*b));
                for p in &probes {
                    assert_eq!(c.extends(*a, p), c.extends(*b, p), "positions {} and another, probe {p:?}", i);
                }
            }
        }
    }
    assert!(pairs >= 10, "only {pairs} positions share a key: the cache would not be used");
    // The negative controls: two positions whose futures differ have other keys;
    // and so do two outputs whose last sets are alike but whose earlier sets
    // are not (after `(a` a `)` will close, after `[a` a `]`).
    let (inside, after) = (c.walk(c.start(), br#"{"a"#).unwrap(), c.walk(c.start(), br#"{"a""#).unwrap());
    assert_ne!(c.future_key(inside), c.future_key(after));
    let brackets = as_context_free("root ::= \"(\" x \")\" | \"[\" x \"]\"\nx ::= \"a\" \"a\" \"a\"");
    let (round, square) = (brackets.walk(brackets.start(), b"(a").unwrap(), brackets.walk(brackets.start(), b"[a").unwrap());
    assert!(brackets.extends(round, b"aa)") && !brackets.extends(square, b"aa)"));
    assert_ne!(brackets.future_key(round), brackets.future_key(square), "one key for two futures");
}

/// A recursive grammar in llguidance's Lark dialect (the decoder's fast mask
/// of it, `decoder/src/guide.rs`), worked by hand: one rule per rule, one
/// one-byte terminal per byte (`é` as its two UTF-8 bytes, a class as its
/// range), a rule that derives no text gone with every production using it,
/// nothing forced; a DFA's constraint has none.
#[test]
fn a_recursive_grammar_as_lark() {
    let lark = |g: &str| Constraint::grammar(g).unwrap().lark().unwrap();
    let head = "%llguidance {\"allow_invalid_utf8\": true, \"no_forcing\": true}\nstart: r0\n";
    assert_eq!(lark(r#"root ::= "a" root "b" | "c""#), format!("{head}r0: /\\x61/ r0 /\\x62/ | /\\x63/\n"));
    // `dead` recurses without end: it and the alternative using it are dropped.
    assert_eq!(
        lark(
            r#"root ::= "x" root | "é" | dead
dead ::= "y" dead"#
        ),
        format!("{head}r0: /\\x78/ r0 | /\\xc3/ /\\xa9/\n")
    );
    assert_eq!(lark(r#"root ::= [a-c] root | """#), format!("{head}r0: r1 r0 | \"\"\nr1: /[\\x61-\\x63]/\n"));
    assert_eq!(Constraint::grammar(r#"root ::= "a" [b-d]*"#).unwrap().lark(), None, "a regular grammar is a DFA");
}
