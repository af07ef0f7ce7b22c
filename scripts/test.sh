#!/usr/bin/env bash
# The whole test suite, exactly as CI runs it (.ci/run calls this and nothing else):
# formatting, lints with warnings denied, then every test of the workspace.
#
# A failing check does not stop the ones after it: every test binary runs
# (`--no-fail-fast`) and the aarch64 job runs even when an x86-64 test failed, so one
# failure hides none of the others. The script then exits 1, naming what failed. Only a
# step the later ones cannot do without (the build, the test model, the Python and
# Debian packages) stops it at once.
#
# One build profile serves the binary and the tests (dev, with optimized dependencies:
# see [profile.dev.package."*"] in Cargo.toml). The test build comes first and its
# `sous` binary imports the test model, so dependencies are compiled once for both.
# Clippy lints that same build (below): the workspace is compiled once, not checked again.
set -euo pipefail
cd "$(dirname "$0")/.."

step() { printf '\n==> %s (%s)\n' "$*" "$(date -u +%T)" >&2; }

# The checks that failed, reported together at the end.
failed=()
check() {
  local name=$1
  shift
  "$@" || { failed+=("$name"); echo "error: $name failed; going on with the rest" >&2; }
}

for tool in cargo rustfmt cargo-clippy python3; do
  command -v "$tool" >/dev/null || { echo "error: $tool is not installed" >&2; exit 1; }
done

# The build, the test model and the Python packages take about 7 GB. Said up front, so
# a run that later fails for want of space says why at its top.
avail_kb=$(df -Pk . | awk 'NR == 2 { print $4 }')
if [ -n "$avail_kb" ] && [ "$avail_kb" -lt $((8 * 1024 * 1024)) ]; then
  echo "warning: only $((avail_kb / 1024)) MB free on $(pwd): the suite needs about 7 GB" >&2
fi

# CI builds a clean clone once: incremental compilation's caches would only be written,
# never read, and writing them costs build time (cargo's own advice for CI). Local runs
# keep them, so a second run rebuilds only what changed.
if [ "${CI:-}" = true ]; then
  export CARGO_INCREMENTAL=0
fi

# The Python and Debian packages install while the build compiles: they need nothing
# from it, and the build leaves the network and the disk mostly idle. Their output is
# shown when they are waited for.
mkdir -p target
scripts/python-env.sh >target/python-env.log 2>&1 &
python_env=$!
scripts/debian-deps.sh >target/debian-deps.log 2>&1 &
debian_deps=$!

step "cargo fmt --check"
check "cargo fmt --check" cargo fmt --all -- --check

step "import circles (scripts/check/circles.py)"
check "import circles" python3 scripts/check/circles.py

step "product files within 650 lines (scripts/check/lengths.py)"
check "product file lengths" python3 scripts/check/lengths.py

step "commands call the library, not each other (scripts/check/commands.py)"
check "commands calling commands" python3 scripts/check/commands.py

# Clippy's driver compiles the workspace's own crates (dependencies are rustc's), as
# `cargo clippy` runs it but with code generation: every target `cargo test` builds is
# linted in the build itself, which saves the second, check-only compilation of the
# workspace that `cargo clippy` would be (benchmarks/build.md, issue 62). Lints stay
# warnings here (`--cap-lints warn`, so a lint stops neither the build nor the tests);
# the clippy check below fails on any warning. Exported: every later cargo command on
# the host must compile the same way, or it would build the workspace again.
export RUSTC_WORKSPACE_WRAPPER
RUSTC_WORKSPACE_WRAPPER=$(command -v clippy-driver)
export CLIPPY_ARGS=--cap-lints=warn

step "build (tests and binaries), linted by clippy"
cargo test --workspace --locked --no-run

step "compile-time crates at opt-level 0 (scripts/check/host_crates.py)"
check "compile-time crates" python3 scripts/check/host_crates.py

step "test model"
SOUS_BIN="${CARGO_TARGET_DIR:-target}/debug/sous" scripts/fetch-test-model.sh

step "python test environment (installed during the build)"
if ! wait "$python_env"; then
  cat target/python-env.log >&2
  exit 1
fi
cat target/python-env.log >&2

step "debian packages the checks run (docker-compose, systemd-analyze, prometheus, the aarch64 toolchain)"
if ! wait "$debian_deps"; then
  cat target/debian-deps.log >&2
  # Outside CI the checks that need them skip loudly; in CI they must run.
  [ "${CI:-}" = true ] && exit 1
  echo "warning: could not install them; the compose, systemd and Prometheus checks will be skipped" >&2
fi
cat target/debian-deps.log >&2

# The lints the build reported (cargo replays a fresh build's warnings): any of them
# fails the check, as `cargo clippy --all-targets -- -D warnings` would.
lints_clean() {
  local out
  out=$(cargo test --workspace --locked --no-run 2>&1) || { printf '%s\n' "$out" >&2; return 1; }
  if grep -qE '^(warning|error)(\[[^]]*\])?:' <<<"$out"; then
    grep -v '^ *Executable ' <<<"$out" >&2
    return 1
  fi
}
step "cargo clippy: the build's lints, warnings denied"
check "cargo clippy" lints_clean

step "cargo test"
# NVRTC from the test environment's nvidia-cuda-nvrtc wheel: the CUDA kernels are
# compiled (not run: there is no GPU here) by `the_kernels_compile_for_every_architecture`.
nvrtc=$(ls -d target/py/lib/python3*/site-packages/nvidia/cu13/lib 2>/dev/null | head -n 1 || true)
if [ -n "$nvrtc" ] && [ -e "$nvrtc/libnvrtc.so.13" ]; then
  export SOUS_TEST_NVRTC=1 LD_LIBRARY_PATH="$PWD/$nvrtc${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
elif [ "${CI:-}" = true ]; then
  echo "error: NVRTC is missing from target/py (scripts/python-env.sh installs nvidia-cuda-nvrtc)" >&2
  exit 1
else
  echo "warning: NVRTC not found in target/py: the CUDA kernels are not compiled by this run" >&2
fi
# The aarch64 build compiles meanwhile, at the lowest priority: the x86-64 tests wait
# on servers and child processes much of the time and leave a core idle, which the
# build takes; when a test wants both cores, the build yields them (same session, so
# `nice` applies; benchmarks/build.md, issue 62).
nice -n 19 scripts/aarch64.sh build >target/aarch64-build.log 2>&1 &
aarch64_build=$!
check "cargo test" cargo test --workspace --locked --no-fail-fast

step "aarch64 (scripts/aarch64.sh; its build ran beside the tests)"
aarch64_built=true
wait "$aarch64_build" || aarch64_built=false
cat target/aarch64-build.log >&2
if [ "$aarch64_built" = true ]; then
  check "aarch64 (scripts/aarch64.sh)" scripts/aarch64.sh test
else
  failed+=("aarch64 build (scripts/aarch64.sh build)")
fi

if [ ${#failed[@]} -gt 0 ]; then
  printf '\nerror: %d check(s) failed:\n' "${#failed[@]}" >&2
  printf '  - %s\n' "${failed[@]}" >&2
  exit 1
fi
step "every check passed"
