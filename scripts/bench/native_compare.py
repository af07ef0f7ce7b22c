#!/usr/bin/env python3
"""Side-by-side markdown table of native_client.py results (scripts/bench/native.sh).

    native_compare.py [--machine machine.txt] RESULT.json...

Throughput columns in the order given; when one result's label starts with "sous", a
ratio column "sous ÷ X" follows for every other server X (above 1: sous is faster, or for
RSS, uses more). Perplexities (lower is better) go in a second table.
"""

import argparse
import json


def rows_of(res):
    rows = {}
    if res.get("prefill"):
        rows["prefill tok/s (~512-token prompt)"] = res["prefill"]["tok_s"]
        rows["TTFT ms (~512-token prompt)"] = res["prefill"]["ttft_s"] * 1000
    if res.get("single_decode"):
        rows[f"decode tok/s, 1 stream ({res['single_decode']['completion_tokens']} tokens)"] = res["single_decode"]["tok_s"]
    for lvl in res.get("concurrency") or []:
        rows[f"aggregate decode tok/s, {lvl['streams']} streams"] = lvl["aggregate_tok_s"]
    if res.get("loadavg_start"):
        rows["load average (1 min) before → after"] = (res["loadavg_start"][0], res["loadavg_end"][0])
    mem = res.get("memory") or {}
    if mem.get("peak_rss_bytes"):
        rows["peak RSS MiB"] = mem["peak_rss_bytes"] / 2**20
    return rows


def fmt(x, digits=1):
    if isinstance(x, (tuple, list)):
        return " → ".join(f"{v:.2f}" for v in x)
    return "—" if x is None else f"{x:,.{digits}f}"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--machine", help="a text file about the machine, printed first")
    ap.add_argument("results", nargs="+")
    args = ap.parse_args()
    results = [json.load(open(p)) for p in args.results]
    out = []
    if args.machine:
        out += [f"    {line}" for line in open(args.machine).read().splitlines()] + [""]

    speed = [r for r in results if r.get("prefill") or r.get("single_decode") or r.get("concurrency")]
    if speed:
        sous = next((r for r in speed if r["label"].startswith("sous")), None)
        peers = [r for r in speed if r is not sous]
        names = []
        for r in speed:
            names.extend(rows_of(r))
        names = list(dict.fromkeys(names))
        header = ["measure"] + [r["label"] for r in speed]
        if sous:
            header += [f"{sous['label']} ÷ {p['label']}" for p in peers]
        out.append("| " + " | ".join(header) + " |")
        out.append("| --- |" + " ---: |" * (len(header) - 1))
        for name in names:
            vals = [rows_of(r).get(name) for r in speed]
            cells = [fmt(v) for v in vals]
            if sous:
                s = rows_of(sous).get(name)
                for p in peers:
                    v = rows_of(p).get(name)
                    ratio = s is not None and v and not isinstance(v, (tuple, list))
                    cells.append(f"{s / v:.2f}×" if ratio else "—")
            out.append(f"| {name} | " + " | ".join(cells) + " |")
        serial = [r["label"] for r in speed
                  if any(l["streams"] > 1 and not l["streams_overlapped"] for l in r.get("concurrency") or [])]
        if serial:
            out.append("")
            out.append(f"Served concurrent streams one at a time: {', '.join(serial)}.")
        out.append("")

    ppl = [r for r in results if r.get("perplexity")]
    if ppl:
        out.append("| perplexity over | server | tokens scored | perplexity |")
        out.append("| --- | --- | ---: | ---: |")
        for r in ppl:
            p = r["perplexity"]
            out.append(f"| {p['file']} | {r['label']} ({p['method']}) | {p['scored_tokens']} | {p['perplexity']:.4f} |")
        out.append("")
    for r in results:
        if r.get("perplexity_error"):
            out.append(f"{r['label']}: no perplexity ({r['perplexity_error']})")
    print("\n".join(out))


if __name__ == "__main__":
    main()
