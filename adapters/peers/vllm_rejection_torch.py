"""vLLM's rejection sampler, ported to torch on the CPU, under the specdec suite.

vLLM's sampler (``vllm/v1/sample/rejection_sampler.py``) runs as Triton GPU
kernels and cannot be installed or run on a CPU, so this file re-expresses the
math of its kernels in torch, decision for decision, and says where it had to
map. The port was written from reading vLLM's source at the commit named in
``PORTED_FROM``; no vLLM code is copied. What it reproduces:

* greedy (``rejection_greedy_sample_kernel``): ``target_argmax`` is torch's
  ``argmax`` over the float32 softmax of the target logits (``forward``
  computes probabilities before ``rejection_sample``); each draft is compared in order; the
  first mismatch emits the target's argmax and stops; all matched appends the
  bonus, which vLLM samples outside the kernel with its greedy sampler (the
  argmax of the row after the last draft).
* random (``rejection_random_sample_kernel``): float32 probabilities, float64
  uniforms; accept iff ``draft_prob > 0 and target_prob / draft_prob >= u``
  (``draft_prob = 1`` without draft probabilities); on the first rejection
  emit the recovered token of that position and stop; all accepted appends the
  bonus.
* recovered tokens (``sample_recovered_tokens_kernel``): the weights are
  ``max(p - q, 0)``, or p with the drafted token zeroed without draft
  probabilities, never normalised; the token is ``argmax(weights / e)`` over
  float32 exponentials e. vLLM draws one exponential row per request and
  shares it across positions (only the first rejected position is ever used);
  explicit-noise cases give each position its own row, the case's row for
  that position.
* the bonus: vLLM's random sampler, ``argmax(p / e)`` with a fresh exponential
  row per request.

Noise. Seeded cases use one ``torch.Generator`` seeded with the case's seed,
drawn in the order of vLLM's unseeded path, which draws from torch's default
generator: the bonus tokens first (``forward`` runs the sampler before
``rejection_sample``: one exponential row per request), then float64 uniforms
for all draft tokens, then one recovered-token exponential row per request
(``q.exponential_()`` fills every row). vLLM's per-request generators, used
when a request carries a seed, are not modelled; the ``method`` parameter is
ignored because vLLM has one sampling method. Explicit-noise cases with
exponentials use them exactly where vLLM uses its own; cases with
inverse-CDF uniforms have no vLLM counterpart, so the recovered and bonus
tokens are drawn from vLLM's weights by the spec's inverse CDF
(``peer_glue.draw_from``), except that an all-zero weight row gives id 0, as
vLLM's ``argmax(0 / e)`` does.

vLLM validates nothing here (shapes are asserted): error cases get whatever
torch does.
"""

import numpy as np
import torch

from peer_glue import F32_PRECISION, case_noise, draw_from, serve, verify_inputs, verify_outputs

PORTED_FROM = "vllm-project/vllm 7f6fc1c5ce8d02f473b1b923debbfef3fa0b7a6a, vllm/v1/sample/rejection_sampler.py"


def recovered_weights(p_row, q_row, draft):
    """``sample_recovered_tokens_kernel``'s unnormalised weights (float32)."""
    if q_row is None:
        w = p_row.clone()
        w[draft] = 0.0
        return w
    return torch.clamp(p_row - q_row, min=0.0)


def race(weights, exponentials):
    """vLLM's draw: ``argmax(weights / e)`` in float32, first index on ties."""
    return int(torch.argmax(weights / exponentials))


class VllmRejection:
    def greedy_verify(self, inputs, params):
        s = torch.from_numpy(np.asarray(inputs["target_scores"], dtype=np.float64)).to(torch.float32)
        d = np.asarray(inputs["draft_tokens"]).astype(np.int64)
        lens = np.asarray(inputs["proposal_lens"]).astype(np.int64)
        target_argmax = torch.argmax(torch.softmax(s, dim=-1), dim=-1)
        rows = []
        for b in range(s.shape[0]):
            row = []
            for pos in range(int(lens[b])):
                row.append(int(target_argmax[b, pos]))
                if int(d[b, pos]) != row[-1]:
                    break
            else:
                row.append(int(torch.argmax(s[b, int(lens[b])])))  # the greedy sampler's bonus: argmax of the logits
            rows.append(row)
        return verify_outputs(rows, d.shape[1])

    def _random(self, inputs, uniform, recovered_draw, bonus_draw):
        p_np, q_np, d, lens = verify_inputs(inputs)
        p = torch.from_numpy(p_np).to(torch.float32)
        q = None if q_np is None else torch.from_numpy(q_np).to(torch.float32)
        rows = []
        for b in range(p.shape[0]):
            n = int(lens[b])
            row, rejected = [], False
            for pos in range(n):
                x = int(d[b, pos])
                draft_prob = 1.0 if q is None else q[b, pos, x]
                target_prob = p[b, pos, x]
                if draft_prob > 0 and float(target_prob / draft_prob) >= float(uniform(b, pos)):
                    row.append(x)
                else:
                    w = recovered_weights(p[b, pos], None if q is None else q[b, pos], x)
                    row.append(recovered_draw(w, b, pos))
                    rejected = True
                    break
            if not rejected:
                row.append(bonus_draw(p[b, n], b, n))
            rows.append(row)
        return verify_outputs(rows, d.shape[1])

    def rejection_verify(self, inputs, params):
        u, noise = case_noise(inputs)
        kind, t = noise

        def draw(weights, b, row):
            if kind == "race":
                return race(weights, torch.from_numpy(t[b, row]).to(torch.float32))
            if float(weights.sum()) == 0.0:
                return 0  # vLLM's argmax(0 / e)
            return draw_from(weights.numpy(), noise, b, row)

        return self._random(inputs, lambda b, pos: u[b, pos], draw, draw)

    def rejection_verify_seeded(self, inputs, params):
        _, _, d, lens = verify_inputs(inputs)
        vocab = inputs["target_probs"].shape[-1]
        g = torch.Generator().manual_seed(int(params["seed"]))
        # The bonus tokens' random sampler runs first: one exponential row per request.
        bonus_e = torch.empty((len(lens), vocab), dtype=torch.float32).exponential_(generator=g)
        # generate_uniform_probs: float64, the draft tokens of all requests in order.
        offsets = np.concatenate([[0], np.cumsum(lens)])
        uniforms = torch.rand(int(offsets[-1]), dtype=torch.float64, generator=g)
        # sample_recovered_tokens: one float32 exponential row per request.
        recovered_e = torch.empty((len(lens), vocab), dtype=torch.float32).exponential_(generator=g)
        return self._random(
            inputs,
            lambda b, pos: uniforms[int(offsets[b]) + pos],
            lambda w, b, pos: race(w, recovered_e[b]),
            lambda w, b, pos: race(w, bonus_e[b]),
        )


if __name__ == "__main__":
    serve(
        VllmRejection(),
        "vllm-rejection-torch",
        ["greedy_verify", "rejection_verify", "rejection_verify_seeded"],
        F32_PRECISION,
        device="cpu",
    )
