#!/usr/bin/env bash
# Benchmark: how far the native engine's numbers move between the kernel paths of this CPU
# (benchmarks/native.md, "Numbers across kernel paths"; docs/numerics.md says what a path is).
# For every path `sous doctor --json` lists (AVX-512 with and without AVX512-BF16's dot
# product, AVX2, ...), the test model served by the native engine in f32 and in bf16 (the
# shipped recipe's arithmetic), one after the other:
#
#   - the whole built-in text's perplexity (`sous eval --whole`: one window of 2,938
#     tokens, the figure the suite's perplexity test checks);
#   - llama.cpp's windows (512 tokens, the second half scored, top-20 log-probabilities)
#     against the first path in f32, whose bits every path shares: Δ perplexity, KL
#     divergence, top-token agreement;
#   - on a CPU with the dot product, bf16 with it against bf16 without it (the spread the
#     suite's tolerances come from).
#
#   scripts/bench/kernel_paths.sh               # every path but `portable`
#   PORTABLE=1 scripts/bench/kernel_paths.sh    # and `portable` (about 11 minutes a run
#                                               # of the whole text on two cores)
#
# Environment: SOUS (default target/debug/sous), MODELS (default target/models, made by
# scripts/fetch-test-model.sh). Results: target/bench/kernel-paths/<UTC time>/ (one
# eval.json per run, machine.txt, summary.md).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT"
SOUS="${SOUS:-$ROOT/target/debug/sous}"
MODEL_DIR="${MODELS:-$ROOT/target/models}/HuggingFaceTB/SmolLM2-135M-Instruct"
say() { printf 'kernel_paths.sh: %s\n' "$*" >&2; }
die() { printf 'kernel_paths.sh: error: %s\n' "$*" >&2; exit 1; }
[[ -x "$SOUS" ]] || die "no sous at $SOUS (cargo build -p sous)"
[[ -f "$MODEL_DIR/config.json" ]] || die "no model at $MODEL_DIR (scripts/fetch-test-model.sh)"

