"""A NumPy port of the specdec verification operations, served over the
specdec-exec/1 protocol (spec/PROTOCOL.md): the worked example of an
external adapter, and proof that the suite can check a non-Rust port.

Run it as ``specdec conform --backend exec:"python3 adapters/python/numpy_backend.py"``.

Every operation follows spec/SPEC.md and ports reference/src/*.rs: f64
throughout, sums and cumulative sums in index order (np.cumsum is
sequential), argmax ties to the lowest id (np.argmax), the strict accept
comparator ``u * q < p``, PAD = -1, and validation that reports the same
error kind and argument as the reference (reference/src/validate.rs), in
the same order. Validation is vectorised for the common valid case and falls
back to an element-by-element port only to name the first defect, so the
statistical batches stay fast. ``rejection_verify_seeded`` draws its noise
from NumPy's own seeded Generator (PCG64), not from the reference's stream:
it is checked statistically (BACKEND-5).

kv_cache and the model forward are not implemented: they answer NotSupported.

Test fixture: SPECDEC_NUMPY_MUTANT=lesseq swaps the strict accept test for
``u * q <= p`` (a known bug class) so that a test can prove the suite
catches it. Never set it otherwise.
"""

import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from specdec_adapter import NotSupported, SpecError, serve  # noqa: E402

PAD = -1
SUM_TOLERANCE = 1e-4
MUTANT = os.environ.get("SPECDEC_NUMPY_MUTANT", "")


# ----------------------------------------------------------- validation


def _shape(arg, actual, expected, names):
    if tuple(actual) != tuple(expected):
        raise SpecError("ShapeMismatch", arg, f"{names} = {list(expected)}", actual=list(actual))


def _rank(arg, actual, rank, names):
    if len(actual) != rank:
        raise SpecError("ShapeMismatch", arg, f"{names} (rank {rank})", actual=list(actual))
    return actual


def _prob_row(arg, prefix, row):
    """CONV-2, element by element as the reference."""
    bad = ~np.isfinite(row) | (row < 0)
    if bad.any():
        i = int(np.argmax(bad))
        kind = "NonFinite" if not np.isfinite(row[i]) else "NegativeProbability"
        raise SpecError(kind, arg, "bad probability", index=list(prefix) + [i], value=row[i])
    total = np.cumsum(row)[-1] if row.size else 0.0
    if abs(total - 1.0) > SUM_TOLERANCE:
        raise SpecError("NotNormalized", arg, "row does not sum to 1", index=list(prefix), value=total)


def _prob_rows(arg, t):
    if t.ndim == 0:
        raise SpecError("ShapeMismatch", arg, "at least one axis", actual=[])
    if t.shape[-1] == 0:
        raise SpecError("EmptyVocab", arg, "the vocabulary is empty")
    rows = t.reshape(-1, t.shape[-1])
    if _rows_ok(rows, _prob_ok):
        return
    for r in range(rows.shape[0]):
        _prob_row(arg, list(np.unravel_index(r, t.shape[:-1])) if t.ndim > 1 else [], rows[r])


def _prob_ok(rows):
    with np.errstate(all="ignore"):
        sums = np.cumsum(rows, axis=-1)[..., -1] if rows.shape[-1] else np.zeros(rows.shape[:-1])
        return bool(np.all(np.isfinite(rows)) and np.all(rows >= 0) and np.all(np.abs(sums - 1.0) <= SUM_TOLERANCE))


def _score_row(arg, prefix, row):
    """CONV-8: no NaN, no +inf, not entirely -inf."""
    bad = np.isnan(row) | (row == np.inf)
    if bad.any():
        i = int(np.argmax(bad))
        raise SpecError("NonFinite", arg, "bad score", index=list(prefix) + [i], value=row[i])
    if not np.isfinite(row).any():
        raise SpecError("AllMasked", arg, "score row is entirely -inf", index=list(prefix))


def _score_ok(rows):
    return bool(not np.any(np.isnan(rows) | (rows == np.inf)) and np.all(np.isfinite(rows).any(axis=-1)))


def _rows_ok(rows, check):
    return rows.size == 0 or check(rows)


def _uniforms(arg, t):
    ok = (t >= 0) & (t < 1)
    if not ok.all():
        i = int(np.argmax(~ok.reshape(-1)))
        raise SpecError("UniformOutOfRange", arg, "outside [0, 1)", index=[int(x) for x in np.unravel_index(i, t.shape)], value=t.reshape(-1)[i])


