#!/usr/bin/env bash
# The GPU checks and benchmark of `sous quantize --device cuda`, run on a machine with an
# NVIDIA GPU by a `sous` binary built on any x86-64 Linux machine (no CUDA needed to
# build: the driver and NVRTC are opened at run time). CI has no GPU and never runs this.
#
#   scripts/gpu-check.sh SOUS_BIN [OUT_DIR]
#
# Environment:
#   SMOLLM2=DIR        the SmolLM2-135M-Instruct test model (scripts/fetch-test-model.sh):
#                      quantized on the CPU and on the GPU, in both formats, every output
#                      file compared byte for byte
#   BIG_GB=8.5         size of the generated model quantized end to end (0 skips it; needs
#                      PyTorch and safetensors, and twice that much free disk)
#   CHECK_MIB=256      size of the largest generated tensor of the kernel check
#   CT=1               also time compressed-tensors' own GPU path
#                      (scripts/bench/ct_nvfp4_gpu.py; needs compressed-tensors importable)
#
# Steps: the device; `sous kernels check` (edge-case tensors, GPU bytes = CPU bytes);
# `sous kernels bench` (kernel GB/s beside a device-to-device copy and a host-to-device
# copy); compressed-tensors' GPU path on the same GPU; SmolLM2 CPU vs GPU; a generated
# model of BIG_GB quantized on the GPU and on the CPU, compared, with the disk read rate
# measured in the same run. The last lines are a short table.
set -euo pipefail
sous="${1:?usage: scripts/gpu-check.sh SOUS_BIN [OUT_DIR]}"
out="${2:-$(mktemp -d "${TMPDIR:-/tmp}/sous-gpu-check.XXXXXX")}"
big_gb="${BIG_GB:-8.5}"
check_mib="${CHECK_MIB:-256}"
cd "$(dirname "$0")/.."
mkdir -p "$out"
work=$(mktemp -d "${TMPDIR:-/tmp}/sous-gpu-work.XXXXXX")
trap 'rm -rf "$work"' EXIT
export SOUS_CACHE_DIR="$work/cache"
table=()
row() { table+=("$(printf '%-44s %s' "$1" "$2")"); }
step() { printf '\n==> %s\n' "$*" >&2; }
json() { python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print(eval(sys.argv[2], {}, {'d': d}))" "$@"; }

step "device"
nvidia-smi --query-gpu=name,memory.total,driver_version,compute_cap --format=csv,noheader | tee "$out/device.txt"
row "device" "$(head -1 "$out/device.txt")"

step "sous kernels check (GPU bytes against the CPU's)"
if "$sous" kernels check --device cuda --mib "$check_mib" --json > "$out/check.json"; then
  row "kernel check" "$(json "$out/check.json" 'len(d["cases"])') cases, all identical"
else
  row "kernel check" "FAILED: $(json "$out/check.json" 'd["failures"]') cases differ"
fi

step "sous kernels bench"
"$sous" kernels bench --device cuda --gib 1 --repeats 20 | tee "$out/bench.txt" >&2
"$sous" kernels bench --device cuda --gib 1 --repeats 20 --json > "$out/bench.json"
row "device-to-device copy" "$(json "$out/bench.json" '"%.2f TB/s read+written" % d["copy"]["read_write_tb_per_s"]')"
row "host-to-device copy (pinned)" "$(json "$out/bench.json" '"%.1f GB/s" % d["host_to_device"]["gb_per_s"]')"
row "sous quantize kernel" "$(json "$out/bench.json" '"%.0f GB/s of bf16; %.0f %% of the copy" % (d["quantize"]["input_gb_per_s"], 100*d["quantize"]["of_copy"])')"
row "sous amax + quantize" "$(json "$out/bench.json" '"%.0f GB/s of bf16; %.0f %% of the copy" % (d["amax_then_quantize"]["input_gb_per_s"], 100*d["amax_then_quantize"]["of_copy"])')"

if [ "${CT:-1}" = 1 ] && python3 -c 'import compressed_tensors' 2>/dev/null; then
  step "compressed-tensors on the same GPU"
  python3 scripts/bench/ct_nvfp4_gpu.py --gib 1 --repeats 10 --json > "$out/ct.json"
  row "compressed-tensors (Triton path)" "$(json "$out/ct.json" '"%.0f GB/s of bf16" % d["ct_triton"]["gb_per_s"]' 2>/dev/null || echo "see ct.json")"
  row "compressed-tensors (eager)" "$(json "$out/ct.json" '"%.0f GB/s of bf16" % d["ct_eager"]["gb_per_s"]' 2>/dev/null || echo "see ct.json")"
else
  row "compressed-tensors" "not installed here (CT=1 and pip install compressed-tensors)"
fi

if [ -n "${SMOLLM2:-}" ]; then
  step "SmolLM2: the CPU and the GPU write the same checkpoint"
  for format in compressed-tensors modelopt; do
    "$sous" quantize "$SMOLLM2" --format "$format" --out "$work/smol-cpu-$format" --quiet --json > "$out/smol-cpu-$format.json"
    "$sous" quantize "$SMOLLM2" --format "$format" --device cuda --out "$work/smol-gpu-$format" --quiet --json > "$out/smol-gpu-$format.json"
    if diff -r --exclude=.sous-quantize.json "$work/smol-cpu-$format" "$work/smol-gpu-$format" > "$out/smol-diff-$format.txt"; then
      row "SmolLM2 $format" "$(json "$out/smol-gpu-$format.json" 'd["quantized"]') tensors, every output file identical"
    else
      row "SmolLM2 $format" "FILES DIFFER (smol-diff-$format.txt)"
    fi
  done
fi

if [ "$big_gb" != 0 ]; then
  step "a generated ${big_gb} GB model, end to end"
  python3 scripts/bench/gen_model.py "$work/big" --gb "$big_gb" --shards 4 > "$out/big-model.json"
  bytes=$(json "$out/big-model.json" 'd["bytes"]')
  sync
  # The shards were just written, so they are in the page cache where memory allows:
  # this is the rate `sous quantize` can read them at now.
  start=$(date +%s%N)
  cat "$work"/big/*.safetensors > /dev/null
  read_ns=$(( $(date +%s%N) - start ))
  row "reading the shards (cat, page cache)" "$(python3 -c "print('%.1f GB/s' % ($bytes / $read_ns))")"
  timer=()
  [ -x /usr/bin/time ] && timer=(/usr/bin/time -v)
  "${timer[@]}" "$sous" quantize "$work/big" --device cuda --out "$work/big-gpu" --json --quiet \
    > "$out/big-gpu.json" 2> "$out/big-gpu.time"
  row "sous quantize --device cuda, ${big_gb} GB" "$(json "$out/big-gpu.json" '"%.1f s, %.1f GB/s of bf16" % (d["seconds"], d["gb_per_s"])')$(awk '/Maximum resident/ {printf "; peak RSS %.0f MiB", $6/1024}' "$out/big-gpu.time")"
  "${timer[@]}" "$sous" quantize "$work/big" --out "$work/big-cpu" --json --quiet \
    > "$out/big-cpu.json" 2> "$out/big-cpu.time"
  row "sous quantize on the CPU ($(nproc) cores)" "$(json "$out/big-cpu.json" '"%.1f s, %.1f GB/s of bf16" % (d["seconds"], d["gb_per_s"])')"
  if diff -r --exclude=.sous-quantize.json "$work/big-cpu" "$work/big-gpu" > "$out/big-diff.txt"; then
    row "generated model CPU vs GPU" "every output file identical"
  else
    row "generated model CPU vs GPU" "FILES DIFFER"
  fi
fi

printf '\n%s\n' "sous GPU check, $(date -u +%Y-%m-%dT%H:%MZ)" | tee "$out/summary.txt"
printf '%s\n' "${table[@]}" | tee -a "$out/summary.txt"
