"""The local provider: Spaces by name from any process, restarts, daemon kills, deletion."""

from __future__ import annotations

import fcntl
import os
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import pytest

from backends.local import LocalSpaces
from backends.local.procs import kill_process
from chaos.faults.rendezvous import Answer, Hit, Rendezvous
from durable.errors import SpaceError, SpaceNotFound, SpaceUnavailable
from durable.spaces import Spaces
from spacesd.procfs import start_time
from tests.backends.pause_contract import (
    check_a_command_pause_freezes_the_commands_alone,
    check_a_daemon_pause_freezes_the_daemon_alone,
    check_a_pause_freezes_the_space,
    until,
)
from tests.liveness import running

ROOT = str(Path(__file__).resolve().parents[2])


def in_child(base: Path, code: str) -> str:
    """Run ``code`` in a fresh Python process with ``spaces = LocalSpaces(base)``."""
    out = subprocess.run(
        [sys.executable, "-c", f"from backends.local import LocalSpaces\n"
                               f"spaces = LocalSpaces({str(base)!r})\n{code}"],
        env={**os.environ, "PYTHONPATH": ROOT}, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout


def wait_for(path: Path, timeout: float = 120.0) -> str:
    deadline = time.monotonic() + timeout
    while not (path.exists() and path.read_text().strip()):
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.01)
    return path.read_text()


def test_is_a_spaces_provider(spaces: LocalSpaces) -> None:
    assert isinstance(spaces, Spaces) and spaces.kind == "local"
    assert spaces.names() == []
    spaces.create("a")
    daemon = spaces.get("a").daemon()
    spaces.create("a")  # idempotent: the running daemon is kept
    assert spaces.get("a").daemon() == daemon
    assert spaces.exists("a") and not spaces.exists("b")
    assert spaces.names() == ["a"]
    assert spaces.connect("a", epoch=3).epoch == 3


@pytest.mark.parametrize("name", ["", "a/b", "..", ".hidden", "x" * 101, "new\nline"])
def test_bad_names_are_refused_clearly(spaces: LocalSpaces, name: str) -> None:
    with pytest.raises(SpaceError) as exc:
        spaces.create(name)
    assert exc.value.code == "bad_request" and "bad Space name" in str(exc.value)
    assert not spaces.exists(name)


def test_missing_spaces(spaces: LocalSpaces) -> None:
    with pytest.raises(SpaceNotFound):
        spaces.connect("missing", epoch=1)
    with pytest.raises(SpaceNotFound):
        spaces.restart("missing")
    with pytest.raises(SpaceNotFound):
        spaces.kill_daemon("missing")
    spaces.delete("missing")  # no error


def test_spaces_outlive_their_creator_and_are_found_by_name(spaces: LocalSpaces) -> None:
    in_child(spaces.base_dir, "spaces.create('child')")
    assert spaces.names() == ["child"] and spaces.get("child").daemon()
    client = spaces.connect("child", epoch=1)
    client.write_file("hello.txt", b"from the parent")
    out = in_child(spaces.base_dir,
                   "c = spaces.connect('child', epoch=1)\n"
                   "print(c.read_file('hello.txt').decode())")
    assert out == "from the parent\n"


def test_parallel_processes_create_each_space_once(spaces: LocalSpaces) -> None:
    code = "import sys\nfor n in sys.argv[1:]: spaces.create(n)"
    procs = [subprocess.Popen([sys.executable, "-c",
                               f"from backends.local import LocalSpaces\n"
                               f"spaces = LocalSpaces({str(spaces.base_dir)!r})\n{code}",
                               "shared", f"own{i}"],
                              env={**os.environ, "PYTHONPATH": ROOT})
             for i in range(4)]
    for p in procs:
        assert p.wait(timeout=120) == 0
    assert spaces.names() == ["own0", "own1", "own2", "own3", "shared"]
    state = str(spaces.get("shared").state)
    daemons = [p for p in psutil.process_iter(["cmdline"])
               if p.info["cmdline"] and "spacesd" in p.info["cmdline"]
               and state in p.info["cmdline"]]
    assert len(daemons) == 1
    for name in spaces.names():
        assert spaces.connect(name, epoch=1).capabilities()


def test_kill_daemon_keeps_commands_and_restart_kills_them(spaces: LocalSpaces) -> None:
    spaces.create("s")
    space = spaces.get("s")
    client = spaces.connect("s", epoch=1)
    client.exec_start("k", "sleep 300 & echo $! > bg.pid; sleep 300")
    bg = int(wait_for(space.work / "bg.pid"))
    old_daemon = space.daemon()

    spaces.kill_daemon("s")
    assert not running(old_daemon[0]) and space.daemon() != old_daemon
    assert running(bg) and client.exec_status("k").state == "running"

    spaces.restart("s")
    assert not running(bg)
    assert client.exec_status("k").state == "lost"
    assert (space.work / "bg.pid").exists()  # the disk is kept


#: Holds a lock on ``sys.argv[1]`` with threads that keep its process busy, as a daemon's do.
_LOCK_HOLDER = """
import fcntl, os, sys, threading, time
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
fcntl.flock(fd, fcntl.LOCK_EX)
def busy():
    held = bytearray(20_000_000)
    while True:
        time.sleep(0.001)
for _ in range(8):
    threading.Thread(target=busy, daemon=True).start()
print("locked", flush=True)
time.sleep(300)
"""


