#!/usr/bin/env bash
# Create .venv (if missing or stale) and install the project with its dev and cluster extras.
# Idempotent and quiet when nothing changed; every other script in ci/ calls it first.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if ! "$PY" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
    echo "ci/setup.sh: Python 3.11+ is needed (found: $("$PY" --version 2>&1)); set PYTHON=" >&2
    exit 254
fi
stamp=.venv/.installed-$(sha256sum pyproject.toml | cut -c1-16)
if [ ! -f "$stamp" ]; then
    [ -x .venv/bin/python ] || "$PY" -m venv .venv
    .venv/bin/python -m pip install -q --upgrade pip
    .venv/bin/python -m pip install -q -e '.[dev,cluster]'
    rm -f .venv/.installed-*
    touch "$stamp"
fi
