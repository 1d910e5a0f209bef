"""The contract of ``pause`` and ``resume`` (``chaos.space_providers.Pausable``), checked the
same way on every backend: a paused Space answers nothing, a request sent to it meanwhile
has an unknown outcome (never a refusal), and once resumed its processes go on where they
stood, none killed."""

from __future__ import annotations

import time
from typing import Any

import pytest

from durable.errors import SpaceError, SpaceUnavailable

#: Only a hang gets this far.
DEADLINE_S = 120.0


def until(what: str, check: Any) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while not check():
        assert time.monotonic() < deadline, f"waited {DEADLINE_S:.0f} s for {what}"
        time.sleep(0.05)


def check_a_pause_freezes_the_space(spaces: Any, name: str, *,
                                    late_requests_land: bool) -> None:
    """``late_requests_land``: the backend delivers a request sent while it was frozen once
    it is thawed (a process's socket backlog does; a microVM's user-mode network may drop
    the connection instead): then its effect must appear."""
    spaces.create(name)
    client = spaces.connect(name, epoch=1)
    client.exec_start("ticker@1", "n=0; while :; do n=$((n+1)); echo $n; sleep 0.05; done")
    until("the ticker's first output", lambda: client.exec_status("ticker@1").output_size > 0)

    spaces.pause(name)
    spaces.pause(name)  # a second pause changes nothing
    frozen = spaces.connect(name, epoch=1)
    frozen.timeout, frozen.retry_for = 1.0, 0.5
    with pytest.raises(SpaceUnavailable, match="unknown"):
        frozen.write_file("late.txt", b"sent while frozen")

    spaces.resume(name)
    spaces.resume(name)  # a running Space is left as it is
    before = client.exec_status("ticker@1")
    assert before.state == "running", f"the pause ended the ticker: {before}"
    until("the ticker to go on after the pause",
           lambda: client.exec_status("ticker@1").output_size > before.output_size)
    if late_requests_land:
        until("the write sent while frozen", lambda: client.stat("late.txt") is not None)
        assert client.read_file("late.txt") == b"sent while frozen"
    client.exec_kill("ticker@1")


def check_a_daemon_pause_freezes_the_daemon_alone(spaces: Any, name: str) -> None:
    """``pause_daemon`` (``chaos.space_providers.DaemonPausable``): the daemon answers
    nothing (a request meanwhile has an unknown outcome), while its commands run on: one
    that ends while it is frozen (most likely: a short sleep against the frozen request's
    seconds of timeouts) is reported exited, with its output, once it is thawed; a long one
    is still running, not killed."""
    spaces.create(name)
    client = spaces.connect(name, epoch=1)
    client.exec_start("ticker@1", "n=0; while :; do n=$((n+1)); echo $n; sleep 0.05; done")
    until("the ticker's first output", lambda: client.exec_status("ticker@1").output_size > 0)
    client.exec_start("short@1", "sleep 0.3; echo ended")

    spaces.pause_daemon(name)
    frozen = spaces.connect(name, epoch=1)
    frozen.timeout, frozen.retry_for = 1.0, 0.5
    with pytest.raises(SpaceUnavailable, match="unknown"):
        frozen.write_file("late.txt", b"sent while frozen")

    spaces.resume_daemon(name)
    spaces.resume_daemon(name)  # a running daemon is left as it is
    short = client.exec_wait("short@1")
    assert (short.state, short.exit_code, short.output) == ("exited", 0, "ended\n"), short
    ticker = client.exec_status("ticker@1")
    assert ticker.state == "running", f"the daemon's pause ended the ticker: {ticker}"
    client.exec_kill("ticker@1")


def check_a_command_pause_freezes_the_commands_alone(spaces: Any, name: str) -> None:
    """``pause_commands`` (``chaos.space_providers.CommandPausable``): every process of the
    daemon's commands is stopped (a command started afterwards reads ``T`` in the first's
    ``/proc`` stat) while the daemon answers and reports them running; once thawed they go
    on. It names the keys whose shims it froze (the commands alive, held). With no command
    running there is nothing to freeze, and it says so."""
    spaces.create(name)
    client = spaces.connect(name, epoch=1)
    client.exec_start("ticker@1", "n=0; while :; do n=$((n+1)); echo $n; sleep 0.05; done")
    until("the ticker's first output", lambda: client.exec_status("ticker@1").output_size > 0)
    shim = client.exec_status("ticker@1").pid

    assert spaces.pause_commands(name) == ["ticker@1"]
    # Stopped once the kernel next schedules it: the probe looks until it is (or a hang).
    client.exec_start("probe@1", f"for i in $(seq {int(DEADLINE_S / 0.05)}); do "
                                 f"read -r pid comm state rest < /proc/{shim}/stat; "
                                 "[ \"$state\" = T ] && break; sleep 0.05; done; "
                                 "echo $state")
    probe = client.exec_wait("probe@1")
    assert (probe.state, probe.output) == ("exited", "T\n"), probe
    ticker = client.exec_status("ticker@1")
    assert ticker.state == "running", f"the pause ended the ticker: {ticker}"

    spaces.resume_commands(name)
    until("the ticker to go on after the pause",
          lambda: client.exec_status("ticker@1").output_size > ticker.output_size)
    client.exec_kill("ticker@1")
    with pytest.raises(SpaceError, match="no command running"):
        spaces.pause_commands(name)
