#!/usr/bin/env bash
# Benchmark: does `sous bench sweep --request-rate` offer the load it is asked for?
# Against the fake engine (tests/fake-engine) on loopback:
#
#   1. a fast server (TTFT 2 ms, ITL 1 ms, 4 tokens): rates 5, 10, 20, 40 and inf,
#      Poisson arrivals (burstiness 1): completed requests/s against the rate offered;
#   2. the same server at 20 requests/s with burstiness 0.5 and 4: the same mean rate,
#      burstier or more even arrivals (the most requests in flight shows it);
#   3. a slow server (TTFT 60 ms) behind --max-concurrency 1: the cap holds one request
#      in flight, so the rate achieved stays under 1 / 60 ms whatever is offered, and
#      TTFT (timed from sending, as vLLM times it) does not include the wait.
#
#   scripts/bench/open-loop.sh
#
#   4. with VLLM set (a `vllm` executable), `vllm bench serve --request-rate` against the
#      same servers, level by level, and a table of both clients' figures side by side.
#
# Environment: SOUS (default target/debug/sous), FAKE (default target/debug/fake-engine),
# TOKENIZER (default the SmolLM2 test model), REQUESTS per level (default 100), VLLM
# (default: `vllm` on PATH; without one only sous runs).
# Results: target/bench/open-loop/<UTC time>/ (each sweep's JSON, summary.md).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT"
SOUS="${SOUS:-$ROOT/target/debug/sous}"
FAKE="${FAKE:-$ROOT/target/debug/fake-engine}"
TOKENIZER="${TOKENIZER:-$ROOT/target/models/HuggingFaceTB/SmolLM2-135M-Instruct}"
REQUESTS="${REQUESTS:-100}"
VLLM="${VLLM:-$(command -v vllm || true)}"
PORT="${PORT:-18510}"

say() { printf 'open-loop.sh: %s\n' "$*" >&2; }
die() { printf 'open-loop.sh: error: %s\n' "$*" >&2; exit 1; }
[[ -x "$SOUS" ]] || die "no sous at $SOUS (cargo build -p sous)"
[[ -x "$FAKE" ]] || die "no fake engine at $FAKE (cargo build -p sous-fake-engine)"
[[ -f "$TOKENIZER/tokenizer.json" ]] || die "no tokenizer at $TOKENIZER (scripts/fetch-test-model.sh)"

OUT="$ROOT/target/bench/open-loop/$(date -u +%Y%m%dT%H%M%SZ)"
mkdir -p "$OUT/model"
say "results in $OUT"

FAKE_PID=""
stop_fake() { if [[ -n "$FAKE_PID" ]]; then kill "$FAKE_PID" 2>/dev/null || true; wait "$FAKE_PID" 2>/dev/null || true; fi; FAKE_PID=""; }
trap stop_fake EXIT
start_fake() { # TTFT_MS ITL_MS
    stop_fake
    FAKE_TTFT_MS="$1" FAKE_ITL_MS="$2" FAKE_LOAD_SECS=0 \
        "$FAKE" serve "$OUT/model" --port "$PORT" --served-model-name fake >"$OUT/fake.log" 2>&1 &
    FAKE_PID=$!
    for _ in $(seq 100); do (exec 3<>"/dev/tcp/127.0.0.1/$PORT") 2>/dev/null && return 0; sleep 0.05; done
    die "the fake engine did not start (log: $OUT/fake.log)"
}
sweep() { # NAME ARGS...
    local name="$1"; shift
    "$SOUS" bench sweep --url "http://127.0.0.1:$PORT" --tokenizer "$TOKENIZER" --seed 0 --salt 1 \
        --requests "$REQUESTS" --input-len 16 --output-len 4 --percentiles 50,99 --json "$@" \
        >"$OUT/$name.json" 2>"$OUT/$name.log"
}

start_fake 2 1
say "fast server: rates 5,10,20,40,inf"
sweep poisson --request-rate 5,10,20,40,inf
say "fast server: 20/s, burstiness 0.5 and 4"
sweep bursty --request-rate 20 --burstiness 0.5
sweep even --request-rate 20 --burstiness 4
start_fake 60 1
say "slow server (TTFT 60 ms), at most 1 in flight: rates 10,20,40"
sweep capped --request-rate 10,20,40 --max-concurrency 1

