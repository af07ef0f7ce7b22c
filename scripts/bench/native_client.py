#!/usr/bin/env python3
"""Benchmark client for an OpenAI-compatible completions server (sous native, llama.cpp).

Standard library only. Every measurement goes through POST {base}/v1/completions with a
plain-text prompt (no chat template), temperature 0, streaming, and
`stream_options: {"include_usage": true}` so the server's own token counts are used
(when a server sends no usage, each streamed chunk with text counts as one token).

(a) prefill: a ~PREFILL_TOKENS-token prompt, max_tokens=1; prefill tok/s =
    prompt_tokens / time to first token. Median of --prefill-reps runs.
(b) single-stream decode: --decode-tokens output tokens with ignore_eos;
    decode tok/s = (tokens - 1) / (t_last_token - t_first_token). Median of --decode-reps.
(c) aggregate decode: at each concurrency level N (--levels), N streams start together,
    each with its own ~--level-prompt-tokens prompt and --level-output-tokens output tokens
    (ignore_eos); aggregate tok/s = all output tokens / wall time of the level (first
    request sent to last stream done, prefill included). Also per-stream decode rates and
    TTFTs.
(d) --perplexity TEXTFILE: the text in one request with max_tokens=1 and the vLLM
    extension `prompt_logprobs: 0`, which returns choices[0].prompt_logprobs, a list with
    None first and then one {token_id: {"logprob": x, ...}} per prompt token (an entry
    with several tokens is resolved with prompt_token_ids). perplexity = exp(-mean
    logprob) over tokens 2..N. (llama.cpp's servers have no such field; for llama.cpp
    use scripts/bench/llamacpp_perplexity.py.)

Every prompt starts with a unique tag, so no prefix cache can serve one from another.
Prompts are cut from a fixed public-domain text (--corpus), and their length in tokens is
calibrated against the server's usage.prompt_tokens before measuring.

`ignore_eos: true` is sent as a request field (vLLM's, honoured by sous native and by
llama.cpp's llama-server); --eos-logit-bias IDS adds `logit_bias: {id: -100}` as well, for
servers without ignore_eos (llama-cpp-python's llama_cpp.server).

Output: a JSON document (--out, or stdout) and a markdown table on stderr.
"""

import argparse
import http.client
import json
import math
import os
import statistics
import sys
import threading
import time
import urllib.parse
import uuid

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_CORPUS = os.path.join(HERE, "data", "alice-chapter1.txt")


