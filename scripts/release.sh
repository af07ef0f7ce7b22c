#!/usr/bin/env bash
# Release tarballs of `sous` for x86-64 and aarch64 Linux, with their SHA-256 sums, in the
# shape ripgrep and uv publish theirs:
#
#   dist/sous-<version>-<target>.tar.gz          sous-<version>-<target>/{sous, README.md, man/*.1}
#   dist/sous-<version>-<target>.tar.gz.sha256   `sha256sum` of it
#   dist/SHA256SUMS                              every tarball's line
#
# Usage: scripts/release.sh [TARGET...]   (default: x86_64-unknown-linux-gnu aarch64-unknown-linux-gnu)
#
# x86-64 builds with the rustup toolchain; aarch64 with Debian's rustc-web and its arm64
# standard library, linked by gcc-aarch64-linux-gnu (scripts/debian-deps.sh installs them;
# see scripts/aarch64.sh). Each binary is checked before it is packed: its ELF machine,
# and `sous --version` run (aarch64 under qemu-user). A tarball is written under a
# temporary name and renamed, so `dist/` never holds a half-written one.
set -euo pipefail
cd "$(dirname "$0")/.."

targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(x86_64-unknown-linux-gnu aarch64-unknown-linux-gnu)
version=$(sed -n 's/^version = "\(.*\)"$/\1/p' Cargo.toml | head -n 1)
[ -n "$version" ] || { echo "error: no version in Cargo.toml" >&2; exit 1; }
mkdir -p dist

for target in "${targets[@]}"; do
  case "$target" in
    x86_64-unknown-linux-gnu)
      machine="Advanced Micro Devices X86-64"
      run=()
      build=(cargo build --release --locked -p sous --bin sous --target "$target")
      dir="${CARGO_TARGET_DIR:-target}"
      env_cross=()
      ;;
    aarch64-unknown-linux-gnu)
      machine="AArch64"
      run=(qemu-aarch64-static)
      for tool in /usr/bin/rustc aarch64-linux-gnu-gcc qemu-aarch64-static; do
        command -v "$tool" >/dev/null || { echo "error: $tool is missing: run scripts/debian-deps.sh" >&2; exit 1; }
      done
      dir="${CARGO_TARGET_DIR:-target}/aarch64"
      env_cross=(RUSTC=/usr/bin/rustc CARGO_TARGET_DIR="$dir"
        CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER=aarch64-linux-gnu-gcc)
      build=(cargo build --release --locked -p sous --bin sous --target "$target")
      ;;
    *) echo "error: no release for $target (x86_64-unknown-linux-gnu, aarch64-unknown-linux-gnu)" >&2; exit 1 ;;
  esac
  echo "==> $target: ${build[*]}" >&2
  env "${env_cross[@]}" "${build[@]}"
  binary="$dir/$target/release/sous"
  readelf -h "$binary" | grep -q "Machine: *$machine" || { echo "error: $binary is not $machine" >&2; exit 1; }
  reported=$("${run[@]}" "$binary" --version)
  [ "$reported" = "sous $version" ] || { echo "error: $binary says \`$reported\`, not sous $version" >&2; exit 1; }

  name="sous-$version-$target"
  stage=$(mktemp -d)
  trap 'rm -rf "$stage"' EXIT
  mkdir -p "$stage/$name/man"
  install -m 0755 "$binary" "$stage/$name/sous"
  install -m 0644 README.md "$stage/$name/README.md"
  install -m 0644 docs/man/*.1 "$stage/$name/man/"
  tar -C "$stage" --owner=0 --group=0 --numeric-owner --sort=name -czf "dist/.$name.tar.gz.partial" "$name"
  mv "dist/.$name.tar.gz.partial" "dist/$name.tar.gz"
  (cd dist && sha256sum "$name.tar.gz" > "$name.tar.gz.sha256")
  rm -rf "$stage"
  trap - EXIT
  echo "wrote dist/$name.tar.gz ($reported, $(du -h "dist/$name.tar.gz" | cut -f1))" >&2
done
(cd dist && cat sous-"$version"-*.tar.gz.sha256 > SHA256SUMS && sha256sum -c SHA256SUMS >&2)
