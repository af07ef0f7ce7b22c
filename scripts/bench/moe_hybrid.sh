#!/usr/bin/env bash
# Speed of the native engine's MoE and hybrid decoders against a dense model of the same
# active size (benchmarks/native.md, "MoE and hybrid decoders"):
#
#   PYTHON=/work/venv-ref/bin/python scripts/bench/moe_hybrid.sh [ROUNDS]
#
# Generates four bf16 models with transformers (scripts/bench/gen_arch_model.py) under
# target/bench-models/ (skipped when present): a dense Qwen3 (hidden 1024, 8 layers,
# MLP 3072), Qwen3-MoE with 4 and with 32 experts of width 1536, two active (the same
# active MLP as the dense one; 6x the total parameters between them), and the dense
# Qwen3.5 hybrid (6 Gated DeltaNet layers, 2 gated attention layers, the dense MLP).
# Then times each with engine/examples/decode_step.rs: 32 single-token decode steps and
# 512-token prefills, ROUNDS rounds (default 3) with the models interleaved, so that
# the machine's noise falls on all of them alike; prints every round's figures.
set -euo pipefail
cd "$(dirname "$0")/../.."
python="${PYTHON:-python3}"
rounds="${1:-3}"
out=target/bench-models
models=(qwen3:8 qwen3_moe:4 qwen3_moe:32 qwen3_5:8)
for spec in "${models[@]}"; do
  arch=${spec%%:*} experts=${spec##*:}
  [ -d "$out/$arch-e$experts" ] || "$python" scripts/bench/gen_arch_model.py "$out/$arch-e$experts" --arch "$arch" --experts "$experts"
done
cargo build --quiet -p sous-engine --example decode_step
bin="${CARGO_TARGET_DIR:-target}/debug/examples/decode_step"
echo "# $(date -u +%Y-%m-%d) $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) threads"
for round in $(seq "$rounds"); do
  for spec in "${models[@]}"; do
    arch=${spec%%:*} experts=${spec##*:}
    dir="$out/$arch-e$experts"
    decode=$("$bin" "$dir" 32 decode | grep 'decode steps' | sed 's/.*: //')
    prefill=$("$bin" "$dir" 1 prefill | grep 'prefill of' | tail -3 | sed 's/.*: //' | paste -sd' ')
    echo "round $round  $arch-e$experts  $(du -sh "$dir" | cut -f1)  decode: $decode  prefill (last 3 of 10): $prefill"
  done
done
