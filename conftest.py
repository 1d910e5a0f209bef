"""Shared pytest fixtures: a backend's Spaces provider and a Space, for unit tests and
campaign tests alike. Every Space a fixture creates is deleted (its daemon and commands
killed by pid) when the test ends.

A test cut short does not get that far: a Ctrl-C makes pytest-xdist's controller end its
workers, killing one that is not done within seconds, in the middle of a campaign or of a
fixture's teardown. So the session's own process (the controller, or the one process
without xdist) ends, once its tests are over, what they left: its workers first (noted in
a directory of the session's: a second Ctrl-C cuts xdist's wait for them short), then what
the dead campaigns whose Spaces were under the session's temporary directory noted (as
``chaos clean`` would), then every Space daemon, command and QEMU under that directory, by
pid. A session killed outright leaves its campaigns' notes where ``chaos clean`` finds
them."""

from __future__ import annotations

import os
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

from backends.local import LocalSpaces
from chaos.campaign import live
from spacesd import procfs
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
    directory = os.environ.get(_WORKERS_ENV)
    if hasattr(config, "workerinput"):  # an xdist worker: noted for its controller
        if directory is not None:
            pid = os.getpid()
            Path(directory, f"{pid}-{procfs.start_time(pid)}").touch()
        return
    config.stash[_WORKERS] = tempfile.mkdtemp(prefix="pytest-workers-")
    os.environ[_WORKERS_ENV] = config.stash[_WORKERS]


@pytest.hookimpl(tryfirst=True)  # a Ctrl-C in a later one would skip it
def pytest_unconfigure(config: pytest.Config) -> None:
    if _WORKERS not in config.stash:
        return
    # One more Ctrl-C is raised once this ended: cut short, it would leave what it is there
    # to end.
    came: list[int] = []
    previous = signal.signal(signal.SIGINT, lambda signum, _frame: came.append(signum))
    try:
        _end_what_tests_left(config, config.stash[_WORKERS])
    finally:
        signal.signal(signal.SIGINT, previous)
    if came:
        raise KeyboardInterrupt


def _end_what_tests_left(config: pytest.Config, directory: str) -> None:
    try:
        # A second Ctrl-C cuts short xdist's wait for its workers: end them first, or a
        # worker would go on making Spaces behind the sweep.
        _end([(int(pid), int(started)) for pid, started in
              (name.split("-") for name in os.listdir(directory))])
        factory = getattr(config, "_tmp_path_factory", None)  # pytest's; xdist's workers
        basetemp = getattr(factory, "_basetemp", None)  # have <this>/popen-gw<N>
        if basetemp is None:
            return
        campaigns, killed = live.clean_dead(under=[str(basetemp)])
        for _ in range(5):  # again while a pass finds some: a command forks as it is killed
            left = live.orphans_of([str(basetemp)])
            if not left:
                break
            _end(left)
            killed += len(left)
        if campaigns or killed:
            print(f"conftest: ended what the tests left running: {campaigns} campaign(s), "
                  f"{killed} process(es)", file=sys.stderr)
    finally:
        shutil.rmtree(directory, ignore_errors=True)
        os.environ.pop(_WORKERS_ENV, None)


def _end(processes: list[tuple[int, int]]) -> None:
    """SIGKILL each ``(pid, start time)`` still that process, and wait until they are gone
    (a zombie is: it runs nothing)."""
    for pid, started in processes:
        procfs.kill_exact(pid, started)
    deadline = time.monotonic() + 120  # SIGKILLed: only a process stuck in the kernel stays
    while any(procfs.is_alive(*p) and running(p[0]) for p in processes) and \
            time.monotonic() < deadline:
        time.sleep(0.05)


#: Where the workers of a session note themselves (``<pid>-<start time>``).
_WORKERS_ENV = "CUA_TEST_WORKERS_DIR"
_WORKERS = pytest.StashKey[str]()
