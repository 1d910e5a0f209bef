import sys

from chaos.exits import EXIT_INTERRUPTED, by_ctrl_c, exit_with

try:
    from chaos.cli import main

    code = main()
except BaseException as exc:  # Ctrl-C outside the campaign's own handler (modules loading)
    if not by_ctrl_c(exc):
        raise
    print("chaos: interrupted", file=sys.stderr)
    code = EXIT_INTERRUPTED
exit_with(code)
