"""End a forked child as a fresh interpreter running the same ``main`` would end: the exit
status ``sys.exit`` would give, a ``SystemExit`` message or a traceback on stderr, its
output flushed. Shared by the servers that fork instead of starting interpreters
(``spacesd.fork_server``, ``chaos.run.driver_server``)."""

from __future__ import annotations

import os
import sys
import traceback
from collections.abc import Callable
from typing import NoReturn


def exit_as_main(main: Callable[[], int | None]) -> NoReturn:
    """Run ``main`` in this forked child, then ``os._exit`` with its status (never returns,
    never runs the parent's clean-up: its ``atexit`` handlers and buffers are the parent's)."""
    code = 1
    try:
        code = main() or 0
    except SystemExit as exc:  # what ``sys.exit`` in a fresh interpreter would give
        if exc.code is None or isinstance(exc.code, int):
            code = exc.code or 0
        else:
            print(exc.code, file=sys.stderr)
            code = 1
    except BaseException:  # noqa: BLE001 - a fresh interpreter prints it and exits 1
        traceback.print_exc()
        code = 1
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        os._exit(code if 0 <= code <= 255 else 1)
