"""How a command line of the project ends: one exit code per kind of ending, and one
handler that turns an exception into its code and a line that says what happened, shared by
``python -m chaos`` and ``python -m reports``.

``0``/``1``/``2``: the command's own answer (a campaign's verdict); ``130``: Ctrl-C;
``254``: bad arguments or input, one line saying what, nothing run; ``255``: the tool
itself crashed, with its traceback (never a false pass).
"""

from __future__ import annotations

import atexit
import os
import signal
import sys
import threading
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import NoReturn

EXIT_INTERRUPTED = 130
EXIT_BAD_ARGS = 254
EXIT_CRASHED = 255


def by_ctrl_c(exc: BaseException | None) -> bool:
    """Whether ``exc`` is Ctrl-C or an error it caused: a SIGINT that lands while a C
    extension initialises (matplotlib's ``ft2font``, loaded with the campaign's modules)
    surfaces as ``ImportError: initialization failed`` raised from the
    ``KeyboardInterrupt`` (found by the Ctrl-C test: exit 1 instead of 130)."""
    while exc is not None:
        if isinstance(exc, KeyboardInterrupt):
            return True
        exc = exc.__cause__ or exc.__context__
    return False


_noted: list[int] = []


def noting_ctrl_c(signum: int, _frame: object) -> None:
    """The SIGINT handler of ``python -m chaos``: Python's own (``KeyboardInterrupt``), but
    the Ctrl-C is noted first. CPython drops an exception raised inside a weakref callback
    or a ``__del__`` (it prints "Exception ignored in"), so a Ctrl-C that landed in one was
    lost and the campaign ran to its end (found by the Ctrl-C test: exit 0 at "start
    +0.4 s", inside the import system's module-lock callback). ``raise_noted_ctrl_c``
    raises it again where it must have taken effect."""
    _noted.append(signum)
    raise KeyboardInterrupt


_stopping: list[int] = []


def stopping() -> None:
    """Note that the command is ending by a Ctrl-C or a SIGTERM (its runs being ended, its
    SUMMARY written): a SIGTERM from now on is ignored (``terminate_as_ctrl_c``)."""
    _stopping.append(signal.SIGINT)


def terminate_as_ctrl_c(signum: int, _frame: object) -> None:
    """The SIGTERM handler of ``python -m chaos``: a SIGTERM (``timeout``, a CI runner
    cancelling its job, ``kill``) ends the command as Ctrl-C does, through whatever SIGINT
    handler holds at that instant (one that only notes it while the SUMMARY is written
    too), so the running runs' drivers and Spaces end with it. Its default ended the
    process at once and left them running: a microVM campaign under ``timeout`` left its
    QEMU machines behind (found by hand; ``chaos clean`` ended them). Once it is stopping
    (a SIGTERM or a Ctrl-C came), a SIGTERM is ignored: runners send one a few seconds
    after their Ctrl-C, which would cut the ending of the runs short; SIGKILL ends it at
    once (and ``chaos clean`` what it leaves)."""
    if _stopping or _noted:
        return
    _stopping.append(signum)
    signal.raise_signal(signal.SIGINT)


def ctrl_c_noted() -> bool:
    """Whether ``noting_ctrl_c`` saw a Ctrl-C: one that raised as it should, or one that
    Python dropped. Either way the command ends by it (exit 130)."""
    return bool(_noted)


def raise_noted_ctrl_c() -> None:
    """Raise ``KeyboardInterrupt`` if a Ctrl-C was noted (and forget it): at a point where
    a Ctrl-C must have taken effect, so that one Python dropped takes effect there."""
    if _noted:
        _noted.clear()
        raise KeyboardInterrupt


@contextmanager
def ctrl_c_deferred() -> Iterator[None]:
    """A block that Ctrl-C must not cut half-way: a SIGINT during it raises
    ``KeyboardInterrupt`` once it ended. For the main thread (the one signals reach) while
    Ctrl-C raises; anywhere else, a plain block. (A run handed to a thread pool: cut between
    the thread's start and the pool's count of it, the run went on unseen by the campaign's
    abort, and the exit then cut it short with its Space alive; found by the Ctrl-C test.)"""
    before = signal.getsignal(signal.SIGINT)
    if threading.current_thread() is not threading.main_thread() or \
            before not in (signal.default_int_handler, noting_ctrl_c):
        yield
        return
    came: list[int] = []
    signal.signal(signal.SIGINT, lambda signum, _frame: came.append(signum))
    try:
        yield
    except BaseException as exc:
        signal.signal(signal.SIGINT, before)
        if came:  # the Ctrl-C is what the command ends by (``by_ctrl_c``)
            raise KeyboardInterrupt from exc
        raise
    signal.signal(signal.SIGINT, before)
    if came:
        raise KeyboardInterrupt


def guarded(prog: str, what: str, run: Callable[[], int],
            bad_input: tuple[type[BaseException], ...]) -> int:
    """``run()``'s exit code; ``bad_input`` exceptions exit 254 with their message, Ctrl-C
    exits 130, anything else 255 with its traceback (``what`` names the tool that crashed)."""
    try:
        return run()
    except BaseException as exc:
        if by_ctrl_c(exc):
            print(f"{prog}: interrupted", file=sys.stderr)
            return EXIT_INTERRUPTED
        if isinstance(exc, bad_input):
            print(f"{prog}: {exc}", file=sys.stderr)
            return EXIT_BAD_ARGS
        if not isinstance(exc, Exception):
            raise  # SystemExit: the command's own exit
        traceback.print_exc()
        print(f"{prog}: {what} crashed (exit 255); the traceback above says where",
              file=sys.stderr)
        return EXIT_CRASHED


def exit_with(code: int) -> NoReturn:
    """End the process with ``code``. An interrupted command (130) does what the
    interpreter's exit does first (its threads that are not daemons joined, then its exit
    handlers: the driver server's close ends its drivers) and flushes its output, then
    skips the interpreter's finalisation: a Ctrl-C that lands while the campaign's C
    extensions load can leave one half-initialised, and its teardown then aborts the
    interpreter after ``chaos: interrupted`` was printed (``Fatal Python error:
    PyThreadState_Get``, exit -6 instead of 130; seen once, under load, by the Ctrl-C
    test)."""
    if code != EXIT_INTERRUPTED:
        sys.exit(code)
    stopping()
    threading._shutdown()  # type: ignore[attr-defined]  # the interpreter's own first step
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe: nothing more can be said
            pass
    os._exit(code)
