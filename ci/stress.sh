#!/usr/bin/env bash
# Hunt flaky tests: run the test command N times in a row, optionally with a local crash
# campaign running beside it as load, and stop at the first red run (its output is kept).
#
#   ci/stress.sh [N] [--load] [PYTEST_ARGS...]
#
# N defaults to 10. --load keeps `python -m chaos run --mode checkpoint --runs 100 --jobs 2`
# running (restarted whenever it ends) while the tests run: the machine is then busier than
# any CI host, so a test that waits on time instead of an event shows itself. Each run's
# output goes to $STRESS_DIR/run-<i>.log (default: a new temp directory); a summary line per
# run is printed. The load campaign is ended by its pid, with its drivers and Spaces.
#
# Stopped (Ctrl-C, or SIGTERM to it or its process group), it ends the test run as a Ctrl-C
# would: pytest tears its fixtures down, which delete the Spaces the running tests made
# (their daemons left in sessions of their own, their QEMU guests), then the load ends.
set -euo pipefail
cd "$(dirname "$0")/.."
runs=10
if [[ "${1:-}" =~ ^[0-9]+$ ]]; then runs=$1; shift; fi
load=0
if [ "${1:-}" = "--load" ]; then load=1; shift; fi
STRESS_DIR=${STRESS_DIR:-$(mktemp -d -t stress-XXXXXX)}
mkdir -p "$STRESS_DIR"
bash ci/setup.sh

load_pid=
end_load() {
    [ -n "$load_pid" ] || return 0
    kill -TERM "$load_pid" 2>/dev/null || true  # it Ctrl-C's its campaign and waits for it
    wait "$load_pid" 2>/dev/null || true
}
trap end_load EXIT
if [ $load = 1 ]; then
    # In Python, not a shell loop: a shell's background job ignores SIGINT, and so would the
    # campaign it starts, which then could not end its runs and Spaces itself.
    .venv/bin/python - "$STRESS_DIR" <<'PY' &
import signal, subprocess, sys
child = None
stopping = False
def end(_signum, _frame):
    # Only a flag and a signal here: the main thread may be inside child.wait(), whose
    # lock a wait in this handler would wait on forever.
    global stopping
    stopping = True
    if child is not None and child.returncode is None:
        child.send_signal(signal.SIGINT)  # the campaign ends its runs, then the loop ends
signal.signal(signal.SIGTERM, end)
with open(f"{sys.argv[1]}/load.log", "ab") as log:
    while not stopping:
        child = subprocess.Popen(
            [".venv/bin/python", "-m", "chaos", "run", "--mode", "checkpoint", "--runs", "100",
             "--jobs", "2", "--results", f"{sys.argv[1]}/load"], stdout=log, stderr=log,
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
        if stopping:  # the SIGTERM came between the loop's test and the start
            child.send_signal(signal.SIGINT)
        child.wait()
PY
    load_pid=$!
    echo "ci/stress.sh: load: a checkpoint campaign loop (pid $load_pid)" >&2
fi

test_pid=
stop() {
    trap - INT TERM
    if [ -n "$test_pid" ]; then
        echo "ci/stress.sh: stopped: ending the running tests (pid $test_pid) as a Ctrl-C" \
             "would, so their fixtures delete what they made" >&2
        kill -INT -- "-$test_pid" 2>/dev/null || true
        wait "$test_pid" 2>/dev/null || true
    fi
    exit 130
}
trap stop INT TERM

for i in $(seq 1 "$runs"); do
    started=$SECONDS
    # A process group of its own: a signal to this script's group does not reach it
    # unannounced (a SIGTERM would kill pytest before its teardown); stop() forwards a
    # SIGINT, which a background job would ignore (hence --default-signal).
    setsid env --default-signal=INT bash ci/test.sh "$@" >"$STRESS_DIR/run-$i.log" 2>&1 &
    test_pid=$!
    if wait "$test_pid"; then
        echo "ci/stress.sh: run $i/$runs passed in $((SECONDS - started)) s:" \
             "$(tail -1 "$STRESS_DIR/run-$i.log")"
    else
        echo "ci/stress.sh: run $i/$runs FAILED after $((SECONDS - started)) s;" \
             "its output: $STRESS_DIR/run-$i.log" >&2
        grep -E '^(FAILED|ERROR) ' "$STRESS_DIR/run-$i.log" >&2 || true
        exit 1
    fi
done
echo "ci/stress.sh: $runs of $runs runs passed (logs: $STRESS_DIR)"
