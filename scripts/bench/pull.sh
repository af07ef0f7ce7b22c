#!/usr/bin/env bash
# Benchmark: `sous pull` vs huggingface_hub's `snapshot_download` vs plain `curl`, all
# fetching the same files from the same `sous hub serve` mirror on loopback, cold cache
# every run, interleaved (each round in another order, see `williams`) so machine noise
# and what ran before hit all of them alike. The mirror lists each
# LFS file's Xet hash (--xet-hash), as the Hub does for files in Xet storage; the
# mirror does not speak the Xet transfer protocol, so huggingface_hub runs with
# HF_HUB_DISABLE_XET=1 (plain HTTP, as from any mirror). `sous pull` runs four
# times per round: as a user runs it (checking the Xet hash, which needs no SHA
# extensions, and writing the weights past the page cache), the same with
# SOUS_PULL_IO=buffered (every file through the page cache), with SOUS_VERIFY=sha256
# (the sha256 with what this CPU has: a repository the Hub gives no Xet hash for), and
# with SOUS_VERIFY=sha256 SOUS_SHA256=portable (the sha256 without CPU extensions: what
# such a repository costs on a CPU without SHA-NI).
# On a CPU with SHA-NI that offers CPUID faulting (`cpuid_fault`), a fifth: with
# SOUS_VERIFY=sha256 under scripts/bench/no-sha-ni.c (LD_PRELOAD), which hides SHA-NI
# from CPUID, so that every SHA-256 in the process takes the path of a CPU without it
# (`ring`'s AVX code, which `sous` picks there) at this core's speed. Also peak RSS of
# `sous pull`. Results go to benchmarks/pull.md by hand, with the date and machine.
#
#   scripts/bench/pull.sh [ROUNDS] [BIG_GIB] [BIG_ROUNDS]
#
# ROUNDS (default 5) rounds over the SmolLM2 test model. With BIG_GIB (e.g. 8), also a
# generated repository of BIG_GIB GiB in 4 shards (target/test-hub/acme/bigNg, made
# by the e2e test helper, ~2 x BIG_GIB of disk while it runs): first the e2e test that
# kills a pull at half way and resumes it (bytes fetched twice, peak RSS), then
# BIG_ROUNDS (default 2) interleaved rounds of the pulls.
#
# Needs: the test model (scripts/fetch-test-model.sh), the Python test environment
# (scripts/python-env.sh), curl, GNU time.
set -euo pipefail
cd "$(dirname "$0")/../.."
rounds="${1:-5}"
big="${2:-}"
big_rounds="${3:-2}"
models=target/models
[ -d "$models/HuggingFaceTB/SmolLM2-135M-Instruct" ] || scripts/fetch-test-model.sh
scripts/python-env.sh
cargo build --quiet --bin sous --example sha256_speed
sous="${CARGO_TARGET_DIR:-target}/debug/sous"
python=target/py/bin/python
work=$(mktemp -d "${TMPDIR:-/tmp}/sous-pull-bench.XXXXXX")
mirror_pid=
trap 'kill $mirror_pid 2>/dev/null || true; rm -rf "$work"' EXIT

echo "CPU: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//'); SHA-NI: $(grep -qw sha_ni /proc/cpuinfo && echo yes || echo no); $(nproc) cores" >&2
echo "sous pull hashes with: $("$sous" --version 2>/dev/null | head -1); $(target/debug/examples/sha256_speed 64 1 2>/dev/null | head -1 || true)" >&2

# The no-SHA-NI variant, where it means something and can run.
no_sha_ni=
if grep -qw sha_ni /proc/cpuinfo && grep -qw cpuid_fault /proc/cpuinfo && command -v cc > /dev/null; then
  mkdir -p target/bench
  cc -O2 -shared -fPIC -o target/bench/no-sha-ni.so scripts/bench/no-sha-ni.c
  no_sha_ni="$PWD/target/bench/no-sha-ni.so"
  echo "with SHA-NI hidden: $(LD_PRELOAD="$no_sha_ni" target/debug/examples/sha256_speed 64 1 2>/dev/null | head -1 || true)" >&2
