# syntax=docker/dockerfile:1
#
# The router image `sous deploy` renders in front of several replicas
# (`[deploy.router]`): a router from PyPI and nothing else. Neither vllm-router nor
# sglang-router publishes an image of its own; both publish manylinux wheels for
# x86-64 and aarch64, so one build serves both kinds of node:
#
#   docker build -f docker/router.Dockerfile -t vllm-router:0.1.17 .
#   docker build -f docker/router.Dockerfile \
#       --build-arg ROUTER=sglang-router --build-arg VERSION=0.3.2 -t sglang-router:0.3.2 .
#   docker buildx build -f docker/router.Dockerfile --platform linux/amd64,linux/arm64 \
#       -t REGISTRY/vllm-router:0.1.17 --push .
#
# The tags are what recipes default to (`deploy.router.image`).
FROM python:3.12-slim-bookworm
ARG ROUTER=vllm-router
ARG VERSION=0.1.17
RUN pip install --no-cache-dir "${ROUTER}==${VERSION}" \
 && useradd --system --uid 10002 router
USER router
# The command comes from the rendering: `vllm-router ...` or
# `python3 -m sglang_router.launch_router ...`.
