#!/usr/bin/env bash
# Build a minimal Debian root filesystem with debootstrap and print the path of its tarball.
#
#     ci/build-rootfs.sh            -> prints e.g. /var/cache/durable-spaces/rootfs/bookworm-minbase-3f2a9c01d4e5.tar
#     ci/build-rootfs.sh --recipe   -> prints the recipe hash only (3f2a9c01d4e5), builds nothing
#
# The one place that makes the project's Debian root filesystem: ci/build-images.sh imports
# it as the Docker base image (an equivalent of debian:bookworm-slim, for machines that cannot
# pull from a registry), and the microVM guest disk will be made from the same tarball.
#
# Equivalent of the official slim image: `debootstrap --variant=minbase`, the same apt
# sources (main, updates, security), the same dpkg excludes for docs/man/locales (and those
# files removed), no apt lists or cached .debs left behind.
#
# Cached: the tarball's name carries a hash of this script and its inputs, so a second call
# with nothing changed prints the existing path at once. Downloaded .debs are kept in
# $ROOTFS_CACHE/debs for the next build with other inputs.
#
# Environment:
#   SUITE           Debian suite (default bookworm)
#   DEBIAN_MIRROR   package mirror (default http://deb.debian.org/debian)
#   SECURITY_MIRROR security mirror (default http://deb.debian.org/debian-security)
#   EXTRA_PACKAGES  comma-separated packages to include (default none; the microVM guest
#                   will add its init and kernel-side tools here)
#   ROOTFS_CACHE    where tarballs and .debs are kept (default /var/cache/durable-spaces/rootfs)
# Needs root (debootstrap) and the debootstrap package.
set -euo pipefail

SUITE=${SUITE:-bookworm}
DEBIAN_MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
SECURITY_MIRROR=${SECURITY_MIRROR:-http://deb.debian.org/debian-security}
EXTRA_PACKAGES=${EXTRA_PACKAGES:-}
ROOTFS_CACHE=${ROOTFS_CACHE:-/var/cache/durable-spaces/rootfs}

die() { echo "build-rootfs.sh: $*" >&2; exit 1; }

recipe=$(printf '%s\n' "$SUITE" "$DEBIAN_MIRROR" "$SECURITY_MIRROR" "$EXTRA_PACKAGES" \
         | cat - "${BASH_SOURCE[0]}" | sha256sum | cut -c1-12)
if [ "${1:-}" = --recipe ]; then
    echo "$recipe"
    exit 0
fi
out="$ROOTFS_CACHE/$SUITE-minbase-$recipe.tar"
if [ -s "$out" ]; then
    echo "$out"
    exit 0
fi

mkdir -p "$ROOTFS_CACHE/debs"
work=$(mktemp -d "$ROOTFS_CACHE/build.XXXXXX")
trap 'rm -rf "$work"' EXIT
root="$work/root"

[ "$(id -u)" = 0 ] || die "debootstrap needs root; run as root (or with sudo)"
command -v debootstrap >/dev/null || die "debootstrap is missing; apt-get install -y debootstrap"
echo "build-rootfs.sh: debootstrap --variant=minbase $SUITE from $DEBIAN_MIRROR" >&2
include=()
[ -n "$EXTRA_PACKAGES" ] && include=(--include="$EXTRA_PACKAGES")
if ! debootstrap --variant=minbase "${include[@]}" --cache-dir="$ROOTFS_CACHE/debs" \
        "$SUITE" "$root" "$DEBIAN_MIRROR" >"$work/debootstrap.log" 2>&1; then
    tail -n 30 "$work/debootstrap.log" >&2
    [ -f "$root/debootstrap/debootstrap.log" ] && tail -n 30 "$root/debootstrap/debootstrap.log" >&2
    die "debootstrap failed (log above)"
fi

# The official image's apt sources, and its dpkg excludes (what makes it "slim").
cat >"$root/etc/apt/sources.list" <<EOF
deb $DEBIAN_MIRROR $SUITE main
deb $DEBIAN_MIRROR $SUITE-updates main
deb $SECURITY_MIRROR $SUITE-security main
EOF
cat >"$root/etc/dpkg/dpkg.cfg.d/slim" <<'EOF'
path-exclude /usr/share/doc/*
path-include /usr/share/doc/*/copyright
path-exclude /usr/share/man/*
path-exclude /usr/share/groff/*
path-exclude /usr/share/info/*
path-exclude /usr/share/locale/*
path-exclude /usr/share/lintian/*
path-exclude /usr/share/linda/*
EOF
find "$root/usr/share/doc" -mindepth 1 -not -name copyright -not -type d -delete
find "$root/usr/share/doc" -mindepth 1 -type d -empty -delete
rm -rf "$root/usr/share/man/"* "$root/usr/share/info/"* "$root/usr/share/locale/"* \
       "$root/usr/share/groff/"* "$root/usr/share/lintian/"*
rm -rf "$root/var/lib/apt/lists/"* "$root/var/cache/apt/"*.bin "$root/var/cache/apt/archives/"*.deb \
       "$root/var/log/"*.log "$root/debootstrap" "$root/tmp/"*
: >"$root/etc/hostname"
: >"$root/etc/resolv.conf"  # the container engine (or the VM's init) fills it in

tar --numeric-owner --xattrs -C "$root" -cf "$work/rootfs.tar" .
mv "$work/rootfs.tar" "$out"
echo "build-rootfs.sh: wrote $out ($(du -h "$out" | cut -f1))" >&2
echo "$out"