fi

start_mirror() { # ROOT
  kill $mirror_pid 2>/dev/null || true
  rm -f "$work/url"
  "$sous" hub serve --root "$1" --port 0 --quiet --xet-hash > "$work/url" 2>/dev/null &
  mirror_pid=$!
  for _ in $(seq 100); do [ -s "$work/url" ] && break; sleep 0.1; done
  url=$(head -1 "$work/url")
  export HF_ENDPOINT="$url" HF_HUB_DISABLE_TELEMETRY=1
}

# williams ROUND N: the tools' order in round ROUND, a row of a Williams design for N
# tools (0, 1, N-1, 2, N-2, ... shifted by the round; with N odd, the second N rounds
# run reversed): over N rounds (2N when N is odd) each tool runs right after every other
# one exactly once.
williams() {
  local round=$1 n=$2 base=(0) low=1 high=$(($2 - 1)) row=()
  while [ ${#base[@]} -lt "$n" ]; do
    base+=($low); low=$((low + 1))
    [ ${#base[@]} -lt "$n" ] && { base+=($high); high=$((high - 1)); }
  done
  for b in "${base[@]}"; do row+=($(((b + round) % n))); done
  if [ $((n % 2)) -eq 1 ] && [ $((round / n % 2)) -eq 1 ]; then
    local reversed=()
    for ((i = n - 1; i >= 0; i--)); do reversed+=("${row[$i]}"); done
    row=("${reversed[@]}")
  fi
  echo "${row[@]}"
}

now() { date +%s.%N; }
elapsed() { echo "$2 - $1" | bc -l; }

# bench LABEL ROOT REPO ROUNDS: interleaved rounds of the pulls into empty caches.
bench() {
  local label=$1 root=$2 repo=$3 n=$4
  start_mirror "$root"
  local files bytes
  files=$(cd "$root/$repo" && find . -type f -not -path './.*' -printf '%P\n' | sort)
  bytes=$(cd "$root/$repo" && cat $files | wc -c)
  echo "$label: $repo, $(echo $files | wc -w) files, $bytes bytes, $n rounds, mirror $url" >&2
  # The mirror indexes (hashes) the repository on its first request: not timed.
  curl -sf "$url/api/models/$repo" > /dev/null
  echo "$label bytes $bytes" >> "$work/results"
  local variants=(sous sous-buffered sous-sha256 sous-sha256-portable huggingface_hub curl)
  [ -n "$no_sha_ni" ] && variants+=(sous-sha256-no-sha-ni)
  for round in $(seq 0 $((n - 1))); do
    # Each round runs the tools in another order of a Williams design, so that no tool
    # always runs first nor always after the same one: what ran before a pull moves its
    # time (a pull after huggingface_hub's, whose files were just deleted, ran up to
    # 1.6 times as long on the Zen 5 of benchmarks/pull.md), and so do the host's minutes.
    local order=()
    for i in $(williams "$round" ${#variants[@]}); do order+=("${variants[$i]}"); done
    echo "$label round $((round + 1)): ${order[*]}" >&2
    for variant in "${order[@]}"; do
      rm -rf "$work/c"; sync; echo 3 > /proc/sys/vm/drop_caches 2>/dev/null || true
      # The source files stay hot: the mirror serves from the page cache, as a CDN
      # serves from memory; only the client side is measured.
      cat $(cd "$root/$repo" && printf "$root/$repo/%s " $files) > /dev/null
      t0=$(now)
      case $variant in
        sous) HF_HUB_CACHE="$work/c" "$sous" pull "$repo" --quiet > /dev/null ;;
        sous-buffered) SOUS_PULL_IO=buffered HF_HUB_CACHE="$work/c" "$sous" pull "$repo" --quiet > /dev/null ;;
        sous-sha256) SOUS_VERIFY=sha256 HF_HUB_CACHE="$work/c" "$sous" pull "$repo" --quiet > /dev/null ;;
        sous-sha256-portable)
          SOUS_VERIFY=sha256 SOUS_SHA256=portable HF_HUB_CACHE="$work/c" "$sous" pull "$repo" --quiet > /dev/null ;;
        sous-sha256-no-sha-ni)
          LD_PRELOAD="$no_sha_ni" SOUS_VERIFY=sha256 HF_HUB_CACHE="$work/c" "$sous" pull "$repo" --quiet > /dev/null ;;
        huggingface_hub)
          HF_HUB_DISABLE_XET=1 HF_HUB_CACHE="$work/c" "$python" -c "from huggingface_hub import snapshot_download; snapshot_download('$repo')" > /dev/null 2>&1 ;;
        curl)
          mkdir -p "$work/c"
          for f in $files; do mkdir -p "$work/c/$(dirname "$f")"; curl -sf -o "$work/c/$f" "$url/$repo/resolve/main/$f"; done ;;
      esac
      t1=$(now)
      echo "$label $variant $(elapsed $t0 $t1)" >> "$work/results"
    done
  done
  rm -rf "$work/c"
  /usr/bin/time -v env HF_HUB_CACHE="$work/c" "$sous" pull "$repo" --json --quiet > "$work/$label.json" 2> "$work/time"
  echo "$label rss_kb $(awk -F: '/Maximum resident set size/ {gsub(/ /, "", $2); print $2}' "$work/time")" >> "$work/results"
  echo "$label report $(tr -d '\n ' < "$work/$label.json")" >> "$work/results"
  rm -rf "$work/c"
}

