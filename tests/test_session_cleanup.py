"""The test session ends what tests cut short left running (``conftest.py``): a Ctrl-C makes
pytest-xdist's controller kill a worker that does not stop in time, and a Space the worker
made is then nobody's to delete; a second Ctrl-C cuts the controller's wait for its workers
short, and a worker left running would go on making Spaces."""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from backends.local.procs import daemons_under
from spacesd import procfs
from tests.liveness import running

ROOT = Path(__file__).resolve().parents[1]
STUCK = '''
import os, signal, time
from pathlib import Path
from backends.local import LocalSpaces

def test_stuck(tmp_path):
    spaces = LocalSpaces(tmp_path / "spaces")  # no fixture: nothing deletes its Spaces
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a worker that does not stop in time
    for i in range(3000):
        spaces.create(f"a{i}")
        Path(os.environ["MADE"]).touch()
        time.sleep(0.2)
'''
#: A deadline only a hang reaches.
HANG_S = 300


@pytest.mark.parametrize("ctrl_cs", [1, 2])
def test_what_a_worker_cut_short_left_is_ended_with_the_session(tmp_path: Path,
                                                                 ctrl_cs: int) -> None:
    (tmp_path / "test_stuck.py").write_text(STUCK)
    made, basetemp = tmp_path / "made", tmp_path / "basetemp"
    proc = subprocess.Popen(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "conftest",
         "-n", "1", "--basetemp", str(basetemp), str(tmp_path / "test_stuck.py")],
        cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(ROOT), "MADE": str(made)},
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    assert proc.stdout is not None
    lines: queue.Queue[str | None] = queue.Queue()
    reader = threading.Thread(target=lambda: [*map(lines.put, proc.stdout), lines.put(None)])
    reader.start()
    out: list[str] = []

    def read_until(text: str) -> None:
        deadline = time.monotonic() + HANG_S
        while not any(text in line for line in out):
            line = lines.get(timeout=max(0.0, deadline - time.monotonic()))
            assert line is not None, f"the session ended before {text!r}:\n{''.join(out)}"
            out.append(line)

    try:
        deadline = time.monotonic() + HANG_S
        while not made.exists():
            assert proc.poll() is None, "".join(lines.queue)
            assert time.monotonic() < deadline, "the inner test never made a Space"
            time.sleep(0.05)
        assert daemons_under([str(basetemp)])
        os.killpg(proc.pid, signal.SIGINT)  # a Ctrl-C at the terminal
        if ctrl_cs == 2:
            read_until("KeyboardInterrupt")  # the controller is ending its workers
            os.killpg(proc.pid, signal.SIGINT)
        proc.wait(timeout=HANG_S)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        reader.join(timeout=HANG_S)
        proc.stdout.close()
        left = [d for d in daemons_under([str(basetemp)]) if running(d[0])]
        for d in left:  # this test's, whatever the session under test did
            procfs.kill_exact(*d)
    out += [line for line in lines.queue if line is not None]
    assert not left, "".join(out)
    assert "conftest: ended what the tests left running: 0 campaign(s), " in "".join(out)
