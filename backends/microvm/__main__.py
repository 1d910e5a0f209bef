"""``python -m backends.microvm build``: build (or find) the guest's kernel, initramfs and
base disk, and print where they are; ``probe``: which accelerator works here."""

from __future__ import annotations

import sys

from .artifacts import ArtifactsUnavailable, ensure
from .provider import probe_accel


def main(argv: list[str]) -> int:
    if argv not in (["build"], ["probe"]):
        print("usage: python -m backends.microvm build|probe", file=sys.stderr)
        return 254
    try:
        art = ensure(say=lambda line: print(line, file=sys.stderr, flush=True))
        if argv == ["probe"]:
            print(probe_accel())
            return 0
    except ArtifactsUnavailable as exc:
        print(f"backends.microvm: {exc}", file=sys.stderr)
        return 1
    print(f"kernel {art.kernel}\ninitrd {art.initrd}\ndisk {art.disk}\nkey {art.key}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
