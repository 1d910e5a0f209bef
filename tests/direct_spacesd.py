"""``python -m spacesd`` run directly, without a provider, for tests of its HTTP layer."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO

from backends.local.procs import kill_space_processes

ROOT = str(Path(__file__).resolve().parents[1])
TOKEN_ENV = "SPACESD_TEST_TOKEN"


@contextmanager
def direct_spacesd(tmp: Path, token: str, *args: str,
                   stderr: IO[bytes] | int = subprocess.DEVNULL
                   ) -> Iterator[tuple[int, subprocess.Popen[bytes], Path]]:
    """A daemon on ``tmp/work`` (created if missing) whose token comes from the
    environment, with ``args`` added; yields its port, its process and its workspace, and
    ends it by its pid (SIGTERM, then SIGKILL), then its commands and its cgroup (the local
    provider's ``kill_space_processes``)."""
    work, port_file = tmp / "work", tmp / "port"
    work.mkdir(exist_ok=True)
    proc = subprocess.Popen(
        [sys.executable, "-m", "spacesd", "--root", str(work), "--state", str(tmp / "st"),
         "--token-env", TOKEN_ENV, "--port-file", str(port_file), *args],
        env={**os.environ, "PYTHONPATH": ROOT, TOKEN_ENV: token},
        stdin=subprocess.DEVNULL, stderr=stderr, cwd=ROOT)
    try:
        deadline = time.monotonic() + 30
        while not port_file.exists():
            assert proc.poll() is None and time.monotonic() < deadline, "spacesd did not start"
            time.sleep(0.02)
        yield int(port_file.read_text()), proc, work
    finally:
        proc.terminate()
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        kill_space_processes(str(tmp / "st"))
