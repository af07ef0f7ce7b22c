#!/usr/bin/env bash
# Debian packages the test suite runs (never needed to build or run sous):
# - docker-compose: a real Compose parser for `sous deploy --target compose`
#   (`docker-compose config`), bookworm's 1.29.2, without the Docker daemon it
#   recommends;
# - systemd: `systemd-analyze verify` for `sous deploy --target systemd`;
# - prometheus: a real Prometheus server for `sous bench scrape --prometheus`
#   (bookworm's 2.42; the test runs its own, on a loopback port, never the service);
# - rustc-web, libstd-rust-web-dev:arm64, gcc-aarch64-linux-gnu, libc6-dev-arm64-cross,
#   qemu-user-static: the aarch64 cross-build and its tests under emulation
#   (scripts/aarch64.sh), after `dpkg --add-architecture arm64`. The C library's
#   headers are only a recommendation of the cross gcc, which --no-install-recommends
#   leaves out, and `ring`'s C needs them.
# Idempotent; installs only what is missing, with sudo when not root.
set -euo pipefail

missing=()
command -v docker-compose >/dev/null || missing+=("docker-compose=1.29.2-3")
command -v systemd-analyze >/dev/null || missing+=("systemd")
command -v prometheus >/dev/null || missing+=("prometheus=2.42.0+ds-5+b6")
[ -x /usr/bin/rustc ] || missing+=("rustc-web")
[ -d /usr/lib/rustlib/aarch64-unknown-linux-gnu ] || missing+=("libstd-rust-web-dev:arm64")
command -v aarch64-linux-gnu-gcc >/dev/null || missing+=("gcc-aarch64-linux-gnu")
[ -f /usr/aarch64-linux-gnu/include/stdint.h ] || missing+=("libc6-dev-arm64-cross")
command -v qemu-aarch64-static >/dev/null || missing+=("qemu-user-static")
[ ${#missing[@]} -eq 0 ] && exit 0

as_root=()
[ "$(id -u)" -eq 0 ] || as_root=(sudo -n)
if [[ " ${missing[*]} " == *":arm64 "* ]] && ! dpkg --print-foreign-architectures | grep -qx arm64; then
  "${as_root[@]}" dpkg --add-architecture arm64
  "${as_root[@]}" apt-get update -qq >/dev/null
fi
install() { "${as_root[@]}" apt-get install -y -qq --no-install-recommends "$@" >/dev/null; }
if ! install "${missing[@]}" 2>/dev/null; then
  "${as_root[@]}" apt-get update -qq >/dev/null
  # The pin first; if bookworm has moved on (a security update), its current release.
  install "${missing[@]}" 2>/dev/null || install "${missing[@]%%=*}"
fi
echo "debian packages ready: ${missing[*]}" >&2
