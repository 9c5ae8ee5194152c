"""HF transformers' speculative sampling under the specdec suite.

Run by ``cargo xtask peers`` with the peers' cached environment (torch and
transformers from PyPI); by hand:
``specdec conform --backend exec:"PYTHON adapters/peers/hf_transformers.py"``.

What is HF's own code, called unchanged:

* ``rejection_verify`` and ``rejection_verify_seeded`` call
  ``transformers.generation.utils._speculative_sampling`` once per sequence
  (it takes a batch of one), exactly as ``_assisted_decoding`` does: target and
  draft logits in float32 (``_assisted_decoding`` casts the target's logits to
  float32), the candidate ids, the candidate length. The case's probabilities
  become logits as ``log p`` (softmax recovers p to about an ulp; ``log 0 =
  -inf`` keeps zeros exact). A case without draft probabilities (a
  deterministic proposer, RESID-2) is given the draft distribution it really
  has, a point mass on the drafted token, so HF's residual ``max(p - q, 0)`` is
  p with the drafted token removed. That is what a deterministic proposer
  plugged into ``_speculative_sampling`` gets; it is not HF's own prompt-lookup
  path, which has no draft logits and so takes ``_assisted_decoding``'s other
  branch (one target sample per position, kept while it matches the drafts):
  the same law, different per-draw decisions, and inline code, not a function.
* ``process_logits`` runs HF's ``SequenceBiasLogitsProcessor`` (logit bias),
  ``RepetitionPenaltyLogitsProcessor``, ``TemperatureLogitsWarper``,
  ``TopKLogitsWarper``, ``TopPLogitsWarper`` and ``MinPLogitsWarper`` in the
  order and under the conditions of ``GenerationMixin._get_logits_processor``
  (bias and repetition outside ``do_sample``; temperature when not 1, top-k
  when not 0, top-p when below 1, min-p when above 0), then softmax, on
  float32 logits as ``generate`` does. HF has no presence or frequency
  penalty: such a row is answered NotSupported. Temperature 0 is HF's greedy decoding: a one-hot at
  ``torch.argmax``. A ``ValueError`` a warper raises is answered as the spec's
  ``InvalidParameter`` naming that parameter: HF validated it.

Noise. In explicit-noise cases ``torch.rand_like`` inside the call returns
the case's accept uniforms, rounded to float32 as HF's own ``rand_like`` of a
float32 ratio would be (a uniform within 2^-25 of 1 becomes 1), and HF's ``torch.multinomial`` still runs (so its
own checks, e.g. on NaN, still fire) but its pick is replaced by a draw from
the very distribution HF passed to it, with the case's draw noise at the row
HF chose (``peer_glue.draw_from``). Seeded cases leave everything to torch:
``torch.manual_seed(seed)`` once per call, then the sequences in order. HF
draws from torch's process-global generator and ``_speculative_sampling``
takes no generator, so reseeding it per call is the only way to seed HF; this
adapter is a single-threaded process that does nothing else.

HF does not validate inputs (its inputs come from its own models): error
cases get whatever torch does. No other operation maps onto a callable HF
function (the greedy/assisted comparison is inline in ``_assisted_decoding``),
so none other is listed.
"""

import contextlib

import numpy as np
import torch
import transformers
from transformers.generation.logits_process import (
    MinPLogitsWarper,
    RepetitionPenaltyLogitsProcessor,
    SequenceBiasLogitsProcessor,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)
from transformers.generation.utils import _speculative_sampling

from peer_glue import F32_PRECISION, NotSupported, SpecError, case_noise, draw_from, serve, verify_inputs, verify_outputs


@contextlib.contextmanager
def case_noise_in_torch(uniforms):
    """Inside the block, ``torch.rand_like`` returns `uniforms` and
    ``torch.multinomial`` records the distribution it is given (after torch's
    own checks) and returns a placeholder that the caller replaces."""
    real_rand_like, real_multinomial = torch.rand_like, torch.multinomial
    seen = []

    def rand_like(t, *args, **kwargs):
        if tuple(t.shape) != tuple(uniforms.shape):
            raise RuntimeError(f"rand_like shape {tuple(t.shape)} is not the case's {tuple(uniforms.shape)}")
        return uniforms.to(t.dtype)

    def multinomial(probs, num_samples, *args, **kwargs):
        picked = real_multinomial(probs, num_samples, *args, **kwargs)  # torch's checks (NaN, negative, zero sum)
        seen.append(probs.detach().to(torch.float64).reshape(-1).numpy().copy())
        return torch.full_like(picked, -7)

    torch.rand_like, torch.multinomial = rand_like, multinomial
    try:
        yield seen
    finally:
        torch.rand_like, torch.multinomial = real_rand_like, real_multinomial


def logits_of(probs):
    with np.errstate(divide="ignore"):
        return torch.from_numpy(np.log(probs)).to(torch.float32)


