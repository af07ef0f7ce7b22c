#!/usr/bin/env bash
# Single-stream decode against the memory wall (benchmarks/native.md, "Decode at the
# memory wall"): generated Llama-shaped models of 1B and 3B parameters (scripts/bench/gen_model.py,
# SmolLM2's vocabulary, tied embeddings), in bf16, NVFP4A16 and W4A4 (`sous quantize`),
# each decoded by engine/examples/decode_step.rs in bf16 arithmetic with a bf16 KV cache,
# which prints the bytes a step reads (`Model::step_bytes`) and the fraction of the read
# bandwidth probed right after the steps in the same process (`sous kernels bandwidth`'s
# probe, the median of its passes).
#
#   PYTHON=/work/venv-llmc/bin/python scripts/bench/memory_wall.sh [ROUNDS] [SIZES] [ISAS]
#
# ROUNDS (default 3) rounds, the configurations interleaved in each, so that a busy
# minute of a shared host falls on all of them; SIZES defaults to "1b 3b", ISAS to
# "native avx2" (`SOUS_KERNELS_ISA=avx2`: the AVX2 kernels, as on a CPU without AVX-512).
# Models go to target/bench-models/ (kept between runs; PYTHON needs torch and
# safetensors to generate them). `DOT=off` runs the f32 kernels on bf16-rounded inputs
# instead of AVX512-BF16's dot products (SOUS_BF16_DOT).
set -euo pipefail
cd "$(dirname "$0")/../.."
python="${PYTHON:-python3}"
rounds="${1:-3}"
sizes="${2:-1b 3b}"
isas="${3:-native avx2}"
out=target/bench-models
tokenizer=target/models/HuggingFaceTB/SmolLM2-135M-Instruct
[ -f "$tokenizer/tokenizer.json" ] || scripts/fetch-test-model.sh
cargo build --quiet -p sous -p sous-engine --example decode_step
sous="${CARGO_TARGET_DIR:-target}/debug/sous"
bin="${CARGO_TARGET_DIR:-target}/debug/examples/decode_step"
for size in $sizes; do
  dir="$out/gen-$size"
  if [ ! -f "$dir/config.json" ]; then
    "$python" scripts/bench/gen_model.py "$dir" --shape "$size" --shards 1
    cp "$tokenizer"/tokenizer.json "$tokenizer"/tokenizer_config.json "$dir"/
  fi
  [ -f "$dir-nvfp4a16/config.json" ] || "$sous" quantize "$dir" -o "$dir-nvfp4a16" --quiet
  [ -f "$dir-w4a4/config.json" ] || "$sous" quantize "$dir" -o "$dir-w4a4" --scheme nvfp4 \
    --calibration-format text --samples 4 --seq-len 256 --quiet
done
echo "# $(date -u +%Y-%m-%dT%H:%MZ) $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) threads, DOT=${DOT:-measured}"
for round in $(seq "$rounds"); do
  for size in $sizes; do
    for weights in bf16 nvfp4a16 w4a4; do
      dir="$out/gen-$size"
      [ "$weights" = bf16 ] || dir="$dir-$weights"
      for isa in $isas; do
        env=(PRECISION=bf16 KV=bf16)
        [ "$isa" = native ] || env+=(SOUS_KERNELS_ISA="$isa")
        [ -z "${DOT:-}" ] || env+=(SOUS_BF16_DOT="$DOT")
        result=$(env "${env[@]}" "$bin" "$dir" 32 decode | grep -E '^(32 decode|decode read)' | sed 's/^32 decode steps of 1 × 1 token(s): //' | paste -sd' ')
        printf 'round %s  %-3s %-9s %-6s  %s\n' "$round" "$size" "$weights" "$isa" "$result"
      done
    done
  done
done
