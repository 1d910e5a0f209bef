"""The campaign's driver, except that the driver of epoch 2 dies (SIGKILL) before it opens
the log, as a planned fault can kill a race's newer driver before it takes over."""

from __future__ import annotations

import os
import signal
import sys

from chaos.driver import main

if __name__ == "__main__":
    if os.environ.get("CUA_SESSION_EPOCH") == "2":
        os.kill(os.getpid(), signal.SIGKILL)
    sys.exit(main())
