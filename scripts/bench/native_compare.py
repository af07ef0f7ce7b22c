#!/usr/bin/env python3
"""Side-by-side markdown table of native_client.py results (scripts/bench/native.sh).

    native_compare.py [--machine machine.txt] [--sous LABEL] RESULT.json...

Throughput columns in the order given; when one result's label starts with "sous" (or is
--sous's), a ratio column "sous ÷ X" follows for every other server X (above 1: sous is faster, or for
RSS, uses more). Perplexities (lower is better) go in a second table.

Results of several rounds of one server (`LABEL.rN.json`, from `native.sh --rounds N`) are
one column: each measure's median over the rounds with its range, the ratios of the
medians, and a column per peer with the rounds in which sous was ahead of it (the two
measured in the same round: higher tok/s, lower TTFT and RSS).
"""

import argparse
import json
import re
import statistics


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


LOWER_IS_BETTER = ("TTFT", "RSS")


class Server:
    """One server's results: one run, or one per round."""

    def __init__(self, label):
        self.label = label
        self.rounds = {}  # round number -> that round's rows

    def value(self, name):
        """The median over the rounds (the value itself for one run)."""
        vals = [rows[name] for rows in self.rounds.values() if rows.get(name) is not None]
        if not vals:
            return None
        if isinstance(vals[0], (tuple, list)):
            return vals[0] if len(vals) == 1 else (min(v[0] for v in vals), max(v[1] for v in vals))
        return statistics.median(vals)

    def cell(self, name):
        vals = [rows[name] for rows in self.rounds.values() if rows.get(name) is not None]
        mid = self.value(name)
        if len(vals) < 2 or isinstance(mid, (tuple, list)):
            return fmt(mid)
        return f"{fmt(mid)} ({fmt(min(vals))}–{fmt(max(vals))})"

    def wins(self, peer, name):
        """'W of N': the rounds both ran in which this server was ahead of `peer`."""
        both = [r for r in self.rounds if r in peer.rounds]
        pairs = [(self.rounds[r].get(name), peer.rounds[r].get(name)) for r in both]
        pairs = [(a, b) for a, b in pairs if isinstance(a, (int, float)) and isinstance(b, (int, float))]
        if len(pairs) < 2:
            return None
        lower = any(word in name for word in LOWER_IS_BETTER)
        won = sum(1 for a, b in pairs if (a < b if lower else a > b))
        return f"{won} of {len(pairs)}"


def servers_of(paths):
    """Results grouped by label, in the order first seen; each with its round (`.rN.json`)."""
    servers = {}
    for path in paths:
        res = json.load(open(path))
        m = re.search(r"\.r(\d+)\.json$", path)
        server = servers.setdefault(res["label"], Server(res["label"]))
        server.rounds[int(m.group(1)) if m else 0] = rows_of(res)
        server.first = getattr(server, "first", res)
    return list(servers.values())


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--machine", help="a text file about the machine, printed first")
    ap.add_argument("--sous", help="the sous result the ratios are of (default: the first labelled sous*)")
    ap.add_argument("results", nargs="+")
    args = ap.parse_args()
    results = [json.load(open(p)) for p in args.results]
    out = []
    if args.machine:
        out += [f"    {line}" for line in open(args.machine).read().splitlines()] + [""]

    speed = [srv for srv in servers_of([p for p, r in zip(args.results, results)
                                         if r.get("prefill") or r.get("single_decode") or r.get("concurrency")])]
    if speed:
        sous = next((r for r in speed if r.label == args.sous or (not args.sous and r.label.startswith("sous"))),
                    None)
        peers = [r for r in speed if r is not sous]
        names = []
        for srv in speed:
            for rows in srv.rounds.values():
                names.extend(rows)
        names = list(dict.fromkeys(names))
        rounds = max(len(srv.rounds) for srv in speed)
        header = ["measure"] + [r.label for r in speed]
        if sous:
            header += [f"{sous.label} ÷ {p.label}" for p in peers]
            if rounds > 1:
                header += [f"rounds {sous.label} ahead of {p.label}" for p in peers]
        out.append("| " + " | ".join(header) + " |")
        out.append("| --- |" + " ---: |" * (len(header) - 1))
        for name in names:
            cells = [srv.cell(name) for srv in speed]
            if sous:
                s = sous.value(name)
                for p in peers:
                    v = p.value(name)
                    ratio = s is not None and v and not isinstance(v, (tuple, list))
                    cells.append(f"{s / v:.2f}×" if ratio else "—")
                if rounds > 1:
                    cells += [sous.wins(p, name) or "—" for p in peers]
            out.append(f"| {name} | " + " | ".join(cells) + " |")
        if rounds > 1:
            out.append("")
            out.append(f"Medians over {rounds} rounds, range in brackets; ratios of the medians.")
        serial = [srv.label for srv in speed
                  if any(l["streams"] > 1 and not l["streams_overlapped"] for l in srv.first.get("concurrency") or [])]
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