# SAMPLE-2's noise domain: the binary32 normal range [2^-126, 2^126].
MIN_EXPONENTIAL, MAX_EXPONENTIAL = 2.0**-126, 2.0**126


def _exponentials(arg, t):
    ok = (t >= MIN_EXPONENTIAL) & (t <= MAX_EXPONENTIAL)
    if not ok.all():
        i = int(np.argmax(~ok.reshape(-1)))
        raise SpecError("InvalidNoise", arg, "must be in [2^-126, 2^126]", index=[int(x) for x in np.unravel_index(i, t.shape)], value=t.reshape(-1)[i])


def _token(arg, index, t, vocab):
    if not (0 <= t < vocab):
        raise SpecError("TokenOutOfRange", arg, f"outside [0, {vocab})", index=index, value=int(t), vocab=vocab)


def _draft_layout(draft, lens, vocab):
    """CONV-5: returns (B, k, lens as ints)."""
    batch, k = _rank("draft_tokens", draft.shape, 2, "[B, k]")
    if batch == 0:
        raise SpecError("EmptyBatch", "draft_tokens", "the batch is empty")
    if k == 0:
        raise SpecError("EmptyDraft", "draft_tokens", "k = 0")
    _shape("proposal_lens", lens.shape, (batch,), "[B]")
    j = np.arange(k)[None, :]
    with np.errstate(all="ignore"):
        in_range = (lens >= 0) & (lens <= k)
        live = j < lens[:, None]
        ok = in_range.all() and np.all(np.where(live, (draft >= 0) & (draft < vocab), draft == PAD))
    if not ok:
        for b in range(batch):
            n = int(lens[b])
            if n < 0 or n > k:
                raise SpecError("LengthOutOfRange", "proposal_lens", "outside [0, k]", seq=b, value=n, max=k)
            for jj in range(k):
                t = int(draft[b, jj])
                if jj < n:
                    _token("draft_tokens", [b, jj], t, vocab)
                elif t != PAD:
                    raise SpecError("PaddingMismatch", "draft_tokens", "PAD (-1) beyond the proposal length", index=[b, jj], value=t)
    return batch, k, lens.astype(np.int64)


def _verify_batch(arg, target, draft, lens, row_check, rows_ok):
    """CONV-4/5/7: rows 0..=len_b of each sequence are validated, the rest never read."""
    dims = _rank(arg, target.shape, 3, "[B, k+1, V]")
    vocab = dims[-1]
    if vocab == 0:
        raise SpecError("EmptyVocab", arg, "the vocabulary is empty")
    batch, k, n = _draft_layout(draft, lens, vocab)
    _shape(arg, target.shape, (batch, k + 1, vocab), "[B, k+1, V]")
    readable = np.arange(k + 1)[None, :] <= n[:, None]
    if not _rows_ok(target[readable], rows_ok):
        for b in range(batch):
            for j in range(int(n[b]) + 1):
                row_check(arg, [b, j], target[b, j])
    return batch, k, vocab, n


def _float(inputs, name):
    t = inputs[name]
    if t.dtype.kind != "f":
        raise SpecError("ShapeMismatch", name, "a float tensor", actual=list(t.shape))
    return t.astype(np.float64)


def _int(inputs, name):
    t = inputs[name]
    if t.dtype.kind not in "iu":
        raise SpecError("ShapeMismatch", name, "an i64 tensor", actual=list(t.shape))
    return t.astype(np.int64)


# ----------------------------------------------------------- drawing


def _inverse_cdf(w, v):
    """SAMPLE-1 row-wise: the smallest i with v*S < C_i; else the last positive weight."""
    c = np.cumsum(w, axis=1)
    target = v * c[:, -1]
    hit = target[:, None] < c
    first = np.argmax(hit, axis=1)
    last_pos = w.shape[1] - 1 - np.argmax((w > 0)[:, ::-1], axis=1)
    return np.where(hit.any(axis=1), first, last_pos)


def _exponential_race(w, e):
    """SAMPLE-2 row-wise: argmax of w/e over positive weights, ties to the lowest id."""
    with np.errstate(all="ignore"):
        ratio = w / e
        overflow = np.any((w > 0) & np.isinf(ratio), axis=1)
        logs = np.log(w) - np.log(e)
        score = np.where(overflow[:, None], logs, ratio)
        score = np.where(w > 0, score, -np.inf)
    return np.argmax(score, axis=1)


