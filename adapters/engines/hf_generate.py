"""HF transformers' `generate` as an engine under test (spec section 21, PROTO-9).

    hf_generate.py MODEL_DIR --speculation none|prompt-lookup:K|assistant:self|early-exit:L

MODEL_DIR is an HF-layout Llama (`specdec model tiny --preset tiny-v12-l2 DIR` writes the
engine checks' model). Each request runs alone (batch size 1, as HF's assisted generation
requires), seeded with `torch.manual_seed(seed)`, through `model.generate` unchanged:
greedy or multinomial sampling with HF's own temperature, top-k and top-p warpers, the
request's eos ids, and with speculation on the candidate generator the flag names
(`prompt_lookup_num_tokens`, `assistant_model`, `assistant_early_exit`). Only the calling
convention is translated here; every decision the checks judge is HF's.

Stop strings go to HF's own `StopStringCriteria` (`stop_strings` with `tokenizer`), which
needs a tokenizer: the tiny model's is built here as its ids read (`tiny_text`: id i is the
two letters chr(65 + i) chr(97 + i)), a word-level tokenizer whose decoder joins pieces
without spaces, plus six single letters outside the model's vocabulary, which HF's criteria
need to clean a vocabulary (they tokenize "abcdef"); the model never generates those. When
and where generation stops is HF's decision; the finish reason says `stop` when the text of
the generated tokens holds a stop string, so tokens HF lets through after one are seen.

The processors HF has go to its own: min-p as `min_p` (its `MinPLogitsWarper`, after
temperature, top-k and top-p, LOGITS-10's place), a logit bias as `sequence_bias` of
one-token sequences, the repetition penalty as `repetition_penalty` (over prompt and output,
the `context` scope). HF has no presence or frequency penalty: not stated, so not asked.
Logprobs (LOGPROB-1/2) come from HF's own `output_logits` (raw: the model's logits) and
`output_scores` (processed: the scores HF sampled from, after its processors and warpers),
one per emitted token as HF returns them, assisted generation included (it returns the
verify rows of the tokens it keeps); here they are only put in LOGPROB-3's form.

A regex constraint (CONSTRAIN-1) goes to HF's own constraint path, `prefix_allowed_tokens_fn`
(its `PrefixConstrainedLogitsProcessor`, which assisted generation applies to every row of a
verify window with the drafts before it, and hands to the assistant for its drafts). The
function given to it is CONSTRAIN-2's plain rule over the tiny text, with the `regex`
module HF itself depends on: a token is allowed iff the output's text with the token's
appended is still a prefix of a match (`fullmatch(..., partial=True)`), an eos iff the
output's text matches. HF has no JSON-schema path; a schema is not stated, so not asked.
"""

import argparse
import sys

import regex
import torch
import transformers
from transformers import AutoModelForCausalLM, GenerationConfig

from engine_loop import check_fields, serve


def tiny_tokenizer(vocab_size):
    """The tiny model's ids as text, for HF's stop-string criteria (module doc)."""
    from tokenizers import Regex, Tokenizer, decoders, pre_tokenizers
    from tokenizers.models import WordLevel
    from transformers import PreTrainedTokenizerFast

    vocab = {chr(65 + i) + chr(97 + i): i for i in range(vocab_size)}
    vocab.update({c: vocab_size + j for j, c in enumerate("abcdef")})
    tok = Tokenizer(WordLevel(vocab, unk_token="a"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("[A-Z][a-z]|."), behavior="isolated")
    tok.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=tok)


def tiny_text(ids):
    return "".join(chr(65 + i) + chr(97 + i) for i in ids)


def allowed_tokens(request, prompt_len, vocab_size):
    """HF's `prefix_allowed_tokens_fn` for the request's regex constraint (module doc), or None."""
    constraint = request.get("constraint")
    if constraint is None:
        return None
    if set(constraint) != {"regex"}:
        raise ValueError(f"constraint {sorted(constraint)}: only a regex is stated")
    pattern, eos = regex.compile(constraint["regex"]), request["eos"]
    if not eos:
        raise ValueError("a constraint needs an eos id to end where the output matches")
    texts = [tiny_text([t]) for t in range(vocab_size)]

    def allowed(_batch, input_ids):
        generated = input_ids[prompt_len:].tolist()
        if any(t in eos for t in generated):
            # A window row after a drafted eos: never emitted (the output ends at the eos),
            # and HF refuses an empty list, so every id.
            return list(range(vocab_size))
        text = tiny_text(generated)
        ids = [t for t in range(vocab_size) if t not in eos and pattern.fullmatch(text + texts[t], partial=True)]
        return ids + (eos if pattern.fullmatch(text) else [])

    return allowed


