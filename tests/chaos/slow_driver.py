"""The campaign's driver, started late: it sleeps ``SLOW_DRIVER_S`` seconds first (default:
a second longer than the stale foreign kind's command sleeps), as a driver on a machine
under heavy load might take to get going."""

from __future__ import annotations

import os
import sys
import time

from chaos.driver import main
from chaos.modes.stale_kinds import FOREIGN_PRESET
from scenarios import load

if __name__ == "__main__":
    time.sleep(float(os.environ.get("SLOW_DRIVER_S", load(FOREIGN_PRESET).long_seconds + 1)))
    sys.exit(main())
