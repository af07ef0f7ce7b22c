#!/usr/bin/env bash
# The native engine beside llama.cpp on the generated models of memory_wall.sh
# (benchmarks/native.md, "Decode at the memory wall"): single-stream decode (64 tokens) and a
# 512-token prompt, same machine, same threads, one after the other in each round.
#
#   CONVERT_PYTHON=/work/venv-llmc/bin/python scripts/bench/wall_llamacpp.sh [ROUNDS] [SIZES]
#
# llama.cpp is the build of scripts/bench/llamacpp-setup.sh (from the llama-cpp-python
# sdist; CONVERT_PYTHON, a Python with torch, converts the models with its
# convert_hf_to_gguf.py). Each generated model (target/bench-models/gen-SIZE, made by
# memory_wall.sh) is converted to a BF16 GGUF and quantized from it to Q4_0 with
# llama-quantize (its default mixture: the bulk in Q4_0, 4.5 bits a weight, the output
# projection wider). llama-bench runs `-p 512 -n 64 -r 3 -t THREADS` with a bf16 KV cache.
# sous runs engine/examples/decode_step.rs in bf16 arithmetic with a bf16 KV cache: the
# bf16 model beside the BF16 GGUF, and its NVFP4A16 checkpoint with the embedding held as
# Q8_0 (memory.embedding_dtype) beside Q4_0. Both sides' bytes per step are printed:
# sous's from `Model::step_bytes`, llama.cpp's as the GGUF's size (every tensor is read
# once a step, the embedding rows aside).
#
# ROUNDS defaults to 3, SIZES to "1b 3b"; THREADS to nproc.
set -euo pipefail
cd "$(dirname "$0")/../.."
rounds="${1:-3}"
sizes="${2:-1b 3b}"
threads="${THREADS:-$(nproc)}"
eval "$(scripts/bench/llamacpp-setup.sh | grep -E '^LLAMA_SERVER=')"
bin_dir="$(dirname "$LLAMA_SERVER")"
convert="$(ls target/cache/llamacpp/*/vendor/llama.cpp/convert_hf_to_gguf.py | head -1)"
gguf_py="$(dirname "$convert")/gguf-py"
cargo build --quiet -p sous-engine --example decode_step
step="${CARGO_TARGET_DIR:-target}/debug/examples/decode_step"
out=target/llamacpp/gguf
for size in $sizes; do
  dir="target/bench-models/gen-$size"
  [ -f "$dir/config.json" ] && [ -f "$dir-nvfp4a16/config.json" ] \
    || { echo "no $dir or $dir-nvfp4a16: run scripts/bench/memory_wall.sh 1 $size first" >&2; exit 2; }
  if [ ! -f "$out/gen-$size-BF16.gguf" ]; then
    PYTHONPATH="$gguf_py" "${CONVERT_PYTHON:?a Python with torch}" "$convert" "$dir" --outtype bf16 \
      --outfile "$out/gen-$size-BF16.gguf.partial" > "$out/gen-$size-BF16.log" 2>&1
    mv "$out/gen-$size-BF16.gguf.partial" "$out/gen-$size-BF16.gguf"
  fi
  if [ ! -f "$out/gen-$size-Q4_0.gguf" ]; then
    "$bin_dir/llama-quantize" "$out/gen-$size-BF16.gguf" "$out/gen-$size-Q4_0.gguf.partial" Q4_0 \
      "$threads" > "$out/gen-$size-Q4_0.log" 2>&1
    mv "$out/gen-$size-Q4_0.gguf.partial" "$out/gen-$size-Q4_0.gguf"
  fi
done
echo "# $(date -u +%Y-%m-%dT%H:%MZ) $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $threads threads"
for round in $(seq "$rounds"); do
  for size in $sizes; do
    for pair in "bf16:BF16" "nvfp4a16:Q4_0"; do
      ours=${pair%%:*} theirs=${pair##*:}
      dir="target/bench-models/gen-$size"
      env=(PRECISION=bf16 KV=bf16 RAYON_NUM_THREADS="$threads")
      if [ "$ours" != bf16 ]; then dir="$dir-$ours"; env+=(EMBEDDINGS=q8_0); fi
      decode=$(env "${env[@]}" "$step" "$dir" 64 decode | grep -E '^(64 decode|decode read)' | sed 's/^64 decode steps of 1 × 1 token(s): //' | paste -sd' ')
      prefill=$(env "${env[@]}" "$step" "$dir" 1 prefill | grep 'prefill of' | tail -3 | sed 's/.*: //' | paste -sd' ')
      echo "round $round  $size  sous $ours  decode: $decode  prefill 512 (last 3 of 10): $prefill"
      gguf="$out/gen-$size-$theirs.gguf"
      "$bin_dir/llama-bench" -m "$gguf" -t "$threads" -p 512 -n 64 -r 3 -ctk bf16 -ctv bf16 -o jsonl 2>/dev/null \
        | python3 -c '
import json, sys
rows = [json.loads(l) for l in sys.stdin if l.strip()]
parts = []
for r in rows:
    what = "prefill %d" % r["n_prompt"] if r["n_prompt"] else "decode %d" % r["n_gen"]
    parts.append("%s: %.1f ± %.1f tok/s" % (what, r["avg_ts"], r["stddev_ts"]))
print("  ".join(parts))
' | sed "s|^|round $round  $size  llama.cpp $theirs ($(du -b "$gguf" | cut -f1) bytes)  |"
    done
  done
done
