"""``python -m durable run MODULE:START``: the session driver for an app (``app_driver``)."""

from __future__ import annotations

import sys

from .app_driver import main

USAGE = ("usage: python -m durable run MODULE:START [--spaces MODULE:FACTORY] "
         "[--spaces-arg KEY=VALUE] [--mode MODE] [--no-checkpoint-store]\n"
         "(the session driver for an app's start function; python -m durable run --help)")

if len(sys.argv) < 2 or sys.argv[1] != "run":
    print(f"python -m durable: expected the command 'run', got "
          f"{sys.argv[1] if len(sys.argv) > 1 else 'nothing'}\n{USAGE}", file=sys.stderr)
    sys.exit(2)
sys.exit(main(sys.argv[2:]))
