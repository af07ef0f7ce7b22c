#!/usr/bin/env bash
# The README's main job, on a fresh Linux machine with a Rust toolchain.
#
# Today: build sous, check the shipped recipes, and print the exact vLLM command line
# of the DGX Spark field report's tuned deployment. The native engine (serve the
# SmolLM2 test model on this CPU and answer a request) is not built yet; when it is,
# this script will fetch the test model, serve it and send one chat request.
set -euo pipefail
cd "$(dirname "$0")/.."

cargo build --bin sous
sous="${CARGO_TARGET_DIR:-target}/debug/sous"

"$sous" recipe check recipes/dgx-spark/*.toml recipes/titan/*.toml >/dev/null
"$sous" serve --recipe recipes/dgx-spark/qwen3.8-27b-nvfp4.toml --dry-run
