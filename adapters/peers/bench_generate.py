"""Peers of the speedup report's prompt mix, timed in the same run (benches/src/mix.rs).

    bench_generate.py JOB.json

JOB.json: {"prompts": [{"id": ..., "ids": [token ids]}], "max_tokens": N, "k": K,
"threads": T, "hf_dir": DIR or null, "gguf": FILE or null, "llama_cpp": true to time
llama-cpp-python on the GGUF, "llama_server": BINARY or null}.
For each engine given, each prompt runs greedy, plain and with the engine's own n-gram
drafter proposing up to K tokens: HF transformers' `generate(prompt_lookup_num_tokens=K)`
on the HF-layout model; llama.cpp through llama-cpp-python
(`LlamaPromptLookupDecoding(num_pred_tokens=K)`) on the GGUF; and llama.cpp's own server
(`llama-server` on the GGUF, started here on 127.0.0.1 and stopped here, one slot, its
native `/completion` endpoint, neither its prompt cache nor its host-memory cache), plain and with its `ngram-simple` drafter
(lookup of LOOKUP tokens, drafts of up to K). The prompts arrive as token ids, so every
engine reads the tokens specdec reads.

Decode time excludes the prompt, as specdec's own runs do: each configuration is timed
generating N tokens and generating 1 token from the same prompt (the prefill and the first
token), and tokens per second is (n - 1) over the difference, with n the tokens it
generated (an engine may stop early at the model's end-of-sequence id, as specdec does);
0 where that is not a time: one token, or a difference within twice the spread between the
repeated runs of either timing (the machine's noise, not a decode).
Each timing is the best of two runs after one warm-up run of the first prompt. Prints one
JSON object: {"engines": [{"engine", "version", "mode", "runs": [{"prompt", "tokens",
"decode_s", "tokens_per_s", "prefill_s"}]}], "skipped": [why an engine did not run]}, where
prefill_s is the one-token timing (the prompt's prefill and one step).
"""

import json
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

# The n-gram llama-server's drafter looks up (specdec's n-gram proposer matches up to 3).
LOOKUP = 3


def best_of(n, f):
    """(the shortest of n timings, its output, the spread of the n timings)."""
    best, times = None, []
    for _ in range(n):
        t = time.perf_counter()
        out = f()
        dt = time.perf_counter() - t
        times.append(dt)
        if best is None or dt < best[0]:
            best = (dt, out)
    return best[0], best[1], max(times) - min(times)


def time_engine(generate, prompts, max_tokens):
    """generate(ids, n) -> generated ids; the decode timing of every prompt."""
    generate(prompts[0]["ids"], max_tokens)  # warm-up
    runs = []
    for p in prompts:
        full_s, tokens, full_spread = best_of(2, lambda: generate(p["ids"], max_tokens))
        first_s, _, first_spread = best_of(2, lambda: generate(p["ids"], 1))
        n = len(tokens)
        decode_s = full_s - first_s
        # Untimed (0) where the answer is one token, or the difference is within twice the
        # spread the repeated runs showed: it is then the machine's noise, not a decode.
        timed = n > 1 and decode_s > 2 * max(full_spread, first_spread)
        runs.append({"prompt": p["id"], "tokens": n, "decode_s": decode_s if timed else 0.0, "tokens_per_s": (n - 1) / decode_s if timed else 0.0, "prefill_s": first_s})
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

    version = f"llama.cpp via llama-cpp-python {llama_cpp.__version__} ({job['threads']} threads, the GGUF's Q4_1, {vector_paths(llama_cpp.llama_print_system_info())})"
    for mode, draft in (("plain", None), (f"prompt-lookup:{job['k']}", LlamaPromptLookupDecoding(num_pred_tokens=job["k"]))):
        yield {"engine": "llama.cpp", "version": version, "mode": mode, "runs": time_engine(make(load(draft)), job["prompts"], job["max_tokens"])}


def vector_paths(system_info):
    """The x86 vector paths llama.cpp was built with, from its system-info line
    ("CPU : SSE3 = 1 | ... | AVX512 = 1 | ..."): a peer built without the machine's widest
    path is a slower peer than a user's own build, and the report says which it timed."""
    text = system_info.decode() if isinstance(system_info, bytes) else str(system_info)
    on = [f.split("=")[0].strip() for f in text.replace("CPU :", "|").split("|") if f.strip().endswith("= 1")]
    wide = [f for f in on if f.startswith("AVX")]
    return "built with " + (", ".join(wide) if wide else "no AVX path")


