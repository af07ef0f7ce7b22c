#!/usr/bin/env bash
# Debian packages the test suite runs (never needed to build or run sous):
# - docker-compose: a real Compose parser for `sous deploy --target compose`
#   (`docker-compose config`), bookworm's 1.29.2, without the Docker daemon it
#   recommends;
# - systemd: `systemd-analyze verify` for `sous deploy --target systemd`;
# - prometheus: a real Prometheus server for `sous bench scrape --prometheus`
#   (bookworm's 2.42; the test runs its own, on a loopback port, never the service).
# Idempotent; installs only what is missing, with sudo when not root.
set -euo pipefail

missing=()
command -v docker-compose >/dev/null || missing+=("docker-compose=1.29.2-3")
command -v systemd-analyze >/dev/null || missing+=("systemd")
command -v prometheus >/dev/null || missing+=("prometheus=2.42.0+ds-5+b6")
[ ${#missing[@]} -eq 0 ] && exit 0

as_root=()
[ "$(id -u)" -eq 0 ] || as_root=(sudo -n)
install() { "${as_root[@]}" apt-get install -y -qq --no-install-recommends "$@" >/dev/null; }
if ! install "${missing[@]}" 2>/dev/null; then
  "${as_root[@]}" apt-get update -qq >/dev/null
  # The pin first; if bookworm has moved on (a security update), its current release.
  install "${missing[@]}" 2>/dev/null || install "${missing[@]%%=*}"
fi
echo "debian packages ready: ${missing[*]}" >&2
