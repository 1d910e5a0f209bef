"""Daemons forked by ``spacesd.fork_server`` (``backends.local.daemon_start``): the same
Space as a spawned daemon's, found, killed, frozen and cleaned up without the command line
and environment a spawned one has, and spawned again once their server is gone."""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import psutil
import pytest

from backends.local import LocalSpaces, daemon_start, procs
from durable.errors import SpaceUnavailable
from tests.backends.pause_contract import (
    check_a_command_pause_freezes_the_commands_alone,
    check_a_daemon_pause_freezes_the_daemon_alone,
    check_a_pause_freezes_the_space,
)

ROOT = str(Path(__file__).resolve().parents[2])


@pytest.fixture
def server() -> Iterator[daemon_start.ForkServer]:
    forks = daemon_start.ForkServer()
    yield forks
    forks.close()


@pytest.fixture
def forked(tmp_path: Path, server: daemon_start.ForkServer) -> Iterator[LocalSpaces]:
    provider = LocalSpaces(tmp_path / "spaces")
    server.serve(provider.base_dir)
    yield provider
    provider.delete_all()


NO_PIDFDS = """\
import errno, os, runpy, sys
server, real = os.getpid(), os.pidfd_open
def no_descriptor(pid, flags=0):  # the server's own probe passes; its starts find no room
    if os.getpid() == server and pid != server:
        raise OSError(errno.EMFILE, "Too many open files")
    return real(pid, flags)
os.pidfd_open = no_descriptor
assert sys.argv[1] == "-m", sys.argv
sys.argv = [sys.argv[2], *sys.argv[3:]]
runpy.run_module(sys.argv[0], run_name="__main__", alter_sys=True)
"""


@pytest.fixture
def blind_server(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                 ) -> Iterator[daemon_start.ForkServer]:
    """A fork server that can open no pidfd for its starts (as one at its descriptor limit)."""
    (tmp_path / "no_pidfds.py").write_text(NO_PIDFDS)
    python = tmp_path / "python"
    python.write_text(f'#!/bin/sh\nexec {sys.executable} {tmp_path / "no_pidfds.py"} "$@"\n')
    python.chmod(0o755)
    monkeypatch.setattr(sys, "executable", str(python))
    forks = daemon_start.ForkServer()
    yield forks
    forks.close()


def _gone(proc: psutil.Process) -> bool:
    try:
        return proc.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def cmdline(pid: int) -> list[str]:
    return psutil.Process(pid).cmdline()


def test_a_forked_daemon_serves_its_space_and_is_found_by_its_lock(
        forked: LocalSpaces) -> None:
    forked.create("a")
    space = forked.get("a")
    daemon = space.daemon()
    assert daemon is not None
    assert cmdline(daemon[0])[1:3] == ["-m", "spacesd.fork_server"]  # forked, not spawned
    client = forked.connect("a", epoch=1)
    client.exec_start("k@1", 'printf "%s %s" "$SPACESD_STATE" "$PWD"')
    marker = os.path.realpath(space.state)
    assert client.exec_wait("k@1", timeout=60).output == f"{marker} {space.work}"
    space.pid_file.unlink()  # found without its pid file, by the lock it holds
    assert space.daemon() == daemon == procs.find_daemon(str(space.state))
    assert procs.daemons_under([str(forked.base_dir)]) == [daemon]
    forked.create("a")  # idempotent: the live daemon is found and kept
    assert space.daemon() == daemon
    forked.restart("a")
    assert not psutil.pid_exists(daemon[0]) or psutil.Process(daemon[0]).status() == "zombie"
    after = space.daemon()
    assert after is not None and after != daemon
    forked.kill_daemon("a")
    assert space.daemon() not in (None, after)
    forked.delete("a")
    assert procs.daemons_under([str(forked.base_dir)]) == []


def test_a_forked_space_pauses_as_a_spawned_one(forked: LocalSpaces) -> None:
    check_a_pause_freezes_the_space(forked, "s", late_requests_land=True)
    check_a_daemon_pause_freezes_the_daemon_alone(forked, "sd")
    check_a_command_pause_freezes_the_commands_alone(forked, "sc")


def test_a_forked_daemon_whose_space_was_removed_is_still_found(forked: LocalSpaces) -> None:
    """As ``chaos clean`` finds the daemons of a campaign that died: by the lock they hold
    open, since neither their command line nor their first environment names the Space."""
    forked.create("gone")
    daemon = forked.get("gone").daemon()
    assert daemon is not None
    shutil.rmtree(forked.base_dir / "gone")
    try:
        assert procs.daemons_under([str(forked.base_dir)]) == [daemon]
    finally:
        procs.kill_process(*daemon)


