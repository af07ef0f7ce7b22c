#!/usr/bin/env bash
# The whole test suite, exactly as CI runs it (.ci/run calls this and nothing else):
# formatting, lints with warnings denied, then every test of the workspace.
#
# One build profile serves the binary and the tests (dev, with optimized dependencies:
# see [profile.dev.package."*"] in Cargo.toml), so nothing is compiled twice.
set -euo pipefail
cd "$(dirname "$0")/.."

step() { printf '\n==> %s\n' "$*" >&2; }

for tool in cargo rustfmt cargo-clippy; do
  command -v "$tool" >/dev/null || { echo "error: $tool is not installed (rustup component add rustfmt clippy)" >&2; exit 1; }
done

if [ -x scripts/fetch-test-model.sh ]; then
  step "test model"
  scripts/fetch-test-model.sh
fi

step "python test environment"
scripts/python-env.sh

step "cargo fmt --check"
cargo fmt --all -- --check

step "cargo clippy --all-targets -- -D warnings"
cargo clippy --workspace --all-targets --locked -- -D warnings

step "cargo test"
cargo test --workspace --locked