def entries(rows, tokens, top):
    """LOGPROB-3's entries of `tokens` from HF's per-token rows (logits or scores)."""
    out = []
    for row, token in zip(rows, tokens):
        lp = torch.log_softmax(row[0].to(torch.float64), dim=-1)
        finite = [(i, v) for i, v in enumerate(lp.tolist()) if v != float("-inf")]
        finite.sort(key=lambda e: (-e[1], e[0]))
        chosen = lp[token].item()
        out.append({"id": token, "logprob": chosen if chosen != float("-inf") else -9999.0, "top": [[i, v] for i, v in finite[:top]]})
    return out


def load(path):
    try:
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    except TypeError:  # releases before `dtype` was the argument's name
        model = AutoModelForCausalLM.from_pretrained(path, torch_dtype=torch.float32)
    model.eval()
    # No defaults of the model's own generation config (eos, top-k 50) leak into a request.
    model.generation_config = GenerationConfig()
    return model


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--speculation", default="none")
    args = ap.parse_args()
    torch.set_num_threads(1)
    model = load(args.model)
    kind, _, arg = args.speculation.partition(":")
    assistant = load(args.model) if args.speculation == "assistant:self" else None
    if kind not in ("none", "prompt-lookup", "assistant", "early-exit") or (kind == "assistant" and arg != "self"):
        sys.exit(f"unknown --speculation {args.speculation}")
    info = {
        "name": f"hf-transformers/{args.speculation}",
        "version": transformers.__version__,
        "speculation": args.speculation,
        "vocab": model.config.vocab_size,
        # float32 logits: a greedy token may differ from the f64 reference's only near a tie.
        "greedy_epsilon": 1e-4,
        "batch_invariant": True,
        "stop_strings": True,
        "constraints": ["regex"],
        "processors": ["min_p", "logit_bias", "repetition_penalty"],
        "penalty_scopes": ["context"],
        # float32 logits against the reference's f64.
        "logprobs": {"modes": ["raw", "processed"], "max_top": 20, "epsilon": 1e-4},
    }
    tokenizer = tiny_tokenizer(model.config.vocab_size)

    def generate(r):
        check_fields(r, stated={"constraint", "min_p", "logit_bias", "repetition_penalty", "penalty_scope", "logprobs"})
        if r.get("penalty_scope", "context") != "context":
            raise ValueError("HF's repetition penalty counts the prompt too: only the `context` scope")
        sample = r["temperature"] > 0
        config = GenerationConfig(
            max_new_tokens=r["max_new_tokens"],
            do_sample=sample,
            temperature=r["temperature"] if sample else 1.0,
            top_k=r["top_k"] if sample else None,
            top_p=r["top_p"] if sample else None,
            eos_token_id=r["eos"] or None,
            pad_token_id=0,
            min_p=r.get("min_p") or None,
            repetition_penalty=r.get("repetition_penalty", 1.0),
            sequence_bias=[[[i], b] for i, b in r.get("logit_bias", [])] or None,
        )
        ask = r.get("logprobs")
        if ask:
            config.return_dict_in_generate = True
            config.output_logits = ask["mode"] == "raw"
            config.output_scores = ask["mode"] == "processed"
        extra = {}
        if r["stop"]:
            config.stop_strings = r["stop"]
            extra["tokenizer"] = tokenizer
        if r["speculation"] and kind == "prompt-lookup":
            config.prompt_lookup_num_tokens = int(arg)
        elif r["speculation"] and kind == "assistant":
            extra["assistant_model"] = assistant
        elif r["speculation"] and kind == "early-exit":
            config.assistant_early_exit = int(arg)
        prompt = torch.tensor([r["prompt"]], dtype=torch.long)
        constrained = allowed_tokens(r, prompt.shape[1], model.config.vocab_size)
        if constrained is not None:
            extra["prefix_allowed_tokens_fn"] = constrained
        torch.manual_seed(r["seed"])
        with torch.no_grad():
            out = model.generate(prompt, attention_mask=torch.ones_like(prompt), generation_config=config, **extra)
        sequences = out.sequences if ask else out
        tokens = sequences[0, prompt.shape[1]:].tolist()
        if tokens and tokens[-1] in r["eos"]:
            finish = "eos"
        elif any(stop in tiny_text(tokens) for stop in r["stop"]):
            finish = "stop"
        elif len(tokens) >= r["max_new_tokens"]:
            finish = "length"
        else:
            finish = "capacity"
        reply = {"tokens": tokens, "finish": finish}
        if ask:
            rows = out.logits if ask["mode"] == "raw" else out.scores
            reply["logprobs"] = entries(rows, tokens, ask["top"])
        return reply

    serve(info, generate)

if __name__ == "__main__":
    main()