def test_a_forked_start_that_fails_says_why(tmp_path: Path,
                                            server: daemon_start.ForkServer) -> None:
    bad = LocalSpaces(tmp_path / "spaces", daemon_args=["--max-requests", "many"])
    server.serve(bad.base_dir)
    with pytest.raises(SpaceUnavailable, match="invalid int value: 'many'"):
        bad.create("a")


def test_without_its_server_a_directory_spawns_its_daemons(
        tmp_path: Path, server: daemon_start.ForkServer) -> None:
    provider = LocalSpaces(tmp_path / "spaces")
    server.serve(provider.base_dir)
    server.close()
    try:
        provider.create("a")
        daemon = provider.get("a").daemon()
        assert daemon is not None and cmdline(daemon[0])[1:3] == ["-m", "spacesd"]
    finally:
        provider.delete_all()


def test_the_server_serves_only_starts_it_can_answer(
        tmp_path: Path, forked: LocalSpaces, server: daemon_start.ForkServer) -> None:
    """A start without ``--daemonize`` would be answered only when the daemon ends; a
    request that is not one JSON object with the log is refused; each says what to do, and
    the server serves on."""
    log = tmp_path / "log"
    with pytest.raises(SpaceUnavailable, match="only --daemonize starts are served"):
        daemon_start.start(["--root", str(tmp_path)], env={}, cwd=tmp_path, log=log,
                           timeout=60, base_dir=forked.base_dir)
    for packet, fds in ((b"{}", []), (b"[]", [os.open(log, os.O_WRONLY)])):
        with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as sock:
            sock.connect(str(server.socket))
            socket.send_fds(sock, [packet], fds)
            answer = json.loads(sock.recv(65536))
        for fd in fds:
            os.close(fd)
        assert answer["error"].startswith("spacesd.fork_server: a request is "), answer
    forked.create("after")
    daemon = forked.get("after").daemon()
    assert daemon is not None and cmdline(daemon[0])[1:3] == ["-m", "spacesd.fork_server"]


