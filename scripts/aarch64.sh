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
# What it does, chosen for coverage per minute on 2 cores:
#   1. `cargo check` of the whole workspace, every target, for aarch64, warnings denied;
#   2. every test of sous-kernels under qemu (the NVFP4 test vectors, the bit-exactness
#      and property tests, products, attention) but for two that ask the kernel whether
#      a mapping was advised for huge pages: qemu's user mode accepts madvise and
#      ignores it, so they cannot pass under it. The exhaustive FP4 encoder test takes
#      every 257th f32 (and every f32 near the rounding boundaries), not all of them.
#
# qemu runs the binaries with the machine's own arm64 libc (libc6:arm64, which
# libstd-rust-web-dev:arm64 brings), never `-L /usr/aarch64-linux-gnu`: that directory's
# dynamic loader comes from libc6-arm64-cross, a different build of glibc than the
# libc6:arm64 it ends up loading, and pthread_create then spins forever in its stack
# cache. Every program that starts a thread (rayon, tokio) hangs that way.
set -euo pipefail
cd "$(dirname "$0")/.."

step() { printf '\n==> %s\n' "$*" >&2; }

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

export RUSTC=/usr/bin/rustc
# Apart from the host build: another rustc, other flags.
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-target}/aarch64"
export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER=aarch64-linux-gnu-gcc
export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_RUNNER=qemu-aarch64-static
export RUSTFLAGS="-D warnings"
# The test environment's NVRTC is an x86-64 library: an aarch64 process cannot load it.
unset SOUS_TEST_NVRTC

step "aarch64: cargo check --workspace --all-targets ($("$RUSTC" --version))"
cargo check --workspace --all-targets --locked --target "$target"

step "aarch64: sous-kernels tests under qemu"
SOUS_TEST_F32_STRIDE=257 cargo test -p sous-kernels --lib --tests --locked --target "$target" -- \
  --skip pages::tests::the_mapping_is_advised_for_huge_pages_and_reported \
  --skip pages::tests::a_zeroed_buffer_is_zero_writable_and_advised
