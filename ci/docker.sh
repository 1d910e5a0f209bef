#!/usr/bin/env bash
# The docker job: from a bare Debian machine to passing docker tests and a short docker
# crash campaign, with no manual step.
#
#   1. install docker.io and debootstrap when missing (apt; sudo when not root);
#   2. start dockerd in the background when no engine answers (log: $DOCKERD_LOG);
#   3. build the Space image (ci/build-images.sh: a debootstrap'd base when no registry);
#   4. pytest -m docker;
#   5. a short docker campaign per mode (transactional, checkpoint, auto, redrive, and auto
#      with --pause-spaces --cut-links, and as root --fill-work-disks --cut-host-power),
#      SUMMARY lines.
# Exits non-zero when any step fails; every SUMMARY line is printed before that.
# `--prepare` stops after step 3 (engine and image ready); `--campaign` skips step 4.
#
# What dockerd needs here (a VM with cgroup v1, iptables available, no registry): nothing
# but `--userland-proxy=false`. The defaults (overlay2, iptables NAT for builds reaching
# Debian's mirror) work. Without the userland proxy, a connection to a Space whose daemon
# is down is refused, exactly as for a local Space, instead of being accepted by
# docker-proxy and reset; the client then waits for the supervisor to bring the daemon back
# rather than failing the request (both are correct; the campaign just sees fewer crashes).
# Override with DOCKERD_ARGS (e.g. "--storage-driver=vfs" where overlayfs is unavailable).
#
# Environment: DOCKER_CAMPAIGN_RUNS (default 10 per mode), JOBS (default 2),
# CRASH_SEED_BASE (default 1), RESULTS (default results), DOCKERD_ARGS, DOCKERD_LOG.
set -euo pipefail
cd "$(dirname "$0")/.."

say() { echo "ci/docker.sh: $*" >&2; }
SUDO=()
[ "$(id -u)" = 0 ] || SUDO=(sudo)

# 1. tools ------------------------------------------------------------------
missing=()
command -v dockerd >/dev/null 2>&1 || missing+=(docker.io)
command -v debootstrap >/dev/null 2>&1 || missing+=(debootstrap)
bash ci/apt-install.sh "${missing[@]}"
bash ci/setup.sh

# 2. engine -----------------------------------------------------------------
if ! docker info >/dev/null 2>&1; then
    DOCKERD_LOG=${DOCKERD_LOG:-/var/log/dockerd.log}
    read -r -a extra <<<"${DOCKERD_ARGS:---userland-proxy=false}"
    group=()
    [ "$(id -u)" = 0 ] || group=(--group "$(id -gn)")  # let this user use the socket
    say "no engine answers; starting dockerd ${extra[*]} ${group[*]} (log: $DOCKERD_LOG)"
    "${SUDO[@]}" sh -c 'nohup setsid "$@" >>"$0" 2>&1 </dev/null &' \
        "$DOCKERD_LOG" dockerd "${extra[@]}" "${group[@]}"
    for _ in $(seq 120); do
        docker info >/dev/null 2>&1 && break
        sleep 0.5
    done
    if ! docker info >/dev/null 2>&1; then
        "${SUDO[@]}" tail -n 40 "$DOCKERD_LOG" >&2 || true
        say "dockerd did not answer within 60s (its log ends above); set DOCKERD_ARGS"
        exit 1
    fi
fi
say "engine: $(docker version --format 'server {{.Server.Version}}, API {{.Server.APIVersion}}')"

# 3. image ------------------------------------------------------------------
"${SUDO[@]}" env PATH="$PATH" bash ci/build-images.sh

if [ "${1:-}" = "--prepare" ]; then
    exit 0  # engine and image are ready; the caller runs the tests
fi

# 4. tests ------------------------------------------------------------------
status=0
if [ "${1:-}" != "--campaign" ]; then
    .venv/bin/python -m pytest -m docker -q || status=1
fi

# 5. a short campaign per mode ---------------------------------------------------------
for mode in transactional checkpoint auto redrive; do
    .venv/bin/python -m chaos run --mode "$mode" --backend docker \
        --runs "${DOCKER_CAMPAIGN_RUNS:-10}" --jobs "${JOBS:-2}" \
        --seed-base "${CRASH_SEED_BASE:-1}" --results "${RESULTS:-results}" \
        | grep -Ev '^run [0-9]+ seed=[0-9]+ ok ' || status=1
done
# ... and one with the containers paused (docker pause) and their links cut past the drivers'
# request timeout; as root, their workspace disks filled and the drivers' host's power cut too
held=(--pause-spaces --cut-links)
[ "$(id -u)" = 0 ] && held+=(--fill-work-disks --cut-host-power)
.venv/bin/python -m chaos run --mode auto --backend docker "${held[@]}" \
    --runs "${DOCKER_CAMPAIGN_RUNS:-10}" --jobs "${JOBS:-2}" \
    --seed-base "${CRASH_SEED_BASE:-1}" --results "${RESULTS:-results}" \
    | grep -Ev '^run [0-9]+ seed=[0-9]+ ok ' || status=1
exit $status
