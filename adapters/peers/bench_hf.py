"""Times HF transformers' verify from logits and a torch greedy verify at the
shapes of the specdec speedup report, for `cargo xtask bench` (which runs it
with the peers' cached environment, installing it on first use).

Verify from logits is what ``_assisted_decoding`` does with sampling at
temperature 1 and no top-k/top-p (no warper runs): ``_speculative_sampling``
once per sequence (it takes a batch of one) on float32 target logits
``[1, k+1, V]`` and draft logits ``[1, k, V]``; it takes the softmax of both
itself. Greedy verify is ``_assisted_decoding``'s greedy branch, batched:
``argmax`` of the target logits, compared with the drafts, the leading run of
matches counted. Inputs are uniform logits in [0, 8), as the Rust bench uses,
resident before timing. Prints one JSON object: the median of 25 calls per
(op, shape), in seconds.

Usage: python bench_hf.py B,k,V [B,k,V ...]
"""

import json
import sys
import time

import torch
import transformers
from transformers.generation.utils import _speculative_sampling

REPEATS = 25


def median_s(fn):
    fn()  # warm up
    times = []
    for _ in range(REPEATS):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    times.sort()
    return times[len(times) // 2]


def shape_times(batch, k, vocab, gen):
    target = torch.rand((batch, k + 1, vocab), generator=gen, dtype=torch.float32) * 8
    draft = torch.rand((batch, k, vocab), generator=gen, dtype=torch.float32) * 8
    drafts = torch.randint(0, vocab, (batch, k), generator=gen)
    prompt = torch.zeros((1, 4), dtype=torch.long)
    candidates = [torch.cat([prompt, drafts[b : b + 1]], dim=1) for b in range(batch)]

    def verify_from_logits():
        for b in range(batch):
            _speculative_sampling(candidates[b], draft[b : b + 1], k, target[b : b + 1])

    def greedy_verify():
        selected = target.argmax(dim=-1)
        matches = ((~(drafts == selected[:, :-1])).cumsum(dim=-1) < 1).sum(dim=-1)
        return selected.gather(1, matches.unsqueeze(1)), matches

    return {"verify_from_logits": median_s(verify_from_logits), "greedy_verify": median_s(greedy_verify)}


def main():
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(20261122)
    rows = []
    for arg in sys.argv[1:]:
        batch, k, vocab = (int(x) for x in arg.split(","))
        for op, seconds in shape_times(batch, k, vocab, gen).items():
            rows.append({"op": op, "shape": {"batch": batch, "k": k, "vocab": vocab}, "median_s": seconds})
    peer = f"HF transformers {transformers.__version__} (torch {torch.__version__}, {torch.get_num_threads()} threads)"
    print(json.dumps({"peer": peer, "times": rows}))


if __name__ == "__main__":
    main()
