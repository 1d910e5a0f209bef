"""The campaign's driver, started late: it sleeps ``SLOW_DRIVER_S`` seconds (default 7)
first, as a driver on a machine under heavy load might take to get going."""

from __future__ import annotations

import os
import sys
import time

from chaos.driver import main

if __name__ == "__main__":
    time.sleep(float(os.environ.get("SLOW_DRIVER_S", "7")))
    sys.exit(main())
