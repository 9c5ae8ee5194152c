"""Peers of the speedup report's prompt mix, timed in the same run (benches/src/mix.rs).

    bench_generate.py JOB.json

JOB.json: {"prompts": [{"id": ..., "ids": [token ids]}], "max_tokens": N, "k": K,
"threads": T, "hf_dir": DIR or null, "gguf": FILE or null}. For each engine given, each
prompt runs greedy, plain and with the engine's own prompt-lookup drafter proposing up to K
tokens: HF transformers' `generate(prompt_lookup_num_tokens=K)` on the HF-layout model, and
llama.cpp through llama-cpp-python (`LlamaPromptLookupDecoding(num_pred_tokens=K)`) on the
GGUF. The prompts arrive as token ids, so every engine reads the tokens specdec reads.

Decode time excludes the prompt, as specdec's own runs do: each configuration is timed
generating N tokens and generating 1 token from the same prompt (the prefill and the first
token), and tokens per second is (n - 1) over the difference, with n the tokens it
generated (an engine may stop early at the model's end-of-sequence id, as specdec does).
Each timing is the best of two runs after one warm-up run of the first prompt. Prints one
JSON object: {"engines": [{"engine", "version", "mode", "runs": [{"prompt", "tokens",
"decode_s", "tokens_per_s"}]}], "skipped": [why an engine did not run]}.
"""

import json
import sys
import time


def best_of(n, f):
    best = None
    for _ in range(n):
        t = time.perf_counter()
        out = f()
        dt = time.perf_counter() - t
        if best is None or dt < best[0]:
            best = (dt, out)
    return best


def time_engine(generate, prompts, max_tokens):
    """generate(ids, n) -> generated ids; the decode timing of every prompt."""
    generate(prompts[0]["ids"], max_tokens)  # warm-up
    runs = []
    for p in prompts:
        full_s, tokens = best_of(2, lambda: generate(p["ids"], max_tokens))
        first_s, _ = best_of(2, lambda: generate(p["ids"], 1))
        n = len(tokens)
        decode_s = max(full_s - first_s, 1e-9)
        runs.append({"prompt": p["id"], "tokens": n, "decode_s": decode_s, "tokens_per_s": (n - 1) / decode_s if n > 1 else 0.0})
    return runs


def hf_engines(job):
    import torch
    import transformers
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(job["threads"])
    model = AutoModelForCausalLM.from_pretrained(job["hf_dir"], dtype=torch.float32)
    model.eval()
    eos = model.config.eos_token_id

    def make(lookup):
        def generate(ids, n):
            x = torch.tensor([ids], dtype=torch.long)
            extra = {"prompt_lookup_num_tokens": job["k"]} if lookup else {}
            with torch.no_grad():
                out = model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=n, do_sample=False, eos_token_id=eos, pad_token_id=eos, **extra)
            return out[0, len(ids):].tolist()
        return generate

    version = f"HF transformers {transformers.__version__} (torch {torch.__version__}, {job['threads']} threads, f32)"
    for mode, lookup in (("plain", False), (f"prompt-lookup:{job['k']}", True)):
        yield {"engine": "HF transformers", "version": version, "mode": mode, "runs": time_engine(make(lookup), job["prompts"], job["max_tokens"])}


def llama_engines(job):
    import llama_cpp
    from llama_cpp import Llama
    from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

    n_ctx = max(len(p["ids"]) for p in job["prompts"]) + job["max_tokens"] + 16

    def load(draft):
        return Llama(model_path=job["gguf"], n_ctx=n_ctx, n_batch=n_ctx, n_threads=job["threads"], n_threads_batch=job["threads"], draft_model=draft, verbose=False)

    def make(llm):
        eos = llm.token_eos()

        def generate(ids, n):
            llm.reset()
            out = []
            for t in llm.generate(ids, temp=0.0, top_k=1, top_p=1.0, min_p=0.0, repeat_penalty=1.0, reset=True):
                out.append(t)  # the end-of-sequence id counts, as in HF's and specdec's runs
                if t == eos or len(out) >= n:
                    break
            return out
        return generate

    version = f"llama.cpp via llama-cpp-python {llama_cpp.__version__} ({job['threads']} threads, the GGUF's Q4_1)"
    for mode, draft in (("plain", None), (f"prompt-lookup:{job['k']}", LlamaPromptLookupDecoding(num_pred_tokens=job["k"]))):
        yield {"engine": "llama.cpp", "version": version, "mode": mode, "runs": time_engine(make(load(draft)), job["prompts"], job["max_tokens"])}


def main():
    job = json.load(open(sys.argv[1]))
    engines, skipped = [], []
    for key, run in (("hf_dir", hf_engines), ("gguf", llama_engines)):
        if not job.get(key):
            continue
        try:
            engines.extend(run(job))
        except Exception as e:  # an engine that cannot run is reported, not fatal
            skipped.append(f"{run.__name__}: {type(e).__name__}: {e}")
    json.dump({"engines": engines, "skipped": skipped}, sys.stdout)


if __name__ == "__main__":
    main()
