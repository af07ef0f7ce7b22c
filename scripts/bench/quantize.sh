#!/usr/bin/env bash
# Benchmark: NVFP4A16 quantization of the SmolLM2-135M-Instruct test model, sous beside
# compressed-tensors' own PyTorch implementation on the same CPU in the same run:
#
#   1. the kernel alone: sous-kernels (examples/throughput.rs) and compressed-tensors
#      (scripts/bench/quantize_peers.py ct-kernel) on the model's 210 Linear weights,
#      each on 1 thread and on all cores, GB/s of bf16 input (wall and per CPU second);
#      both digests are printed and must match (the same bytes were computed);
#   2. end to end: `sous quantize` (dev profile, as CI builds it) into a fresh directory,
#      ROUNDS times, median wall time, GB/s of bf16 input, peak RSS; beside it the disk
#      floor (writing the same number of bytes with fsync) and llm-compressor's oneshot
#      (load + quantize + save) once.
#
# Results go to benchmarks/quantize.md by hand, with the date and machine.
#
#   PYTHON=/path/to/venv/bin/python scripts/bench/quantize.sh [ROUNDS] [SECONDS]
#
# The venv needs: pip install llmcompressor==0.14.0.1 compressed-tensors==0.19.0
# Needs the test model (scripts/fetch-test-model.sh) and GNU time.
set -euo pipefail
cd "$(dirname "$0")/../.."
rounds="${1:-5}"
seconds="${2:-5}"
python="${PYTHON:-python3}"
model=target/models/HuggingFaceTB/SmolLM2-135M-Instruct
[ -d "$model" ] || scripts/fetch-test-model.sh
cargo build --quiet --bin sous --example throughput -p sous -p sous-kernels
bin="${CARGO_TARGET_DIR:-target}/debug"
work=$(mktemp -d "${TMPDIR:-/tmp}/sous-bench-quantize.XXXXXX")
trap 'rm -rf "$work"' EXIT
export TQDM_DISABLE=1 PYTHONWARNINGS=ignore
cores=$(nproc)

echo "== $(date -u +%Y-%m-%dT%H:%MZ), $(lscpu | sed -n 's/^Model name: *//p'), $cores cores, $(free -g | awk '/Mem:/ {print $2}') GB, load $(cut -d' ' -f1-3 /proc/loadavg)" >&2

echo "== kernel: sous-kernels" >&2
"$bin/examples/throughput" "$model/model.safetensors" "$seconds" | grep CompressedTensors > "$work/kernel.jsonl"
echo "== kernel: compressed-tensors (PyTorch)" >&2
for threads in 1 "$cores"; do
  "$python" scripts/bench/quantize_peers.py ct-kernel "$model" "$threads" "$seconds" 2>/dev/null >> "$work/kernel.jsonl"
done

echo "== end to end: sous quantize x $rounds" >&2
for round in $(seq "$rounds"); do
  rm -rf "$work/out"; sync
  /usr/bin/time -v "$bin/sous" quantize "$model" --out "$work/out" --json --quiet > "$work/summary.json" 2> "$work/time"
  wall=$(awk -F': ' '/Elapsed \(wall clock\)/ {split($2, t, ":"); print t[1] * 60 + t[2]}' "$work/time")
  rss=$(awk -F': ' '/Maximum resident set size/ {print $2}' "$work/time")
  echo "{\"round\": $round, \"wall\": $wall, \"rss_kb\": $rss}" >> "$work/e2e.jsonl"
done
"$python" scripts/bench/quantize_peers.py digest "$work/out" 2>/dev/null >> "$work/kernel.jsonl"
out_bytes=$(du -sb "$work/out" | cut -f1)
in_bytes=$(stat -Lc %s "$model/model.safetensors")
echo "== disk floor: $out_bytes bytes written with fsync" >&2
for round in $(seq "$rounds"); do
  rm -f "$work/floor"; sync
  start=$(date +%s.%N)
  dd if=/dev/zero of="$work/floor" bs=1M count=$((out_bytes / 1048576 + 1)) conv=fsync status=none
  echo "$(date +%s.%N) - $start" | bc -l >> "$work/floor.txt"
done
rm -f "$work/floor"
echo "== llm-compressor oneshot" >&2
"$python" scripts/bench/quantize_peers.py oneshot "$model" "$work/llmc" 2>/dev/null | grep '^{"tool"' > "$work/oneshot.json"

"$python" - "$work" "$in_bytes" "$out_bytes" <<'PY'
import json, statistics, sys
work, in_bytes, out_bytes = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
rows = [json.loads(l) for l in open(f"{work}/kernel.jsonl")]
kernels = [r for r in rows if "gb_per_s" in r]
digests = {r.get("tool", "sous-kernels"): r["sha256"] for r in rows if "sha256" in r}
print(f"{'kernel':<22} {'threads':>7} {'GB/s':>7} {'GB/CPU-s':>9}")
for r in kernels:
    name = r.get("tool", "sous-kernels")
    print(f"{name:<22} {r['threads']:>7} {r['gb_per_s']:>7.3f} {r['gb_per_cpu_s']:>9.3f}")
for threads in sorted({r["threads"] for r in kernels}):
    s = [r for r in kernels if r["threads"] == threads and "tool" not in r][0]
    c = [r for r in kernels if r["threads"] == threads and r.get("tool") == "compressed-tensors"][0]
    print(f"sous / compressed-tensors, {threads} thread(s): {s['gb_per_s'] / c['gb_per_s']:.1f}x "
          f"(per CPU second {s['gb_per_cpu_s'] / c['gb_per_cpu_s']:.1f}x)")
print("same bytes (sous output vs compressed-tensors):", len(set(digests.values())) == 1, digests)
e2e = [json.loads(l) for l in open(f"{work}/e2e.jsonl")]
walls = [r["wall"] for r in e2e]
med = statistics.median(walls)
floor = statistics.median(float(l) for l in open(f"{work}/floor.txt"))
print(f"sous quantize end to end: median {med:.3f} s (min {min(walls):.3f}, max {max(walls):.3f}), "
      f"{in_bytes / med / 1e9:.2f} GB/s of bf16 input, peak RSS {max(r['rss_kb'] for r in e2e) / 1024:.1f} MiB")
print(f"disk floor: writing {out_bytes / 1e6:.1f} MB with fsync takes {floor:.3f} s "
      f"({floor / med * 100:.0f}% of the end-to-end time)")
one = json.load(open(f"{work}/oneshot.json"))
print(f"llm-compressor oneshot: load {one['load_seconds']:.2f} s + oneshot {one['oneshot_seconds']:.2f} s "
      f"+ save {one['save_seconds']:.2f} s = {one['seconds']:.2f} s; sous end to end is {one['seconds'] / med:.1f}x faster")
PY
