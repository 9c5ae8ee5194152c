"""llama.cpp, through llama-cpp-python, as an engine under test (spec section 21, PROTO-9).

    llama_cpp_generate.py MODEL.gguf --speculation none|prompt-lookup:K

MODEL.gguf is a llama GGUF (`specdec model tiny --preset tiny-v12-l2 DIR --gguf` writes the
engine checks' model in f32, its ids' two-letter pieces as the vocabulary). Each request runs
alone through `Llama.generate` unchanged: llama.cpp's own sampler chain (top-k, typical, top-p,
min-p, temperature, then a draw from its RNG seeded with the request's seed; greedy at
temperature 0), and with speculation on llama-cpp-python's prompt-lookup drafter
(`LlamaPromptLookupDecoding(num_pred_tokens=K)` passed as `draft_model`), which samples the
target at every drafted position and keeps the drafts up to the first mismatch.

`Llama.generate` leaves stopping to its caller (its own `create_completion` loop checks the
model's eos and stop strings after each token); this adapter stops the same way with the
request's eos ids, stop strings and `max_new_tokens`, so the eos, stop and length checks judge
that loop and llama.cpp's generator together. Typical-p is 1 and every processor the request
does not set is off, so the chain keeps only what the request asks. Seeds are reduced to
llama.cpp's 32 bits (below its "random seed" value 0xFFFFFFFF).

The processors go where the binding puts them for its own `create_completion`: a logit bias
as a `logits_processor` adding each bias to its id's logit (as the binding's
`logit_bias_processor` does, which its chain runs first, LOGITS-7's place); min-p, the
repetition, presence and frequency penalties as `generate`'s arguments, into llama.cpp's
penalties and min-p samplers. llama.cpp's penalties count the tokens its chain has accepted:
every token `generate` sampled in this request (the window, `last_n_tokens_size`, is the
context's length, so none drops out), never the prompt, so the stated scope is `generated`
alone (LOGITS-12); a penalised request in another scope, a bias the spec refuses or a
logprobs request it cannot answer is refused by index. Its min-p, like its top-p, comes
before its temperature (ERRATA E24): the same law as LOGITS-10 at temperature 1, where the
processor checks set it.

Logprobs (LOGPROB-1, raw) are what the binding's `create_completion` reports: the log-softmax
(`Llama.logits_to_logprobs`) of the row of `Llama.scores` each generated token was sampled
from, so both models keep every row's logits (`logits_all`). With prompt lookup those rows
are the verify window's, kept for the tokens accepted. The binding exposes no distribution
after its sampler chain, so `processed` is not stated.

A GBNF grammar (CONSTRAIN-5, `{"grammar": G}`) goes to `generate`'s own `grammar`
(`LlamaGrammar`, llama.cpp's grammar sampler, which its chain runs first, CONSTRAIN-1's
place), written as the spec's rule asks: the grammar's `root` renamed and a new `root` of it
followed by one of the request's eos ids as a token (`<[11]>`, matched by id), so an eos is
allowed exactly where the output matches (CONSTRAIN-2); the model's own end token (the tiny
GGUF's is id 11) is left to the sampler, which allows it exactly where the grammar is
complete. With speculation on, the binding
applies it to every row its prompt-lookup verify samples. Regexes and JSON schemas are not
stated: llama.cpp takes neither as such through the binding.

The KV cache is f32 (`type_k`, `type_v`), so on the tiny model's f32 GGUF the logits lie
within about 2e-6 of the f64 reference's and the stated epsilons are 1e-4. With llama.cpp's
default f16 cache they lie up to 1.5e-3 away (measured 2026-11-29), which would blunt every
check judged against the reference.
"""

import argparse
import math
import sys

import llama_cpp
import numpy as np
from llama_cpp import Llama, LlamaGrammar, LogitsProcessorList
from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

from engine_loop import check_fields, logprob_entries, serve


