#!/usr/bin/env bash
# Benchmark: sous's native CPU engine beside llama.cpp, same model, same precision, same
# machine, same run. For SmolLM2-135M-Instruct (the imported test model):
#
#   prefill tok/s (~512-token prompt, max_tokens=1, prompt_tokens / TTFT, median of 5),
#   single-stream decode tok/s (256 tokens, ignore_eos, temperature 0),
#   aggregate decode tok/s at 1/2/4/8/16 concurrent streams (128-token prompts, 128 tokens
#   each, ignore_eos), the server's peak RSS (VmHWM), and perplexity over
#   scripts/bench/data/alice-chapter1.txt for sous's bf16 model and its NVFP4 model.
#
# The servers run one after another, never together, each on the loopback. The client is
# scripts/bench/native_client.py (standard library only); the table comes from
# scripts/bench/native_compare.py. Results: target/bench/native/<UTC time>/ (one JSON and
# one markdown table per server, and summary.md). benchmarks/native.md is written by hand.
#
#   scripts/bench/native.sh [--precision f32|bf16|q4_0|q4_1] [--peer llama-server|llama-cpp-python|both|none]
#                           [--no-sous] [--quick] [--threads N] [--wait-quiet SECONDS]
#                           [--sous-dtype float32|bfloat16] [--sweep] [--isa native|avx2]
#                           [--rounds N] [--sous-set KEY=VALUE]...
#
# --sous-set passes `--set KEY=VALUE` to every `sous serve` (e.g. memory.kv_cache_dtype=bfloat16).
#
# --rounds N (default 1) measures every server N times, one after another, the order turned
# each round (sous first in odd rounds, the peer first in even ones), so that a minute of a
# busy host does not land on one server alone. The table then gives each measure's median
# over the rounds with its range, the ratio of the medians, and in how many rounds sous was
# ahead of the peer measured beside it in the same round. Perplexities and --sweep run in
# the first round only (they do not vary between rounds).
#
# --isa avx2 runs both sides on AVX2 (with FMA and F16C) alone, as on a CPU without AVX-512:
# sous with SOUS_KERNELS_ISA=avx2, llama.cpp from a second build without its AVX-512
# kernels (llamacpp-setup.sh with GGML_ISA=avx2). The default, native, gives each the
# widest instructions this CPU has.
#
# --sweep also runs `sous bench sweep` against sous's bf16 server and llama-server (16
# requests of 128-token prompts and 128 tokens at 1, 4, 8 and 16 concurrent streams: the
# TTFT p50 of a 128-token prompt, TPOT, output tok/s) and `sous bench compare` of the two
# reports (sweep-compare.md).
#
# On 2 cores every other busy process (a cargo build) distorts the figures badly (llama.cpp's
# threads spin at barriers: a 2-thread llama.cpp beside a 2-job build decodes ~20x slower),
# so --wait-quiet waits up to SECONDS for the 1-minute load average to drop below 0.5
# first; the load before and after each server's run is in its results either way.
#
# Same precision. --precision f32, the default: sous computes in f32 from the bf16 weights
# with an f32 KV cache (`--set serving.dtype=float32`) beside the F32 GGUF (the same bf16
# weights, widened exactly) with an f32 KV cache. --precision bf16: the recipe as shipped
# (bf16 arithmetic, bf16 KV cache) beside the BF16 GGUF with a bf16 KV cache. --sous-dtype
# overrides sous's `serving.dtype` alone, its cache following (e.g. --precision bf16
# --sous-dtype float32: f32 arithmetic and cache beside llama.cpp's BF16 GGUF). --precision q4_0 and q4_1 serve a 4-bit GGUF (quantized from the
# F32 one by llama-quantize) with a bf16 KV cache: llama.cpp's 4-bit weights beside sous's
# NVFP4 recipe as shipped (bf16 arithmetic, bf16 KV cache).
#
# llama.cpp peers (built by scripts/bench/llamacpp-setup.sh from the llama-cpp-python
# sdist; the first run compiles llama.cpp, about 10 minutes on 2 cores, and needs
# CONVERT_PYTHON, a Python with torch, for the GGUF conversion):
#   llama-server       llama.cpp's own server: -np 16 slots, continuous batching, a KV
#                      cache of 16 x 640 tokens (-c 10240 --no-kv-unified: each slot its
#                      own 640 tokens, enough for the ~520-token prefill prompt and for
#                      128 + 256 tokens), host prompt cache off (--cache-ram 0). Honours
#                      ignore_eos. The default peer. (--kv-unified, one shared cache,
#                      decodes 40 % slower here: a slot attends over the cells every
#                      finished request left behind.)
#   llama-cpp-python   `python -m llama_cpp.server`: one Llama object behind a lock, so it
#                      serves one request at a time (concurrent streams queue); no
#                      ignore_eos field, so EOS ids 0 and 2 get logit_bias -100.
# llama.cpp's perplexity over the same text comes from scripts/bench/llamacpp_perplexity.py
# (in-process, logits for every position; transformers gives 17.988 on the bf16 model).
#
# Environment: SOUS (the sous binary, default target/debug/sous: the one optimized build
# profile of the workspace), MODELS (the mirror's root, default target/models), CONVERT_PYTHON (see
# above), THREADS (default: nproc), PORT (first port to use, default 18400), GGML_AMX
# (passed to llamacpp-setup.sh: off builds llama.cpp without its AMX kernels).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT"

