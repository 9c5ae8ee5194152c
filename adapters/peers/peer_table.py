"""Turns the peers' conformance reports into the peer table (`reports/peers/PEERS.md`,
quoted in RESULTS.md).

Usage: ``python3 peer_table.py DIVERGENCES.toml REPORT.json...`` (what
``cargo xtask peers`` runs); prints Markdown.

Every failing check is put in exactly one class, and nothing is dropped:

* a known divergence from ``divergences.toml``: the check's name is listed
  there for that peer, with the spec rules it breaks, the errata entry, whether
  it is by design, and what the peer does;
* input not rejected: the case expects one of the spec's errors and the peer
  ran (or failed inside torch) instead; listed by the expected error kind;
* unexplained: anything else, quoted with the suite's message. A new peer
  version or a changed generator shows up here first.

Only the standard library is used (``tomllib`` needs Python 3.11).
"""

import collections
import json
import sys
import tomllib


def load(paths):
    reports = []
    for path in paths:
        with open(path, encoding="utf-8") as f:
            reports.append(json.load(f))
    return reports


def peer_of(backend, divergences):
    """The divergence file's peer name for a report's backend label."""
    for name in divergences.get("peers", {}):
        if backend.startswith("exec-" + name):
            return name
    return backend


def classify(report, peer, divergences):
    known = {}
    for d in divergences.get("divergence", []):
        if peer in d["peers"]:
            for case in d["cases"].get(peer, []):
                known[case] = d
    by_divergence = collections.defaultdict(list)
    validation = collections.defaultdict(list)
    unexplained = []
    for r in report["results"]:
        if r["status"] != "Fail":
            continue
        d = known.get(r["name"])
        if d is not None:
            by_divergence[d["id"]].append(r["name"])
        elif r["message"].startswith("expected error"):
            kind = r["message"].split('"')[1] if '"' in r["message"] else "?"
            validation[kind].append(r["name"])
        else:
            unexplained.append(r)
    return by_divergence, validation, unexplained


def main(argv):
    if len(argv) < 3:
        print(__doc__, file=sys.stderr)
        return 2
    with open(argv[1], "rb") as f:
        divergences = tomllib.load(f)
    reports = load(argv[2:])
    ids = {d["id"]: d for d in divergences.get("divergence", [])}
    out = []
    out.append("| peer | checks run | pass | fail: known divergence | fail: input not rejected | fail: unexplained | not supported |")
    out.append("|---|---|---|---|---|---|---|")
    details = []
    for report in reports:
        peer = peer_of(report["backend"], divergences)
        counts = collections.Counter(r["status"] for r in report["results"])
        by_div, validation, unexplained = classify(report, peer, divergences)
        ran = counts["Pass"] + counts["Fail"]
        n_div = sum(len(v) for v in by_div.values())
        n_val = sum(len(v) for v in validation.values())
        out.append(f"| `{report['backend']}` | {ran} | {counts['Pass']} | {n_div} | {n_val} | {len(unexplained)} | {counts['NotSupported']} |")
        info = divergences.get("peers", {}).get(peer, {})
        details.append(f"\n### `{report['backend']}`\n")
        if info:
            details.append(f"{info['what']}\n")
        stat = [r for r in report["results"] if r["kind"] in ("statistical", "exact") and r["status"] in ("Pass", "Fail")]
        if stat:
            failed = [r["name"] for r in stat if r["status"] == "Fail"]
            details.append(f"Statistical and exact checks: {len(stat) - len(failed)} of {len(stat)} pass" + (f"; failing: {', '.join(f'`{n}`' for n in failed)}." if failed else "."))
            details.append("")
        for div_id, cases in sorted(by_div.items()):
            d = ids[div_id]
            errata = f" ({d['errata']})" if d.get("errata") else ""
            design = f"by design{errata}" if d.get("by_design") else f"not by design{errata.replace('(', '(see ')}"
            details.append(f"- **{', '.join(d['rules'])}**, {design}: {d['what']} Cases: {', '.join(f'`{c}`' for c in sorted(cases))}.")
        if validation:
            details.append("- **input not rejected**: the case expects the spec's error and the peer either ran on the input or failed inside torch without a typed error (peers take their inputs from their own models and check few of them):")
            for kind, cases in sorted(validation.items()):
                details.append(f"  - `{kind}`: {', '.join(f'`{c}`' for c in sorted(cases))}")
        for r in unexplained:
            details.append(f"- **unexplained** `{r['name']}` ({', '.join(r['rules']) or 'no rule listed'}): {r['message']}")
        listed = {c for d in by_div.values() for c in d}
        for div_id in sorted({d["id"] for d in divergences.get("divergence", []) if peer in d["peers"]}):
            missing = sorted(set(ids[div_id]["cases"].get(peer, [])) - listed)
            if missing:
                details.append(f"- note: divergence `{div_id}` lists {', '.join(f'`{c}`' for c in missing)}, which did not fail in this run.")
    print("\n".join(out))
    print("\n".join(details))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
