//! The tokenizer from GGUF metadata and from an HF directory (MODEL-6): a
//! small byte-level BPE built from `tokenizer.ggml.*` keys encodes as
//! llama.cpp would (merges by rank, single digits, special tokens as one id),
//! decodes back exactly, survives `save`/`from_dir`, and renders ChatML.

mod common;

use common::{GgufBuilder, SMALL_CHATML, Val, s, scratch_dir, small_vocab, with_small_tokenizer};
use specdec_models::Tokenizer;
use specdec_models::gguf::GgufFile;

fn small() -> Tokenizer {
    from(with_small_tokenizer(GgufBuilder::default()))
}

fn from(b: GgufBuilder) -> Tokenizer {
    Tokenizer::from_gguf(&GgufFile::from_bytes("small.gguf", b.build()).unwrap()).unwrap()
}

/// The id of a token string in the small vocabulary.
fn id(token: &str) -> u32 {
    small_vocab().0.iter().position(|t| t == token).unwrap_or_else(|| panic!("{token:?} is in the vocabulary")) as u32
}

/// The id of the token for one byte (looked up through GPT-2's byte map).
fn byte(c: char) -> u32 {
    let ch = common::byte_chars()[c as usize];
    id(&ch.to_string())
}

/// MODEL-6: golden encodings of the small vocabulary, each worked out by hand
/// from the merge ranks.
#[test]
fn encodes_as_the_merges_say() {
    let t = small();
    let cases: Vec<(&str, Vec<u32>)> = vec![
        // "h e" (rank 0) then "t he" (rank 1) makes "the"; " the" is Ġ,t,h,e
        // -> Ġ,t,he -> Ġ,the -> "Ġthe" (rank 2).
        ("the the", vec![id("the"), id("Ġthe")]),
        ("in thin", vec![id("in"), byte(' '), byte('t'), byte('h'), id("in")]),
        // Each digit is its own pre-token (smollm).
        ("2024", vec![byte('2'), byte('0'), byte('2'), byte('4')]),
        // Special tokens in the text are one id each; newline is byte 0x0A.
        ("<|im_start|>user\nthe<|im_end|>", vec![1, byte('u'), byte('s'), byte('e'), byte('r'), byte('\n'), id("the"), 2]),
        // The user-defined token is matched too.
        ("a<tool>b", vec![byte('a'), id("<tool>"), byte('b')]),
        ("", vec![]),
    ];
    for (text, want) in cases {
        assert_eq!(t.encode(text, true).unwrap(), want, "{text:?}");
    }
    assert_eq!(t.vocab_size(), 265);
    assert_eq!((t.bos_id(), t.eos_id(), t.pad_id(), t.unk_id()), (Some(1), Some(2), Some(2), Some(0)));
    assert!(!t.add_bos());
}

/// MODEL-6: byte-level BPE decodes every text back exactly.
#[test]
fn decode_round_trips() {
    let t = small();
    for text in [
        "Hello, world!",
        "  leading and trailing spaces  ",
        "tabs\tand\nnewlines\r\n\n\nruns     of    spaces",
        "naïve café, Straße, 東京, Ελληνικά, עברית",
        "emoji 🙂👍🏽 and ZWJ 👨‍👩‍👧",
        "digits 3.14159 and 1,000,000 and ٣",
        "<|im_start|>user\nthe thin tin<|im_end|>\n<|im_start|>assistant\n",
    ] {
        let ids = t.encode(text, true).unwrap();
        assert_eq!(t.decode(&ids, false).unwrap(), text, "{text:?}");
    }
    // skip_special drops control tokens but keeps user-defined ones.
    let ids = t.encode("<|im_start|>a<tool>b<|im_end|>", true).unwrap();
    assert_eq!(t.decode(&ids, true).unwrap(), "a<tool>b");
    let e = t.decode(&[0, 265], false).unwrap_err();
    assert_eq!(e.kind(), "InvalidInput");
}

/// MODEL-6: `add_bos_token` prepends BOS only when special tokens are asked for.
#[test]
fn add_bos_is_honoured() {
    let t = from(with_small_tokenizer(GgufBuilder::default()).kv("tokenizer.ggml.add_bos_token", Val::Bool(true)));
    assert_eq!(t.encode("the", true).unwrap(), vec![1, id("the")]);
    assert_eq!(t.encode("the", false).unwrap(), vec![id("the")]);
    let dir = scratch_dir("tok-bos");
    t.save(&dir).unwrap();
    let back = Tokenizer::from_dir(&dir).unwrap();
    assert!(back.add_bos());
    assert_eq!(back.encode("the", true).unwrap(), vec![1, id("the")]);
}

