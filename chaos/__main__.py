"""``python -m chaos`` and the ``chaos`` command: ``chaos.cli.main``, with a Ctrl-C that
lands while its modules load ending the command as any other (exit 130), and a SIGTERM
taken as a Ctrl-C."""

import signal
import sys

from chaos.exits import (
    EXIT_INTERRUPTED,
    by_ctrl_c,
    ctrl_c_noted,
    exit_with,
    noting_ctrl_c,
    raise_noted_ctrl_c,
    terminate_as_ctrl_c,
)


def entry() -> None:
    signal.signal(signal.SIGINT, noting_ctrl_c)
    signal.signal(signal.SIGTERM, terminate_as_ctrl_c)
    try:
        from chaos.cli import main

        raise_noted_ctrl_c()  # one that landed where Python drops it (``noting_ctrl_c``)
        code = main()
        if ctrl_c_noted() and code != EXIT_INTERRUPTED:  # dropped where none checks it
            raise KeyboardInterrupt
    except BaseException as exc:  # Ctrl-C outside the campaign's own handler (modules loading)
        if not by_ctrl_c(exc):
            raise
        print("chaos: interrupted", file=sys.stderr)
        code = EXIT_INTERRUPTED
    exit_with(code)


if __name__ == "__main__":
    entry()
