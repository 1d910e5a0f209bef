#!/usr/bin/env bash
# The main job: a local crash campaign on the embedded defaults (SQLite log, local Spaces).
# Prints one SUMMARY line; exits 0 only when every run kept the invariant.
# Extra arguments go to `chaos run` (e.g. --mode transactional --runs 100).
set -euo pipefail
cd "$(dirname "$0")/.."
bash ci/setup.sh
exec .venv/bin/python -m chaos run --mode "${CRASH_MODE:-checkpoint}" --backend local \
    --runs "${CRASH_RUNS:-40}" --seed-base "${CRASH_SEED_BASE:-1}" "$@"
