"""A driver for the driver server's tests (``python -m tests.chaos.run.fork_probe ACTION``):
prints what a forked driver sees as one JSON line, then does what ``ACTION`` says."""

from __future__ import annotations

import json
import os
import sys
import time

from backends import space_client
from durable import failpoints


def main(argv: list[str]) -> int:
    print(json.dumps({
        "pid": os.getpid(), "pgid": os.getpgid(0), "sid": os.getsid(0), "ppid": os.getppid(),
        "probe": os.environ.get("PROBE"), "runner": os.environ.get("CHAOS_RUNNER_PID"),
        "owner": space_client.PROCESS_OWNER, "failpoints": failpoints.enabled(),
        "argv": sys.argv, "stdin": os.read(0, 10).decode()}), flush=True)
    action, *rest = argv
    if action == "sleep":
        time.sleep(120)
    if action == "raise":
        raise RuntimeError("the probe raised")
    if action == "sys.exit":
        sys.exit(rest[0])
    return int(rest[0]) if action == "exit" else 0
