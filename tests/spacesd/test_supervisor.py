"""spacesd.supervisor on this machine (it is the PID 1 of docker Spaces; the docker tests
check it there): restarts a dead daemon, kill-daemon, stops on SIGTERM, backs off when the
daemon cannot start. Every supervisor is killed and waited for when its test ends."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from backends.local.procs import kill_space_processes
from backends.space_client import Endpoint, HttpSpaceClient
from spacesd import procfs

ROOT = str(Path(__file__).resolve().parents[2])
TOKEN = "t0ken"


@contextmanager
def supervisor(tmp: Path, *extra: str, token: str = TOKEN) -> Iterator[subprocess.Popen]:
    (tmp / "work").mkdir(exist_ok=True)
    (tmp / "state").mkdir(exist_ok=True)
    argv = [sys.executable, "-m", "spacesd.supervisor", "run", *extra,
            "--pid-file", str(tmp / "state/daemon.pid"), "--port-file", str(tmp / "state/port"),
            "--", "--root", str(tmp / "work"), "--state", str(tmp / "state"),
            "--token-env", "SPACESD_TOKEN"]
    env = {**os.environ, "PYTHONPATH": ROOT, "SPACESD_TOKEN": token}
    with open(tmp / "supervisor.log", "ab") as log:
        proc = subprocess.Popen(argv, env=env, stdout=log, stderr=log, start_new_session=True)
    try:
        yield proc
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)  # its daemon is in a group of its own:
        proc.wait(timeout=30)
        daemon = read_pid(tmp)
        if daemon and procfs.is_alive(*daemon):
            os.kill(daemon[0], signal.SIGKILL)
        kill_space_processes(str(tmp / "state"))  # its commands, and its cgroup


def read_pid(tmp: Path) -> tuple[int, int] | None:
    try:
        pid, started = map(int, (tmp / "state/daemon.pid").read_text().split())
        return pid, started
    except (FileNotFoundError, ValueError):
        return None


def wait_daemon(tmp: Path, other_than: tuple[int, int] | None = None,
                timeout: float = 120.0) -> tuple[int, int]:
    deadline = time.monotonic() + timeout
    while True:
        pid = read_pid(tmp)
        if pid and pid != other_than and procfs.is_alive(*pid):
            return pid
        assert time.monotonic() < deadline, (tmp / "supervisor.log").read_text()
        time.sleep(0.02)


def client(tmp: Path) -> HttpSpaceClient:
    return HttpSpaceClient("sup", 1, lambda: Endpoint(
        "127.0.0.1", int((tmp / "state/port").read_text()), TOKEN), retry_for=10)


def kill_daemon(tmp: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "spacesd.supervisor", "kill-daemon",
                           "--pid-file", str(tmp / "state/daemon.pid"), "--timeout", "20"],
                          env={**os.environ, "PYTHONPATH": ROOT}, capture_output=True,
                          text=True, timeout=60, check=False)


def test_a_killed_daemon_is_started_again_and_its_commands_live_on(tmp_path: Path) -> None:
    with supervisor(tmp_path):
        first = wait_daemon(tmp_path)
        c = client(tmp_path)
        c.exec_start("k", "echo $$ > sh.pid; while [ ! -e gate ]; do sleep 0.05; done")
        deadline = time.monotonic() + 120
        while not (tmp_path / "work/sh.pid").exists():
            assert time.monotonic() < deadline
            time.sleep(0.02)

        done = kill_daemon(tmp_path)
        assert done.returncode == 0, done.stderr
        second = wait_daemon(tmp_path)
        assert second != first and int(done.stdout) == second[0]
        assert not procfs.is_alive(*first)
        assert c.exec_status("k").state == "running"
        (tmp_path / "work/gate").touch()
        assert c.exec_wait("k", timeout=120).exit_code == 0


def test_kill_daemon_with_no_daemon_kills_nothing(tmp_path: Path) -> None:
    (tmp_path / "state").mkdir()
    assert kill_daemon(tmp_path).returncode == 1
    # A pid file whose process is gone (or is someone else now) names no daemon.
    (tmp_path / "state/daemon.pid").write_text(f"{os.getpid()} 1\n")
    assert kill_daemon(tmp_path).returncode == 1


def test_sigterm_stops_the_daemon_and_the_supervisor(tmp_path: Path) -> None:
    with supervisor(tmp_path) as proc:
        daemon = wait_daemon(tmp_path)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=120) == 0
        assert not procfs.is_alive(*daemon)
    assert "stopped by signal 15" in (tmp_path / "supervisor.log").read_text()


def test_a_daemon_that_cannot_start_is_retried_with_a_growing_delay(tmp_path: Path) -> None:
    log_file = tmp_path / "supervisor.log"
    with supervisor(tmp_path, "--max-delay", "0.4", token="") as proc:
        deadline = time.monotonic() + 300  # only a hang takes minutes: the delays are < 1 s
        while not (log_file.exists() and "starting it again in 0.4s" in log_file.read_text()
                   and log_file.read_text().count("started spacesd") >= 3):
            assert time.monotonic() < deadline, log_file.read_text()
            time.sleep(0.05)
        assert proc.poll() is None  # still supervising, not dead
    log = log_file.read_text()
    assert "the token is empty" in log
    # not spinning: every start after the first followed a delay it announced
    starts = log.count("started spacesd")
    assert log.count("starting it again in") >= starts - 1, log


def test_daemonize_is_refused(tmp_path: Path) -> None:
    out = subprocess.run([sys.executable, "-m", "spacesd.supervisor", "run", "--",
                          "--root", str(tmp_path), "--state", str(tmp_path / "s"),
                          "--token-env", "X", "--daemonize"],
                         env={**os.environ, "PYTHONPATH": ROOT}, capture_output=True,
                         text=True, timeout=60, check=False)
    assert out.returncode != 0 and "do not pass --daemonize" in out.stderr
