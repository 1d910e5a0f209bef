"""The drivers' host losing power (``chaos.faults.host_power``), on a real ext4 image on a real loop
device: what was synced survives a cut, what was not is lost, and a durable log keeps every
commit that returned."""

from __future__ import annotations

import json
import os
import sqlite3
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from chaos.faults.host_power import HostDisk, HostDiskBroken, commits
from chaos.faults.plans import DISK_BYTES
from chaos.faults.rendezvous import Hit
from chaos.modes.holds import Hold, Holds
from chaos.modes.stale_kinds import StaleHost
from chaos.run.attempts import AttemptScope
from chaos.run.state import RunState
from durable.storage import Batch, ConversationRecord, EntryRecord
from durable.storage_fences import open_fenced_sqlite


@pytest.fixture
def host_disk(tmp_path: Path) -> Iterator[HostDisk]:
    if os.geteuid() != 0:
        pytest.skip("a host disk of its own is a loop mount, which needs root")
    state = tmp_path / "state"
    state.mkdir()
    disk = HostDisk(state, DISK_BYTES)
    try:
        disk.mount()
    except OSError as exc:  # no loop device here
        pytest.skip(str(exc))
    try:
        yield disk
    finally:
        disk.close()


def test_a_cut_keeps_what_was_synced_and_loses_what_was_not(host_disk: HostDisk) -> None:
    state = host_disk.directory
    with open(state / "synced", "wb") as f:
        f.write(b"kept")
        f.flush()
        os.fsync(f.fileno())
    fd = os.open(state, os.O_RDONLY)
    try:
        os.fsync(fd)  # its name too
    finally:
        os.close(fd)
    (state / "unsynced").write_bytes(b"lost")
    # A database that does not sync its commits (SQLite's synchronous=OFF), committed and
    # closed, as a killed driver's would be: its rows are in the page cache only.
    conn = sqlite3.connect(state / "lax.sqlite", isolation_level=None)
    conn.execute("PRAGMA synchronous=OFF")
    conn.execute("CREATE TABLE t (x)")
    conn.execute("INSERT INTO t VALUES (1)")
    conn.close()
    assert (state / "unsynced").exists() and (state / "lax.sqlite").stat().st_size > 0
    seen: list[bool] = []

    host_disk.cut("a test's cut", lambda: seen.append(host_disk.up.is_set()))

    assert seen == [False], "the host is down while the drivers die"
    assert host_disk.up.is_set()
    assert (state / "synced").read_bytes() == b"kept"
    assert not (state / "unsynced").exists()
    lax = state / "lax.sqlite"
    assert not lax.exists() or lax.stat().st_size == 0, "an unsynced database is lost"
    assert host_disk.cuts == [{"fault": "a test's cut", "before": [], "after": [],
                               "before_error": None, "after_error": None}]


def test_no_driver_starts_between_a_cuts_instant_and_its_kills(host_disk: HostDisk) -> None:
    """A launch and a cut exclude each other: a cut that struck while a driver was being
    launched waits for the launch (the driver is then among those it kills), and a launch
    during a cut waits until the host is back. A launch that only waited for the host to be
    up could start its driver after the cut's instant, where no kill would find it."""
    order: list[str] = []
    cut_over = threading.Event()

    def cut() -> None:
        host_disk.cut("a cut during a launch", lambda: order.append("kills"))
        cut_over.set()

    with host_disk.staying_up():
        cutter = threading.Thread(target=cut)
        cutter.start()
        assert not cut_over.wait(0.5), "the cut began while a driver was being launched"
        order.append("launched")
    cutter.join(timeout=60)
    assert order == ["launched", "kills"]

    in_cut, release, entered = threading.Event(), threading.Event(), threading.Event()

    def before_boot() -> None:
        in_cut.set()
        release.wait(60)

    def launch() -> None:
        with host_disk.staying_up():
            order.append(f"launched, host up: {host_disk.up.is_set()}")
            entered.set()

    cutter = threading.Thread(target=host_disk.cut, args=("a cut", before_boot))
    cutter.start()
    assert in_cut.wait(60)
    launcher = threading.Thread(target=launch)
    launcher.start()
    assert not entered.wait(0.5), "a driver was launched while the host was down"
    release.set()
    cutter.join(timeout=60)
    launcher.join(timeout=60)
    assert order[-1] == "launched, host up: True"

    # what the cut asks under the lock (after any launch) can call it off, whole
    assert host_disk.cut("an unfit cut", lambda: order.append("killed"),
                         unfit=lambda: "a driver is loose") == "a driver is loose"
    assert order[-1] != "killed" and host_disk.up.is_set() and len(host_disk.cuts) == 2


def test_a_durable_log_keeps_every_commit_that_returned(host_disk: HostDisk) -> None:
    path = host_disk.directory / "log.sqlite"
    storage, _fence = open_fenced_sqlite(path, 1)
    storage.commit(Batch(base_id=1, next_id=2,
                         conversations=[ConversationRecord(1, "main", None, None, 5)]))
    for i in range(2, 12):
        storage.commit(Batch(base_id=i, next_id=i + 1,
                             entries=[EntryRecord(i, 1, "user", {"n": i}, 1000 + i)]))

    host_disk.cut("cut after 11 commits", storage.close)

    (cut,) = host_disk.cuts
    assert len(cut["before"]) == 11 and cut["before"][1].startswith("entry 2 user ")
    assert cut["after"] == cut["before"]
    assert commits(host_disk.directory) == cut["before"]


