#!/usr/bin/env bash
# Remakes the NVFP4 reference fixtures in tests/fixtures/nvfp4/ with the real tools,
# and the record of compressed-tensors checking sous's output. Run by hand, never in
# CI (it needs PyTorch):
#
#   PYTHON=/path/to/venv/bin/python scripts/reference/nvfp4_fixtures.sh
#
# The venv needs: pip install llmcompressor==0.14.0.1 compressed-tensors==0.19.0 nvidia-modelopt==0.47.0
set -euo pipefail
cd "$(dirname "$0")/../.."
python="${PYTHON:-python3}"
model=target/models/HuggingFaceTB/SmolLM2-135M-Instruct
fixtures=tests/fixtures/nvfp4
work=target/nvfp4-reference
[ -d "$model" ] || scripts/fetch-test-model.sh
mkdir -p "$work" "$fixtures"
export TQDM_DISABLE=1
cargo build --quiet --bin sous
sous="${CARGO_TARGET_DIR:-target}/debug/sous"

"$python" scripts/reference/nvfp4_reference.py reference "$model" "$fixtures/smollm2-135m-instruct.llmcompressor.json" --work "$work"
"$python" scripts/reference/nvfp4_reference.py modelopt "$model" "$fixtures/smollm2-135m-instruct.modelopt-cpu.json" --work "$work"

rm -rf "$work/sous"
"$sous" quantize "$model" --out "$work/sous" --json --digests --quiet > "$work/sous.json"
{
  echo "# scripts/reference/nvfp4_fixtures.sh, $(date -u +%Y-%m-%d), $(uname -m)"
  echo "# sous quantize $model --out sous --json --digests; then:"
  echo "# nvfp4_reference.py check smollm2-135m-instruct.llmcompressor.json sous sous.json --compare-with llm-compressor"
  "$python" scripts/reference/nvfp4_reference.py check "$fixtures/smollm2-135m-instruct.llmcompressor.json" \
    "$work/sous" "$work/sous.json" --compare-with "$work/llm-compressor" 2>/dev/null
} | tee "$fixtures/smollm2-135m-instruct.check.txt"
