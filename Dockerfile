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

# --- build -------------------------------------------------------------------------
FROM rust:1-bookworm AS build
WORKDIR /src
COPY . .
# The registry and target/ are cache mounts (BuildKit): a rebuild after a source change
# recompiles sous, not its dependencies. target/ does not outlive the RUN, so the
# binary is copied out within it.
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked -p sous --bin sous \
 && install -m 0755 target/release/sous /usr/local/bin/sous

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
