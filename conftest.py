"""Shared pytest fixtures: a backend's Spaces provider and a Space, for unit tests and
campaign tests alike. Every Space a fixture creates is deleted (its daemon and commands
killed by pid) when the test ends.

A test cut short does not get that far: a Ctrl-C makes pytest-xdist's controller end its
workers, killing one that is not done within seconds, in the middle of a campaign or of a
fixture's teardown. So the session's own process (the controller, or the one process
without xdist) ends, once its tests are over, what they left: every campaign of the
session notes what it owns in a directory of the session's (``CHAOS_LIVE_DIR``), and
what a dead one noted is ended as ``chaos clean`` would; then every Space daemon, command
and QEMU found under the session's temporary directory, by pid."""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

from backends.local import LocalSpaces
from tests.liveness import running

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


def pytest_configure(config: pytest.Config) -> None:
    if hasattr(config, "workerinput"):
        return  # an xdist worker: the controller owns the session's clean-up
    from chaos.campaign.live import LIVE_DIR_ENV

    config.stash[_LIVE_DIR] = (os.environ.get(LIVE_DIR_ENV),
                               tempfile.mkdtemp(prefix="pytest-chaos-live-"))
    os.environ[LIVE_DIR_ENV] = config.stash[_LIVE_DIR][1]


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config: pytest.Config) -> None:
    if _LIVE_DIR not in config.stash:
        return
    from chaos.campaign import live
    from spacesd import procfs

    before, session_dir = config.stash[_LIVE_DIR]
    campaigns, killed = live.clean_dead()
    factory = getattr(config, "_tmp_path_factory", None)  # pytest's, which xdist uses too
    basetemp = getattr(factory, "_basetemp", None)
    left = live.orphans_of([str(basetemp)] if basetemp is not None else [])
    for pid, started in left:
        procfs.kill_exact(pid, started)
    deadline = time.monotonic() + 120  # SIGKILLed: only a process stuck in the kernel stays
    while any(procfs.is_alive(*p) and running(p[0]) for p in left) and \
            time.monotonic() < deadline:
        time.sleep(0.05)
    killed += len(left)
    if campaigns or killed:
        print(f"conftest: ended what the tests left running: {campaigns} campaign(s), "
              f"{killed} process(es)", file=sys.stderr)
    shutil.rmtree(session_dir, ignore_errors=True)
    if before is None:
        os.environ.pop(live.LIVE_DIR_ENV, None)
    else:
        os.environ[live.LIVE_DIR_ENV] = before


#: The user's ``CHAOS_LIVE_DIR`` (None: unset) and the session's own.
_LIVE_DIR = pytest.StashKey[tuple[str | None, str]]()