out="$ROOT/target/bench/kernel-paths/$(date -u +%Y%m%dT%H%M%SZ)"
mkdir -p "$out"
export SOUS_STATE_DIR="$out/state"

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
flags() { grep -m1 '^flags' /proc/cpuinfo | tr ' ' '\n' | grep -xE 'avx2|fma|avx512f|avx512bw|avx512vl|avx512_bf16|avx512_vnni|amx_bf16|sha_ni' | tr '\n' ' '; }
"$SOUS" doctor --json >"$out/doctor.json" 2>/dev/null || true
mapfile -t paths < <(python3 -c '
import json, sys
cpu = json.load(open(sys.argv[1]))["engines"]["native"]["cpu"]
for p in cpu["kernel_paths"]:
    if p != "portable" or sys.argv[2] == "1":
        print(p)
' "$out/doctor.json" "${PORTABLE:-0}")
[[ ${#paths[@]} -gt 0 ]] || die "sous doctor --json listed no kernel path ($out/doctor.json)"
{
    echo "date: $(date -u +%FT%TZ)"
    echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //'), $(nproc) cores"
    echo "flags: $(flags)"
    echo "sous: $(git rev-parse --short HEAD)$(git diff --quiet || echo '+changes')"
    echo "paths: ${paths[*]}"
} | tee "$out/machine.txt" >&2

recipe="$out/recipe.toml"
cat >"$recipe" <<EOF
name = "kernel-paths"
[model]
path = "$MODEL_DIR"
served_name = "smollm2"
[engine]
kind = "native"
[memory]
kv_cache_bytes = "512MiB"
[serving]
max_model_len = 8192
[server]
host = "127.0.0.1"
EOF

# The recipe overrides that serve PATH (`avx512 + bf16 dot`, `avx2`, ...) in DTYPE, as
# the engine reads them: SOUS_KERNELS_ISA and SOUS_BF16_DOT in the engine's environment.
sets() { # PATH DTYPE
    local isa=${1%% *} dot=off
    [[ "$1" == *"bf16 dot"* ]] && dot=on
    printf -- '--set\nserving.dtype=%s\n--set\nenv.SOUS_KERNELS_ISA=%s\n--set\nenv.SOUS_BF16_DOT=%s\n' "$2" "$isa" "$dot"
}
slug() { echo "$1-$2" | tr -c 'a-z0-9\n' '-' | tr -s '-'; }

summary="$out/summary.md"
{
    echo "| arithmetic | path | whole-text perplexity | Δ perplexity (windows) | KL mean | KL p99 | KL max | same top token |"
    echo "|---|---|---:|---:|---:|---:|---:|---:|"
} >"$summary"
reference=("${paths[0]}" float32)
for dtype in float32 bfloat16; do
    for path in "${paths[@]}"; do
        name=$(slug "$dtype" "$path")
        mapfile -t candidate < <(sets "$path" "$dtype")
        mapfile -t baseline < <(sets "${reference[@]}")
        say "$dtype on $path: the whole text"
        "$SOUS" eval --recipe "$recipe" --set "server.port=$(free_port)" "${candidate[@]}" \
            --whole --fresh --json >"$out/$name-whole.json" 2>"$out/$name-whole.log" \
            || die "$name failed ($out/$name-whole.log)"
        say "$dtype on $path: windows against ${reference[*]}"
        "$SOUS" eval --recipe "$recipe" --set "server.port=$(free_port)" "${candidate[@]}" \
            --baseline "$recipe" --baseline-set "server.port=$(free_port)" "${baseline[@]/#--set/--baseline-set}" \
            --fresh --json >"$out/$name-windows.json" 2>"$out/$name-windows.log" \
            || die "$name failed ($out/$name-windows.log)"
        python3 - "$dtype" "$path" "$out/$name-whole.json" "$out/$name-windows.json" >>"$summary" <<'PY'
import json, sys
dtype, path, whole, windows = sys.argv[1:]
ppl = json.load(open(whole))["runs"][0]["perplexity"]["perplexity"]["value"]
c = json.load(open(windows))["comparison"]
print(f"| {dtype} | {path} | {ppl:.6f} | {c['delta_perplexity']['value']:+.6f} | {c['kld_mean']['value']:.7f} "
      f"| {c['kld_p99']:.7f} | {c['kld_max']:.7f} | {100 * c['top1_agreement']['value']:.2f} % |")
PY
    done
done
# bf16 with the dot product against bf16 without it, where the CPU has both.
if [[ "${paths[0]}" == *"bf16 dot"* && ${#paths[@]} -gt 1 ]]; then
    say "bf16: ${paths[0]} against ${paths[1]}"
    mapfile -t candidate < <(sets "${paths[0]}" bfloat16)
    mapfile -t baseline < <(sets "${paths[1]}" bfloat16)
    "$SOUS" eval --recipe "$recipe" --set "server.port=$(free_port)" "${candidate[@]}" \
        --baseline "$recipe" --baseline-set "server.port=$(free_port)" "${baseline[@]/#--set/--baseline-set}" \
        --fresh --json >"$out/dot-against-plain.json" 2>"$out/dot-against-plain.log" \
        || die "the dot product against the f32 kernels failed ($out/dot-against-plain.log)"
    python3 - "${paths[0]}" "${paths[1]}" "$out/dot-against-plain.json" >>"$summary" <<'PY'
import json, sys
dot, plain, windows = sys.argv[1:]
c = json.load(open(windows))["comparison"]
print(f"\nbf16, {dot} against {plain} (windows): Δ perplexity {c['delta_perplexity']['value']:+.6f}, "
      f"KL mean {c['kld_mean']['value']:.7f}, p99 {c['kld_p99']:.7f}, max {c['kld_max']:.7f}, "
      f"same top token {100 * c['top1_agreement']['value']:.2f} %")
PY
fi
cat "$summary"
say "results in $out"
