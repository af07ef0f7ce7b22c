#!/usr/bin/env bash
# Benchmark: is `sous bench` ever the bottleneck, and does it measure what
# `vllm bench serve` measures? Both clients run, one after the other, against the same
# loopback server: the fake engine (tests/fake-engine) streaming OpenAI completions with
# injected delays (FAKE_TTFT_MS, FAKE_ITL_MS, FAKE_JITTER_MS, FAKE_SEED; restarted before
# each client so both get the same sequence of delays).
#
#   1. throughput: zero delay, 64 requests of 1,024 tokens at 8 and 32 concurrent
#      streams: output tokens/s each client sustains (the server shares the 2 cores);
#   2. agreement: TTFT 20 ms, ITL 5 ms, jitter ±2 ms, 4 concurrent streams, 64 requests
#      of 64 tokens: mean/median/p99 TTFT, TPOT and ITL of both clients (within 5 %?).
#
# At zero delay the latencies are the clients' own processing times, not the server's,
# so agreement is judged on the run with delays.
#
#   scripts/bench/bench-overhead.sh
#
# Environment: SOUS (default target/debug/sous), FAKE (default target/debug/fake-engine),
# TOKENIZER (default the SmolLM2 test model), VLLM (a `vllm` executable; default `vllm`
# on PATH; without one only sous runs). vllm 0.33.0 was installed with
# `pip install --no-deps vllm==0.33.0` into a venv with torch and transformers, plus the
# modules `vllm bench serve` imports (aiohttp, tqdm, cbor2, pyzmq, msgspec, ...).
# Results: target/bench/overhead/<UTC time>/ (both clients' JSON, summary.md).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT"
SOUS="${SOUS:-$ROOT/target/debug/sous}"
FAKE="${FAKE:-$ROOT/target/debug/fake-engine}"
TOKENIZER="${TOKENIZER:-$ROOT/target/models/HuggingFaceTB/SmolLM2-135M-Instruct}"
VLLM="${VLLM:-$(command -v vllm || true)}"
PORT="${PORT:-18500}"

say() { printf 'bench-overhead.sh: %s\n' "$*" >&2; }
die() { printf 'bench-overhead.sh: error: %s\n' "$*" >&2; exit 1; }
[[ -x "$SOUS" ]] || die "no sous at $SOUS (cargo build)"
[[ -x "$FAKE" ]] || die "no fake engine at $FAKE (cargo build -p sous-fake-engine)"
[[ -f "$TOKENIZER/tokenizer.json" ]] || die "no tokenizer at $TOKENIZER (scripts/fetch-test-model.sh)"
[[ -n "$VLLM" ]] || say "no vllm executable (set VLLM=...): sous only"

OUT="$ROOT/target/bench/overhead/$(date -u +%Y%m%dT%H%M%SZ)"
mkdir -p "$OUT/model"
say "results in $OUT"

FAKE_PID=""
stop_fake() { if [[ -n "$FAKE_PID" ]]; then kill "$FAKE_PID" 2>/dev/null || true; wait "$FAKE_PID" 2>/dev/null || true; fi; FAKE_PID=""; }
trap stop_fake EXIT
start_fake() { # TTFT ITL JITTER [DELAYS_LOG]
    stop_fake
    FAKE_DELAYS_LOG="${4:-/dev/null}" \
    FAKE_TTFT_MS="$1" FAKE_ITL_MS="$2" FAKE_JITTER_MS="$3" FAKE_SEED=7 FAKE_LOAD_SECS=0 \
        "$FAKE" serve "$OUT/model" --port "$PORT" --served-model-name fake >"$OUT/fake.log" 2>&1 &
    FAKE_PID=$!
    for _ in $(seq 100); do (exec 3<>"/dev/tcp/127.0.0.1/$PORT") 2>/dev/null && return 0; sleep 0.05; done
    die "the fake engine did not start (log: $OUT/fake.log)"
}