def test_a_start_whose_client_died_goes_on_and_holds_its_lock(
        tmp_path: Path, server: daemon_start.ForkServer) -> None:
    """A driver killed while the server starts its Space's daemon: the daemon comes up all
    the same, as a spawned one would (only a client's own timeout cancels its start), and
    the Space's lock the driver held stays held until it is up: whoever takes it next finds
    the daemon, which it could not while it was starting (no pid file, no state lock yet)."""
    state, work = tmp_path / "state", tmp_path / "work"
    work.mkdir()
    state.mkdir()
    (state / "token").write_text("t" * 64)
    argv = ["--root", str(work), "--state", str(state), "--token-file", str(state / "token"),
            "--pid-file", str(state / "daemon.pid"), "--daemonize"]
    lock = tmp_path / "space.lock"
    with open(tmp_path / "log", "ab") as log, open(lock, "a") as held, \
            socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as sock:
        fcntl.flock(held, fcntl.LOCK_EX)
        sock.connect(str(server.socket))
        socket.send_fds(sock, [json.dumps({"argv": argv, "env": daemon_start.daemon_env(),
                                           "cwd": str(state)}).encode()],
                        [log.fileno(), held.fileno()])
    # The client is gone (its socket and its lock's descriptor closed): the server holds the
    # lock now. Take it as the next process would, then look for the daemon.
    try:
        with open(lock, "a") as after:
            deadline = time.monotonic() + 120
            while True:
                try:
                    fcntl.flock(after, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    assert time.monotonic() < deadline, "the lock was never given back"
                    time.sleep(0.01)
            daemon = procs.find_daemon(str(state))
            assert daemon is not None and (state / "daemon.pid").exists(), \
                (tmp_path / "log").read_text()
    finally:  # the daemon comes up in any case: end it, found by its lock
        deadline = time.monotonic() + 120
        while (up := procs.find_daemon(str(state))) is None and time.monotonic() < deadline:
            time.sleep(0.01)
        if up is not None:
            procs.kill_process(*up)


@pytest.mark.parametrize("which", ["server", "blind_server"])
def test_a_start_past_its_timeout_is_cancelled(tmp_path: Path, which: str,
                                               request: pytest.FixtureRequest) -> None:
    """As ``subprocess.run`` kills a child whose wait timed out: a token file that is a FIFO
    nobody writes holds the start forever; the client's timeout ends it, and the server
    serves on. Also when the server has no pidfd for the start (``blind_server``): a
    blocking wait for it, the first fix of that case, stood the server still for good."""
    server: daemon_start.ForkServer = request.getfixturevalue(which)
    provider = LocalSpaces(tmp_path / "spaces")
    try:
        server.serve(provider.base_dir)
        fifo = provider.base_dir / "token"
        os.mkfifo(fifo)
        argv = ["--root", str(provider.base_dir), "--state", str(provider.base_dir / "state"),
                "--token-file", str(fifo), "--daemonize"]
        with pytest.raises(subprocess.TimeoutExpired):
            daemon_start.start(argv, env=daemon_start.daemon_env(), cwd=provider.base_dir,
                               log=provider.base_dir / "log", timeout=1.0,
                               base_dir=provider.base_dir)
        deadline = time.monotonic() + 120
        while psutil.Process(server.pid).children():
            assert time.monotonic() < deadline, "the cancelled start still runs"
            time.sleep(0.01)
        provider.create("after")
        assert provider.get("after").daemon() is not None
    finally:
        provider.delete_all()


def test_daemons_started_at_once_are_each_their_own(forked: LocalSpaces) -> None:
    names = [f"s{i}" for i in range(4)]
    with ThreadPoolExecutor(len(names)) as pool:
        list(pool.map(forked.create, names))
    daemons = {forked.get(n).daemon() for n in names}
    assert None not in daemons and len(daemons) == len(names)
    for name in names:
        client = forked.connect(name, epoch=1)
        client.exec_start("k@1", "printf %s \"$SPACESD_STATE\"")
        assert client.exec_wait("k@1", timeout=60).output == \
            os.path.realpath(forked.get(name).state)


def test_chaos_fork_daemons_0_spawns_them(forked: LocalSpaces,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(daemon_start.FORK_ENV, "0")
    forked.create("a")
    daemon = forked.get("a").daemon()
    assert daemon is not None and cmdline(daemon[0])[1:3] == ["-m", "spacesd"]


_OWNER = """import sys
from backends.local import LocalSpaces
from backends.local.daemon_start import ForkServer
server = ForkServer()
spaces = LocalSpaces(sys.argv[1])
server.serve(spaces.base_dir)
spaces.create("a")
print(server.pid, server.dir, *spaces.get("a").daemon(), flush=True)
sys.stdin.read()
"""


def test_the_server_ends_with_its_owner_and_its_daemons_live_on(tmp_path: Path) -> None:
    """Its owner SIGKILLed, the server exits and removes its socket; the daemons it started
    live on, as spawned ones do."""
    owner = subprocess.Popen([sys.executable, "-c", _OWNER, str(tmp_path / "spaces")],
                             env={**os.environ, "PYTHONPATH": ROOT}, stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
    daemon: tuple[int, int] | None = None
    try:
        assert owner.stdout is not None
        pid, directory, *started = owner.stdout.readline().split()
        server, daemon = psutil.Process(int(pid)), (int(started[0]), int(started[1]))
        owner.send_signal(signal.SIGKILL)
        owner.wait(60)
        deadline = time.monotonic() + 120
        while not _gone(server):
            assert time.monotonic() < deadline, "the server outlived its owner by 120 s"
            time.sleep(0.01)
        assert not Path(directory).exists()
        assert LocalSpaces(tmp_path / "spaces").get("a").daemon() == daemon
    finally:
        owner.kill()
        owner.wait()
        for stream in (owner.stdin, owner.stdout):
            assert stream is not None
            stream.close()
        LocalSpaces(tmp_path / "spaces").delete_all()


def test_a_start_the_server_cannot_watch_is_answered_and_lets_its_lock_go(
        tmp_path: Path, blind_server: daemon_start.ForkServer) -> None:
    """No pidfd for a start: the server looks at it after each poll, answers it once it
    ended and lets the Space's lock go. It used to leave the client unanswered until its
    timeout, the child unreaped and the lock held for as long as the server lived."""
    provider = LocalSpaces(tmp_path / "spaces")
    try:
        blind_server.serve(provider.base_dir)
        provider.create("a")
        daemon = provider.get("a").daemon()
        assert daemon is not None and "spacesd.fork_server" in cmdline(daemon[0])  # forked
        client = provider.connect("a", epoch=1)
        client.exec_start("k@1", "echo up")
        assert client.exec_wait("k@1", timeout=60).output == "up\n"
        provider.restart("a")  # takes the Space's lock: the server let it go
        provider.create("b")  # and serves on
        assert provider.get("b").daemon() is not None
    finally:
        provider.delete_all()


def test_a_temp_directory_too_deep_for_a_socket_puts_the_server_in_tmp(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A unix socket's path has at most 107 bytes: under a deep ``TMPDIR`` the server
    could not bind, and daemons were spawned with a warning whose reason was elsewhere."""
    deep = tmp_path / ("d" * 100)
    deep.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(deep))
    server = daemon_start.ForkServer()
    provider = LocalSpaces(tmp_path / "spaces")
    try:
        assert server.socket.parent.parent == Path("/tmp")
        server.serve(provider.base_dir)
        provider.create("a")
        daemon = provider.get("a").daemon()
        assert daemon is not None and "spacesd.fork_server" in cmdline(daemon[0])
    finally:
        provider.delete_all()
        server.close()
    assert not server.dir.exists()