def test_closing_keeps_the_log_in_the_directory_and_deletes_the_image(
    host_disk: HostDisk,
) -> None:
    with open(host_disk.directory / "log.jsonl", "wb") as f:
        f.write(b"a line\n")
        f.flush()
        os.fsync(f.fileno())
    host_disk.close()
    assert not os.path.ismount(host_disk.directory)
    assert sorted(os.listdir(host_disk.directory)) == ["log.jsonl"]
    assert (host_disk.directory / "log.jsonl").read_bytes() == b"a line\n"
    assert not host_disk.image.exists()


def test_a_cut_that_breaks_leaves_the_host_down_and_keeps_the_image(host_disk: HostDisk) -> None:
    def drivers_hang() -> None:
        raise TimeoutError("the driver was not reaped")

    with pytest.raises(TimeoutError):
        host_disk.cut("a cut that breaks", drivers_hang)
    with pytest.raises(HostDiskBroken, match=r"did not come back from its power cut "
                       r"\(TimeoutError: the driver was not reaped\); its image is kept"):
        host_disk.wait_up()
    host_disk.close()
    assert host_disk.image.exists(), "the evidence is kept"
    host_disk.image.unlink()
    host_disk.image.with_name(host_disk.image.name + ".cut").unlink()


def test_chaos_clean_unmounts_what_a_dead_campaign_mounted_and_keeps_the_log(
        host_disk: HostDisk, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A campaign SIGKILLed mid-run leaves its run's log on a disk of its own: ``chaos
    clean`` unmounts it and keeps the log in the directory (for ``chaos repro``)."""
    from chaos.campaign import live

    monkeypatch.setenv(live.LIVE_DIR_ENV, str(tmp_path / "live"))
    with open(host_disk.directory / "log.jsonl", "wb") as f:
        f.write(b"a line\n")
    note = live.live_dir()
    note.mkdir(parents=True)
    (note / "999999999-1.jsonl").write_text(  # a pid no process has
        json.dumps({"mount": str(host_disk.directory)}) + "\n")
    assert live.clean_dead() == (1, 0)
    assert not os.path.ismount(host_disk.directory)
    assert (host_disk.directory / "log.jsonl").read_bytes() == b"a line\n"


SLEEPER = [sys.executable, "-c", "import time; time.sleep(600)"]


def _stop_state(pid: int) -> str:
    """"stopped" once ``pid`` is stopped (a SIGSTOP sent to it stops it before it runs any
    more code of its own, but its state shows it a moment later: waited for, up to 120 s),
    else its state then."""
    deadline = time.monotonic() + 120.0
    while True:
        state = next(line.split(":", 1)[1].strip() for line in
                     Path(f"/proc/{pid}/status").read_text().splitlines()
                     if line.startswith("State:"))
        if state.startswith("T"):
            return "stopped"
        if time.monotonic() > deadline:
            return state
        time.sleep(0.01)


def test_a_stale_runs_power_cut_stops_every_driver_before_it_kills_one(tmp_path: Path) -> None:
    """The run's thread releases one parked driver when the other dies (the older when the
    newer ended, in a finished race; the newer when the older did, in an opened one): were
    it still running then, it could commit after the instant of the cut. So when the cut
    kills its first driver, every driver is already stopped."""
    seen: list[set[str]] = []
    with AttemptScope() as scope:
        drivers = [scope.launch(SLEEPER, {}, tmp_path / f"{i}.log") for i in range(2)]
        for driver in drivers:
            kill = driver.kill_group

            def kill_seen(kill: Callable[[], None] = kill) -> None:
                seen.append({_stop_state(d.pid) for d in drivers if d.poll() is None})
                kill()

            driver.kill_group = kill_seen  # type: ignore[method-assign]
        host = StaleHost(scope, Holds())
        host.power_off()
        assert all(d.poll() is not None for d in drivers), "both died"
        assert host.killed == {d.pid for d in drivers}
        assert seen and seen[0] == {"stopped"}, \
            f"the drivers were {seen[0]} when the cut killed the first"
        host.power_on(True)
        assert scope.running() == [], "nothing starts again at boot"


def test_a_stale_run_is_cut_only_while_every_other_driver_is_parked(tmp_path: Path) -> None:
    """The cut strikes at one driver's failpoint; another driver not parked at one (its park
    gave up) may be inside a commit, so the cut is skipped, and says why."""
    holds = Holds()
    with AttemptScope() as scope:
        reporter = scope.launch(SLEEPER, {}, tmp_path / "reporter.log")
        other = scope.launch(SLEEPER, {}, tmp_path / "other.log")
        host = StaleHost(scope, holds)
        assert host.unfit() == (f"drivers {[reporter.pid, other.pid]} are not all held at a "
                                "failpoint (a park gave up): one may be inside a commit")
        hold = Hold("the other", lambda hit: True)
        holds.add(hold)
        parking = threading.Thread(target=holds.park, args=(
            Hit("call.intent", 1, other.pid, {}), RunState()))
        parking.start()
        assert hold.parked.wait(120)
        assert host.unfit() is None, "the other driver is parked: the cut may strike"
        holds.release_all()
        parking.join(120)
        assert host.unfit() is not None, "released, it runs on"