run_sous() { # NAME CONCURRENCY REQUESTS OUTPUT
    "$SOUS" bench sweep --url "http://127.0.0.1:$PORT" --tokenizer "$TOKENIZER" --seed 0 --salt 1 \
        --concurrency "$2" --requests "$3" --input-len 64 --output-len "$4" \
        --percentiles 50,90,99 --json >"$OUT/sous-$1.json" 2>"$OUT/sous-$1.log"
}
run_vllm() { # NAME CONCURRENCY REQUESTS OUTPUT
    [[ -n "$VLLM" ]] || return 0
    (cd "$OUT" && "$VLLM" bench serve --backend openai --base-url "http://127.0.0.1:$PORT" \
        --endpoint /v1/completions --model fake --tokenizer "$TOKENIZER" --dataset-name random \
        --random-input-len 64 --random-output-len "$4" --num-prompts "$3" --max-concurrency "$2" \
        --ignore-eos --percentile-metrics ttft,tpot,itl,e2el --metric-percentiles 50,90,99 \
        --seed 0 --save-result --result-dir "$OUT" --result-filename "vllm-$1.json") >"$OUT/vllm-$1.log" 2>&1
}

for c in 8 32; do
    say "throughput, zero delay, $c streams: sous"
    start_fake 0 0 0; run_sous "zero-c$c" "$c" 64 1024
    say "throughput, zero delay, $c streams: vllm bench serve"
    start_fake 0 0 0; run_vllm "zero-c$c" "$c" 64 1024
done
for ttft in 20 200; do
    say "agreement, TTFT $ttft ms, ITL 5 ms ± 2 ms: sous"
    start_fake "$ttft" 5 2 "$OUT/injected-sous-delays$ttft.jsonl"; run_sous "delays$ttft" 4 64 64
    say "agreement, TTFT $ttft ms: vllm bench serve"
    start_fake "$ttft" 5 2 "$OUT/injected-vllm-delays$ttft.jsonl"; run_vllm "delays$ttft" 4 64 64
done
stop_fake

python3 - "$OUT" <<'PY' | tee "$OUT/summary.md"
import json, os, sys
out = sys.argv[1]
def load(name):
    path = os.path.join(out, name)
    if not os.path.exists(path):
        return None
    doc = json.load(open(path))
    return doc["levels"][0] if "levels" in doc else doc
def pct(values, p):
    v = sorted(values)
    if not v:
        return None
    r = p / 100 * (len(v) - 1)
    lo = int(r); hi = min(lo + 1, len(v) - 1)
    return v[lo] + (v[hi] - v[lo]) * (r - lo)
def injected(name):
    """What the fake engine was told to do, from its delays log (the ground truth)."""
    path = os.path.join(out, name)
    if not os.path.exists(path):
        return {}
    reqs = [json.loads(l) for l in open(path)]
    ttft = [r["ttft_ms"] for r in reqs]
    itl = [g for r in reqs for g in r["itl_ms"]]
    tpot = [sum(r["itl_ms"]) / len(r["itl_ms"]) for r in reqs if r["itl_ms"]]
    res = {}
    for m, vals in (("ttft", ttft), ("tpot", tpot), ("itl", itl)):
        res[f"mean_{m}_ms"] = sum(vals) / len(vals) if vals else None
        res[f"median_{m}_ms"] = pct(vals, 50)
        res[f"p99_{m}_ms"] = pct(vals, 99)
    return res
fmt = lambda x: "-" if x is None else f"{x:,.2f}"
print("| run | metric | sous bench | vllm bench serve | sous / vllm | injected (sous run) | injected (vllm run) |")
print("|---|---|---|---|---|---|---|")
rows = [("zero-c8", "output_throughput", "output tok/s, 8 streams"),
        ("zero-c32", "output_throughput", "output tok/s, 32 streams")]
for ttft in (20, 200):
    for m in ("ttft", "tpot", "itl"):
        for stat in ("mean", "median", "p99"):
            rows.append((f"delays{ttft}", f"{stat}_{m}_ms", f"{stat} {m.upper()} ms"))
    rows.append((f"delays{ttft}", "output_throughput", "output tok/s"))
worst = {}
for run, key, label in rows:
    s, v = load(f"sous-{run}.json"), load(f"vllm-{run}.json")
    sv = s.get(key) if s else None
    vv = v.get(key) if v else None
    ratio = sv / vv if sv is not None and vv else None
    if run.startswith("delays") and ratio is not None and key != "output_throughput":
        worst[run] = max(worst.get(run, 0.0), abs(ratio - 1))
    i_s, i_v = injected(f"injected-sous-{run}.jsonl").get(key), injected(f"injected-vllm-{run}.jsonl").get(key)
    print(f"| {run} | {label} | {fmt(sv)} | {fmt(vv)} | {'-' if ratio is None else f'{ratio:.3f}'} | {fmt(i_s)} | {fmt(i_v)} |")
for run, w in worst.items():
    print(f"\n{run}: largest TTFT/TPOT/ITL disagreement between the clients {w * 100:.1f} %")
PY