vllm_level() { # NAME RATE BURSTINESS [CAP]
    [[ -n "$VLLM" ]] || return 0
    local cap=()
    [[ -n "${4:-}" ]] && cap=(--max-concurrency "$4")
    (cd "$OUT" && "$VLLM" bench serve --backend openai --base-url "http://127.0.0.1:$PORT" \
        --endpoint /v1/completions --model fake --tokenizer "$TOKENIZER" --dataset-name random \
        --random-input-len 16 --random-output-len 4 --num-prompts "$REQUESTS" --ignore-eos \
        --request-rate "$2" --burstiness "$3" "${cap[@]}" --percentile-metrics ttft,e2el \
        --metric-percentiles 50,99 --seed 0 --save-result --result-dir "$OUT" \
        --result-filename "vllm-$1.json") >"$OUT/vllm-$1.log" 2>&1 || die "vllm bench serve failed: $OUT/vllm-$1.log"
}
if [[ -n "$VLLM" ]]; then
    say "vllm bench serve, the same levels"
    for r in 10 20 40; do vllm_level "capped-$r" "$r" 1 1; done
    start_fake 2 1
    for r in 5 10 20 40; do vllm_level "poisson-$r" "$r" 1; done
    vllm_level "bursty-20" 20 0.5
    vllm_level "even-20" 20 4
else
    say "no vllm executable (set VLLM=...): sous only"
fi
stop_fake

python3 - "$OUT" <<'PY' | tee "$OUT/summary.md"
import json, os, sys
out = sys.argv[1]
print("| run | request_rate | burstiness | max_concurrency | requests | duration s | request_throughput | peak in flight | median / p99 TTFT ms |")
print("|---|---|---|---|---|---|---|---|---|")
for name in ("poisson", "bursty", "even", "capped"):
    for l in json.load(open(os.path.join(out, f"{name}.json")))["levels"]:
        cap = "null" if l["max_concurrency"] is None else l["max_concurrency"]
        print(f"| {name} | {l['request_rate']} | {l['burstiness']} | {cap} | {l['completed']}/{l['num_prompts']} "
              f"| {l['duration']:.3f} | {l['request_throughput']:.2f} | {l['peak_in_flight']} "
              f"| {l['median_ttft_ms']:.1f} / {l['p99_ttft_ms']:.1f} |")
PY

[[ -n "$VLLM" ]] && python3 - "$OUT" <<'PY' | tee -a "$OUT/summary.md"
import json, os, sys
out = sys.argv[1]
levels = {}
for name in ("poisson", "bursty", "even", "capped"):
    for l in json.load(open(os.path.join(out, f"{name}.json")))["levels"]:
        tag = {"poisson": "poisson", "bursty": "bursty", "even": "even", "capped": "capped"}[name]
        if l["request_rate"] != "inf":
            levels[f"{tag}-{l['request_rate']:g}"] = l
print()
print("| level | client | duration s | request_throughput | max_concurrent_requests | median / p99 TTFT ms | median E2EL ms |")
print("|---|---|---|---|---|---|---|")
for key, s in levels.items():
    path = os.path.join(out, f"vllm-{key}.json")
    if not os.path.exists(path):
        continue
    v = json.load(open(path))
    for client, l in (("sous", s), ("vllm", v)):
        print(f"| {key} | {client} | {l['duration']:.3f} | {l['request_throughput']:.2f} | {l.get('max_concurrent_requests', '-')} "
              f"| {l['median_ttft_ms']:.1f} / {l['p99_ttft_ms']:.1f} | {l['median_e2el_ms']:.1f} |")
    print(f"| {key} | sous / vllm | {s['duration'] / v['duration']:.3f} | {s['request_throughput'] / v['request_throughput']:.3f} | | "
          f"{s['median_ttft_ms'] / v['median_ttft_ms']:.3f} | {s['median_e2el_ms'] / v['median_e2el_ms']:.3f} |")
PY
