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
that loop and llama.cpp's generator together. Penalties are off (1.0), min-p 0 and typical-p
1, so the chain keeps only what the request asks. Seeds are reduced to llama.cpp's 32 bits
(below its "random seed" value 0xFFFFFFFF).
"""

import argparse
import sys

import llama_cpp
from llama_cpp import Llama
from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

from engine_loop import check_fields, serve


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--speculation", default="none")
    ap.add_argument("--n-ctx", type=int, default=64)
    # What the engine states of its greedy argmax: f32 weights and activations sit near the
    # f64 reference (1e-4); quantized weights with llama.cpp's 8-bit activations do not.
    ap.add_argument("--greedy-epsilon", type=float, default=1e-4)
    args = ap.parse_args()
    kind, _, arg = args.speculation.partition(":")
    if kind not in ("none", "prompt-lookup"):
        sys.exit(f"unknown --speculation {args.speculation}")

    def load(draft):
        return Llama(model_path=args.model, n_ctx=args.n_ctx, n_batch=args.n_ctx, n_threads=1, n_threads_batch=1,
                     draft_model=draft, verbose=False)

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
    }

    def text(llm, tokens):
        return llm.detokenize(tokens).decode("utf-8", errors="replace")

    def generate(r):
        check_fields(r)
        llm = spec if r["speculation"] else plain
        llm.set_seed(r["seed"] % 0xFFFFFFFF)
        tokens, finish = [], "capacity"
        gen = llm.generate(r["prompt"], top_k=r["top_k"], top_p=r["top_p"], min_p=0.0, typical_p=1.0, temp=r["temperature"],
                           repeat_penalty=1.0, reset=True)
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
        # The next request starts from a clean context (no prefix of this one reused).
        llm.reset()
        return {"tokens": tokens, "finish": finish}

    serve(info, generate)

if __name__ == "__main__":
    main()
