#!/usr/bin/env bash
# Benchmark: two builds of sous on the same work, in the same run, with hyperfine
# (interleaved rounds, so machine noise hits both alike). For a refactor or any
# change near a hot path: `sous pull` of the SmolLM2 test model from a local mirror
# into a cold cache, and `sous quantize` of it to NVFP4A16 into a fresh directory.
# Results go to benchmarks/build.md by hand, with the date, the machine and both commits.
#
#   scripts/bench/builds.sh OLD_SOUS NEW_SOUS [RUNS]     (default 10 runs each)
#
# Build each binary from its commit as CI does (`cargo build --bin sous`, the dev
# profile), e.g. in a clean clone. Needs the test model (scripts/fetch-test-model.sh)
# and hyperfine (Debian package; installed here if missing and apt-get can).
set -euo pipefail
cd "$(dirname "$0")/../.."
old="${1:?usage: builds.sh OLD_SOUS NEW_SOUS [RUNS]}"
new="${2:?usage: builds.sh OLD_SOUS NEW_SOUS [RUNS]}"
runs="${3:-10}"
for bin in "$old" "$new"; do
  [ -x "$bin" ] || { echo "error: $bin is not an executable" >&2; exit 1; }
done
if ! command -v hyperfine >/dev/null; then
  apt-get install -y -qq hyperfine >/dev/null || { echo "error: install hyperfine" >&2; exit 1; }
fi
repo=HuggingFaceTB/SmolLM2-135M-Instruct
models=target/models
[ -d "$models/$repo" ] || scripts/fetch-test-model.sh
work=$(mktemp -d "${TMPDIR:-/tmp}/sous-bench-builds.XXXXXX")
trap 'kill "$mirror_pid" 2>/dev/null; rm -rf "$work"' EXIT

# One mirror for both builds: the new one serves, so only the client differs.
"$new" hub serve --root "$models" --port 0 --quiet > "$work/url" 2>/dev/null &
mirror_pid=$!
for _ in $(seq 50); do [ -s "$work/url" ] && break; sleep 0.1; done
url=$(head -1 "$work/url")
echo "old: $old ($("$old" --version)); new: $new ($("$new" --version)); mirror $url" >&2

export HF_ENDPOINT="$url" HF_HUB_DISABLE_TELEMETRY=1 NO_COLOR=1
hyperfine --runs "$runs" --warmup 1 --export-markdown "$work/pull.md" \
  --prepare "rm -rf '$work/cache'" \
  -n "old pull" "HF_HUB_CACHE='$work/cache' '$old' pull $repo --quiet" \
  -n "new pull" "HF_HUB_CACHE='$work/cache' '$new' pull $repo --quiet"
hyperfine --runs "$runs" --warmup 1 --export-markdown "$work/quantize.md" \
  --prepare "rm -rf '$work/out'" \
  -n "old quantize" "'$old' quantize '$models/$repo' --out '$work/out' --quiet" \
  -n "new quantize" "'$new' quantize '$models/$repo' --out '$work/out' --quiet"
cat "$work/pull.md" "$work/quantize.md"
