"""Fixtures for the daemon's tests: real spacesd processes, through the local backend.

Every Space a test creates is deleted in the finalizer, which kills its daemon and its
commands by pid (never by name). ``failpoints`` is a rendezvous that answers the daemon's
failpoints and SIGKILLs, by pid, the process (daemon or shim) that reaches the point it is
told to kill at; ``fp_spaces`` starts every daemon with that channel."""

from __future__ import annotations

import os
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from backends.local import LocalSpace, LocalSpaces
from backends.local.procs import kill_process
from backends.space_client import HttpSpaceClient
from chaos.faults.rendezvous import Answer, Hit, Rendezvous
from spacesd.procfs import start_time

#: A disk of a test's own: small enough to fill in a moment, big enough for a daemon's state.
DISK_BYTES = 16 * 1024 * 1024


@pytest.fixture
def disk(tmp_path: Path) -> Iterator[Path]:
    """A filesystem of the test's own (a tmpfs, so root only), ``DISK_BYTES`` in size."""
    if os.geteuid() != 0:
        pytest.skip("a disk of the test's own is a tmpfs mount, which needs root")
    root = tmp_path / "disk"
    root.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={DISK_BYTES}", "tmpfs", str(root)],
                   check=True)
    try:
        yield root
    finally:
        if subprocess.run(["umount", str(root)], capture_output=True).returncode:
            subprocess.run(["umount", "-l", str(root)], check=True)  # a process still in it


@pytest.fixture
def spaces(tmp_path) -> Iterator[LocalSpaces]:
    provider = LocalSpaces(tmp_path / "spaces")
    yield provider
    provider.delete_all()


@pytest.fixture
def space(spaces: LocalSpaces) -> LocalSpace:
    spaces.create("s1")
    return spaces.get("s1")


@pytest.fixture
def client(spaces: LocalSpaces, space: LocalSpace) -> HttpSpaceClient:
    return spaces.connect(space.name, epoch=1)


@dataclass
class FailpointKiller:
    """Answers every failpoint; the first process to reach ``kill_at`` is SIGKILLed there
    (by pid and start time, and waited for) instead. One kill per test, then it answers."""

    kill_at: str | None = None
    killed: list[Hit] = field(default_factory=list)
    rendezvous: Rendezvous | None = None
    #: What went wrong in ``on_hit`` (the fixture fails the test with it).
    errors: list[str] = field(default_factory=list)

    @property
    def address(self) -> str:
        assert self.rendezvous is not None
        return self.rendezvous.address

    def hits(self, point: str) -> list[Hit]:
        """The reports of ``point`` so far."""
        assert self.rendezvous is not None
        return [h for h in self.rendezvous.hits if h.point == point]

    def on_hit(self, hit: Hit) -> Answer:
        if hit.point != self.kill_at or self.killed:
            return "continue"
        started = start_time(hit.pid)
        if started is None:
            self.errors.append(f"{hit} came from a process that is gone: nothing killed")
            return "continue"
        self.killed.append(hit)  # first: whoever waits on the victim sees it at once
        kill_process(hit.pid, started)
        return "killed"


@pytest.fixture
def failpoints() -> Iterator[FailpointKiller]:
    killer = FailpointKiller()
    # A short directory: a unix socket's path is limited to 107 bytes.
    with tempfile.TemporaryDirectory(prefix="fp-") as short, \
            Rendezvous(os.path.join(short, "fp.sock"), killer.on_hit) as rv:
        killer.rendezvous = rv
        yield killer
    assert not killer.errors, killer.errors


@pytest.fixture
def fp_spaces(tmp_path, failpoints: FailpointKiller) -> Iterator[LocalSpaces]:
    provider = LocalSpaces(tmp_path / "spaces", failpoints=failpoints.address)
    yield provider
    provider.delete_all()


def wait_relayed(client: HttpSpaceClient, key: str, size: int) -> None:
    """Until ``size`` bytes of ``key``'s output are in its output file: a command's output
    reaches it through its shim's pipe, after the command wrote it (a deadline only a hang
    reaches)."""
    deadline = time.monotonic() + 300
    while (got := client.exec_status(key).output_size) < size:
        assert time.monotonic() < deadline, f"{key}: {got} of {size} output bytes relayed"
        time.sleep(0.01)


def run_command(client: HttpSpaceClient, key: str, script: str) -> None:
    """Run ``script`` through the exec ledger as ``key`` and wait for it; it must exit 0."""
    client.exec_start(key, script)
    info = client.exec_wait(key, timeout=300)
    assert (info.state, info.exit_code) == ("exited", 0), info.output
