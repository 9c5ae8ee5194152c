"""What the peer adapters share: the translation between the specdec-exec/1
operations and a peer's own calling convention, and nothing else.

A peer adapter must test the peer's code, not ours. So the glue here only
reshapes inputs, hands out the case's noise, and lays out outputs. Every
decision the suite judges (accept or reject, which weights a rejection draws
from, which row the bonus comes from, how logits become probabilities) stays
inside the peer's code. The one exception is named wherever it is used:
explicit-noise cases need the peer's *draw* replaced by a draw from the peer's
own weights with the case's noise (``draw_from``), because a peer's sampler
reads its own generator and the case fixes the noise.
"""

import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "python"))

from numpy_backend import _exponential_race, _inverse_cdf  # noqa: E402
from specdec_adapter import NotSupported, SpecError, serve  # noqa: E402,F401

PAD = -1

# The precision both peers compute in: torch float32 probabilities (HF casts the
# target's logits to float32; vLLM's probabilities are float32). The values match
# the f32 Rust ports' statement (candle), so the judge treats peers and ports alike.
F32_PRECISION = {
    "float_dtype": "f32",
    "accumulate_dtype": "f32",
    "margin_epsilon": 1e-6,
    "value_tolerance": 1e-5,
}


def verify_inputs(inputs):
    """The verify operation's tensors: p [B, k+1, V], q [B, k, V] or None,
    drafts [B, k], lens [B]. Shapes are the peer's business; this only names them."""
    p = np.asarray(inputs["target_probs"], dtype=np.float64)
    q = np.asarray(inputs["draft_probs"], dtype=np.float64) if "draft_probs" in inputs else None
    d = np.asarray(inputs["draft_tokens"]).astype(np.int64)
    lens = np.asarray(inputs["proposal_lens"]).astype(np.int64)
    return p, q, d, lens


def case_noise(inputs):
    """The explicit noise of a `rejection_verify` case: accept uniforms [B, k]
    and the draw noise, ("inverse", [B, k+1]) or ("race", [B, k+1, V])."""
    u = np.asarray(inputs["accept_uniforms"], dtype=np.float64)
    if "draw_uniforms" in inputs:
        return u, ("inverse", np.asarray(inputs["draw_uniforms"], dtype=np.float64))
    return u, ("race", np.asarray(inputs["draw_exponentials"], dtype=np.float64))


def draw_from(weights, noise, b, row):
    """Replaces a peer's sampler in explicit-noise cases: one draw from the
    peer's weights (any scale) with the case's noise for sequence b, row `row`
    (SAMPLE-1 inverse CDF or SAMPLE-2 exponential race)."""
    kind, t = noise
    w = np.asarray(weights, dtype=np.float64).reshape(1, -1)
    if kind == "inverse":
        return int(_inverse_cdf(w, np.array([t[b, row]]))[0])
    return int(_exponential_race(w, t[b, row].reshape(1, -1))[0])


def verify_outputs(rows, k):
    """Lays out per-sequence emitted tokens as the operation's outputs:
    tokens [B, k+1] padded with PAD, and num_accepted = emitted - 1."""
    tokens = np.full((len(rows), k + 1), PAD, dtype=np.int64)
    accepted = np.zeros(len(rows), dtype=np.int64)
    for b, row in enumerate(rows):
        tokens[b, : len(row)] = row
        accepted[b] = len(row) - 1
    return {"tokens": tokens, "num_accepted": accepted}
