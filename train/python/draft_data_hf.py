"""DFlash training data at volume on a GPU, in `specdec draft-data`'s format.

`specdec draft-data` decodes with specdec's own backends, which run one
sequence's attention at a time: fine for the shipped recipe's hundreds of
prompts, far too slow for millions of tokens. This script makes the same
data with HF transformers' batched generation, for a GPU session:

1. prompts: the prompt file's `--split` prompts, plus (train split only)
   `--synthesize N` user messages the target writes itself, as
   `specdec draft-data --synthesize` does: given its chat template up to a
   user turn, it samples a message at temperature 1 (no top-k, no top-p);
   messages that do not end in the end-of-turn token, are blank or repeat an
   earlier one are dropped;
2. the target's greedy continuation of every prompt (chat prompts in its
   ChatML template), up to `--max-tokens`, ending after the first eos;
3. the residual stream after each layer of `--layers` at every position but
   the last (a second, batched forward over prompt + continuation).

It writes `data.json` and `hidden.safetensors` exactly as
`specdec_models::DraftData::write` does (format `specdec-draft-data/1`,
hidden rows in f16); `DraftData::read`, which trusts nothing, is the check
(`specdec-train` reads it). Seeded (`--seed`); a GPU's kernels may still
round differently from run to run. `--time-budget S` bounds a lent GPU's
minutes: once S seconds have passed since the start, no new batch is begun
(synthesis or greedy continuation) and only the prompts continued so far
are written, so a run ends with usable data instead of being killed.

Usage (the model is `specdec model export`'s HF folder):
  python3 draft_data_hf.py --model DIR --prompts fixtures/dflash/prompts.json \
      --split train --synthesize 8192 --layers 1,14,27 --max-tokens 256 \
      --batch 512 --out DIR
"""

import argparse
import json
import os
import sys
import time

import torch
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM, AutoTokenizer

FORMAT = "specdec-draft-data/1"
SYNTH_MAX_TOKENS = 128


def log(msg):
    print(f"draft-data-hf: {msg}", file=sys.stderr, flush=True)


def left_padded(rows, pad, device):
    """Token rows as one left-padded batch and its attention mask."""
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, width - len(r):] = torch.tensor(r, dtype=torch.long)
        mask[i, width - len(r):] = 1
    return ids.to(device), mask.to(device)


def generate(model, rows, pad, eos, max_new, sample, device):
    """New tokens of each row, cut after the first eos (kept)."""
    ids, mask = left_padded(rows, pad, device)
    with torch.no_grad():
        out = model.generate(
            input_ids=ids,
            attention_mask=mask,
            max_new_tokens=max_new,
            do_sample=sample,
            temperature=1.0 if sample else None,
            top_k=0 if sample else None,
            top_p=1.0 if sample else None,
            eos_token_id=eos,
            pad_token_id=pad,
        )
    new = out[:, ids.shape[1]:].tolist()
    cut = []
    for row in new:
        for j, t in enumerate(row):
            if t in eos:
                row = row[: j + 1]
                break
        cut.append(row)
    return cut


def over_budget(started, budget):
    """Whether `--time-budget` seconds have passed since `started` (None: no budget)."""
    return budget is not None and time.time() - started >= budget


