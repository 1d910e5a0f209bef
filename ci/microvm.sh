#!/usr/bin/env bash
# The microVM job: from a bare Debian machine to a built guest, passing microvm tests and a
# short microVM crash campaign per mode, with no manual step.
#
#   1. install qemu-system-x86, qemu-utils, zstd (machine checkpoints are compressed with it),
#      busybox-static and debootstrap when missing;
#   2. build the guest once (kernel, initramfs, base disk; cached by recipe hash under
#      /var/cache/durable-spaces/microvm: a second build with nothing changed is instant);
#   3. pytest -m microvm;
#   4. a short campaign per mode on microVM Spaces (transactional with clock jumps, checkpoint with machine
#      snapshots and a forking agent, machine), SUMMARY lines.
# `--prepare` stops after step 2; `--campaign` skips step 3. Needs root for the first build
# (debootstrap). Environment: MICROVM_CAMPAIGN_RUNS (default 3), JOBS (default 2),
# RESULTS (default results).
set -euo pipefail
cd "$(dirname "$0")/.."
say() { echo "ci/microvm.sh: $*" >&2; }
SUDO=()
[ "$(id -u)" = 0 ] || SUDO=(sudo)
missing=()
command -v qemu-system-x86_64 >/dev/null 2>&1 || missing+=(qemu-system-x86)
command -v qemu-img >/dev/null 2>&1 || missing+=(qemu-utils)
command -v zstd >/dev/null 2>&1 || missing+=(zstd)
[ -x /bin/busybox ] && ! grep -q /lib64/ld-linux /bin/busybox 2>/dev/null || missing+=(busybox-static)
command -v debootstrap >/dev/null 2>&1 || missing+=(debootstrap)
bash ci/apt-install.sh "${missing[@]}"
bash ci/setup.sh
"${SUDO[@]}" .venv/bin/python -m backends.microvm build >/dev/null
say "guest built; accelerator: $(.venv/bin/python -m backends.microvm probe)"
[ "${1:-}" = "--prepare" ] && exit 0
status=0
if [ "${1:-}" != "--campaign" ]; then
    .venv/bin/python -m pytest -m microvm -q || status=1
fi
# checkpoint mode's agent forks (the forks preset): whole-machine checkpoints outside the
# Space give a lost Space and a fork their state.
# transactional mode's runs also step the guest's clock (--jump-clocks).
for mode in transactional checkpoint machine; do
    preset=default extra=()
    [ "$mode" = checkpoint ] && preset=forks
    [ "$mode" = transactional ] && extra=(--jump-clocks)
    .venv/bin/python -m chaos run --mode "$mode" --backend microvm --preset "$preset" "${extra[@]}" \
        --runs "${MICROVM_CAMPAIGN_RUNS:-3}" --jobs "${JOBS:-2}" --results "${RESULTS:-results}" \
        | grep -Ev '^run [0-9]+ seed=[0-9]+ ok ' || status=1
done
exit $status