class HfTransformers:
    def _sequence(self, p, q, d, n):
        """One `_speculative_sampling` call for a sequence with n drafts."""
        vocab = p.shape[-1]
        if q is None:
            q = np.zeros((n, vocab))
            q[np.arange(n), d[:n]] = 1.0
        candidate_ids = torch.from_numpy(d[:n].copy()).reshape(1, n)
        candidate_logits = logits_of(q[:n]).reshape(1, n, vocab)
        new_logits = logits_of(p[: n + 1]).reshape(1, n + 1, vocab)
        valid, n_matches = _speculative_sampling(candidate_ids, candidate_logits, n, new_logits)
        return [int(x) for x in valid.reshape(-1)], int(n_matches)

    def rejection_verify(self, inputs, params):
        p, q, d, lens = verify_inputs(inputs)
        u, noise = case_noise(inputs)
        rows = []
        for b in range(p.shape[0]):
            n = int(lens[b])
            with case_noise_in_torch(torch.from_numpy(u[b, :n].copy())) as seen:
                row, n_matches = self._sequence(p[b], None if q is None else q[b], d[b], n)
            # HF's last token is its multinomial pick: draw it from HF's distribution
            # with the case's noise at the row HF stopped on.
            row[-1] = draw_from(seen[-1], noise, b, n_matches)
            rows.append(row)
        return verify_outputs(rows, d.shape[1])

    def rejection_verify_seeded(self, inputs, params):
        p, q, d, lens = verify_inputs(inputs)
        torch.manual_seed(int(params["seed"]))
        rows = [self._sequence(p[b], None if q is None else q[b], d[b], int(lens[b]))[0] for b in range(p.shape[0])]
        return verify_outputs(rows, d.shape[1])

    def process_logits(self, inputs, params):
        """HF `generate`'s own processors in its own order: SequenceBias (logit
        bias), RepetitionPenalty (outside `do_sample`, so greedy rows get them
        too), then Temperature, TopK, TopP, MinP. HF has no presence or
        frequency penalty: a row that asks for one is NotSupported."""
        z = torch.from_numpy(np.asarray(inputs["logits"], dtype=np.float64)).to(torch.float32)
        temps, top_ks, top_ps = inputs["temperature"], inputs["top_k"], inputs["top_p"]
        rows = z.shape[0]
        min_ps = inputs.get("min_p", np.zeros(rows))
        counts, bias = inputs.get("penalty_counts"), inputs.get("logit_bias")
        reps = inputs.get("repetition_penalty", np.ones(rows))
        for name in ("presence_penalty", "frequency_penalty"):
            if name in inputs and np.any(np.asarray(inputs[name]) != 0.0):
                raise NotSupported(f"{name}: HF transformers has no presence or frequency penalty")
        out = []
        for r in range(rows):
            scores = z[r : r + 1].clone()
            t, k, tp, mp = float(temps[r]), int(top_ks[r]), float(top_ps[r]), float(min_ps[r])
            processors = []
            try:
                if bias is not None and np.any(bias[r] != 0.0):
                    processors.append(SequenceBiasLogitsProcessor([[[int(i)], float(bias[r][i])] for i in np.nonzero(bias[r])[0]]))
                if counts is not None and float(reps[r]) != 1.0:
                    processors.append(RepetitionPenaltyLogitsProcessor(penalty=float(reps[r])))
                if t != 0.0:
                    if t != 1.0:
                        processors.append(TemperatureLogitsWarper(t))
                    if k != 0:
                        processors.append(TopKLogitsWarper(top_k=k))
                    if tp < 1.0:
                        processors.append(TopPLogitsWarper(top_p=tp))
                    if mp > 0.0:
                        processors.append(MinPLogitsWarper(min_p=mp))
            except ValueError as e:
                raise SpecError("InvalidParameter", _named_parameter(str(e)), str(e)) from e
            # The ids the penalty counts, as HF reads them: the context's tokens.
            seen = [] if counts is None else [int(i) for i in np.nonzero(counts[r])[0]]
            input_ids = torch.tensor([seen or [0]], dtype=torch.long)
            for process in processors:
                if isinstance(process, RepetitionPenaltyLogitsProcessor) and not seen:
                    continue
                scores = process(input_ids, scores)
            if t == 0.0:
                one_hot = torch.zeros_like(scores)
                one_hot[0, torch.argmax(scores, dim=-1)] = 1.0
                out.append(one_hot[0])
                continue
            out.append(scores.softmax(dim=-1)[0])
        return {"probs": torch.stack(out).to(torch.float64).numpy()}


def _named_parameter(message):
    for name in ("temperature", "top_k", "top_p", "min_p", "penalty"):
        if f"`{name}`" in message:
            if name == "penalty":
                return "repetition_penalty"
            return name
    return None


if __name__ == "__main__":
    serve(
        HfTransformers(),
        f"hf-transformers-{transformers.__version__}",
        ["rejection_verify", "rejection_verify_seeded", "process_logits", "logits_processors"],
        F32_PRECISION,
        device="cpu",
    )