def synthesize(model, tok, n, seed, batch, pad, eos, device, first_id, started, budget):
    """Magpie-style user messages (module doc)."""
    sentinel = "\u0000SPLIT\u0000"
    rendered = tok.apply_chat_template([{"role": "user", "content": sentinel}], tokenize=False, add_generation_prompt=True)
    prefix = tok.encode(rendered.split(sentinel)[0], add_special_tokens=False)
    seen, prompts = set(), []
    for start in range(0, n, batch):
        if over_budget(started, budget):
            log(f"time budget reached: synthesis stopped after {start}/{n} requests")
            break
        torch.manual_seed(seed + start)
        rows = [prefix] * min(batch, n - start)
        for new in generate(model, rows, pad, eos, SYNTH_MAX_TOKENS, True, device):
            if not new or new[-1] not in eos:
                continue
            text = tok.decode(new, skip_special_tokens=True).strip()
            if text and text not in seen:
                seen.add(text)
                prompts.append({"id": first_id + len(prompts), "split": "train", "kind": "synthetic", "chat": True, "text": text})
        log(f"synthesised {min(start + batch, n)}/{n} requests, {len(prompts)} kept")
    return prompts


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--prompts", required=True)
    ap.add_argument("--split", default="train", choices=["train", "heldout"])
    ap.add_argument("--synthesize", type=int, default=0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--layers", required=True)
    ap.add_argument("--max-tokens", type=int, default=160)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--time-budget", type=float, default=None, help="seconds after which no new batch is begun")
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    if a.synthesize and a.split != "train":
        sys.exit("--synthesize makes training prompts; the held-out split is the file's own")
    if a.batch < 1 or a.max_tokens < 1 or a.synthesize < 0:
        sys.exit("--batch and --max-tokens must be at least 1, --synthesize at least 0")
    if a.time_budget is not None and not a.time_budget > 0:
        sys.exit("--time-budget must be a positive number of seconds")
    layers = [int(x) for x in a.layers.split(",")]
    started = time.time()
    tok = AutoTokenizer.from_pretrained(a.model)
    model = AutoModelForCausalLM.from_pretrained(a.model, dtype=torch.float32).to(a.device).eval()
    cfg = model.config
    if any(not 0 <= l < cfg.num_hidden_layers for l in layers):
        sys.exit(f"--layers {layers}: the model has {cfg.num_hidden_layers} layers")
    eos = cfg.eos_token_id if isinstance(cfg.eos_token_id, list) else [cfg.eos_token_id]
    pad = cfg.pad_token_id if cfg.pad_token_id is not None else eos[0]

    with open(a.prompts) as f:
        every = json.load(f)["prompts"]
    prompts = [p for p in every if p["split"] == a.split]
    if a.synthesize:
        prompts += synthesize(model, tok, a.synthesize, a.seed, a.batch, pad, eos, a.device, max(p["id"] for p in every) + 1, started, a.time_budget)

    def encode(p):
        text = tok.apply_chat_template([{"role": "user", "content": p["text"]}], tokenize=False, add_generation_prompt=True) if p["chat"] else p["text"]
        return tok.encode(text, add_special_tokens=False)

    encoded = [encode(p) for p in prompts]
    # Similar lengths share a batch (less padding); the output keeps file order.
    order = sorted(range(len(prompts)), key=lambda i: len(encoded[i]))
    tokens = [None] * len(prompts)
    for start in range(0, len(order), a.batch):
        if over_budget(started, a.time_budget):
            log(f"time budget reached: {start}/{len(prompts)} prompts continued, the rest dropped")
            break
        idx = order[start:start + a.batch]
        for i, new in zip(idx, generate(model, [encoded[i] for i in idx], pad, eos, a.max_tokens, False, a.device)):
            tokens[i] = encoded[i] + new
        done = sum(len(tokens[i]) - len(encoded[i]) for i in order[: start + len(idx)])
        log(f"greedy {start + len(idx)}/{len(prompts)} prompts, {done} tokens, {time.time() - started:.0f} s")

    # Prompts left without a continuation by the time budget are dropped.
    kept = [i for i in range(len(prompts)) if tokens[i] is not None]
    prompts, encoded, tokens = [prompts[i] for i in kept], [encoded[i] for i in kept], [tokens[i] for i in kept]
    hidden = {}
    by_len = sorted(range(len(prompts)), key=lambda i: len(tokens[i]))
    # Every layer's states of a whole batch are held at once: a quarter batch.
    step = max(1, a.batch // 4)
    for start in range(0, len(by_len), step):
        idx = by_len[start:start + step]
        width = max(len(tokens[i]) for i in idx)
        ids = torch.full((len(idx), width), pad, dtype=torch.long)
        for r, i in enumerate(idx):
            ids[r, : len(tokens[i])] = torch.tensor(tokens[i])
        # Right padding under a causal mask: a row's real positions never see it.
        with torch.no_grad():
            states = model.model(input_ids=ids.to(a.device), output_hidden_states=True).hidden_states
        # hidden_states[0] is the embedding; [l + 1] is the residual stream after layer l.
        rows = torch.cat([states[l + 1] for l in layers], dim=-1)
        for r, i in enumerate(idx):
            hidden[f"seq.{i}"] = rows[r, : len(tokens[i]) - 1].to(torch.float16).cpu().contiguous()
    bad = [name for name, t in hidden.items() if not torch.isfinite(t).all()]
    if bad:
        sys.exit(f"non-finite hidden rows (f16 overflow?) in {bad[:5]}")

    os.makedirs(a.out, exist_ok=True)
    save_file(hidden, os.path.join(a.out, "hidden.safetensors"))
    manifest = {
        "format": FORMAT,
        "target_layer_ids": layers,
        "hidden_size": cfg.hidden_size,
        "vocab_size": cfg.vocab_size,
        "sequences": [{"prompt_id": p["id"], "kind": p["kind"], "prompt_len": len(encoded[i]), "tokens": tokens[i]} for i, p in enumerate(prompts)],
    }
    with open(os.path.join(a.out, "data.json"), "w") as f:
        json.dump(manifest, f)
        f.write("\n")
    generated = sum(len(tokens[i]) - len(encoded[i]) for i in range(len(prompts)))
    print(f"draft-data-hf: {len(prompts)} sequences, {generated} generated tokens, layers {layers}, on {a.device}, in {time.time() - started:.0f} s, written to {a.out}")


if __name__ == "__main__":
    main()
