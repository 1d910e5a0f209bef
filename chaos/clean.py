"""``chaos clean``: end what campaigns left behind.

First every dead campaign's note (``live.clean_dead``: its drivers, Spaces, daemons,
commands and temp directories, even after its results directory was deleted), then the
local and microVM Spaces found under a results directory, then, unless only local ones are
asked for, every campaign's docker Spaces (by their labels).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from . import live


def _microvms(spaces_dir: Path) -> int:
    """Delete the microVM Spaces (their QEMUs by pid and start time) under ``spaces_dir``."""
    from backends.microvm import MicroVMSpaces

    provider = MicroVMSpaces(spaces_dir)
    names = provider.names()
    for name in names:
        provider.delete(name)
    return len(names)


def clean(args: argparse.Namespace) -> int:
    from backends.local import LocalSpaces

    campaigns, killed = live.clean_dead()
    if campaigns:
        print(f"clean: ended {campaigns} dead campaign(s): {killed} process(es) killed, their "
              "Spaces and temp directories removed")
    removed = 0
    for spaces_dir in sorted(args.results.glob("**/spaces")) if args.backend != "docker" else []:
        provider = LocalSpaces(spaces_dir)
        for name in provider.names():
            provider.delete(name)
            removed += 1
        removed += _microvms(spaces_dir)
    if args.backend == "local":
        print(f"clean: removed {removed} Space(s)")
        return 0
    try:
        from backends.docker import DockerSpaces, DockerUnavailable
    except ImportError:  # no docker SDK here: no docker Spaces either
        pass
    else:
        try:
            removed += DockerSpaces.clean_all()
        except DockerUnavailable as exc:
            print(f"clean: docker Spaces not cleaned: {exc}", file=sys.stderr)
    print(f"clean: removed {removed} Space(s)")
    return 0
