"""The adapter side of the exec protocol's `generate` operation (PROTO-9), shared by the
engine adapters: the handshake with the engine's statement, one JSON line in and out per
call, and every failure reported as a reply, never a crash.
"""

import json
import sys

PROTOCOL = "specdec-exec/1"
# A request's fields (PROTO-9); any other is an error.
FIELDS = {"prompt", "temperature", "top_k", "top_p", "seed", "max_new_tokens", "eos", "stop", "speculation"}


def check_fields(request, stated=()):
    """Refuses a field outside PROTO-9's base set and the optional ones the adapter states."""
    unknown = set(request) - FIELDS - set(stated)
    if unknown:
        raise ValueError(f"unknown request fields {sorted(unknown)}")


def logprob_entries(rows, tokens, top):
    """LOGPROB-3's entries of `tokens`, one per token, from the log-probability row (floats,
    `-inf` for an id outside the kept set) each was drawn with: the chosen id's value (a
    chosen `-inf` written -9999.0) and the `top` finite ids by value, ties to the lower id."""
    out = []
    for row, token in zip(rows, tokens):
        values = [float(v) for v in row]
        finite = sorted((i for i, v in enumerate(values) if v != float("-inf")), key=lambda i: (-values[i], i))
        chosen = values[token]
        out.append({"id": token, "logprob": chosen if chosen != float("-inf") else -9999.0, "top": [[i, values[i]] for i in finite[:top]]})
    return out


def serve(info, generate, refuse=None):
    """Answers the protocol on stdin/stdout: `generate(request) -> {"tokens", "finish"}` per
    request; `refuse(requests) -> (index, message) or None` names a request the engine does
    not take (the check reports it as not supported)."""
    for line in sys.stdin:
        rid = None
        try:
            req = json.loads(line)
            rid = req.get("id")
            if req["op"] == "handshake":
                reply = {"id": rid, "protocol": PROTOCOL, "name": info["name"], "device": "cpu", "ops": ["generate"], "engine": info}
            elif req["op"] == "generate":
                requests = req["params"]["requests"]
                refused = refuse(requests) if refuse else None
                if refused:
                    index, message = refused
                    reply = {"id": rid, "error": {"kind": "NotSupported", "arg": "requests", "index": [index], "message": message}}
                else:
                    reply = {"id": rid, "outputs": {"generations": [generate(r) for r in requests]}}
            else:
                reply = {"id": rid, "error": {"kind": "NotSupported", "arg": req["op"], "message": "only generate"}}
        except Exception as e:  # a malformed request or the engine's own failure: reported, never a crash
            reply = {"id": rid, "error": {"kind": "Device", "arg": "generate", "message": f"{type(e).__name__}: {e}"}}
        print(json.dumps(reply), flush=True)
