#!/usr/bin/env bash
# A Python virtual environment at target/py with the pinned packages the tests use
# (scripts/requirements-test.txt). Idempotent: reinstalls only when the pins change.
set -euo pipefail
cd "$(dirname "$0")/.."
venv=target/py
stamp="$venv/.requirements"
if [ -x "$venv/bin/python" ] && cmp -s scripts/requirements-test.txt "$stamp"; then
  exit 0
fi
python3 -m venv "$venv"
"$venv/bin/pip" install --quiet --disable-pip-version-check -r scripts/requirements-test.txt
cp scripts/requirements-test.txt "$stamp"
echo "python test environment ready: $venv" >&2
