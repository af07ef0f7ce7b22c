# Sourced by the benchmark scripts that serve a recipe with sous (native.sh, vllm-cpu.sh):
# a local Hub mirror of MODELS on loopback, and a Hub cache, sous cache and state under
# target/bench/, so a recipe's `sous pull` (and an NVFP4 recipe's quantization) happens
# once and later runs reuse it. Needs SOUS, MODELS, ROOT, OUT and a `die` function.
HUB_PID=""
start_hub() {
    [[ -n "$HUB_PID" ]] && return 0
    local url_file="$OUT/hub.url"
    "$SOUS" hub serve --root "$MODELS" --port 0 > "$url_file" 2> "$OUT/hub.log" &
    HUB_PID=$!
    for _ in $(seq 100); do [[ -s "$url_file" ]] && break; sleep 0.1; done
    [[ -s "$url_file" ]] || die "sous hub serve did not start (log: $OUT/hub.log)"
    export HF_ENDPOINT="$(head -n1 "$url_file")"
    export HF_HUB_CACHE="$ROOT/target/bench/hub-cache" SOUS_CACHE_DIR="$ROOT/target/bench/sous-cache"
    export SOUS_STATE_DIR="$ROOT/target/bench/state"
}
stop_hub() { if [[ -n "$HUB_PID" ]]; then kill "$HUB_PID" 2>/dev/null || true; fi; HUB_PID=""; }