def _draw(w, noise, b_idx, row):
    method, t = noise
    if method == "inverse":
        return _inverse_cdf(w, t[b_idx, row])
    return _exponential_race(w, t[b_idx, row])


def _accept(u, p_x, q_x, comparator):
    """ACCEPT-1..3; never divides by q = 0."""
    if comparator == "Seed004LessEq":
        with np.errstate(all="ignore"):
            ratio = np.minimum(np.where(q_x > 0, p_x / np.where(q_x > 0, q_x, 1.0), 0.0), 1.0)
        return np.where(q_x > 0, u <= ratio, p_x > 0)
    if MUTANT == "lesseq":
        return u * q_x <= p_x  # the deliberate bug of the mutant fixture
    return u * q_x < p_x


# ----------------------------------------------------------- the backend


class NumpyBackend:
    """Operations take decoded inputs and params and return named outputs."""

    def greedy_verify(self, inputs, params):
        s, d, l = _float(inputs, "target_scores"), _int(inputs, "draft_tokens"), _int(inputs, "proposal_lens")
        batch, k, _, n_len = _verify_batch("target_scores", s, d, l, _score_row, _score_ok)
        with np.errstate(all="ignore"):
            t = np.argmax(s, axis=2)  # padding rows may pick anything: never read
        j = np.arange(k)[None, :]
        match = (d == t[:, :k]) & (j < n_len[:, None])
        n = np.cumprod(match, axis=1).sum(axis=1)
        tokens = np.full((batch, k + 1), PAD, dtype=np.int64)
        cols = np.arange(k + 1)[None, :]
        tokens = np.where(cols < n[:, None], np.concatenate([d, np.full((batch, 1), PAD)], axis=1), tokens)
        tokens[np.arange(batch), n] = t[np.arange(batch), n]
        return {"tokens": tokens, "num_accepted": n.astype(np.int64)}

    def dflash_accept(self, inputs, params):
        c, t = _int(inputs, "candidates"), _int(inputs, "target_predict")
        vocab = int(params["vocab"])
        bs, block = _rank("candidates", c.shape, 2, "[bs, Bk]")
        if bs == 0:
            raise SpecError("EmptyBatch", "candidates", "the batch is empty")
        if block < 2:
            raise SpecError("EmptyDraft", "candidates", "Bk < 2")
        if vocab == 0:
            raise SpecError("EmptyVocab", "vocab", "the vocabulary is empty")
        _shape("target_predict", t.shape, (bs, block), "[bs, Bk]")
        for arg, x in (("candidates", c), ("target_predict", t)):
            bad = (x < 0) | (x >= vocab)
            if bad.any():
                i = int(np.argmax(bad.reshape(-1)))
                _token(arg, [i // block, i % block], int(x.reshape(-1)[i]), vocab)
        accept = np.cumprod(c[:, 1:] == t[:, :-1], axis=1).sum(axis=1)
        return {"accept_len": accept.astype(np.int64), "bonus": t[np.arange(bs), accept]}

    def _rejection(self, inputs, noise_of, comparator):
        p = _float(inputs, "target_probs")
        q = _float(inputs, "draft_probs") if "draft_probs" in inputs else None
        d, l = _int(inputs, "draft_tokens"), _int(inputs, "proposal_lens")
        batch, k, vocab, lens = _verify_batch("target_probs", p, d, l, _prob_row, _prob_ok)
        if q is not None:
            _shape("draft_probs", q.shape, (batch, k, vocab), "[B, k, V]")
        u, noise = noise_of(batch, k, vocab)
        _shape("accept_uniforms", u.shape, (batch, k), "[B, k]")
        method, t = noise
        if method == "inverse":
            _shape("draw_uniforms", t.shape, (batch, k + 1), "[B, k+1]")
            _uniforms("draw_uniforms", t)
        else:
            _shape("draw_exponentials", t.shape, (batch, k + 1, vocab), "[B, k+1, V]")
            _exponentials("draw_exponentials", t)
        _uniforms("accept_uniforms", u)
        if q is not None:
            live = np.arange(k)[None, :] < lens[:, None]
            if not _rows_ok(q[live], _prob_ok):
                for b in range(batch):
                    for j in range(int(lens[b])):
                        _prob_row("draft_probs", [b, j], q[b, j])

        tokens = np.full((batch, k + 1), PAD, dtype=np.int64)
        accepted = np.zeros(batch, dtype=np.int64)
        active = np.ones(batch, dtype=bool)
        for j in range(k + 1):
            at_end = active & (lens == j)
            b_end = np.nonzero(at_end)[0]
            if b_end.size:  # REJECT-4: the bonus from row len_b
                tokens[b_end, j] = _draw(p[b_end, j], noise, b_end, j)
                accepted[b_end] = j
            testing = np.nonzero(active & (lens > j))[0]
            active = np.zeros(batch, dtype=bool)
            if testing.size == 0:
                break
            x = d[testing, j]
            p_rows = p[testing, j]
            p_x = p_rows[np.arange(testing.size), x]
            q_rows = q[testing, j] if q is not None else None
            q_x = q_rows[np.arange(testing.size), x] if q is not None else np.ones(testing.size)
            ok = _accept(u[testing, j], p_x, q_x, comparator)
            keep = testing[ok]
            tokens[keep, j] = d[keep, j]
            active[keep] = True
            rej = ~ok
            b_rej = testing[rej]
            if b_rej.size:  # REJECT-3 with RESID-1..3
                pr = p_rows[rej]
                if q_rows is not None:
                    w = np.maximum(pr - q_rows[rej], 0.0)
                else:
                    w = pr.copy()
                    w[np.arange(b_rej.size), x[rej]] = 0.0
                mass = np.cumsum(w, axis=1)[:, -1]
                w = np.where((mass > 0)[:, None], w, pr)
                tokens[b_rej, j] = _draw(w, noise, b_rej, j)
                accepted[b_rej] = j
        return {"tokens": tokens, "num_accepted": accepted}

    def rejection_verify(self, inputs, params):
        comparator = params.get("comparator", "Strict")

        def noise_of(batch, k, vocab):
            u = _float(inputs, "accept_uniforms")
            if "draw_uniforms" in inputs:
                return u, ("inverse", _float(inputs, "draw_uniforms"))
            return u, ("race", _float(inputs, "draw_exponentials"))

        return self._rejection(inputs, noise_of, comparator)

    def rejection_verify_seeded(self, inputs, params):
        """BACKEND-5: NumPy's own PCG64 stream, consumed in row order, so rows get independent noise."""
        comparator = params.get("comparator", "Strict")
        method = params["method"]
        rng = np.random.Generator(np.random.PCG64(int(params["seed"])))

        def noise_of(batch, k, vocab):
            u = rng.random((batch, k))
            if method == "InverseCdf":
                return u, ("inverse", rng.random((batch, k + 1)))
            e = rng.standard_exponential((batch, k + 1, vocab))
            while not np.all(e > 0):  # SAMPLE-2 forbids 0; redraw the (vanishingly rare) zeros
                zero = e <= 0
                e[zero] = rng.standard_exponential(int(zero.sum()))
            return u, ("race", e)

        return self._rejection(inputs, noise_of, comparator)

    def residual(self, inputs, params):
        p = _float(inputs, "target_probs")
        q = _float(inputs, "draft_probs") if "draft_probs" in inputs else None
        x = _int(inputs, "drafted")
        rows, vocab = _rank("target_probs", p.shape, 2, "[R, V]")
        if rows == 0:
            raise SpecError("EmptyBatch", "target_probs", "the batch is empty")
        if vocab == 0:
            raise SpecError("EmptyVocab", "target_probs", "the vocabulary is empty")
        if q is not None:
            _shape("draft_probs", q.shape, (rows, vocab), "[R, V]")
        _shape("drafted", x.shape, (rows,), "[R]")
        for r in range(rows):
            _token("drafted", [r], int(x[r]), vocab)
        _prob_rows("target_probs", p)
        if q is not None:
            _prob_rows("draft_probs", q)
        if q is not None:
            w = np.maximum(p - q, 0.0)
        else:
            w = p.copy()
            w[np.arange(rows), x] = 0.0
        mass = np.cumsum(w, axis=1)[:, -1]
        w = np.where((mass > 0)[:, None], w, p)
        total = np.cumsum(w, axis=1)[:, -1]
        return {"residual": w / total[:, None]}

    def process_logits(self, inputs, params):
        """LOGITS-1..13: bias, repetition, presence and frequency, then
        temperature, top-k, top-p and min-p (LOGITS-11's order)."""
        z = _float(inputs, "logits")
        t, k, tp = _float(inputs, "temperature"), _int(inputs, "top_k"), _float(inputs, "top_p")
        rows = z.shape[0] if z.ndim > 0 else 0
        opt = {name: _float(inputs, name) for name in PROCESSOR_INPUTS if name in inputs}
        per_row = [("temperature", t), ("top_k", k), ("top_p", tp)]
        per_row += [(n, opt[n]) for n in ("min_p", "repetition_penalty", "presence_penalty", "frequency_penalty") if n in opt]
        for arg, a in per_row:
            if tuple(a.shape) != (rows,):
                raise SpecError("ShapeMismatch", arg, f"[R] = [{rows}]", actual=list(a.shape))
        for i in range(rows):
            if k[i] < 0:
                raise SpecError("InvalidParameter", "top_k", "must be >= 0", value=str(int(k[i])))
        rows, vocab = _rank("logits", z.shape, 2, "[R, V]")
        if rows == 0:
            raise SpecError("EmptyBatch", "logits", "the batch is empty")
        if vocab == 0:
            raise SpecError("EmptyVocab", "logits", "the vocabulary is empty")
        ones, zeros = np.ones(rows), np.zeros(rows)
        min_p = opt.get("min_p", zeros)
        rep = opt.get("repetition_penalty", ones)
        pres, freq = opt.get("presence_penalty", zeros), opt.get("frequency_penalty", zeros)
        for i in range(rows):
            if not (np.isfinite(t[i]) and t[i] >= 0):
                raise SpecError("InvalidParameter", "temperature", "must be finite and >= 0", value=repr(float(t[i])))
            if not (tp[i] > 0 and tp[i] <= 1):
                raise SpecError("InvalidParameter", "top_p", "must be in (0, 1]", value=repr(float(tp[i])))
            if not (0 <= min_p[i] <= 1):
                raise SpecError("InvalidParameter", "min_p", "must be in [0, 1]", value=repr(float(min_p[i])))
            if not (np.isfinite(rep[i]) and rep[i] > 0):
                raise SpecError("InvalidParameter", "repetition_penalty", "must be finite and > 0", value=repr(float(rep[i])))
            for name, a in (("presence_penalty", pres), ("frequency_penalty", freq)):
                if not np.isfinite(a[i]):
                    raise SpecError("InvalidParameter", name, "must be finite", value=repr(float(a[i])))
        for r in range(rows):
            _score_row("logits", [r], z[r])
        counts, bias = opt.get("penalty_counts"), opt.get("logit_bias")
        if counts is not None:
            _shape("penalty_counts", counts.shape, (rows, vocab), "[R, V]")
            bad = ~np.isfinite(counts) | (counts < 0) | (np.nan_to_num(counts) != np.floor(np.nan_to_num(counts)))
            if bad.any():
                raise SpecError("InvalidParameter", "penalty_counts", "must be finite non-negative integers")
        if bias is not None:
            _shape("logit_bias", bias.shape, (rows, vocab), "[R, V]")
            bad = ~np.isfinite(bias)
            if bad.any():
                r, i = (int(x) for x in np.argwhere(bad)[0])
                raise SpecError("NonFinite", "logit_bias", "bad bias", index=[r, i], value=bias[r, i])
        out = []
        for r in range(rows):
            row = z[r].copy()
            if bias is not None:
                row = row + bias[r]
            if counts is not None:
                c = counts[r] > 0
                with np.errstate(invalid="ignore", over="ignore"):
                    repeated = np.where(row > 0, row / rep[r], row * rep[r])
                    row = np.where(c, repeated - (counts[r] * freq[r] + pres[r]), row)
            _score_row("processed_logits", [r], row)
            out.append(row)
        return {"probs": np.stack([self._logits_row(out[r], float(t[r]), int(k[r]), float(tp[r]), float(min_p[r])) for r in range(rows)])}

    @staticmethod
    def _logits_row(logits, temperature, top_k, top_p, min_p=0.0):
        """LOGITS-2..6 and LOGITS-10."""
        vocab = logits.size
        top = int(np.argmax(logits))
        if temperature == 0.0:
            out = np.zeros(vocab)
            out[top] = 1.0
            return out
        mx = logits[top]
        keep = np.ones(vocab, dtype=bool)
        if 0 < top_k < vocab:
            kth = np.sort(logits)[::-1][top_k - 1]
            keep = logits >= kth

        def weights(keep):
            w = np.where(keep, np.exp((logits - mx) / temperature), 0.0)
            return w / np.cumsum(w)[-1]

        probs = weights(keep)
        if top_p < 1.0:
            ids = np.nonzero(keep)[0]
            order = ids[np.lexsort((ids, -probs[ids]))]
            before = 0.0
            for i in order:
                keep[i] = before < top_p
                before += probs[i]
            probs = weights(keep)
        if min_p > 0.0:
            keep &= probs >= min_p * probs[top]
            probs = weights(keep)
        return probs

    def draw(self, inputs, params):
        w = _float(inputs, "weights")
        rows, vocab = _rank("weights", w.shape, 2, "[R, V]")
        if rows == 0:
            raise SpecError("EmptyBatch", "weights", "the batch is empty")
        if vocab == 0:
            raise SpecError("EmptyVocab", "weights", "the vocabulary is empty")
        if "draw_uniforms" in inputs:
            noise = _float(inputs, "draw_uniforms")
            _shape("draw_uniforms", noise.shape, (rows,), "[R]")
            _uniforms("draw_uniforms", noise)
        else:
            noise = _float(inputs, "draw_exponentials")
            _shape("draw_exponentials", noise.shape, (rows, vocab), "[R, V]")
            _exponentials("draw_exponentials", noise)
        for r in range(rows):
            row = w[r]
            bad = ~np.isfinite(row) | (row < 0)
            if bad.any():
                i = int(np.argmax(bad))
                kind = "NonFinite" if not np.isfinite(row[i]) else "NegativeProbability"
                raise SpecError(kind, "weights", "bad weight", index=[r, i], value=row[i])
            total = np.cumsum(row)[-1]
            if np.isinf(total):
                raise SpecError("NonFinite", "weights", "the total weight overflows", index=[r], value=total)
            if not total > 0:
                raise SpecError("ZeroMass", "weights", "zero total weight", index=[r])
        if "draw_uniforms" in inputs:
            return {"tokens": _inverse_cdf(w, noise).astype(np.int64)}
        return {"tokens": _exponential_race(w, noise).astype(np.int64)}

    def paged_gather(self, inputs, params):
        pages, table, lens = _float(inputs, "pages"), _int(inputs, "block_table"), _int(inputs, "context_lens")
        num_pages, page, heads, head_dim = _rank("pages", pages.shape, 4, "[P, S, H, D]")
        for name, v in (("page_size", page), ("heads", heads), ("head_dim", head_dim)):
            if v == 0:
                raise SpecError("InvalidParameter", name, "must be >= 1", value=str(v))
        batch, slots = _rank("block_table", table.shape, 2, "[B, M]")
        if batch == 0:
            raise SpecError("EmptyBatch", "block_table", "the batch is empty")
        _shape("context_lens", lens.shape, (batch,), "[B]")
        for b in range(batch):
            n = int(lens[b])
            if n == 0:
                raise SpecError("EmptyContext", "context_lens", "empty context", seq=b)
            if n < 0 or n > slots * page:
                raise SpecError("LengthOutOfRange", "context_lens", "outside [1, M * S]", seq=b, value=n, max=slots * page)
            for slot in range(-(-n // page)):
                block = int(table[b, slot])
                if block < 0 or block >= num_pages:
                    raise SpecError("InvalidBlock", None, "not a page", seq=b, slot=slot, value=block, max=num_pages)
        bad = ~np.isfinite(pages)
        if bad.any():
            i = int(np.argmax(bad.reshape(-1)))
            raise SpecError("NonFinite", "pages", "non-finite page value", index=[int(x) for x in np.unravel_index(i, pages.shape)], value=pages.reshape(-1)[i])
        max_len = int(lens.max())
        out = np.zeros((batch, max_len, heads, head_dim))
        for b in range(batch):
            for pos in range(int(lens[b])):
                out[b, pos] = pages[int(table[b, pos // page]), pos % page]
        return {"gathered": out}

    def ngram_propose(self, inputs, params):
        c, l = _int(inputs, "contexts"), _int(inputs, "context_lens")
        vocab = int(params["vocab"])
        cfg = params["config"]
        n_min, n_max, k = int(cfg["ngram_min"]), int(cfg["ngram_max"]), int(cfg["k"])
        policy, max_len = cfg.get("policy", "LargestNMostRecent"), cfg.get("max_model_len")
        # NGRAM-1, in the reference's order.
        if n_max > 1 << 16:
            raise SpecError("InvalidParameter", "ngram_max", "must be <= 65536", value=str(n_max))
        if k > 1 << 16:
            raise SpecError("InvalidParameter", "k", "must be <= 65536", value=str(k))
        if n_min < 1:
            raise SpecError("InvalidParameter", "ngram_min", "must be >= 1", value=str(n_min))
        if n_max < n_min:
            raise SpecError("InvalidParameter", "ngram_max", "must be >= ngram_min", value=str(n_max))
        if k < 1:
            raise SpecError("InvalidParameter", "k", "must be >= 1", value=str(k))
        if max_len == 0:
            raise SpecError("InvalidParameter", "max_model_len", "must be >= 1", value="0")
        batch, width = _rank("contexts", c.shape, 2, "[B, L]")
        if batch == 0:
            raise SpecError("EmptyBatch", "contexts", "the batch is empty")
        _shape("context_lens", l.shape, (batch,), "[B]")

        def capped_k(b, n):
            if max_len is None:
                return k
            if n > max_len:
                raise SpecError("ContextTooLong", "contexts", "beyond max_model_len", seq=b, len=n, max=max_len)
            return min(k, max(max_len - (n + 1), 0))

        for b in range(batch):
            n = int(l[b])
            if n == 0:
                raise SpecError("EmptyContext", "contexts", "empty context", seq=b)
            if n < 0 or n > width:
                raise SpecError("LengthOutOfRange", "context_lens", "outside [1, L]", seq=b, value=n, max=width)
            for i in range(n):
                _token("contexts", [b, i], int(c[b, i]), vocab)
            for j in range(n, width):
                if c[b, j] != PAD:
                    raise SpecError("PaddingMismatch", "contexts", "PAD (-1) beyond the context length", index=[b, j], value=int(c[b, j]))
            capped_k(b, n)
        drafts = np.full((batch, k), PAD, dtype=np.int64)
        out_lens = np.zeros(batch, dtype=np.int64)
        for b in range(batch):
            n = int(l[b])
            ctx = [int(x) for x in c[b, :n]]
            prop = _ngram_search(ctx, n_min, n_max, policy, capped_k(b, n))
            drafts[b, : len(prop)] = prop
            out_lens[b] = len(prop)
        return {"drafts": drafts, "proposal_lens": out_lens}


def _ngram_search(ctx, n_min, n_max, policy, k):
    """NGRAM-2/3 by linear search."""
    length = len(ctx)
    if k == 0:
        return []
    for n in range(n_max, n_min - 1, -1):
        if length < n + 1:
            continue
        key = ctx[length - n:]
        starts = range(length - n - 1, -1, -1) if policy == "LargestNMostRecent" else range(0, length - n)
        for i in starts:
            if ctx[i:i + n] == key:
                return ctx[i + n:min(i + n + k, length)]
    return []


OPS = [
    "greedy_verify",
    "dflash_accept",
    "rejection_verify",
    "rejection_verify_seeded",
    "residual",
    "process_logits",
    "logits_processors",
    "draw",
    "ngram_propose",
    "paged_gather",
]

# process_logits inputs beyond LOGITS-1..6 (handshake entry `logits_processors`).
PROCESSOR_INPUTS = ("min_p", "penalty_counts", "repetition_penalty", "presence_penalty", "frequency_penalty", "logit_bias")

PRECISION = {
    "float_dtype": "f64",
    "accumulate_dtype": "f64",
    # NumPy's exp may differ from the platform libm's in the last ulp: state
    # the bound honestly instead of claiming bit-identity.
    "margin_epsilon": 1e-12,
    "value_tolerance": 1e-12,
}

if __name__ == "__main__":
    serve(NumpyBackend(), "numpy" + ("-mutant-" + MUTANT if MUTANT else ""), OPS, PRECISION, device="cpu")
