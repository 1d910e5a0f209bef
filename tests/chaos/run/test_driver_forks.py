"""The driver server (``chaos.run.driver_server``, ``chaos.run.driver_forks``): a forked driver is a
process of its own, as a spawned one is: its own session, environment, output, failpoint
channel and ``advance_epoch`` owner; its exit code comes back as ``subprocess`` gives it, a
SIGKILL of its group ends it, and it does not outlive the server."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from chaos.run.driver_forks import FORK_ENV, DriverServer, forkable
from chaos.run.processes import python_argv
from tests.liveness import running

PROBE = "tests.chaos.run.fork_probe"


@pytest.fixture
def forks() -> Iterator[DriverServer]:
    server = DriverServer()
    yield server
    server.close()


def probe_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "CUA_FAILPOINTS"}
    return {**env, **extra}


def seen(log: Path) -> dict:
    return json.loads(log.read_text().splitlines()[0])


def test_a_forked_driver_is_a_process_of_its_own(forks: DriverServer, tmp_path: Path) -> None:
    a = forks.launch(python_argv(PROBE, "exit", "0"), probe_env(PROBE="a"), tmp_path / "a.log")
    b = forks.launch(python_argv(PROBE, "exit", "0"),
                     probe_env(PROBE="b", CUA_FAILPOINTS="unix:/nowhere.sock"),
                     tmp_path / "b.log")
    assert (a.wait(60), b.wait(60)) == (0, 0)
    sa, sb = seen(tmp_path / "a.log"), seen(tmp_path / "b.log")
    for s, driver in ((sa, a), (sb, b)):
        assert s["pid"] == s["pgid"] == s["sid"] == driver.pid  # a session and group of its own
        assert s["ppid"] != os.getpid() and s["runner"] == str(s["ppid"])  # dies with the server
        assert s["stdin"] == "" and s["argv"] == [PROBE, "exit", "0"]
    assert (sa["probe"], sb["probe"]) == ("a", "b")
    assert (sa["failpoints"], sb["failpoints"]) == (False, True)  # from its own environment
    assert sa["owner"] != sb["owner"]  # not the server's, copied into both


def test_exit_codes_come_back_as_subprocess_gives_them(forks: DriverServer,
                                                       tmp_path: Path) -> None:
    def run(*args: str) -> tuple[int, str]:
        log = tmp_path / f"{'-'.join(args)}.log"
        code = forks.launch(python_argv(PROBE, *args), probe_env(), log).wait(60)
        return code, log.read_text()

    assert run("exit", "3")[0] == 3
    code, out = run("raise")
    assert code == 1 and "RuntimeError: the probe raised" in out
    code, out = run("sys.exit", "a message")
    assert code == 1 and "a message" in out


def test_a_driver_is_killed_by_its_group_and_ended_on_close(forks: DriverServer,
                                                           tmp_path: Path) -> None:
    killed = forks.launch(python_argv(PROBE, "sleep"), probe_env(), tmp_path / "k.log")
    with pytest.raises(subprocess.TimeoutExpired):
        killed.wait(0.2)
    assert killed.poll() is None
    killed.kill_group()
    assert killed.wait(60) == -signal.SIGKILL and killed.killed
    ended = forks.launch(python_argv(PROBE, "sleep"), probe_env(), tmp_path / "e.log")
    while not (tmp_path / "e.log").read_text():
        time.sleep(0.01)
    ended.close(grace=10)
    assert ended.poll() == -signal.SIGTERM


def test_drivers_do_not_outlive_the_server(tmp_path: Path) -> None:
    server = DriverServer()
    try:
        driver = server.launch(python_argv(PROBE, "sleep"), probe_env(), tmp_path / "d.log")
        while not (tmp_path / "d.log").read_text():
            time.sleep(0.01)
        os.kill(server._proc.pid, signal.SIGKILL)
        assert driver.wait(120) == -signal.SIGKILL
        deadline = time.monotonic() + 120
        while running(driver.pid):  # dead, not only reported dead (a zombie runs nothing)
            assert time.monotonic() < deadline, f"driver {driver.pid} outlived its server"
            time.sleep(0.02)
    finally:
        server.close()


def test_only_the_campaigns_driver_is_forked(monkeypatch) -> None:
    assert forkable(python_argv("chaos.driver", "--seed", "1"))
    assert not forkable(python_argv("durable.coordinator", "serve"))
    assert not forkable([sys.executable, "my_driver.py"])
    monkeypatch.setenv(FORK_ENV, "0")
    assert not forkable(python_argv("chaos.driver", "--seed", "1"))
