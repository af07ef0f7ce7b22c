#!/usr/bin/env bash
# The memory preflight of `sous plan` and `sous serve` against a real GPU and its
# driver, on a machine with an NVIDIA GPU and PyTorch (which holds memory the way
# another process would). CI has no GPU and never runs this; the rules themselves are
# unit-tested everywhere (engine/src/device.rs, engine/src/serve/preflight.rs).
#
#   scripts/gpu-memory-check.sh SOUS_BIN FAKE_ENGINE_BIN [OUT_DIR]
#
# FAKE_ENGINE_BIN is tests/fake-engine built (`cargo build -p sous-fake-engine`): it
# stands in for vLLM, which the check does not need; the GPU, its driver and the memory
# held on it are real.
#
# Steps: `sous doctor` (free memory from the driver); `sous plan` for a vLLM recipe on
# this machine, idle; the same while PyTorch holds HOLD (default 0.6) of the GPU's
# memory; `sous serve` at 0.9 with `memory.oom_fallback = [0.3]` (must start at 0.3
# without launching at 0.9); and at 0.9 alone (must refuse before any launch). The
# last lines are a short table.
set -euo pipefail
sous="$(realpath "${1:?usage: scripts/gpu-memory-check.sh SOUS_BIN FAKE_ENGINE_BIN [OUT_DIR]}")"
fake="$(realpath "${2:?usage: scripts/gpu-memory-check.sh SOUS_BIN FAKE_ENGINE_BIN [OUT_DIR]}")"
out="${3:-$(mktemp -d "${TMPDIR:-/tmp}/sous-gpu-memory.XXXXXX")}"
hold="${HOLD:-0.6}"
cd "$(dirname "$0")/.."
mkdir -p "$out"
work=$(mktemp -d "${TMPDIR:-/tmp}/sous-gpu-memory-work.XXXXXX")
holder=""
cleanup() {
  [ -n "$holder" ] && kill "$holder" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
export SOUS_CACHE_DIR="$work/cache" SOUS_STATE_DIR="$work/state" HF_HUB_OFFLINE=1
table=()
row() { table+=("$(printf '%-46s %s' "$1" "$2")"); }
step() { printf '\n==> %s\n' "$*" >&2; }
json() { python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print(eval(sys.argv[2], {}, {'d': d}))" "$@"; }

port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
recipe="$work/vllm.toml"
cat > "$recipe" <<EOF
name = "gpu-memory-check"

[model]
path = "$PWD/tests/fixtures/architectures/qwen3_moe"
served_name = "tiny"

[engine]
kind = "vllm"
version = "0.33.0"
executable = "$fake"

[server]
host = "127.0.0.1"
port = $port
stop_grace = "5s"
EOF

step "sous doctor"
"$sous" doctor --json > "$out/doctor.json" || true
row "GPU (driver)" "$(json "$out/doctor.json" '"%s, %.2f GiB, %.2f GiB free" % (d["gpus"][0]["name"], d["gpus"][0]["memory_bytes"]/2**30, d["gpus"][0]["memory_free_bytes"]/2**30)')"

step "sous plan, idle GPU"
"$sous" plan --recipe "$recipe" --set memory.gpu_utilization=0.9 | tee "$out/plan-idle.txt" >&2
"$sous" plan --recipe "$recipe" --set memory.gpu_utilization=0.9 --json > "$out/plan-idle.json"
row "plan at 0.9, idle" "$(json "$out/plan-idle.json" '"fits=%s; %.2f of %.2f GiB free" % (d["preflight"]["fits"], d["preflight"]["pool"]["available_bytes"]/2**30, d["preflight"]["pool"]["total_bytes"]/2**30)')"

step "PyTorch holds $hold of the GPU's memory"
python3 - "$hold" "$work/held" <<'EOF' &
import sys, time, torch
share, flag = float(sys.argv[1]), sys.argv[2]
free, total = torch.cuda.mem_get_info()
held = torch.empty(int(total * share), dtype=torch.uint8, device="cuda")
held.fill_(1)
torch.cuda.synchronize()
open(flag, "w").write(str(held.numel()))
time.sleep(600)
EOF
holder=$!
for _ in $(seq 600); do [ -s "$work/held" ] && break; sleep 0.1; done
[ -s "$work/held" ] || { echo "PyTorch did not allocate" >&2; exit 1; }
row "held by PyTorch" "$(python3 -c "print('%.2f GiB' % (int(open('$work/held').read())/2**30))")"

step "sous plan, memory held"
set +e
"$sous" plan --recipe "$recipe" --set memory.gpu_utilization=0.9 > "$out/plan-held.txt"
code=$?
set -e
cat "$out/plan-held.txt" >&2
row "plan at 0.9, held: exit code" "$code ($(grep '^memory now' "$out/plan-held.txt" | sed 's/^memory now *//' | cut -c1-60)...)"

step "sous serve at 0.9 with memory.oom_fallback = [0.3]"
launches="$work/launches.jsonl"
FAKE_LAUNCH_LOG="$launches" "$sous" serve --recipe "$recipe" \
  --set memory.gpu_utilization=0.9 --set 'memory.oom_fallback=[0.3]' 2> "$out/serve-fallback.txt" &
server=$!
ready=no
for _ in $(seq 300); do
  if curl -fsS "http://127.0.0.1:$port/health" > /dev/null 2>&1; then ready=yes; break; fi
  sleep 0.1
done
kill -INT "$server" 2>/dev/null || true
wait "$server" || true
cat "$out/serve-fallback.txt" >&2
row "serve 0.9 → [0.3]: ready" "$ready; launches: $(wc -l < "$launches"), at $(python3 -c "import json; print([a for l in open('$launches') for a in json.loads(l)['argv'] if a.startswith('0.')])")"

step "sous serve at 0.9 alone"
set +e
FAKE_LAUNCH_LOG="$work/refused.jsonl" "$sous" serve --recipe "$recipe" --set memory.gpu_utilization=0.9 2> "$out/serve-refused.txt"
code=$?
set -e
cat "$out/serve-refused.txt" >&2
row "serve 0.9 alone: exit code" "$code; launches: $( [ -f "$work/refused.jsonl" ] && wc -l < "$work/refused.jsonl" || echo 0)"

printf '\n%s\n' "sous GPU memory check, $(date -u +%Y-%m-%dT%H:%MZ)" | tee "$out/summary.txt"
printf '%s\n' "${table[@]}" | tee -a "$out/summary.txt"