PRECISION=f32
SOUS_DTYPE=""
ISA=native
PEER=llama-server
RUN_SOUS=1
QUICK=0
SWEEP=0
ROUNDS=1
SOUS_SETS=()
WAIT_QUIET=0
THREADS="${THREADS:-$(nproc)}"
PORT="${PORT:-18400}"
SOUS="${SOUS:-$ROOT/target/debug/sous}"
MODELS="${MODELS:-$ROOT/target/models}"
MODEL_NAME=smollm2-135m
PPL_TEXT="$ROOT/scripts/bench/data/alice-chapter1.txt"
EOS_IDS="0,2" # <|endoftext|>, <|im_end|> in SmolLM2's vocabulary

while [[ $# -gt 0 ]]; do
    case "$1" in
        --precision) PRECISION="$2"; shift 2 ;;
        --sous-dtype) SOUS_DTYPE="$2"; shift 2 ;;
        --peer) PEER="$2"; shift 2 ;;
        --no-sous) RUN_SOUS=0; shift ;;
        --quick) QUICK=1; shift ;;
        --sweep) SWEEP=1; shift ;;
        --rounds) ROUNDS="$2"; shift 2 ;;
        --sous-set) SOUS_SETS+=(--set "$2"); shift 2 ;;
        --threads) THREADS="$2"; shift 2 ;;
        --wait-quiet) WAIT_QUIET="$2"; shift 2 ;;
        --isa) ISA="$2"; shift 2 ;;
        -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        *) echo "native.sh: unknown argument $1" >&2; exit 2 ;;
    esac
done
case "$PRECISION" in f32|bf16|q4_0|q4_1) ;; *) echo "native.sh: --precision is f32, bf16, q4_0 or q4_1" >&2; exit 2 ;; esac
case "$PEER" in llama-server|llama-cpp-python|both|none) ;; *) echo "native.sh: bad --peer $PEER" >&2; exit 2 ;; esac
[[ "$ROUNDS" =~ ^[1-9][0-9]*$ ]] || { echo "native.sh: --rounds is a whole number of at least 1, not '$ROUNDS'" >&2; exit 2; }
case "$ISA" in
    native) ;;
    avx2)
        grep -qw avx2 /proc/cpuinfo || { echo "native.sh: this CPU has no AVX2" >&2; exit 2; }
        [[ "$PEER" != llama-cpp-python && "$PEER" != both ]] \
            || { echo "native.sh: --isa avx2 is for the llama-server peer (llama-cpp-python keeps the native build)" >&2; exit 2; }
        export SOUS_KERNELS_ISA=avx2 GGML_ISA=avx2 ;;
    *) echo "native.sh: --isa is native or avx2" >&2; exit 2 ;;
esac

say() { printf 'native.sh: %s\n' "$*" >&2; }
die() { printf 'native.sh: error: %s\n' "$*" >&2; exit 1; }

