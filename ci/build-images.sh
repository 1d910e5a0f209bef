#!/usr/bin/env bash
# Build the Space image `durable-space` from the top-level Dockerfile.
#
#     ci/build-images.sh              (the same as: python -m chaos image build)
#
# The Dockerfile starts FROM debian:bookworm-slim. Machines here have no container registry,
# so the base is chosen in this order, and the first that works is used:
#   1. $BASE, when set (any local or pullable image);
#   2. debian:bookworm-slim, when it is already in the engine;
#   3. durable-base:bookworm, our equivalent from an earlier run, when its label says it was
#      made from the current ci/build-rootfs.sh recipe (no network needed: the fast path);
#   4. debian:bookworm-slim pulled from a registry (up to $PULL_TIMEOUT seconds);
#   5. ci/build-rootfs.sh (debootstrap --variant=minbase, cached as a tarball) then
#      `docker import` as durable-base:bookworm.
# Then `docker build --build-arg BASE=... --label durable.spacesd=<digest of spacesd/>`: with
# the same base image id and an unchanged spacesd/, every layer comes from the cache, so a
# rebuild with nothing changed takes seconds.
# Package installs inside the build use Debian's mirror.
#
# Environment: IMAGE (default durable-space), BASE, PULL_TIMEOUT (default 20), and
# build-rootfs.sh's SUITE, DEBIAN_MIRROR, ROOTFS_CACHE. Needs a Docker engine that answers;
# debootstrap and root only when step 5 runs.
set -euo pipefail
cd "$(dirname "$0")/.."

IMAGE=${IMAGE:-durable-space}
PULL_TIMEOUT=${PULL_TIMEOUT:-20}
OFFICIAL=debian:bookworm-slim
OURS=durable-base:bookworm

say() { echo "build-images.sh: $*" >&2; }
die() { say "$*"; exit 1; }

docker info >/dev/null 2>&1 || die "no Docker engine answers (docker info failed); start dockerd \
(ci/docker.sh shows how) or set DOCKER_HOST"

t0=$(date +%s%N)
base=${BASE:-}
if [ -z "$base" ] && docker image inspect "$OFFICIAL" >/dev/null 2>&1; then
    base=$OFFICIAL
    say "base: $OFFICIAL (already in the engine)"
fi
if [ -z "$base" ]; then
    # The imported base carries the rootfs recipe hash it was made from: reuse it only when
    # build-rootfs.sh would make the same thing today.
    recipe=$(bash ci/build-rootfs.sh --recipe)
    have=$(docker image inspect "$OURS" --format '{{ index .Config.Labels "durable.rootfs" }}' \
           2>/dev/null || true)
    if [ "$have" = "$recipe" ]; then
        base=$OURS
        say "base: $OURS (made earlier from rootfs recipe $recipe)"
    elif timeout "$PULL_TIMEOUT" docker pull -q "$OFFICIAL" >/dev/null 2>&1; then
        base=$OFFICIAL
        say "base: $OFFICIAL (pulled)"
    else
        say "cannot pull $OFFICIAL (no registry reachable); building an equivalent with debootstrap"
        tarball=$(bash ci/build-rootfs.sh)
        case "$tarball" in *"-$recipe.tar") ;; *) die "build-rootfs.sh made $tarball, expected recipe $recipe";; esac
        docker import --change "LABEL durable.rootfs=$recipe" --change 'CMD ["bash"]' \
            "$tarball" "$OURS" >/dev/null
        base=$OURS
        say "base: $OURS (imported from $tarball)"
    fi
fi

# BuildKit needs the buildx plugin with newer CLIs; without it, use the classic builder
# (its layer cache serves the same purpose here).
if ! docker buildx version >/dev/null 2>&1; then
    export DOCKER_BUILDKIT=0
fi
# The digest of the spacesd it copies: a provider refuses an image whose label is not its
# own tree's (backends/sources.py), so a campaign never attacks an older spacesd.
digest=$(python3 -m backends.sources)
say "docker build -t $IMAGE --build-arg BASE=$base --label durable.spacesd=$digest ."
docker build -t "$IMAGE" --build-arg "BASE=$base" --label "durable.spacesd=$digest" . >&2
ms=$(( ($(date +%s%N) - t0) / 1000000 ))
say "built $IMAGE ($(docker image inspect "$IMAGE" --format '{{.Id}}' | cut -c8-19)) \
in $((ms / 1000)).$(printf '%03d' $((ms % 1000)) | cut -c1)s"
