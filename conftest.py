"""Shared pytest fixtures: a backend's Spaces provider and a Space, for unit tests and
campaign tests alike. Every Space a fixture creates is deleted (its daemon and commands
killed by pid) when the test ends."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from backends.local import LocalSpaces


@pytest.fixture
def local_spaces(tmp_path: Path) -> Iterator[LocalSpaces]:
    provider = LocalSpaces(tmp_path / "spaces")
    yield provider
    for name in provider.names():
        provider.delete(name)


@pytest.fixture
def escapees() -> Iterator[list[tuple[int, int]]]:
    """Where a test lists the ``(pid, start time)`` of processes it made escape their
    command: any still alive at the end is SIGKILLed (only if it is still that process)."""
    from spacesd import procfs

    found: list[tuple[int, int]] = []
    yield found
    for pid, started in found:
        procfs.kill_exact(pid, started)