if [[ "$WAIT_QUIET" -gt 0 ]]; then
    deadline=$(( $(date +%s) + WAIT_QUIET ))
    while awk '{exit !($1 >= 0.5)}' /proc/loadavg && [[ $(date +%s) -lt $deadline ]]; do
        say "waiting for a quiet machine (load $(cut -d' ' -f1 /proc/loadavg))"
        sleep 15
    done
    awk '{exit !($1 >= 0.5)}' /proc/loadavg && say "warning: still busy (load $(cut -d' ' -f1-3 /proc/loadavg)): figures will be low"
fi

OUT="$ROOT/target/bench/native/$(date -u +%Y%m%dT%H%M%SZ)"
mkdir -p "$OUT"
say "results in $OUT"
{
    echo "date: $(date -u +%Y-%m-%dT%H:%MZ)"
    echo "cpu: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores, $(free -g | awk '/Mem:/ {print $2}') GiB"
    echo "precision: $PRECISION${SOUS_DTYPE:+ (sous: $SOUS_DTYPE)}, threads: $THREADS${SOUS_SETS[*]:+, sous: ${SOUS_SETS[*]}}, rounds: $ROUNDS"
    echo "instructions: $ISA ($(grep -m1 '^flags' /proc/cpuinfo | tr ' ' '\n' | grep -E '^(avx2|avx512f|avx512_vnni|avx512_bf16|amx_tile)$' | tr '\n' ' ')on this CPU)"
    echo "load before: $(cut -d' ' -f1-3 /proc/loadavg)"
} > "$OUT/machine.txt"

CLIENT_ARGS=()
[[ "$QUICK" == 1 ]] && CLIENT_ARGS=(--prefill-reps 2 --decode-reps 1 --decode-tokens 64 --levels 1,4)

SERVER_PID=""
stop_server() {
    if [[ -n "$SERVER_PID" ]] && kill -0 "$SERVER_PID" 2>/dev/null; then
        kill "$SERVER_PID" 2>/dev/null || true
        for _ in $(seq 50); do kill -0 "$SERVER_PID" 2>/dev/null || break; sleep 0.2; done
        kill -9 "$SERVER_PID" 2>/dev/null || true
        wait "$SERVER_PID" 2>/dev/null || true
    fi
    SERVER_PID=""
}
trap 'stop_server; stop_hub' EXIT

# Waits until GET $1 answers 200, or the server process is gone, or $2 seconds pass.
wait_http_200() {
    local url="$1" limit="${2:-300}" i
    for ((i = 0; i < limit * 5; i++)); do
        [[ "$(curl -s -o /dev/null -w '%{http_code}' "$url" || true)" == 200 ]] && return 0
        kill -0 "$SERVER_PID" 2>/dev/null || return 1
        sleep 0.2
    done
    return 1
}

# With --sweep: `sous bench sweep` against the server on $PORT into $OUT/sweep-$1.
run_sweep() {
    [[ "$SWEEP" == 1 ]] || return 0
    "$SOUS" bench sweep --url "http://127.0.0.1:$PORT" --model "$MODEL_NAME" \
        --tokenizer "$MODELS/HuggingFaceTB/SmolLM2-135M-Instruct" --concurrency 1,4,8,16 \
        --requests 16 --input-len 128 --output-len 128 --seed 1 --salt 1 --label "$1" \
        --out "$OUT/sweep-$1" > "$OUT/sweep-$1.log" 2>&1 || say "sweep of $1 failed (log: $OUT/sweep-$1.log)"
}

# ---------------------------------------------------------------------------------------
# sous native engine: `sous serve --recipe` exactly as a user runs it. The model comes from
# a local Hub mirror of target/models (MODELS) into a Hub cache under target/bench/, so the
# NVFP4 recipe pulls and quantizes once and later runs reuse both.
# shellcheck source=scripts/bench/hub.sh
source "$ROOT/scripts/bench/hub.sh"