def post(url, body, timeout):
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.load(r)


class LlamaServer:
    """llama-server on a free port of 127.0.0.1 until `stop` (or the context's end)."""

    def __init__(self, binary, gguf, n_ctx, threads, flags):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"
        args = [binary, "-m", gguf, "--host", "127.0.0.1", "--port", str(port), "-c", str(n_ctx), "-np", "1",
                "-t", str(threads), "-tb", str(threads), "--cache-ram", "0", *flags]
        # Its log goes to a file, read back only to say why it failed: a pipe nobody
        # reads while the requests run could fill and stall the server.
        self.log = tempfile.TemporaryFile()
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=self.log)
        try:
            self.wait_healthy(flags)
        except BaseException:
            self.stop()
            raise

    def wait_healthy(self, flags):
        deadline = time.monotonic() + 120
        while True:
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=5) as r:
                    if r.status == 200:
                        return
            except Exception:  # not listening yet, or not answering HTTP yet: keep waiting
                pass
            if self.proc.poll() is not None:
                self.log.seek(0)
                tail = self.log.read().decode(errors="replace").strip().splitlines()[-3:]
                raise RuntimeError(f"llama-server {flags} exited ({self.proc.returncode}): {' | '.join(tail)}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"llama-server {flags} did not answer /health in 120 s")
            time.sleep(0.2)

    def system_info(self):
        """The system-info line of its log (at `-lv 4`, printed before it listens). Reading
        to the end leaves the file offset, which the server shares, at the end it writes to."""
        self.log.seek(0)
        return next((l for l in self.log.read().decode(errors="replace").splitlines() if "CPU :" in l), "")

    def stop(self):
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()


def llama_server_engines(job):
    binary, gguf = job["llama_server"], job["gguf"]
    n_ctx = max(len(p["ids"]) for p in job["prompts"]) + job["max_tokens"] + 16
    version = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=60)
    build = next((l for l in (version.stdout + version.stderr).splitlines() if l.startswith("version")), "version unknown")
    # Its system-info line is logged only at debug verbosity: read from a server started
    # for that alone, so the timed servers log as they normally do.
    with LlamaServer(binary, gguf, n_ctx, job["threads"], ["-lv", "4"]) as probe:
        paths = vector_paths(probe.system_info())
    k = job["k"]
    for mode, flags in (("plain", []), (f"ngram-simple:{LOOKUP}/{k}", ["--spec-type", "ngram-simple", "--spec-ngram-simple-size-n", str(LOOKUP), "--spec-ngram-simple-size-m", str(k)])):
        with LlamaServer(binary, gguf, n_ctx, job["threads"], flags) as server:
            def generate(ids, n):
                body = {"prompt": ids, "n_predict": n, "temperature": 0.0, "top_k": 1, "samplers": ["top_k"],
                        "cache_prompt": False, "return_tokens": True, "stream": False}
                out = post(server.url + "/completion", body, timeout=600)
                return out["tokens"]
            runs = time_engine(generate, job["prompts"], job["max_tokens"])
        yield {"engine": "llama-server", "version": f"llama.cpp's llama-server ({build}, {job['threads']} threads, the GGUF's Q4_1, one slot, {paths})", "mode": mode, "runs": runs}


# Why an engine of the job does not run when its key is not given.
NOT_GIVEN = {
    "hf_dir": "HF transformers: no HF-layout model (SPECDEC_SMOLLM2_HF unset)",
    "llama_cpp": "llama.cpp's binding: not installed (SPECDEC_LLAMA_CPP_PATH unset)",
    "llama_server": "llama-server: not built (SPECDEC_LLAMA_SERVER unset)",
}


def main():
    # A SIGTERM unwinds like an exception, so every server started here is stopped.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    job = json.load(open(sys.argv[1]))
    engines, skipped = [], []
    for key, run in (("hf_dir", hf_engines), ("llama_cpp", llama_engines), ("llama_server", llama_server_engines)):
        if not job.get(key):
            skipped.append(NOT_GIVEN[key])
            continue
        if key != "hf_dir" and not job.get("gguf"):
            skipped.append(f"{NOT_GIVEN[key].split(':')[0]}: no GGUF (SPECDEC_SMOLLM2_GGUF unset)")
            continue
        try:
            engines.extend(run(job))
        except Exception as e:  # an engine that cannot run is reported, not fatal
            skipped.append(f"{run.__name__}: {type(e).__name__}: {e}")
    json.dump({"engines": engines, "skipped": skipped}, sys.stdout)


if __name__ == "__main__":
    main()
