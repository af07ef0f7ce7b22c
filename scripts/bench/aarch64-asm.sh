#!/usr/bin/env bash
# What the compiler makes of the CPU hot loops for aarch64: the assembly of sous-kernels,
# built for aarch64-unknown-linux-gnu as the dev profile builds it (opt-level 3), with the
# floating-point instructions of each hot function counted, NEON (four lanes, `v.4s`)
# against scalar. No Arm machine is needed, and none is measured: this is about the
# instructions, not their speed.
#
#   scripts/bench/aarch64-asm.sh            # the table
#   scripts/bench/aarch64-asm.sh FUNCTION   # and the assembly of functions matching it
#
# Needs Debian's rustc-web and libstd-rust-web-dev:arm64 (scripts/debian-deps.sh).
set -euo pipefail
cd "$(dirname "$0")/../.."

target=aarch64-unknown-linux-gnu
out="${CARGO_TARGET_DIR:-target}/aarch64-asm"
# One codegen unit: every function in one file, named.
RUSTC=/usr/bin/rustc CARGO_TARGET_DIR="$out" \
  cargo rustc -p sous-kernels --lib --locked --target "$target" -- --emit asm -C codegen-units=1 >&2
asm=$(ls -t "$out/$target/debug/deps"/sous_kernels-*.s | head -n 1)

python3 - "$asm" "${1:-}" <<'EOF'
import re
import subprocess
import sys

path, show = sys.argv[1], sys.argv[2]
functions, name = {}, None
for line in open(path):
    if re.match(r"^_ZN\S+:$", line):
        name = line[:-2]
        functions[name] = []
    elif name and line.startswith(".Lfunc_end"):
        name = None
    elif name:
        functions[name].append(line.rstrip("\n"))

def demangle(symbol):
    try:
        return subprocess.run(["c++filt"], input=symbol, capture_output=True, text=True).stdout.strip()
    except OSError:
        return symbol

# The hot loops: the quantizer's block kernel (two instances: with and without error
# statistics), the products' NEON micro-kernels (inlined into `neon::tile`) and their
# widening (inlined into `gemm::columns`), attention's tile loop.
hot = re.compile(r"fast8portable15quantize_blocks|gemm4neon(4tile|6kernel|5widen)|gemm7columns|11attend_tile")
fp = re.compile(r"^\s+(f[a-z]+|bf[a-z]+)\s+(\S+)")
rows = []
for symbol, body in functions.items():
    if not hot.search(symbol):
        continue
    vector, scalar, ops = 0, 0, {}
    for line in body:
        m = fp.match(line)
        if not m:
            continue
        op, operand = m.group(1), m.group(2)
        if op in ("fmov",):
            continue
        if re.match(r"v\d+\.(4s|2d|8h)", operand):
            vector += 1
            ops[op] = ops.get(op, 0) + 1
        elif re.match(r"[sdh]\d+", operand):
            scalar += 1
    instructions = sum(1 for l in body if re.match(r"^\s+[a-z]", l) and not l.strip().startswith("."))
    top = ", ".join(f"{k} {v}" for k, v in sorted(ops.items(), key=lambda kv: -kv[1])[:6])
    rows.append((demangle(symbol), instructions, vector, scalar, top))

print("| Function | Instructions | NEON floating-point | Scalar floating-point | Most frequent NEON |")
print("|---|---|---|---|---|")
for name, n, v, s, top in sorted(rows):
    name = re.sub(r"::h[0-9a-f]{16}$", "", name)
    print(f"| `{name}` | {n} | {v} | {s} | {top} |")
if show:
    for symbol, body in functions.items():
        if show in demangle(symbol):
            print(f"\n{demangle(symbol)}:")
            print("\n".join(body))
EOF