def test_a_process_kill_process_ended_holds_nothing_once_it_returned(tmp_path: Path) -> None:
    """Found by the cluster test (a daemon kill "skipped: another daemon serves" the state):
    a SIGKILLed multi-threaded process shows as a zombie once its first thread is done,
    while its other threads still hold its files. ``kill_process`` must wait for them all,
    or the next daemon finds the state's lock still taken (it was, 62 times in 100)."""
    lock = tmp_path / "daemon.lock"
    for _ in range(20):
        holder = subprocess.Popen([sys.executable, "-c", _LOCK_HOLDER, str(lock)],
                                  stdout=subprocess.PIPE, text=True)
        try:
            assert holder.stdout is not None and holder.stdout.readline() == "locked\n"
            started = start_time(holder.pid)
            assert started is not None
            kill_process(holder.pid, started)
            fd = os.open(lock, os.O_RDWR)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # BlockingIOError: still held
            finally:
                os.close(fd)
        finally:
            holder.kill()
            holder.wait()
            assert holder.stdout is not None
            holder.stdout.close()


def test_delete_kills_everything_and_removes_the_disk(spaces: LocalSpaces) -> None:
    spaces.create("s")
    space = spaces.get("s")
    client = spaces.connect("s", epoch=1)
    client.exec_start("k", "echo $$ > sh.pid; sleep 300")
    sh = int(wait_for(space.work / "sh.pid"))
    daemon_pid = space.daemon()[0]
    spaces.delete("s")
    assert not running(sh) and not running(daemon_pid)
    assert not space.dir.exists() and spaces.names() == []


def test_a_daemon_that_cannot_start_is_reported_with_its_log(spaces: LocalSpaces) -> None:
    spaces.create("s")
    space = spaces.get("s")
    kill_process(*space.daemon())
    (space.state / "epoch").write_text("")  # a damaged floor stops spacesd from starting
    # Its exit is noticed: the start does not wait out a timeout only a hang would reach.
    patient = LocalSpaces(spaces.base_dir, start_timeout=600)
    started = time.monotonic()
    with pytest.raises(SpaceUnavailable) as exc:
        patient.create("s")
    assert "spacesd: damaged state" in str(exc.value) and str(space.log_file) in str(exc.value)
    assert time.monotonic() - started < 300


def test_commands_do_not_inherit_the_creators_environment(spaces: LocalSpaces,
                                                           monkeypatch) -> None:
    monkeypatch.setenv("CREATOR_SECRET", "leaked")
    spaces.create("s")
    client = spaces.connect("s", epoch=1)
    client.exec_start("k", 'echo "[$CREATOR_SECRET]"; command -v bash')
    out = client.exec_wait("k", timeout=60).output.splitlines()
    assert out[0] == "[]" and out[1].endswith("/bash")


def test_every_daemon_it_starts_reports_to_its_failpoint_channel(tmp_path: Path) -> None:
    hits: list[Hit] = []

    def answer(hit: Hit) -> Answer:
        hits.append(hit)
        return "continue"

    with tempfile.TemporaryDirectory(prefix="fp-") as short, \
            Rendezvous(os.path.join(short, "fp.sock"), answer) as rv:
        spaces = LocalSpaces(tmp_path / "spaces", failpoints=rv.address)
        try:
            for n, start in enumerate((spaces.create, spaces.restart, spaces.kill_daemon)):
                start("s")
                spaces.connect("s", epoch=1).checkpoint_create(f"cp{n}")
                assert (hits[-1].point, hits[-1].info["id"]) == ("spacesd.checkpoint.objects",
                                                                 f"cp{n}")
                assert hits[-1].pid == spaces.get("s").daemon()[0]
        finally:
            spaces.delete_all()


def test_files_commands_create_have_the_daemons_umask_not_the_creators(
        spaces: LocalSpaces) -> None:
    creators = os.umask(0o077)
    try:
        spaces.create("s")
    finally:
        os.umask(creators)
    client = spaces.connect("s", epoch=1)
    client.exec_start("k", "touch f; mkdir d")
    client.exec_wait("k", timeout=60)
    work = spaces.get("s").work
    assert (stat.S_IMODE(os.stat(work / "f").st_mode),
            stat.S_IMODE(os.stat(work / "d").st_mode)) == (0o644, 0o755)


def test_a_daemon_pause_freezes_the_daemon_and_its_commands_run_on(spaces: LocalSpaces) -> None:
    check_a_daemon_pause_freezes_the_daemon_alone(spaces, "sd")


def test_a_command_pause_freezes_the_commands_and_the_daemon_answers(spaces: LocalSpaces) -> None:
    check_a_command_pause_freezes_the_commands_alone(spaces, "sc")


def test_a_pause_freezes_every_process_and_a_resume_thaws_them(spaces: LocalSpaces) -> None:
    check_a_pause_freezes_the_space(spaces, "s", late_requests_land=True)
    space = spaces.get("s")
    client = spaces.connect("s", epoch=1)
    client.exec_start("sh@1", "echo $$ > sh.pid; sleep 300")
    sh = int(wait_for(space.work / "sh.pid"))
    daemon = space.daemon()
    assert daemon is not None
    spaces.pause("s")
    try:
        for pid in (daemon[0], sh):  # stopped once the kernel next schedules it
            until(f"process {pid} stopped",
                  lambda pid=pid: psutil.Process(pid).status() == psutil.STATUS_STOPPED)
    finally:
        spaces.resume("s")
    for pid in (daemon[0], sh):
        assert psutil.Process(pid).status() != psutil.STATUS_STOPPED, pid