start_sous() {
    local recipe="${1:-recipes/local/smollm2-135m.toml}"
    [[ -x "$SOUS" ]] || { say "no sous binary at $SOUS (set SOUS=...)"; return 1; }
    start_hub
    local sets=()
    [[ "$PRECISION" == f32 ]] && sets=(--set serving.dtype=float32)
    [[ -n "$SOUS_DTYPE" ]] && sets+=(--set serving.dtype="$SOUS_DTYPE")
    "$SOUS" serve --recipe "$recipe" --set server.port="$PORT" "${sets[@]}" "${SOUS_SETS[@]}" \
        > "$OUT/sous-$(basename "$recipe" .toml).log" 2>&1 &
    SERVER_PID=$!
    wait_http_200 "http://127.0.0.1:$PORT/health" 600 || { say "sous did not come up (log: $OUT/sous-*.log)"; stop_server; return 1; }
}
# ---------------------------------------------------------------------------------------

start_llama_server() {
    local gguf="$1" kv="$2"
    "$LLAMA_SERVER" -m "$gguf" --host 127.0.0.1 --port "$PORT" -a "$MODEL_NAME" \
        -t "$THREADS" -tb "$THREADS" -c 10240 -np 16 --no-kv-unified --cont-batching \
        -ctk "$kv" -ctv "$kv" --cache-ram 0 --no-webui > "$OUT/llama-server.log" 2>&1 &
    SERVER_PID=$!
    wait_http_200 "http://127.0.0.1:$PORT/health" 300 || die "llama-server did not come up (log: $OUT/llama-server.log)"
}

start_llama_cpp_python() {
    local gguf="$1" log="$2"
    "$LLAMACPP_PYTHON" -m llama_cpp.server --model "$gguf" --model_alias "$MODEL_NAME" --host 127.0.0.1 \
        --port "$PORT" --n_threads "$THREADS" --n_threads_batch "$THREADS" --n_ctx 4096 \
        --interrupt_requests False --verbose False > "$log" 2>&1 &
    SERVER_PID=$!
    wait_http_200 "http://127.0.0.1:$PORT/v1/models" 300 || die "llama_cpp.server did not come up (log: $log)"
}

results=()

# The results of round $2 of server label $1: `label.json` alone, `label.rN.json` with
# --rounds.
result_file() {
    if [[ "$ROUNDS" == 1 ]]; then echo "$OUT/$1.json"; else echo "$OUT/$1.r$2.json"; fi
}

# ", round R of N" with --rounds, nothing without.
of_rounds() {
    [[ "$ROUNDS" == 1 ]] || echo ", round $1 of $ROUNDS"
}

# Runs the client against the server on $PORT into round $2's file of label $1; the rest
# goes to native_client.py.
run_round_client() {
    local label="$1" round="$2"; shift 2
    python3 scripts/bench/native_client.py --base-url "http://127.0.0.1:$PORT" --model "$MODEL_NAME" \
        --label "$label" --server-pid "$SERVER_PID" --out "$(result_file "$label" "$round")" \
        --markdown "$(result_file "$label" "$round" | sed 's/\.json$/.md/')" "${CLIENT_ARGS[@]}" "$@"
    results+=("$(result_file "$label" "$round")")
}

# 1. sous, round $1 (perplexity and sweep in the first round alone).
sous_round() {
    local round="$1" ppl=() nvfp4=()
    [[ "$round" == 1 ]] && ppl=(--perplexity "$PPL_TEXT")
    local compute="bf16 compute, as shipped"
    [[ "$PRECISION" == f32 ]] && compute="f32 compute"
    [[ -n "$SOUS_DTYPE" ]] && compute="serving.dtype $SOUS_DTYPE"
    say "sous native, bf16 weights ($compute)$(of_rounds "$round")"
    if start_sous recipes/local/smollm2-135m.toml; then
        run_round_client "sous-bf16" "$round" "${ppl[@]}"
        [[ "$round" == 1 ]] && run_sweep "sous-bf16"
        stop_server
        # Beside a 4-bit GGUF the NVFP4 model is measured in full; otherwise its
        # perplexity only (first round).
        if [[ "$PRECISION" == q4_* ]]; then
            nvfp4=("${ppl[@]}")
        elif [[ "$round" == 1 ]]; then
            nvfp4=(--only-perplexity --perplexity "$PPL_TEXT")
        else
            return 0
        fi
        say "sous native, NVFP4 weights"
        if start_sous recipes/local/smollm2-135m-nvfp4.toml; then
            run_round_client "sous-nvfp4" "$round" "${nvfp4[@]}"
            stop_server
        fi
    else
        say "sous skipped: it did not start"
    fi
}

