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
# PyPI is the one network this step needs. A failed install (a dropped connection, a
# full disk) is tried again twice, a minute apart, before the suite gives up; the free
# space is printed with the error because a full disk is the usual cause.
for attempt in 1 2 3; do
  if "$venv/bin/pip" install --quiet --disable-pip-version-check --retries 10 --timeout 60 \
      -r scripts/requirements-test.txt; then
    break
  fi
  echo "python-env: pip install failed (attempt $attempt of 3); free space:" >&2
  df -h "$venv" >&2 || true
  [ "$attempt" = 3 ] && { echo "python-env: error: could not install scripts/requirements-test.txt into $venv" >&2; exit 1; }
  sleep 60
done
cp scripts/requirements-test.txt "$stamp"
echo "python test environment ready: $venv" >&2
