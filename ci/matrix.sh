#!/usr/bin/env bash
# The fault matrix on one commit: every campaign mode with every held fault kind its backend
# takes in each run's plan, on each backend and log, and one file of their SUMMARY lines.
#
#   ci/matrix.sh [ROW...]        rows: local jsonl docker microvm (default: all four)
#
# Per row and mode (transactional, checkpoint, auto, stale as the race, stale as the paused
# older driver, redrive), the first half of the seeds run with the log's disk filled
# (--fill-log-disks) and the second half with the host's power cut (--cut-host-power): both
# put the log on a disk of their own, so no campaign can take both. The paused stale kind,
# which may stop its driver inside a commit, refuses power cuts and takes the full log disk
# on every seed. Held kinds per backend:
#
#   local, jsonl  pause Spaces, daemons, commands; cut and slow links; fill state and work disks
#   docker        the same but the state disk (a container keeps its daemon's state on its one)
#   microvm       pause Spaces, daemons, commands; cut and slow links; jump clocks; fill the
#                 work disk. Whole-machine checkpoints (the default there outside
#                 transactional mode) refuse the daemon and command pauses and the full work
#                 disk, which a snapshot would bring back frozen or full: those modes' first
#                 half runs machine checkpoints without them, the second half workspace
#                 checkpoints (--snapshots workspace) with them.
#
# Environment: LOCAL_RUNS (100), JSONL_RUNS (40), DOCKER_RUNS (20), MICROVM_RUNS (5): runs
# per mode; JOBS (2; MICROVM_JOBS, 1); OUT (results/matrix-<commit>-<time>). Needs root
# (disks, power). Each campaign's output goes to OUT/<row>-<mode>-<seeds>.log, its SUMMARY
# line to OUT/summary.txt. Exits 1 if any campaign was not valid, after running every one;
# a Ctrl-C ends the campaign running (as chaos run does) and the matrix with it (exit 130).
set -euo pipefail
cd "$(dirname "$0")/.."
say() { echo "ci/matrix.sh: $*" >&2; }
rows=("$@")
[ ${#rows[@]} -gt 0 ] || rows=(local jsonl docker microvm)
if [ "$(id -u)" != 0 ]; then
    say "needs root: it puts logs and workspaces on disks of their own and cuts the host's" \
        "power; run it with sudo"
    exit 2
fi
git_() { git -c safe.directory="$PWD" --no-optional-locks "$@"; }
if commit=$(git_ rev-parse --short HEAD 2>/dev/null); then
    # Untracked files (results, a venv) change no code; anything else makes it not one commit.
    [ -z "$(git_ status --porcelain --untracked-files=no)" ] || commit="$commit+changes"
    dated=$(git_ log -1 --format=%cd --date=iso)
else
    commit=unknown dated="not a git checkout"
fi
OUT=${OUT:-results/matrix-$commit-$(date -u +%Y%m%dT%H%M%S)}
mkdir -p "$OUT"
bash ci/setup.sh
for row in "${rows[@]}"; do
    case $row in
        local|jsonl) ;;
        docker) bash ci/docker.sh --prepare ;;
        microvm) bash ci/microvm.sh --prepare ;;
        *) say "unknown row '$row': give local, jsonl, docker or microvm"; exit 2 ;;
    esac
done
echo "# ci/matrix.sh on $commit ($dated), $(date -u +%FT%TZ)" >> "$OUT/summary.txt"

invalid=0
campaign() {  # campaign NAME ARGS...: one chaos run, its SUMMARY line kept
    local name=$1; shift
    say "$name: chaos run $*"
    local started=$SECONDS rc=0
    .venv/bin/python -m chaos run --quiet --results "$OUT/results" "$@" \
        > "$OUT/$name.log" 2>&1 || rc=$?
    # chaos ends itself on a Ctrl-C, with 130: the matrix ends too, not only that campaign
    [ $rc -ne 130 ] || { say "$name: interrupted; the lines so far: $OUT/summary.txt"; exit 130; }
    [ $rc -eq 0 ] || invalid=1
    local line
    line=$(grep '^SUMMARY ' "$OUT/$name.log" | tail -1 || true)
    [ -n "$line" ] || { line="SUMMARY missing: see $OUT/$name.log"; invalid=1; }
    echo "$name $line" >> "$OUT/summary.txt"
    say "$name: $((SECONDS - started)) s: ${line:0:160}"
}

for row in "${rows[@]}"; do
    backend=$row log=()
    held=(--pause-spaces --pause-daemons --pause-commands --cut-links --slow-links
          --fill-work-disks)
    jobs=${JOBS:-2}
    case $row in
        local) runs=${LOCAL_RUNS:-100}; held+=(--fill-state-disks) ;;
        jsonl) runs=${JSONL_RUNS:-40}; backend=local; log=(--log jsonl)
               held+=(--fill-state-disks) ;;
        docker) runs=${DOCKER_RUNS:-20} ;;
        microvm) runs=${MICROVM_RUNS:-5}; jobs=${MICROVM_JOBS:-1}
                 held=(--pause-spaces --cut-links --slow-links --jump-clocks) ;;
    esac
    in_machine=(--pause-daemons --pause-commands --fill-work-disks)
    half=$(( (runs + 1) / 2 ))
    for mode in transactional checkpoint auto stale stale-paused redrive; do
        args=(--backend "$backend" "${log[@]}" --jobs "$jobs" "${held[@]}")
        case $mode in
            stale) args+=(--mode stale --stale-kind race) ;;
            stale-paused) args+=(--mode stale --stale-kind paused) ;;
            *) args+=(--mode "$mode") ;;
        esac
        second=()  # what the second half adds
        if [ "$row" = microvm ] && [ "$mode" = transactional ]; then
            args+=("${in_machine[@]}")
        elif [ "$row" = microvm ]; then
            second=(--snapshots workspace "${in_machine[@]}")
        fi
        if [ "$mode" = stale-paused ]; then
            campaign "$row-$mode-1-$runs" "${args[@]}" --runs "$runs" --seed-base 1 \
                --fill-log-disks
            continue
        fi
        campaign "$row-$mode-1-$half" "${args[@]}" --runs "$half" --seed-base 1 \
            --fill-log-disks
        if [ "$runs" -gt "$half" ]; then
            campaign "$row-$mode-$((half + 1))-$runs" "${args[@]}" "${second[@]}" \
                --runs "$((runs - half))" --seed-base "$((half + 1))" --cut-host-power
        fi
    done
done
say "every SUMMARY line: $OUT/summary.txt"
exit $invalid
