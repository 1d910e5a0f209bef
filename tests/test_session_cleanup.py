"""The test session ends what a test cut short left running (``conftest.py``): a Ctrl-C
makes pytest-xdist's controller kill a worker that does not stop in time, and a Space the
worker made is then nobody's to delete."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from spacesd import procfs
from tests.liveness import running

ROOT = Path(__file__).resolve().parents[1]
STUCK = '''
import json, os, signal, time
from pathlib import Path
from backends.local import LocalSpaces
from backends.local.procs import daemons_under

def test_stuck(tmp_path):
    spaces = LocalSpaces(tmp_path / "spaces")  # no fixture: nothing deletes it
    spaces.create("a")
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a worker that does not stop in time
    Path(os.environ["DAEMONS"]).write_text(json.dumps(daemons_under([str(tmp_path)])))
    time.sleep(600)
'''


def test_a_space_left_by_a_worker_killed_at_a_ctrl_c_is_ended(tmp_path: Path) -> None:
    (tmp_path / "test_stuck.py").write_text(STUCK)
    daemons = tmp_path / "daemons.json"
    proc = subprocess.Popen(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "conftest",
         "-n", "1", "--basetemp", str(tmp_path / "basetemp"), str(tmp_path / "test_stuck.py")],
        cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(ROOT), "DAEMONS": str(daemons)},
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        deadline = time.monotonic() + 300
        while not daemons.exists() or not daemons.read_text():
            assert proc.poll() is None, proc.communicate()[0]
            assert time.monotonic() < deadline, "the inner test never made its Space"
            time.sleep(0.1)
        [(pid, started)] = json.loads(daemons.read_text())
        assert procfs.is_alive(pid, started)
        os.killpg(proc.pid, signal.SIGINT)  # a Ctrl-C at the terminal
        out, _ = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        made = json.loads(daemons.read_text() or "[]") if daemons.exists() else []
        alive = [d for d in made if procfs.is_alive(*d)]
        for d in alive:  # this test's, whatever the session under test did
            procfs.kill_exact(*d)
    assert "ended what the tests left running: 0 campaign(s), " in out, out
    assert not any(running(p) for p, _ in alive), out
