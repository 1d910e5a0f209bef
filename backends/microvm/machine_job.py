"""The job that saves a microVM Space's whole state, or starts one from a saved state
(``machine_state`` says why it is a process of its own; ``machine_state.run_job`` starts it
and waits)."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

from durable.errors import PermanentFailure, SpaceError

from .machine_state import PERMANENT_EXIT
from .provider import MicroVMSpaces


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m backends.microvm.machine_job",
                                description="save a microVM Space's state, or start one "
                                            "from a saved state")
    p.add_argument("action", choices=("save", "load"))
    p.add_argument("base_dir", type=Path)
    p.add_argument("name")
    p.add_argument("path", type=Path)
    args = p.parse_args(argv)
    spaces = MicroVMSpaces(args.base_dir)
    try:
        if args.action == "save":
            spaces.save_machine(args.name, args.path)
        else:
            spaces.load_machine(args.name, args.path)
    except PermanentFailure as exc:
        print(exc, file=sys.stderr)
        return PERMANENT_EXIT
    except (SpaceError, OSError, subprocess.CalledProcessError) as exc:
        detail = getattr(exc, "stderr", None)
        print(f"{exc}{': ' + detail.decode(errors='replace').strip() if detail else ''}",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