# The processor fields of a request (PROTO-9) this adapter states.
PROCESSOR_FIELDS = {"min_p", "logit_bias", "repetition_penalty", "presence_penalty", "frequency_penalty"}
# The largest `top` of a logprobs request (LOGPROB-3).
MAX_TOP = 20


def bias_processor(pairs):
    """A logits processor adding the request's `[[id, bias], ..]` to the logits (what the
    binding's `create_completion` builds for its `logit_bias`), or None."""
    if not pairs:
        return None
    bias = {int(i): float(b) for i, b in pairs}

    def apply(_input_ids, scores):
        out = np.copy(scores)
        for i, b in bias.items():
            out[i] = scores[i] + b
        return out

    return LogitsProcessorList([apply])


def rule_names_renamed(grammar, old, new):
    """`grammar` (GBNF) with every rule name `old` written `new`: names outside strings,
    classes and comments, whole."""
    out, i, n = [], 0, len(grammar)
    while i < n:
        c = grammar[i]
        if c in "\"[":
            close = "\"" if c == "\"" else "]"
            j = i + 1
            while j < n and grammar[j] != close:
                j += 2 if grammar[j] == "\\" else 1
            out.append(grammar[i:j + 1])
            i = j + 1
        elif c == "#":
            j = grammar.find("\n", i)
            j = n if j < 0 else j
            out.append(grammar[i:j])
            i = j
        elif c.isalnum() or c in "-_":
            j = i
            while j < n and (grammar[j].isalnum() or grammar[j] in "-_"):
                j += 1
            word = grammar[i:j]
            out.append(new if word == old else word)
            i = j
        else:
            out.append(c)
            i += 1
    return "".join(out)


def grammar_with_eos(grammar, eos, model_eos):
    """CONSTRAIN-2 as llama.cpp's grammar sampler takes it (module doc). The model's own end
    token is never matched as a token there: the sampler allows it exactly where the grammar
    is complete, so it is an empty alternative, the other eos ids token references."""
    body = next(f"specdec-root{k}" for k in range(1000) if f"specdec-root{k}" not in grammar)
    ends = [f"<[{e}]>" for e in eos if e != model_eos] + (['""'] if model_eos in eos else [])
    return f"root ::= {body} ({' | '.join(ends)})\n" + rule_names_renamed(grammar, "root", body)


