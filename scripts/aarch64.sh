#!/usr/bin/env bash
# The aarch64 part of the test suite (scripts/test.sh runs it; CI with it): the DGX Spark
# and other Arm servers run sous as linux/arm64. With Debian's own packages, which
# scripts/debian-deps.sh installs (no toolchain download):
#
#   - rustc-web and libstd-rust-web-dev:arm64: a rustc with an aarch64 standard library
#     (RUSTC=/usr/bin/rustc; rustup's rustc here has none);
#   - gcc-aarch64-linux-gnu: the linker;
#   - qemu-user-static: runs the aarch64 test binaries on this machine.
#
# What it does, chosen for coverage per minute on 2 cores, in the `cross` profile
# (Cargo.toml: dependencies at opt-level 0, which halves the build; the kernels
# optimized as in dev):
#   1. builds every library and binary of the workspace for aarch64 (sous, its engine
#      and kernels; not the fake engine, a test double the x86-64 run uses), warnings
#      denied, and the sous-kernels tests that step 2 runs. The other tests and the
#      examples build for x86-64 in the main run: checking them for aarch64 too costs
#      more than it finds (benchmarks/aarch64.md);
#   2. every test of sous-kernels under qemu (the NVFP4 test vectors, the bit-exactness
#      and property tests, products on the NEON kernels against the portable ones,
#      attention) but for two that ask the kernel whether a mapping was advised for
#      huge pages: qemu's user mode accepts madvise and ignores it, so they cannot pass
#      under it. The exhaustive FP4 encoder test takes every 257th f32 (and every f32
#      near the rounding boundaries), not all of them;
#   3. the aarch64 sous under qemu against this machine's x86-64 one, on the SmolLM2
#      test model (tests/e2e/aarch64.rs): `sous quantize` in both checkpoint formats and
#      W4A4 (calibrated by the native engine) to the same bytes, and the native engine's
#      greedy continuations of the fixture's prompts in f32 to the same tokens and
#      logprobs. This step runs the host's e2e test binary, built by scripts/test.sh.
#
# qemu runs the binaries with the machine's own arm64 libc (libc6:arm64, which
# libstd-rust-web-dev:arm64 brings), never `-L /usr/aarch64-linux-gnu`: that directory's
# dynamic loader comes from libc6-arm64-cross, a different build of glibc than the
# libc6:arm64 it ends up loading, and pthread_create then spins forever in its stack
# cache. Every program that starts a thread (rayon, tokio) hangs that way.
#
#   scripts/aarch64.sh [build|test|all]
#
# `build` is step 1 alone, `test` steps 2 and 3 (after a `build`), `all` (the default)
# the three. scripts/test.sh runs `build` at the lowest priority while the x86-64 tests
# run (they wait on child processes and leave a core idle; benchmarks/build.md), then
# `test`.
set -euo pipefail
cd "$(dirname "$0")/.."
phase=${1:-all}
case "$phase" in
  build | test | all) ;;
  *) echo "usage: scripts/aarch64.sh [build|test|all]" >&2; exit 2 ;;
esac

step() { printf '\n==> %s (%s)\n' "$*" "$(date -u +%T)" >&2; }

target=aarch64-unknown-linux-gnu
missing=()
for tool in /usr/bin/rustc aarch64-linux-gnu-gcc qemu-aarch64-static; do
  command -v "$tool" >/dev/null || missing+=("$tool")
done
if [ -z "$(ls -d /usr/lib/rustlib/$target 2>/dev/null)" ]; then
  missing+=("the $target standard library (libstd-rust-web-dev:arm64)")
fi
if [ ${#missing[@]} -gt 0 ]; then
  [ "${CI:-}" = true ] && { echo "error: missing for the aarch64 job: ${missing[*]}" >&2; exit 1; }
  echo "warning: SKIPPED the aarch64 job: missing ${missing[*]} (scripts/debian-deps.sh installs them)" >&2
  exit 0
fi

host_target_dir="${CARGO_TARGET_DIR:-target}"
# Apart from the host build: another rustc, other flags, another directory. Set per
# command, so that step 3's host build is the suite's own (the same flags, no rebuild).
# SOUS_TEST_NVRTC is unset: the test environment's NVRTC is an x86-64 library, which an
# aarch64 process cannot load. So is scripts/test.sh's clippy wrapper: its driver is the
# host toolchain's, which has no aarch64 standard library (the lints are the host's job).
cross() {
  env -u SOUS_TEST_NVRTC -u RUSTC_WORKSPACE_WRAPPER -u CLIPPY_ARGS \
    RUSTC=/usr/bin/rustc \
    CARGO_TARGET_DIR="$host_target_dir/aarch64" \
    CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER=aarch64-linux-gnu-gcc \
    CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_RUNNER=qemu-aarch64-static \
    RUSTFLAGS="-D warnings" \
    cargo "$@"
}
flags=(--locked --profile cross --target "$target")

kernel_tests=(-p sous-kernels --lib --tests "${flags[@]}")
if [ "$phase" != test ]; then
  step "aarch64: build the workspace's libraries and binaries, and the kernels' tests ($(/usr/bin/rustc --version))"
  cross build --workspace --exclude sous-fake-engine --lib --bins "${flags[@]}"
  cross test --no-run "${kernel_tests[@]}"
fi
[ "$phase" = build ] && exit 0

step "aarch64: sous-kernels tests under qemu"
SOUS_TEST_F32_STRIDE=257 cross test "${kernel_tests[@]}" -- \
  --skip gemm::placement_tests::the_mapping_is_advised_for_huge_pages_and_reported \
  --skip pages::tests::a_zeroed_buffer_is_zero_writable_and_advised

step "aarch64: sous under qemu against x86-64 (quantize, native greedy decoding)"
SOUS_TEST_AARCH64_BIN="$(realpath -m "$host_target_dir/aarch64/$target/cross/sous")" \
  cargo test --workspace --locked --test e2e -- --ignored aarch64::