bench smollm2 "$models" HuggingFaceTB/SmolLM2-135M-Instruct "$rounds"

if [ -n "$big" ]; then
  echo "kill -9 at half way and resume, $big GiB (e2e test)" >&2
  SOUS_TEST_BIG_PULL="$big" cargo test --quiet --test e2e -- pull::a_large_pull_survives_kill_9_in_bounded_memory --nocapture 2>&1 \
    | { grep -E '^big pull:|test result|panicked' || true; } | tee -a "$work/kill9" >&2 || true
  bench "big${big}g" target/test-hub "acme/big${big}g" "$big_rounds"
fi

python3 - "$work/results" <<'PY'
import json, statistics, sys
rows, sizes, rss, reports = {}, {}, {}, {}
for line in open(sys.argv[1]):
    label, kind, value = line.split(maxsplit=2)
    if kind == "bytes":
        sizes[label] = int(value)
    elif kind == "rss_kb":
        rss[label] = int(value)
    elif kind == "report":
        reports[label] = json.loads(value)
    else:
        rows.setdefault(label, {}).setdefault(kind, []).append(float(value))
for label, tools in rows.items():
    size = sizes[label]
    med = {t: statistics.median(v) for t, v in tools.items()}
    print(f"\n{label}: {size} bytes")
    print(f"{'tool':<21} {'median s':>9} {'min s':>7} {'max s':>7} {'MB/s':>8}")
    variants = ("sous", "sous-buffered", "sous-sha256", "sous-sha256-portable", "sous-sha256-no-sha-ni",
                "huggingface_hub", "curl")
    for t in (t for t in variants if t in tools):
        v = tools[t]
        print(f"{t:<21} {med[t]:>9.3f} {min(v):>7.3f} {max(v):>7.3f} {size / 1e6 / med[t]:>8.0f}")
    for t in (t for t in variants[:5] if t in tools):
        print(f"{t} vs huggingface_hub: {med['huggingface_hub'] / med[t]:.2f}x faster; "
              f"vs curl: {med['curl'] / med[t] * 100:.0f}% of curl's throughput")
    r = reports.get(label, {})
    print(f"sous peak RSS: {rss.get(label, 0) / 1024:.1f} MiB; last report: download "
          f"{r.get('download_mb_per_s', 0):.0f} MB/s, verification {r.get('verify_mb_per_s', 0):.0f} MB/s "
          f"({r.get('verify_mb_per_cpu_s', 0):.0f} MB/s per hashing thread, {r.get('verified_with')}), "
          f"bound by {r.get('bound')}, {r.get('files_at_once')} files at once")
PY