def refusal(r, vocab):
    """Why this adapter cannot run request `r` as asked (module doc), or None."""
    penalised = r.get("repetition_penalty", 1.0) != 1.0 or r.get("presence_penalty", 0.0) != 0.0 or r.get("frequency_penalty", 0.0) != 0.0
    # An absent scope is `context` (PROTO-9).
    if penalised and r.get("penalty_scope", "context") != "generated":
        return "llama.cpp's penalties count the generated tokens alone: only the `generated` scope"
    ids = [i for i, _ in r.get("logit_bias", [])]
    if any(not isinstance(i, int) or isinstance(i, bool) or not 0 <= i < vocab for i in ids) or len(set(ids)) != len(ids):
        return f"logit_bias ids {ids}: each in [0, {vocab}), none twice (LOGITS-7)"
    if not all(math.isfinite(b) for _, b in r.get("logit_bias", [])):
        return "logit_bias: every bias finite (LOGITS-7)"
    ask = r.get("logprobs")
    if ask and (ask["mode"] != "raw" or not 0 <= ask["top"] <= MAX_TOP):
        return f"logprobs {ask}: only `raw`, top at most {MAX_TOP}"
    constraint = r.get("constraint")
    if constraint is not None and (set(constraint) != {"grammar"} or not r["eos"]):
        return f"constraint {sorted(constraint)}: only a GBNF grammar, with an eos id to end where it matches"
    return None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--speculation", default="none")
    ap.add_argument("--n-ctx", type=int, default=64)
    # What the engine states of its greedy argmax and its logprobs: f32 weights, activations
    # and KV cache sit near the f64 reference (module doc); quantized weights with
    # llama.cpp's 8-bit activations do not.
    ap.add_argument("--greedy-epsilon", type=float, default=1e-4)
    ap.add_argument("--logprob-epsilon", type=float, default=1e-4)
    args = ap.parse_args()
    kind, _, arg = args.speculation.partition(":")
    if kind not in ("none", "prompt-lookup"):
        sys.exit(f"unknown --speculation {args.speculation}")

    def load(draft):
        return Llama(model_path=args.model, n_ctx=args.n_ctx, n_batch=args.n_ctx, n_threads=1, n_threads_batch=1,
                     logits_all=True, last_n_tokens_size=args.n_ctx, type_k=llama_cpp.GGML_TYPE_F32,
                     type_v=llama_cpp.GGML_TYPE_F32, draft_model=draft, verbose=False)

    plain = load(None)
    spec = load(LlamaPromptLookupDecoding(num_pred_tokens=int(arg))) if kind == "prompt-lookup" else plain
    info = {
        "name": f"llama.cpp/{args.speculation}",
        "version": llama_cpp.__version__,
        "speculation": args.speculation,
        "vocab": plain.n_vocab(),
        "greedy_epsilon": args.greedy_epsilon,
        "batch_invariant": True,
        "stop_strings": True,
        "processors": sorted(PROCESSOR_FIELDS),
        "penalty_scopes": ["generated"],
        "logprobs": {"modes": ["raw"], "max_top": MAX_TOP, "epsilon": args.logprob_epsilon},
        "constraints": ["grammar"],
    }

    def text(llm, tokens):
        return llm.detokenize(tokens).decode("utf-8", errors="replace")

    def generate(r):
        ask = r.get("logprobs")
        llm = spec if r["speculation"] else plain
        llm.set_seed(r["seed"] % 0xFFFFFFFF)
        constraint = r.get("constraint")
        grammar = LlamaGrammar.from_string(grammar_with_eos(constraint["grammar"], r["eos"], llm.token_eos()), verbose=False) if constraint else None
        gen = llm.generate(r["prompt"], top_k=r["top_k"], top_p=r["top_p"], min_p=r.get("min_p", 0.0), typical_p=1.0,
                           temp=r["temperature"], repeat_penalty=r.get("repetition_penalty", 1.0),
                           presence_penalty=r.get("presence_penalty", 0.0), frequency_penalty=r.get("frequency_penalty", 0.0),
                           logits_processor=bias_processor(r.get("logit_bias", [])), grammar=grammar, reset=True)
        try:
            reply = collect(llm, gen, r, ask)
        finally:
            # The next request starts from a clean context (no prefix of this one reused).
            llm.reset()
        return reply

    def collect(llm, gen, r, ask):
        """Draws `gen` until the request's eos, stop string, cap or the context ends it."""
        tokens, finish = [], "capacity"
        for t in gen:
            tokens.append(int(t))
            if tokens[-1] in r["eos"]:
                finish = "eos"
            elif r["stop"] and any(s in text(llm, tokens) for s in r["stop"]):
                finish = "stop"
            elif len(tokens) >= r["max_new_tokens"]:
                finish = "length"
            elif llm.n_tokens + 1 >= args.n_ctx:
                finish = "capacity"
            else:
                continue
            break
        gen.close()
        reply = {"tokens": tokens, "finish": finish}
        if ask:
            # Row n_prompt - 1 + i decided the i-th generated token.
            first = len(r["prompt"]) - 1
            reply["logprobs"] = logprob_entries(Llama.logits_to_logprobs(llm.scores[first:first + len(tokens)]), tokens, ask["top"])
        return reply

    def refuse(requests):
        for i, r in enumerate(requests):
            check_fields(r, stated=PROCESSOR_FIELDS | {"penalty_scope", "logprobs", "constraint"})
            if (why := refusal(r, plain.n_vocab())) is not None:
                return i, why
        return None

    serve(info, generate, refuse)

if __name__ == "__main__":
    main()
