"""A driver for the coordinator's tests. What its n-th launch of a session does comes from
the JSON script in ``CUA_FAKE_SCRIPT`` (one entry per launch, the last repeated):
``{"sleep": s, "heartbeat": bool, "exit": code, "delete_space": bool, "wait_for": path}``
(``wait_for``: a file the test creates, waited for before the sleep); each launch is
journaled in ``<CUA_STATE_DIR>/journal.jsonl`` (start and end, with pid and epoch), so a
test can tell which drivers were alive when."""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from pathlib import Path

from durable.lifetime import DIE_WITH_ENV, die_with


def journal(path: Path, **record: object) -> None:
    with open(path, "a") as f:
        f.write(json.dumps({**record, "pid": os.getpid(), "t": time.time()}) + "\n")
        f.flush()
        os.fsync(f.fileno())


def main() -> int:
    die_with(os.environ.get(DIE_WITH_ENV))
    state = Path(os.environ["CUA_STATE_DIR"])
    state.mkdir(parents=True, exist_ok=True)
    log = state / "journal.jsonl"
    launches = sum(1 for line in log.read_text().splitlines() if '"start"' in line) \
        if log.exists() else 0
    script = json.loads(os.environ["CUA_FAKE_SCRIPT"])
    step = script[min(launches, len(script) - 1)]
    epoch = int(os.environ["CUA_SESSION_EPOCH"])
    journal(log, event="start", epoch=epoch, space=os.environ.get("CUA_SPACE_NAME"))
    if step.get("heartbeat", True):
        interval = float(os.environ["CUA_SESSION_HEARTBEAT_SECS"])

        def beat() -> None:
            while True:
                print(f"CUA-HEARTBEAT {epoch} {int(time.time() * 1000)}", flush=True)
                time.sleep(interval)

        threading.Thread(target=beat, daemon=True).start()
    if step.get("wait_for"):
        deadline = time.monotonic() + 300  # only a hung test takes this long
        while not os.path.exists(step["wait_for"]) and time.monotonic() < deadline:
            time.sleep(0.01)
    time.sleep(step.get("sleep", 0.0))
    if step.get("delete_space"):
        from backends.local import LocalSpaces

        LocalSpaces(os.environ["FAKE_SPACES_DIR"]).delete(os.environ["CUA_SPACE_NAME"])
    code = int(step.get("exit", 0))
    journal(log, event="end", epoch=epoch, exit=code)
    print(f"CUA-EXIT {code} scripted", file=sys.stderr, flush=True)
    return code


if __name__ == "__main__":
    sys.exit(main())
