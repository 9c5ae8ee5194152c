"""The specdec-exec/1 protocol loop for Python adapters (spec/PROTOCOL.md).

An adapter subclasses nothing: it passes an object whose methods are named
after the operations (``greedy_verify(inputs, params)`` returning a dict of
named outputs) to :func:`serve`. This module does the rest: the handshake,
decoding request tensors (plain arrays or base64 little-endian) into NumPy
arrays, encoding outputs, and turning :class:`SpecError` into an error reply
with the spec's kind and argument. Unlisted operations answer NotSupported;
any other exception answers a ``Device`` error with its traceback on stderr,
so one bad call never ends the session.

Set ``SPECDEC_ADAPTER_TRACE=FILE`` to append every request line to FILE:
the exact inputs of a failing check, to replay or read.

Only the standard library and NumPy are used.
"""

import base64
import json
import os
import sys
import traceback

import numpy as np

PROTOCOL = "specdec-exec/1"
INLINE_MAX = 64

_DTYPES = {"f64": "<f8", "f32": "<f4", "i64": "<i8", "i32": "<i4"}


class SpecError(Exception):
    """An input the spec rejects: ``kind`` from reference/src/error.rs, the
    argument it names, and optional details (index, value, seq, ...)."""

    def __init__(self, kind, arg=None, message="", **details):
        super().__init__(f"{kind} `{arg}`: {message}")
        self.kind, self.arg, self.message, self.details = kind, arg, message, details


class NotSupported(Exception):
    """Raised by an adapter for an input combination it does not implement."""


def decode_tensor(obj):
    dtype = _DTYPES[obj["dtype"]]
    shape = tuple(obj["shape"])
    data = obj["data"]
    if isinstance(data, str):
        return np.frombuffer(base64.b64decode(data), dtype=dtype).reshape(shape).copy()
    conv = {"nan": float("nan"), "inf": float("inf"), "-inf": float("-inf")}
    values = [conv.get(x, x) if isinstance(x, str) else x for x in data]
    return np.array(values, dtype=dtype).reshape(shape)


def encode_tensor(a):
    a = np.asarray(a)
    if a.dtype.kind == "f":
        a, dtype = a.astype("<f8"), "f64"
    else:
        a, dtype = a.astype("<i8"), "i64"
    shape = list(a.shape)
    if a.size <= INLINE_MAX and (dtype == "i64" or np.all(np.isfinite(a))):
        data = a.reshape(-1).tolist()
    else:
        data = base64.b64encode(np.ascontiguousarray(a).tobytes()).decode("ascii")
    return {"shape": shape, "dtype": dtype, "data": data}


def _jsonable(v):
    if isinstance(v, (np.integer,)):
        return int(v)
    if isinstance(v, (np.floating, float)):
        v = float(v)
        return v if np.isfinite(v) else str(v)
    if isinstance(v, (list, tuple)):
        return [_jsonable(x) for x in v]
    return v


def serve(backend, name, ops, precision, device="cpu", stdin=None, stdout=None):
    """Runs the protocol loop until stdin closes."""
    stdin = stdin or sys.stdin
    stdout = stdout or sys.stdout
    trace = os.environ.get("SPECDEC_ADAPTER_TRACE")
    for line in stdin:
        if not line.strip():
            continue
        if trace:
            with open(trace, "a", encoding="utf-8") as f:
                f.write(line if line.endswith("\n") else line + "\n")
        try:
            req = json.loads(line)
        except ValueError as e:
            print(f"specdec_adapter: request is not JSON: {e}", file=sys.stderr)
            continue
        rid = req.get("id")
        op = req.get("op")
        if op == "handshake":
            reply = {"id": rid, "protocol": PROTOCOL, "name": name, "device": device, "ops": list(ops), "precision": precision}
        else:
            reply = _dispatch(backend, ops, rid, op, req)
        stdout.write(json.dumps(reply, allow_nan=False) + "\n")
        stdout.flush()


def _support_name(op):
    return "kv_cache" if op.startswith("kv_") else op


def _dispatch(backend, ops, rid, op, req):
    method = getattr(backend, op, None) if isinstance(op, str) else None
    if method is None or _support_name(op) not in ops:
        return {"id": rid, "error": {"kind": "NotSupported", "message": f"{op} is not implemented"}}
    try:
        inputs = {k: decode_tensor(v) for k, v in (req.get("inputs") or {}).items()}
        out = method(inputs, req.get("params") or {})
        outputs = {k: (v if isinstance(v, (int, np.integer)) and not isinstance(v, bool) and k == "cache" else encode_tensor(v)) for k, v in out.items()}
        outputs = {k: (int(v) if isinstance(v, np.integer) else v) for k, v in outputs.items()}
        return {"id": rid, "outputs": outputs}
    except SpecError as e:
        err = {"kind": e.kind, "message": e.message}
        if e.arg is not None:
            err["arg"] = e.arg
        err.update({k: _jsonable(v) for k, v in e.details.items()})
        return {"id": rid, "error": err}
    except NotSupported as e:
        return {"id": rid, "error": {"kind": "NotSupported", "message": str(e)}}
    except Exception as e:  # noqa: BLE001 - any bug of the adapter is a Device error, not a dead session
        traceback.print_exc(file=sys.stderr)
        return {"id": rid, "error": {"kind": "Device", "message": f"{type(e).__name__}: {e}"}}