class Server:
    def __init__(self, base_url, model, timeout, ignore_eos_field, eos_bias):
        u = urllib.parse.urlsplit(base_url.rstrip("/"))
        if u.scheme != "http":
            raise SystemExit(f"only http:// base URLs are supported, got {base_url}")
        self.host, self.port = u.hostname, u.port or 80
        self.prefix = u.path  # e.g. "" or "/v1" stripped below
        if self.prefix.endswith("/v1"):
            self.prefix = self.prefix[: -len("/v1")]
        self.model = model
        self.timeout = timeout
        self.ignore_eos_field = ignore_eos_field
        self.eos_bias = eos_bias

    def body(self, prompt, max_tokens, ignore_eos, stream=True, **extra):
        b = {"model": self.model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0}
        if stream:
            b["stream"] = True
            b["stream_options"] = {"include_usage": True}
        if ignore_eos:
            if self.ignore_eos_field:
                b["ignore_eos"] = True
            if self.eos_bias:
                b["logit_bias"] = {str(i): -100 for i in self.eos_bias}
        b.update(extra)
        return b

    def post(self, body):
        """Non-streaming POST /v1/completions, returns the JSON."""
        conn = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout)
        try:
            conn.request("POST", self.prefix + "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
            resp = conn.getresponse()
            data = resp.read()
            if resp.status != 200:
                raise RuntimeError(f"HTTP {resp.status}: {data[:500]!r}")
            return json.loads(data)
        finally:
            conn.close()

    def stream(self, body):
        """Streaming POST /v1/completions. Returns timings and counts of one request."""
        conn = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout)
        t_send = time.perf_counter()
        t_first = t_last = None
        chunks_with_text = 0
        usage = None
        text = []
        try:
            conn.request("POST", self.prefix + "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
            resp = conn.getresponse()
            if resp.status != 200:
                raise RuntimeError(f"HTTP {resp.status}: {resp.read()[:500]!r}")
            while True:
                line = resp.readline()
                if not line:
                    break
                line = line.strip()
                if not line.startswith(b"data:"):
                    continue
                payload = line[5:].strip()
                if payload == b"[DONE]":
                    break
                now = time.perf_counter()
                msg = json.loads(payload)
                if msg.get("error"):
                    raise RuntimeError(f"server error: {msg['error']}")
                if msg.get("usage"):
                    usage = msg["usage"]
                for choice in msg.get("choices") or []:
                    piece = choice.get("text")
                    if piece is None:
                        continue
                    if t_first is None:
                        t_first = now
                    if piece:
                        chunks_with_text += 1
                        text.append(piece)
                    t_last = now
        finally:
            conn.close()
        t_done = time.perf_counter()
        if t_first is None:
            raise RuntimeError("the stream carried no token")
        tokens = usage.get("completion_tokens") if usage else None
        return {
            "t_send": t_send,
            "t_first": t_first,
            "t_last": t_last,
            "t_done": t_done,
            "ttft_s": t_first - t_send,
            "prompt_tokens": usage.get("prompt_tokens") if usage else None,
            "completion_tokens": tokens if tokens is not None else chunks_with_text,
            "usage_reported": usage is not None,
            "text": "".join(text),
        }


class Prompts:
    """Prompts of a given token length, cut from a fixed text, each with a unique head."""

    def __init__(self, server, corpus_path, run_tag):
        with open(corpus_path, encoding="utf-8") as f:
            self.words = f.read().split()
        self.server = server
        self.run_tag = run_tag
        self.count = 0
        self.words_for = {}

    def _text(self, n_words, offset):
        self.count += 1
        words = [self.words[(offset + i) % len(self.words)] for i in range(n_words)]
        return f"{self.count}-{self.run_tag}: " + " ".join(words)

    def tokens_of(self, text):
        out = self.server.post(self.server.body(text, 1, False, stream=False))
        return out["usage"]["prompt_tokens"]

    def make(self, n_tokens, offset=0):
        """A prompt of about n_tokens tokens (within 2 %, calibrated once per length)."""
        if n_tokens not in self.words_for:
            n_words = max(1, int(n_tokens / 1.35))
            for _ in range(4):
                got = self.tokens_of(self._text(n_words, 0))
                if abs(got - n_tokens) <= max(2, n_tokens // 50):
                    break
                n_words = max(1, round(n_words * n_tokens / got))
            self.words_for[n_tokens] = n_words
        return self._text(self.words_for[n_tokens], offset)


def median(xs):
    return statistics.median(xs) if xs else None


def prefill(server, prompts, n_tokens, reps):
    runs = []
    for r in range(reps):
        prompt = prompts.make(n_tokens, offset=97 * r)
        out = server.stream(server.body(prompt, 1, False))
        if out["prompt_tokens"] is None:  # no usage in the stream: ask afterwards
            out["prompt_tokens"] = prompts.tokens_of(prompt)
        runs.append({"prompt_tokens": out["prompt_tokens"], "ttft_s": out["ttft_s"],
                     "tok_s": out["prompt_tokens"] / out["ttft_s"] if out["prompt_tokens"] else None})
    return {
        "prompt_tokens": median([r["prompt_tokens"] for r in runs]),
        "ttft_s": median([r["ttft_s"] for r in runs]),
        "tok_s": median([r["tok_s"] for r in runs if r["tok_s"]]),
        "runs": runs,
    }


def decode_rate(out):
    n = out["completion_tokens"]
    span = out["t_last"] - out["t_first"]
    return (n - 1) / span if n > 1 and span > 0 else None


def single_decode(server, prompts, prompt_tokens, n_out, reps):
    runs = []
    for r in range(reps):
        out = server.stream(server.body(prompts.make(prompt_tokens, offset=13 * r), n_out, True))
        runs.append({"completion_tokens": out["completion_tokens"], "ttft_s": out["ttft_s"],
                     "tok_s": decode_rate(out)})
        if out["completion_tokens"] != n_out:
            print(f"warning: asked for {n_out} tokens, got {out['completion_tokens']} (ignore_eos not honoured?)",
                  file=sys.stderr)
    return {
        "completion_tokens": median([r["completion_tokens"] for r in runs]),
        "tok_s": median([r["tok_s"] for r in runs if r["tok_s"]]),
        "runs": runs,
    }


def concurrent_level(server, prompts, n, prompt_tokens, n_out):
    bodies = [server.body(prompts.make(prompt_tokens, offset=31 * i), n_out, True) for i in range(n)]
    results = [None] * n
    errors = []
    barrier = threading.Barrier(n + 1)

    def worker(i):
        barrier.wait()
        try:
            results[i] = server.stream(bodies[i])
        except Exception as e:  # reported below
            errors.append(repr(e))

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    t0 = time.perf_counter()
    barrier.wait()
    for t in threads:
        t.join()
    if errors:
        raise RuntimeError(f"{len(errors)} of {n} streams failed: {errors[0]}")
    wall = max(r["t_done"] for r in results) - t0
    total = sum(r["completion_tokens"] for r in results)
    # Time during which all n streams were decoding at once: from the last first token to
    # the first last token (None when the streams did not overlap, e.g. a server that
    # serves one request at a time).
    overlap = min(r["t_last"] for r in results) - max(r["t_first"] for r in results)
    return {
        "streams": n,
        "output_tokens": total,
        "wall_s": wall,
        "aggregate_tok_s": total / wall,
        "per_stream_decode_tok_s_median": median([decode_rate(r) for r in results if decode_rate(r)]),
        "ttft_s_median": median([r["ttft_s"] for r in results]),
        "ttft_s_max": max(r["ttft_s"] for r in results),
        "streams_overlapped": overlap > 0,
    }


def perplexity(server, path):
    with open(path, encoding="utf-8") as f:
        text = f.read()
    method = "prompt_logprobs"
    out = server.post(server.body(text, 1, False, stream=False, prompt_logprobs=0))
    choice = out["choices"][0]
    if choice.get("prompt_logprobs") is None:
        raise RuntimeError("the server returned no choices[0].prompt_logprobs")
    ids = choice.get("prompt_token_ids") or out.get("prompt_token_ids")
    lps = []
    for i, entry in enumerate(choice["prompt_logprobs"]):
        if entry is None:
            continue
        if len(entry) == 1:
            (v,) = entry.values()
        elif ids is not None:
            v = entry[str(ids[i])]
        else:
            raise RuntimeError("prompt_logprobs entry with several tokens and no prompt_token_ids")
        lps.append(v["logprob"] if isinstance(v, dict) else float(v))
    if not lps:
        raise RuntimeError("the server returned no prompt logprobs")
    nll = -sum(lps) / len(lps)
    return {"file": os.path.relpath(path), "method": method, "scored_tokens": len(lps),
            "prompt_tokens": out["usage"]["prompt_tokens"], "mean_nll": nll, "perplexity": math.exp(nll)}


def descendants(pid):
    """pid and every process below it (`sous serve` runs the native engine as a child)."""
    found = [pid]
    # Each thread lists the children it spawned: `sous serve` starts the engine from a
    # tokio worker thread, not from its main thread.
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return found
    for tid in tasks:
        try:
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                for child in f.read().split():
                    found += descendants(int(child))
        except OSError:
            pass
    return found


def rss_of(pid):
    """Peak and current RSS summed over the server's processes (each one's VmHWM)."""
    out = {"VmHWM": 0, "VmRSS": 0}
    for p in descendants(pid):
        try:
            with open(f"/proc/{p}/status") as f:
                for line in f:
                    key, _, val = line.partition(":")
                    if key in out:
                        out[key] += int(val.split()[0]) * 1024
        except OSError:
            if p == pid:
                return None
    return {"peak_rss_bytes": out["VmHWM"], "rss_bytes": out["VmRSS"]}


def fmt(x, digits=1):
    return "—" if x is None else f"{x:.{digits}f}"


def markdown(res):
    lines = [f"### {res['label']} ({res['model']} at {res['base_url']})", "", "| measure | value |", "| --- | ---: |"]
    if res.get("prefill"):
        p = res["prefill"]
        lines.append(f"| prefill tok/s ({p['prompt_tokens']}-token prompt, TTFT {fmt(p['ttft_s'] * 1000, 0)} ms) | {fmt(p['tok_s'])} |")
    if res.get("single_decode"):
        d = res["single_decode"]
        lines.append(f"| single-stream decode tok/s ({d['completion_tokens']} tokens) | {fmt(d['tok_s'])} |")
    for lvl in res.get("concurrency") or []:
        note = "" if lvl["streams_overlapped"] or lvl["streams"] == 1 else " (streams served one after another)"
        lines.append(f"| aggregate decode tok/s, {lvl['streams']} streams{note} | {fmt(lvl['aggregate_tok_s'])} |")
    if res.get("perplexity"):
        p = res["perplexity"]
        lines.append(f"| perplexity, {p['file']} ({p['scored_tokens']} tokens, {p['method']}) | {fmt(p['perplexity'], 3)} |")
    if res.get("memory") and res["memory"].get("peak_rss_bytes"):
        lines.append(f"| server peak RSS (VmHWM) MiB | {fmt(res['memory']['peak_rss_bytes'] / 2**20)} |")
    la = res.get("loadavg_start")
    if la:
        lines.append(f"| load average before / after (1 min) | {la[0]:.2f} / {res['loadavg_end'][0]:.2f} |")
    return "\n".join(lines) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--base-url", required=True, help="e.g. http://127.0.0.1:8080")
    ap.add_argument("--model", required=True, help="the model name the server expects")
    ap.add_argument("--label", default=None, help="name of this server in the output")
    ap.add_argument("--out", help="write the JSON here (default: stdout)")
    ap.add_argument("--markdown", help="also write the markdown table here")
    ap.add_argument("--corpus", default=DEFAULT_CORPUS, help="text the prompts are cut from")
    ap.add_argument("--prefill-tokens", type=int, default=512)
    ap.add_argument("--prefill-reps", type=int, default=5)
    ap.add_argument("--decode-tokens", type=int, default=256)
    ap.add_argument("--decode-prompt-tokens", type=int, default=128)
    ap.add_argument("--decode-reps", type=int, default=3)
    ap.add_argument("--levels", default="1,2,4,8,16", help="concurrency levels, comma-separated ('' skips)")
    ap.add_argument("--level-prompt-tokens", type=int, default=128)
    ap.add_argument("--level-output-tokens", type=int, default=128)
    ap.add_argument("--perplexity", metavar="TEXTFILE", help="also measure perplexity over this text")
    ap.add_argument("--only-perplexity", action="store_true", help="measure nothing but --perplexity")
    ap.add_argument("--server-pid", type=int, help="read the server's peak RSS from /proc/PID/status at the end")
    ap.add_argument("--no-ignore-eos-field", action="store_true", help="do not send ignore_eos")
    ap.add_argument("--eos-logit-bias", default="", help="token ids to bias by -100 when ignoring EOS, e.g. 0,2")
    ap.add_argument("--timeout", type=float, default=600.0, help="per request, seconds")
    args = ap.parse_args()

    eos_bias = [int(x) for x in args.eos_logit_bias.split(",") if x.strip()]
    server = Server(args.base_url, args.model, args.timeout, not args.no_ignore_eos_field, eos_bias)
    prompts = Prompts(server, args.corpus, uuid.uuid4().hex[:8])
    res = {"label": args.label or args.base_url, "base_url": args.base_url, "model": args.model,
           "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "cpus": os.cpu_count(),
           "loadavg_start": os.getloadavg(),
           "settings": {k: v for k, v in vars(args).items() if k not in ("out", "markdown")}}

    def log(msg):
        print(f"native_client[{res['label']}]: {msg}", file=sys.stderr, flush=True)

    if not args.only_perplexity:
        log("warm-up and prompt calibration")
        server.stream(server.body(prompts.make(64), 8, True))
        log(f"prefill: {args.prefill_tokens}-token prompts x {args.prefill_reps}")
        res["prefill"] = prefill(server, prompts, args.prefill_tokens, args.prefill_reps)
        log(f"  {fmt(res['prefill']['tok_s'])} tok/s")
        log(f"single-stream decode: {args.decode_tokens} tokens x {args.decode_reps}")
        res["single_decode"] = single_decode(server, prompts, args.decode_prompt_tokens, args.decode_tokens,
                                             args.decode_reps)
        log(f"  {fmt(res['single_decode']['tok_s'])} tok/s")
        res["concurrency"] = []
        for n in [int(x) for x in args.levels.split(",") if x.strip()]:
            lvl = concurrent_level(server, prompts, n, args.level_prompt_tokens, args.level_output_tokens)
            log(f"  {n:2d} streams: {fmt(lvl['aggregate_tok_s'])} tok/s aggregate "
                f"({lvl['output_tokens']} tokens in {lvl['wall_s']:.2f} s)")
            res["concurrency"].append(lvl)
    if args.perplexity:
        log(f"perplexity over {args.perplexity}")
        try:
            res["perplexity"] = perplexity(server, args.perplexity)
            log(f"  {res['perplexity']['perplexity']:.4f} ({res['perplexity']['method']})")
        except Exception as e:  # a server without prompt logprobs
            res["perplexity_error"] = repr(e)
            log(f"  perplexity failed: {e!r}")
    if args.server_pid:
        res["memory"] = rss_of(args.server_pid)
    res["loadavg_end"] = os.getloadavg()

    doc = json.dumps(res, indent=1)
    if args.out:
        with open(args.out, "w") as f:
            f.write(doc + "\n")
    else:
        print(doc)
    md = markdown(res)
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(md)
    print(md, file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
