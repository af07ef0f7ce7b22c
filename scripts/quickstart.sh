#!/usr/bin/env bash
# The README's main job, on a fresh Linux machine with a Rust toolchain: fetch the
# SmolLM2 test model, build sous, and run the shipped recipe
# recipes/local/smollm2-135m-nvfp4.toml with the built-in native engine on this CPU:
# `sous serve` pulls the model from a local Hub mirror (nothing reaches huggingface.co),
# quantizes it to NVFP4, serves it, and one chat request gets its answer. Everything it
# writes stays under target/quickstart/; a second run reuses the pull and the checkpoint.
#
# Environment: PORT (default 8000), CARGO_TARGET_DIR.
set -euo pipefail
cd "$(dirname "$0")/.."

port="${PORT:-8000}"
work="$PWD/target/quickstart"
mkdir -p "$work"

cargo build --bin sous
sous="${CARGO_TARGET_DIR:-target}/debug/sous"
SOUS_BIN="$sous" scripts/fetch-test-model.sh

pids=()
cleanup() {
    for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
    wait 2>/dev/null || true
}
trap cleanup EXIT

# A local Hub serving target/models; it prints its URL once listening.
"$sous" hub serve --root target/models --port 0 >"$work/hub.url" 2>"$work/hub.log" &
pids+=($!)
for _ in $(seq 100); do [ -s "$work/hub.url" ] && break; sleep 0.1; done
[ -s "$work/hub.url" ] || { cat "$work/hub.log" >&2; exit 1; }

export HF_ENDPOINT="$(head -n1 "$work/hub.url")"
export HF_HUB_CACHE="$work/hub-cache" SOUS_CACHE_DIR="$work/sous-cache" SOUS_STATE_DIR="$work/state"
"$sous" serve --recipe recipes/local/smollm2-135m-nvfp4.toml --set "server.port=$port" &
pids+=($!)
for _ in $(seq 600); do
    curl -fs "http://127.0.0.1:$port/health" >/dev/null 2>&1 && break
    kill -0 "${pids[1]}" 2>/dev/null || { echo "quickstart: sous serve exited" >&2; exit 1; }
    sleep 0.5
done

request='{"model": "smollm2-135m", "messages": [{"role": "user", "content": "What is the capital of France?"}], "max_tokens": 32, "temperature": 0}'
echo "quickstart: POST /v1/chat/completions $request" >&2
curl -fsS "http://127.0.0.1:$port/v1/chat/completions" -H 'Content-Type: application/json' -d "$request" |
    python3 -c 'import json, sys; print(json.load(sys.stdin)["choices"][0]["message"]["content"])'
