#!/usr/bin/env bash
# The strict checks, configured in pyproject.toml ([tool.ruff], [tool.mypy]):
#
#   1. ruff (the linter) over the packages, tests/ and conftest.py;
#   2. mypy (the type checker, strict) over the packages;
#   3. every `# noqa: CODE` and `# type: ignore[code]` in the packages says why after it
#      (ruff's PGH rules already refuse one without its code, everywhere).
#
# Every step runs, each one's findings are printed, and the exit is non-zero if any step
# found something. Fix what they find; where a finding must stay, silence that one line with
# its code and a short reason (`# noqa: BLE001 - the run's error, not the thread's`).
set -euo pipefail
cd "$(dirname "$0")/.."
bash ci/setup.sh

PACKAGES=(durable spacesd backends chaos scenarios reports)
failed=()
say() { echo "ci/lint.sh: $*" >&2; }
step() {  # step NAME COMMAND...: run COMMAND, printed first; remember NAME if it fails
    local name=$1
    shift
    say "$name: $*"
    "$@" || failed+=("$name")
}

step ruff .venv/bin/ruff check --no-cache --output-format concise "${PACKAGES[@]}" tests \
    conftest.py
step mypy .venv/bin/python -m mypy
unexplained() {  # the suppressions in the packages with nothing after their code
    say "(a noqa or type: ignore with no reason after it, in ${PACKAGES[*]})"
    ! grep -rnE --include='*.py' \
        -e '# noqa(: *[A-Z]+[0-9]+(, *[A-Z]+[0-9]+)*)? *$' \
        -e '# type: *ignore(\[[a-z-]+(, *[a-z-]+)*\])? *$' "${PACKAGES[@]}"
}
step "noqa reasons" unexplained

if [ ${#failed[@]} -gt 0 ]; then
    say "FAILED: ${failed[*]}"
    exit 1
fi
say "ruff, mypy and the noqa reasons: all clean"
