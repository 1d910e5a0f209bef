"""Shared pytest fixtures: a backend's Spaces provider and a Space, for unit tests and
campaign tests alike. Every Space a fixture creates is deleted (its daemon and commands
killed by pid) when the test ends."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

from backends.local import LocalSpaces

# Hypothesis in the test command: the same examples on every run (derandomize: a red run
# is one the next run repeats, never a new draw's luck), and nothing judged by the clock (a
# busy machine makes any example slow). `--hypothesis-profile=explore` draws new examples
# each run, to hunt: a failure it finds prints the @example that repeats it.
_UNTIMED = {"deadline": None, "suppress_health_check": [HealthCheck.too_slow]}
settings.register_profile("deterministic", derandomize=True, **_UNTIMED)
settings.register_profile("explore", **_UNTIMED)
settings.load_profile("deterministic")


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
