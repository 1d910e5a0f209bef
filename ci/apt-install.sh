#!/usr/bin/env bash
# Install the named Debian packages (the CI scripts name only those missing), with sudo
# when not root; nothing when none is named.
#
#     ci/apt-install.sh docker.io debootstrap
set -euo pipefail
[ $# -gt 0 ] || exit 0
SUDO=()
[ "$(id -u)" = 0 ] || SUDO=(sudo)
echo "ci/apt-install.sh: installing $*" >&2
"${SUDO[@]}" apt-get update -q >/dev/null
"${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -q "$@" >/dev/null
