#!/usr/bin/env bash
# Benchmark: `sous pull` vs huggingface_hub's `snapshot_download` vs plain `curl`, all
# fetching the same files from the same `sous hub serve` mirror on loopback, cold cache
# every run, interleaved so machine noise hits all three alike. Also peak RSS of
# `sous pull`. Results go to BENCHMARKS.md by hand, with the date and machine.
#
#   scripts/bench/pull.sh [ROUNDS]          (default 5)
#
# Needs: the test model (scripts/fetch-test-model.sh), the Python test environment
# (scripts/python-env.sh), curl, GNU time.
set -euo pipefail
cd "$(dirname "$0")/../.."
rounds="${1:-5}"
repo=HuggingFaceTB/SmolLM2-135M-Instruct
models=target/models
[ -d "$models/$repo" ] || scripts/fetch-test-model.sh
scripts/python-env.sh
cargo build --quiet --bin sous
sous="${CARGO_TARGET_DIR:-target}/debug/sous"
python=target/py/bin/python
work=$(mktemp -d)
trap 'kill $mirror_pid 2>/dev/null; rm -rf "$work"' EXIT

"$sous" hub serve --root "$models" --port 0 --quiet > "$work/url" 2>/dev/null &
mirror_pid=$!
for _ in $(seq 50); do [ -s "$work/url" ] && break; sleep 0.1; done
url=$(head -1 "$work/url")
export HF_ENDPOINT="$url" HF_HUB_DISABLE_TELEMETRY=1
files=$(cd "$models/$repo" && ls)
bytes=$(cd "$models/$repo" && cat $files | wc -c)
echo "mirror $url, $repo: $(echo $files | wc -w) files, $bytes bytes, $rounds rounds" >&2

now() { date +%s.%N; }
elapsed() { echo "$2 - $1" | bc -l; }
results="$work/results"
for round in $(seq "$rounds"); do
  rm -rf "$work/c1" "$work/c2" "$work/c3"; sync
  t0=$(now); HF_HUB_CACHE="$work/c1" "$sous" pull "$repo" --quiet > /dev/null; t1=$(now)
  echo "sous $(elapsed $t0 $t1)" >> "$results"
  t0=$(now)
  HF_HUB_CACHE="$work/c2" "$python" -c "from huggingface_hub import snapshot_download; snapshot_download('$repo')" > /dev/null 2>&1
  t1=$(now)
  echo "huggingface_hub $(elapsed $t0 $t1)" >> "$results"
  mkdir -p "$work/c3"
  t0=$(now)
  for f in $files; do curl -sf -o "$work/c3/$f" "$url/$repo/resolve/main/$f"; done
  t1=$(now)
  echo "curl $(elapsed $t0 $t1)" >> "$results"
done
rm -rf "$work/c1"
/usr/bin/time -v env HF_HUB_CACHE="$work/c1" "$sous" pull "$repo" --quiet > /dev/null 2> "$work/time"
rss_kb=$(awk -F: '/Maximum resident set size/ {gsub(/ /, "", $2); print $2}' "$work/time")

python3 - "$results" "$bytes" "$rss_kb" <<'PY'
import statistics, sys
rows = {}
for line in open(sys.argv[1]):
    tool, secs = line.split()
    rows.setdefault(tool, []).append(float(secs))
size = int(sys.argv[2])
med = {t: statistics.median(v) for t, v in rows.items()}
print(f"{'tool':<16} {'median s':>9} {'min s':>7} {'max s':>7} {'MB/s':>8}")
for t in ("sous", "huggingface_hub", "curl"):
    v = rows[t]
    print(f"{t:<16} {med[t]:>9.3f} {min(v):>7.3f} {max(v):>7.3f} {size / 1e6 / med[t]:>8.0f}")
print(f"sous vs huggingface_hub: {med['huggingface_hub'] / med['sous']:.2f}x faster")
print(f"sous vs curl:            {med['curl'] / med['sous'] * 100:.0f}% of curl's throughput")
print(f"sous peak RSS:           {int(sys.argv[3]) / 1024:.1f} MiB")
PY
