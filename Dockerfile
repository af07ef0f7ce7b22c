# syntax=docker/dockerfile:1
#
# The sous image: what the init containers of `sous deploy` run (`sous pull`,
# `sous quantize`), and the engine container of a native-engine recipe.
#
#   docker build -t sous:0.1.0 .
#
# makes the tag the recipes default to (`deploy.sous_image` is `sous:<version>`, the
# workspace version in Cargo.toml). Push it to a registry the cluster pulls from and
# set `deploy.sous_image`, or import it into the node's container runtime.
#
# For x86-64 and Arm nodes at once (a DGX Spark is linux/arm64), one multi-arch tag:
#
#   docker buildx build --platform linux/amd64,linux/arm64 -t REGISTRY/sous:0.1.0 --push .
#
# The build stage runs on the build machine's own platform and cross-compiles for the
# target's (rustup's target and Debian's cross gcc for the C of `ring`), so no stage
# runs under emulation; only the runtime stage's `apt-get` does, which takes seconds.

# --- build -------------------------------------------------------------------------
FROM --platform=$BUILDPLATFORM rust:1-bookworm AS build
ARG TARGETARCH
ARG BUILDARCH
WORKDIR /src
# The Rust target of the image's platform, and for a cross build its linker.
RUN case "$TARGETARCH" in \
      amd64) target=x86_64-unknown-linux-gnu; gcc=x86-64-linux-gnu; linker=x86_64-linux-gnu-gcc ;; \
      arm64) target=aarch64-unknown-linux-gnu; gcc=aarch64-linux-gnu; linker=aarch64-linux-gnu-gcc ;; \
      *) echo "sous images are built for amd64 and arm64, not $TARGETARCH" >&2; exit 1 ;; \
    esac \
 && echo "$target" > /rust-target \
 && rustup target add "$target" \
 && if [ "$TARGETARCH" != "$BUILDARCH" ]; then \
      apt-get update \
      && apt-get install -y --no-install-recommends "gcc-$gcc" "libc6-dev-$TARGETARCH-cross" \
      && rm -rf /var/lib/apt/lists/* \
      && echo "$linker" > /cross-linker; \
    fi
COPY . .
# The registry and target/ are cache mounts (BuildKit): a rebuild after a source change
# recompiles sous, not its dependencies. target/ does not outlive the RUN, so the
# binary is copied out within it.
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    target=$(cat /rust-target) \
 && if [ -f /cross-linker ]; then \
      export "CARGO_TARGET_$(echo "$target" | tr 'a-z-' 'A-Z_')_LINKER=$(cat /cross-linker)"; \
    fi \
 && cargo build --release --locked -p sous --bin sous --target "$target" \
 && install -m 0755 "target/$target/release/sous" /usr/local/bin/sous

# --- runtime -----------------------------------------------------------------------
FROM debian:bookworm-slim

LABEL org.opencontainers.image.title="sous" \
      org.opencontainers.image.description="One recipe file to a running, measured LLM server." \
      org.opencontainers.image.source="https://github.com/sous-dev/sous" \
      org.opencontainers.image.licenses="Apache-2.0"

# curl for the health check the compose target renders for the native engine, and
# ca-certificates for curl (sous itself carries the Mozilla roots, webpki-roots).
RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates curl \
 && rm -rf /var/lib/apt/lists/*

# uid and gid 10001: the pods set fsGroup 10001, which makes their volumes writable for
# this group. /var/lib/sous is where those pods mount the data volume; created here
# and owned by sous so that a fresh Docker volume mounted there is writable too.
RUN groupadd --gid 10001 sous \
 && useradd --uid 10001 --gid 10001 --no-log-init --no-create-home \
        --home-dir /var/lib/sous/home --shell /usr/sbin/nologin sous \
 && install -d -o 10001 -g 10001 /var/lib/sous /var/lib/sous/home

COPY --from=build /usr/local/bin/sous /usr/local/bin/sous

ENV HOME=/var/lib/sous/home
WORKDIR /var/lib/sous
# Numeric, so that Kubernetes can check `runAsNonRoot` against it.
USER 10001:10001
ENTRYPOINT ["/usr/local/bin/sous"]
CMD ["--help"]