# 2. llama.cpp, round $1.
peer_round() {
    local round="$1"
    if [[ "$PEER" == llama-server || "$PEER" == both ]]; then
        say "llama.cpp llama-server, $PREC_UPPER GGUF, $KV KV cache$(of_rounds "$round")"
        start_llama_server "$GGUF" "$KV"
        run_round_client "llama-server-$PRECISION" "$round"
        [[ "$round" == 1 ]] && run_sweep "llama-server-$PRECISION"
        stop_server
    fi
    if [[ "$PEER" == llama-cpp-python || "$PEER" == both ]]; then
        say "llama-cpp-python llama_cpp.server, $PREC_UPPER GGUF$(of_rounds "$round")"
        start_llama_cpp_python "$GGUF" "$OUT/llama-cpp-python.log"
        run_round_client "llama-cpp-python-$PRECISION" "$round" --no-ignore-eos-field --eos-logit-bias "$EOS_IDS"
        stop_server
    fi
}

if [[ "$PEER" != none ]]; then
    setup="$(scripts/bench/llamacpp-setup.sh)" || die "llama.cpp set-up failed"
    eval "$setup"
    case "$PRECISION" in
        f32) GGUF="$GGUF_F32"; KV=f32 ;;
        bf16) GGUF="$GGUF_BF16"; KV=bf16 ;;
        q4_0) GGUF="$GGUF_Q4_0"; KV=bf16 ;;
        q4_1) GGUF="$GGUF_Q4_1"; KV=bf16 ;;
    esac
    PREC_UPPER="$(echo "$PRECISION" | tr a-z A-Z)"
fi

# sous first in odd rounds (so a failure to start shows before the long peer runs), the
# peer first in even ones.
for ((round = 1; round <= ROUNDS; round++)); do
    if ((round % 2 == 1)); then
        [[ "$RUN_SOUS" == 1 ]] && sous_round "$round"
        [[ "$PEER" != none ]] && peer_round "$round"
    else
        [[ "$PEER" != none ]] && peer_round "$round"
        [[ "$RUN_SOUS" == 1 ]] && sous_round "$round"
    fi
done

if [[ "$PEER" != none ]]; then
    # llama.cpp's perplexity over the same text, in-process (no llama.cpp server returns
    # correct prompt logprobs for a BOS-less prompt: see llamacpp_perplexity.py).
    say "llama.cpp perplexity ($PREC_UPPER GGUF, llama-cpp-python with logits_all)"
    "$LLAMACPP_PYTHON" scripts/bench/llamacpp_perplexity.py "$GGUF" "$PPL_TEXT" --threads "$THREADS" \
        --label "llama.cpp-ppl-$PRECISION" --out "$OUT/llama-cpp-ppl-$PRECISION.json" > /dev/null
    results+=("$OUT/llama-cpp-ppl-$PRECISION.json")
fi

echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)" >> "$OUT/machine.txt"
[[ ${#results[@]} -gt 0 ]] || die "nothing was measured"
compare=(--machine "$OUT/machine.txt")
# Beside a 4-bit GGUF the ratios are the NVFP4 model's.
[[ "$PRECISION" == q4_* ]] && compare+=(--sous sous-nvfp4)
python3 scripts/bench/native_compare.py "${compare[@]}" "${results[@]}" | tee "$OUT/summary.md"
if [[ "$SWEEP" == 1 && -f "$OUT/sweep-sous-bf16/sweep.json" && -f "$OUT/sweep-llama-server-$PRECISION/sweep.json" ]]; then
    "$SOUS" bench compare "$OUT/sweep-llama-server-$PRECISION/sweep.json" "$OUT/sweep-sous-bf16/sweep.json" \
        | tee "$OUT/sweep-compare.md"
fi
