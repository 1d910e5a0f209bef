"""A child that must not outlive its parent: it asks the kernel for SIGKILL when the parent
dies (``PR_SET_PDEATHSIG``), even when the parent is SIGKILLed and cannot clean up.

The parent names itself in the child's environment (``DIE_WITH_ENV``: the coordinator for
its drivers, a campaign runner for a coordinator it starts); the child calls ``die_with``
first thing. If the parent died before the request took effect, the child exits at once:
otherwise it would run on as an orphan nobody owns.
"""

from __future__ import annotations

import ctypes
import os
import signal

#: The pid of the process a child must not outlive.
DIE_WITH_ENV = "CUA_DIE_WITH_PID"
_PR_SET_PDEATHSIG = 1


def die_with(parent: str | int | None) -> None:
    """Be SIGKILLed when ``parent`` (this process's parent, by pid) dies; exit at once if it
    is already gone. None or empty: nothing to do. Off Linux the request is not available:
    the parent must end its children itself."""
    if parent is None or parent == "":
        return
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
        return
    if os.getppid() != int(parent):
        os._exit(1)
