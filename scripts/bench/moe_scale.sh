#!/usr/bin/env bash
# Benchmark: `sous quantize` (NVFP4A16) of a generated MoE of Qwen3-30B-A3B's shape with
# fused 3-D expert tensors (scripts/bench/gen_moe_model.py; never committed):
#
#   1. the disk's cold read rate of the model's shards (page cache dropped, dd);
#   2. sous quantize from a cold page cache: wall time, GB/s of bf16 read, peak RSS;
#   3. the same again with the shards in the page cache (the CPU's own rate);
#   4. W4A4 of the same model, calibrated by the native engine layer by layer on the
#      builtin text's first 4 windows of 64 tokens, every token through all 128 experts
#      (SmolLM2's tokenizer, whose ids are all inside this vocabulary): time, peak RSS;
#   5. the full 48-layer model as sparse files (holes: zeros, no disk blocks), for the
#      memory bound at full size on a disk that cannot hold it (the partial model is
#      deleted first to make room for the 17 GB output).
#
# Needs root (to drop the page cache), GNU time, and numpy for the generator.
#
#   PYTHON=/path/to/python scripts/bench/moe_scale.sh [LAYERS] [WORK_DIR]
#
# Results go to benchmarks/quantize.md by hand, with the date and machine.
set -euo pipefail
cd "$(dirname "$0")/../.."
layers="${1:-10}"
work="${2:-${TMPDIR:-/tmp}/sous-moe-scale}"
python="${PYTHON:-python3}"
cargo build --quiet --bin sous
[ -d target/models/HuggingFaceTB/SmolLM2-135M-Instruct ] || scripts/fetch-test-model.sh
bin="${CARGO_TARGET_DIR:-target}/debug/sous"
mkdir -p "$work"
model="$work/qwen3-30b-a3b-shaped-$layers"
sparse="$work/qwen3-30b-a3b-shaped-sparse"
[ -f "$model/config.json" ] || "$python" scripts/bench/gen_moe_model.py "$model" --layers "$layers"
drop() { sync; echo 3 > /proc/sys/vm/drop_caches; }

echo "== $(date -u +%Y-%m-%dT%H:%MZ), $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores, $(free -g | awk '/Mem:/ {print $2}') GB"
bytes=$(cat "$model"/*.safetensors | wc -c)
echo "== model: $layers of 48 layers, $bytes bytes"

drop
start=$(date +%s.%N)
for f in "$model"/*.safetensors; do dd if="$f" of=/dev/null bs=16M status=none; done
end=$(date +%s.%N)
echo "disk cold read: $("$python" -c "print(f'{$bytes / ($end - $start) / 1e9:.2f}')") GB/s, $("$python" -c "print(f'{$end - $start:.1f}')") s"

quantize() {
  local src="$1" label="$2"
  shift 2
  rm -rf "$work/out"
  /usr/bin/time -f "%M" -o "$work/rss" "$bin" quantize "$src" --out "$work/out" --json --quiet "$@" > "$work/summary.json"
  "$python" - "$work/summary.json" "$work/rss" "$label" <<'EOF'
import json, sys
s = json.load(open(sys.argv[1]))
rss_kib = int(open(sys.argv[2]).read().split()[-1])
print(f"{sys.argv[3]}: {s['bytes_in'] / 1e9:.2f} GB -> {s['bytes_out'] / 1e9:.2f} GB, {s['quantized']} weights, "
      f"{s['seconds']:.1f} s, {s['gb_per_s']:.2f} GB/s, peak RSS {rss_kib / 1024:.0f} MiB, {s['threads']} threads, kernel {s['kernel']}")
c = s.get("calibration")
if c:
    print(f"  calibration: {c['samples']} samples, {c['tokens']} tokens, {c['seconds']:.1f} s, "
          f"peak RSS after it {c['peak_rss_bytes'] / 2**20:.0f} MiB")
EOF
}

drop
quantize "$model" "sous quantize, cold cache"
quantize "$model" "sous quantize, shards in the page cache"
cp target/models/HuggingFaceTB/SmolLM2-135M-Instruct/tokenizer*.json "$model"/
quantize "$model" "sous quantize --scheme nvfp4 (W4A4), shards in the page cache" \
  --scheme nvfp4 --calibration-format text --samples 4 --seq-len 64
# The full model's output is 17 GB, written for real: make room first.
rm -rf "$model" "$work/out"
[ -f "$sparse/config.json" ] || "$python" scripts/bench/gen_moe_model.py "$sparse" --sparse
drop
quantize "$sparse" "sous quantize, full 48 layers, sparse"
rm -rf "$work/out" "$sparse"
