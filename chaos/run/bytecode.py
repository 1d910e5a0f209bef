"""Compiled bytecode for the processes a campaign starts: drivers, daemons, coordinators.

Python compiles a module at every import when it may not write the compiled copy
(``PYTHONDONTWRITEBYTECODE=1``, which some environments set): a driver then spends about
60 ms compiling the project's modules before it runs, on every attempt, and every daemon
does the same. Compiling them once here, into the usual ``__pycache__`` directories (only
what changed since the last time), lets every later process read them, whatever that
variable says. A tree that cannot be written is left as it is: its processes compile, as
before.
"""

from __future__ import annotations

import compileall
from pathlib import Path

#: The project's packages that the started processes import.
PACKAGES = ("durable", "spacesd", "backends", "chaos", "scenarios")
ROOT = Path(__file__).resolve().parents[2]


def compile_packages() -> bool:
    """Bring the compiled copies of ``PACKAGES`` up to date; whether all were written."""
    return all([bool(compileall.compile_dir(ROOT / name, quiet=2)) for name in PACKAGES])
