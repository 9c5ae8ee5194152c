//! Logprobs as OpenAI's two endpoints write them (LOGPROB-3): the legacy
//! completion's parallel lists (`tokens`, `token_logprobs`, `top_logprobs`
//! as `{token: logprob}` maps, `text_offset`) and chat's `content` list of
//! `{token, logprob, bytes, top_logprobs}`. A token is its own text, or
//! `token_id:N` where the request asked (vLLM's
//! `return_tokens_as_token_ids`: two ids may share a text, an id is exact).
//! Every generated token has its entry, a final eos and the token that
//! completes a stop string included, as `token_ids` lists them.

use serde_json::{Map, Value, json};
use specdec_decoder::TokenLogprob;

use crate::text::Codec;

/// How an endpoint writes a token.
pub struct Tokens<'a> {
    pub codec: &'a Codec,
    pub as_ids: bool,
}

impl Tokens<'_> {
    fn text(&self, id: u32) -> String {
        if self.as_ids { format!("token_id:{id}") } else { self.codec.decode(&[id]) }
    }

    /// A completion's `logprobs` for `entries`, whose text starts `offset`
    /// characters into the output; returns the offset after them.
    pub fn completion(&self, entries: &[TokenLogprob], offset: usize) -> (Value, usize) {
        let (mut tokens, mut values, mut tops, mut offsets) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        let mut at = offset;
        for e in entries {
            let text = self.text(e.id);
            offsets.push(at);
            at += self.codec.decode(&[e.id]).chars().count();
            tokens.push(text);
            values.push(e.logprob);
            tops.push(Value::Object(e.top.iter().map(|&(id, lp)| (self.text(id), json!(lp))).collect::<Map<String, Value>>()));
        }
        (json!({"tokens": tokens, "token_logprobs": values, "top_logprobs": tops, "text_offset": offsets}), at)
    }

    /// A chat choice's `logprobs` for `entries`.
    pub fn chat(&self, entries: &[TokenLogprob]) -> Value {
        let one = |id: u32, lp: f64| {
            let text = self.text(id);
            let bytes: Vec<u8> = text.as_bytes().to_vec();
            (text, bytes, lp)
        };
        let content: Vec<Value> = entries
            .iter()
            .map(|e| {
                let (token, bytes, logprob) = one(e.id, e.logprob);
                let top: Vec<Value> = e
                    .top
                    .iter()
                    .map(|&(id, lp)| {
                        let (token, bytes, logprob) = one(id, lp);
                        json!({"token": token, "logprob": logprob, "bytes": bytes})
                    })
                    .collect();
                json!({"token": token, "logprob": logprob, "bytes": bytes, "top_logprobs": top})
            })
            .collect();
        json!({"content": content})
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entries() -> Vec<TokenLogprob> {
        vec![TokenLogprob { id: 1, logprob: -0.25, top: vec![(1, -0.25), (3, -1.5)] }, TokenLogprob { id: 2, logprob: -9999.0, top: vec![] }]
    }

    /// The two layouts, with ids written `token_id:N` and offsets counted in characters.
    #[test]
    fn both_layouts_carry_every_entry_in_order() {
        let codec = Codec::Tiny { vocab: 12 };
        let t = Tokens { codec: &codec, as_ids: true };
        let (v, end) = t.completion(&entries(), 3);
        assert_eq!(v["tokens"], json!(["token_id:1", "token_id:2"]));
        assert_eq!(v["token_logprobs"], json!([-0.25, -9999.0]));
        assert_eq!(v["top_logprobs"], json!([{"token_id:1": -0.25, "token_id:3": -1.5}, {}]));
        assert_eq!(v["text_offset"][0], json!(3));
        assert_eq!(end, 3 + codec.decode(&[1, 2]).chars().count());
        let c = t.chat(&entries());
        assert_eq!(c["content"][0]["token"], json!("token_id:1"));
        assert_eq!(c["content"][0]["top_logprobs"][1], json!({"token": "token_id:3", "logprob": -1.5, "bytes": "token_id:3".as_bytes()}));
        assert_eq!(c["content"][1]["logprob"], json!(-9999.0));
    }
}