/// MODEL-6: `save` then `from_dir` gives the same tokenizer.
#[test]
fn save_and_reload() {
    let t = small();
    let dir = scratch_dir("tok-save");
    t.save(&dir).unwrap();
    let back = Tokenizer::from_dir(&dir).unwrap();
    for text in ["the the in 2024", "<|im_start|>user\nhi<|im_end|>", "emoji 🙂 東京", "a<tool>b"] {
        assert_eq!(back.encode(text, true).unwrap(), t.encode(text, true).unwrap(), "{text:?}");
    }
    assert_eq!(back.vocab_size(), t.vocab_size());
    assert_eq!((back.bos_id(), back.eos_id(), back.pad_id(), back.unk_id()), (Some(1), Some(2), Some(2), Some(0)));
    assert_eq!(back.chat_template(), Some(SMALL_CHATML));
    assert_eq!(back.chat_prompt("x").unwrap(), t.chat_prompt("x").unwrap());
    let cfg: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(dir.join("tokenizer_config.json")).unwrap()).unwrap();
    assert_eq!(cfg["bos_token"], "<|im_start|>");
    assert_eq!(cfg["eos_token"], "<|im_end|>");
}

/// MODEL-6: ChatML renders with the template's default system message;
/// anything else is refused rather than guessed.
#[test]
fn chat_prompt_renders_chatml_only() {
    let t = small();
    assert_eq!(t.default_system().as_deref(), Some("Be brief."));
    assert_eq!(t.chat_prompt("What is 2+2?").unwrap(), "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n");
    // The text before a user message: what a model continues to write one (draft-data --synthesize).
    assert_eq!(t.chat_user_prefix().unwrap(), "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n");
    let ids = t.encode(&t.chat_prompt("hi").unwrap(), false).unwrap();
    assert_eq!(ids.first(), Some(&1));
    assert_eq!(ids.iter().filter(|&&i| i == 1).count(), 3);

    // ChatML without a default system message has no system turn.
    let plain =
        from(with_small_tokenizer(GgufBuilder::default()).kv("tokenizer.chat_template", s("{% for m in messages %}{{'<|im_start|>' + m['role'] + '\n' + m['content'] + '<|im_end|>\n'}}{% endfor %}")));
    assert_eq!(plain.chat_prompt("hi").unwrap(), "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n");

    let llama2 = from(with_small_tokenizer(GgufBuilder::default()).kv("tokenizer.chat_template", s("[INST] {{ messages[0]['content'] }} [/INST]")));
    assert_eq!(llama2.chat_prompt("hi").unwrap_err().kind(), "Tokenizer");
    assert_eq!(llama2.chat_user_prefix().unwrap_err().kind(), "Tokenizer");
    let none = from(with_small_tokenizer(GgufBuilder::default()).without_kv("tokenizer.chat_template"));
    assert_eq!(none.chat_prompt("hi").unwrap_err().kind(), "MissingField");
    assert_eq!(none.chat_user_prefix().unwrap_err().kind(), "MissingField");
}

/// MODEL-6: the pre-tokenizer decides which merges can apply: with a merge
/// `Ġ 1`, `gpt-2` keeps " 12" as one pre-token (so `Ġ1` forms) while
/// `smollm` splits digits off first (so the space stays alone).
#[test]
fn pre_tokenizer_decides_digit_merges() {
    let (mut tokens, mut types, mut merges) = small_vocab();
    tokens.push("Ġ1".into());
    types.push(1);
    merges.push("Ġ 1".into());
    let with = |pre: &str| {
        from(
            with_small_tokenizer(GgufBuilder::default())
                .kv("tokenizer.ggml.tokens", Val::StrArr(tokens.clone()))
                .kv("tokenizer.ggml.token_type", Val::I32Arr(types.clone()))
                .kv("tokenizer.ggml.merges", Val::StrArr(merges.clone()))
                .kv("tokenizer.ggml.pre", s(pre)),
        )
    };
    let g1 = tokens.len() as u32 - 1;
    assert_eq!(with("gpt-2").encode("a 12", true).unwrap(), vec![byte('a'), g1, byte('2')]);
    assert_eq!(with("smollm").encode("a 12", true).unwrap(), vec![byte('a'), byte(' '), byte('1'), byte('2')]);
}

/// CONSTRAIN-2: each token's bytes, concatenated, are the text it encodes
/// (bytes of a character split across tokens included); special tokens
/// have none, a user-defined one its literal text.
#[test]
fn token_bytes_spell_the_text() {
    let t = small();
    let bytes = t.token_bytes().unwrap();
    assert_eq!(bytes.len(), t.vocab_size());
    for text in ["Hello, world!", "naïve café, 東京 🙂👍🏽", "tabs\tand\nnewlines  the thin", "a<tool>b 2024"] {
        let ids = t.encode(text, true).unwrap();
        let spelled: Vec<u8> = ids.iter().flat_map(|&i| bytes[i as usize].clone().unwrap_or_else(|| panic!("{text:?}: token {i} has no bytes"))).collect();
        assert_eq!(spelled, text.as_bytes(), "{text:?}");
    }
    assert_eq!((bytes[1].as_ref(), bytes[2].as_ref()), (None, None), "<|im_start|> and <|im_end|> are not text");
    assert_eq!(bytes[id("<tool>") as usize].as_deref(), Some(&b"<tool>"[..]));
    assert_eq!(bytes[byte(' ') as usize].as_deref(), Some(&b" "[..]));
}
