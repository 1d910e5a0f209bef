#!/usr/bin/env bash
# The test command: unit and integration tests plus the fast fixed-seed crash subset
# (pytest -m crash_ci), in parallel on the machine's cores.
set -euo pipefail
cd "$(dirname "$0")/.."
bash ci/setup.sh
exec .venv/bin/python -m pytest -n "${JOBS:-auto}" -q "$@"
