"""The coordinator with real driver processes (``fake_driver.py``) on real local Spaces and
real stores: exit codes, backoff and the attempt cap, stalls, the Space checked before each
drive, epochs, leases and the race for one Space, cancel; and the coordinator itself as a
real process, SIGKILLed during a backoff and while its driver runs, restarted from its
store, and two of them on one PostgreSQL store."""

from __future__ import annotations

import itertools
import json
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from backends.local import LocalSpaces
from durable.coordinator import (
    Backoff,
    Coordinator,
    CoordinatorConfig,
    CoordinatorStore,
    SessionSpec,
    StoreUnavailable,
)
from tests.durable.coordinator.conftest import store_url
from tests.liveness import running

FAKE = Path(__file__).with_name("fake_driver.py")
#: Claims and stalls only a hang reaches: a driver's silence is timed from its spawn, and
#: its start on a busy machine must never read as a stall. (With 2 s claims one lapsed
#: mid-drive on a busy machine and its script ran out of order: a drive's late save wrote
#: its claim's first expiry back over the renewals', fixed since; see the frozen-Space test
#: below.)
FAST = CoordinatorConfig(backoff=Backoff(0.0), stall_secs=60.0, heartbeat_secs=0.2,
                         poll_secs=0.05, claim_secs=30.0)


def fake(name: str, tmp: Path, spaces: LocalSpaces, script: list[dict], *, space: str = "ws",
         mode: str = "auto", store: bool = True) -> SessionSpec:
    return SessionSpec(name, space, (sys.executable, str(FAKE)), str(tmp / name), mode=mode,
                       checkpoint_store=store,
                       env={"CUA_FAKE_SCRIPT": json.dumps(script),
                            "FAKE_SPACES_DIR": str(spaces.base_dir)})


def journal(tmp: Path, name: str) -> list[dict]:
    path = tmp / name / "journal.jsonl"
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


def serve(store: CoordinatorStore, spaces: LocalSpaces, config: CoordinatorConfig = FAST,
          timeout: float = 300.0) -> Coordinator:
    """A coordinator in a thread until every session ended (or ``timeout``: a failure)."""
    coordinator = Coordinator(store, spaces, config=config, id="test")
    stop = threading.Event()
    thread = threading.Thread(target=coordinator.serve, args=(stop,),
                              kwargs={"until_idle": True})
    thread.start()
    thread.join(timeout)
    if thread.is_alive():
        stop.set()
        thread.join()
        pytest.fail(f"sessions did not end within {timeout} s: "
                    f"{[(r.name, r.state, r.reason) for r in store.sessions()]}")
    return coordinator


def kinds(store: CoordinatorStore, name: str) -> list[str]:
    return [e.kind for e in store.events(name)]


@pytest.fixture
def spaces(local_spaces: LocalSpaces) -> LocalSpaces:
    return local_spaces


def test_exit_codes_decide_what_comes_next(store: CoordinatorStore, spaces: LocalSpaces,
                                           tmp_path: Path) -> None:
    store.submit(fake("s", tmp_path, spaces, [{"exit": 1}, {"exit": 75}, {"exit": 0}]), 0.0)
    store.submit(fake("p", tmp_path, spaces, [{"exit": 78}], space="ws2"), 0.0)
    serve(store, spaces)
    s, p = store.get("s"), store.get("p")
    assert (s.state, s.reason, s.attempts, s.last_exit) == ("done", "finished", 3, 0)
    epochs = [e["epoch"] for e in journal(tmp_path, "s") if e["event"] == "start"]
    assert epochs == [1, 2, 3]  # each drive above the last; the fenced one ignored
    backoffs = [e.data for e in store.events("s") if e.kind == "backoff"]
    assert [b["crashes"] for b in backoffs] == [1, 1]  # a fenced exit is no crash
    assert (p.state, p.attempts) == ("failed", 1) and "permanent" in p.reason, p
    assert store.lease("ws").session is None and store.lease("ws2").session is None


def test_backoff_doubles_and_the_attempt_cap_ends_the_session(
        store: CoordinatorStore, spaces: LocalSpaces, tmp_path: Path) -> None:
    store.submit(fake("s", tmp_path, spaces, [{"exit": 3}]), 0.0)
    config = CoordinatorConfig(backoff=Backoff(0.3, 2.0, 10.0), max_attempts=3,
                               stall_secs=60.0, heartbeat_secs=0.2, poll_secs=0.05)
    serve(store, spaces, config)
    rec = store.get("s")
    assert rec.state == "failed" and rec.attempts == 3, rec
    assert rec.reason.startswith("gave up after 3 drives; the last: crashed (exit 3)"), rec
    starts = [e["t"] for e in journal(tmp_path, "s") if e["event"] == "start"]
    ends = [e["t"] for e in journal(tmp_path, "s") if e["event"] == "end"]
    gaps = [b - a for a, b in zip(ends, starts[1:], strict=False)]
    assert len(starts) == 3 and gaps[0] >= 0.3 and gaps[1] >= 0.6, gaps
    assert [e.data["delay"] for e in store.events("s") if e.kind == "backoff"] == [0.3, 0.6]


def test_a_silent_driver_is_replaced_and_a_busy_one_kept(store: CoordinatorStore,
                                                         spaces: LocalSpaces,
                                                         tmp_path: Path) -> None:
    # The silence a stall takes (15 s) is far above a driver's start on a busy machine (its
    # clock runs from the spawn: 1 s once took a busy driver starting for stalled, and 5 s
    # was close under a campaign and a second suite), and the busy one runs twice that
    # long, beating (the silent one would sleep 10 minutes).
    store.submit(fake("silent", tmp_path, spaces,
                      [{"sleep": 600, "heartbeat": False}, {"exit": 0}]), 0.0)
    store.submit(fake("busy", tmp_path, spaces, [{"sleep": 30, "exit": 0}], space="ws2"),
                 0.0)
    config = CoordinatorConfig(backoff=Backoff(0.0), stall_secs=15.0, heartbeat_secs=0.2,
                               poll_secs=0.05)
    serve(store, spaces, config)
    silent = store.get("silent")
    assert (silent.state, silent.attempts) == ("done", 2)
    assert "stalled" in kinds(store, "silent")
    first = journal(tmp_path, "silent")[0]
    assert first["event"] == "start" and not running(first["pid"])
    assert [e["event"] for e in journal(tmp_path, "silent")] == ["start", "start", "end"]
    busy = store.get("busy")
    assert (busy.state, busy.attempts) == ("done", 1) and "stalled" not in kinds(store, "busy")


def test_the_space_is_checked_before_each_drive(store: CoordinatorStore, spaces: LocalSpaces,
                                                tmp_path: Path) -> None:
    """Never made: placed. Removed right after a crash: noticed before the next drive and
    placed again. Checkpoint mode without a store: nothing holds its state, failed."""
    store.submit(fake("s", tmp_path, spaces, [{"delete_space": True, "exit": 1}, {"exit": 0}]),
                 0.0)
    store.submit(fake("c", tmp_path, spaces, [{"delete_space": True, "exit": 1}, {"exit": 0}],
                      space="ws2", mode="checkpoint", store=False), 0.0)
    serve(store, spaces)
    s = store.get("s")
    assert s.state == "done" and s.attempts == 2
    k = kinds(store, "s")
    assert k.index("space_placed") < k.index("drive")
    second = [i for i, x in enumerate(k) if x == "drive"][1]
    assert k.index("space_gone") < k.index("space_placed", k.index("space_gone")) < second
    assert spaces.exists("ws")
    c = store.get("c")
    assert (c.state, c.attempts) == ("failed", 1), c
    assert "use a CheckpointStore or mode transactional" in c.reason
    assert not spaces.exists("ws2")


def test_a_drive_held_up_by_a_frozen_space_keeps_its_claim(store: CoordinatorStore,
                                                            spaces: LocalSpaces,
                                                            tmp_path: Path) -> None:
    """A drive reads the Space's floor before it launches; with the Space frozen (every
    process SIGSTOPped) that read waits past a claim. The drive then saved its record with
    its claim's first expiry over the renewals', the claim lapsed at once, this same
    coordinator claimed the session again, ended the just-launched driver as an orphan,
    and the earlier drive took that kill for a clean exit: the session was marked done
    while a newer driver ran, and a waiting session got an epoch already used. Found by a
    redrive campaign with --pause-spaces. Whatever the machine's load (a stall may still
    let a claim lapse), the session ends done by its own driver's clean exit, and no
    epoch is driven twice."""
    spaces.create("ws")
    spaces.pause("ws")
    thaw = threading.Timer(4.0, spaces.resume, args=("ws",))  # the fault's length
    thaw.start()
    try:
        store.submit(fake("s", tmp_path, spaces, [{"sleep": 0.5, "exit": 0}]), 0.0)
        store.submit(fake("t", tmp_path, spaces, [{"exit": 0}]), 1.0)
        config = CoordinatorConfig(backoff=Backoff(0.0), stall_secs=60.0, heartbeat_secs=0.2,
                                   poll_secs=0.05, claim_secs=1.5)
        serve(store, spaces, config)
    finally:
        thaw.cancel()
        spaces.resume("ws")
    s = store.get("s")
    assert (s.state, s.reason) == ("done", "finished"), s
    drives = [e.data["epoch"] for e in store.events("s") if e.kind == "drive"]
    runs = journal(tmp_path, "s")
    assert runs[-1]["event"] == "end" and runs[-1]["exit"] == 0, runs
    assert runs[-1]["epoch"] == drives[-1], (runs, drives)
    later = [e.data["epoch"] for e in store.events("t") if e.kind == "drive"]
    assert store.get("t").state == "done" and later[0] > drives[-1], (drives, later)
    assert len(set(drives + later)) == len(drives + later), (drives, later)


def test_a_drive_whose_claim_was_taken_over_records_its_end_and_saves_nothing(
        store: CoordinatorStore, spaces: LocalSpaces, tmp_path: Path) -> None:
    """A coordinator frozen past its claim (its host paused) finds, once woken, its session
    taken by another coordinator and its driver ended: it must not save the session (the
    other drives it), but how its drive ended is still the session's history (the redrive
    campaign's frozen_host kind checks it, G6). Before, the lost claim dropped the drive's
    ``exited``. Here the claim is taken while the driver runs (it waits for the test's
    word), between two renewals."""
    go = tmp_path / "go"
    store.submit(fake("s", tmp_path, spaces, [{"wait_for": str(go), "exit": 0}]), 0.0)
    config = CoordinatorConfig(backoff=Backoff(0.0), stall_secs=600.0, heartbeat_secs=0.2,
                               poll_secs=0.05, claim_secs=900.0)  # renewed every 300 s
    coordinator = Coordinator(store, spaces, config=config, id="a", host="host-a")
    stop = threading.Event()
    thread = threading.Thread(target=coordinator.serve, args=(stop,))
    thread.start()
    try:
        deadline = time.monotonic() + 120  # only a hang takes this long
        while "launched" not in kinds(store, "s"):
            assert time.monotonic() < deadline, kinds(store, "s")
            time.sleep(0.02)
        # another coordinator, on another host, finds the claim lapsed and takes it
        taken = store.claim("b", time.time() + 901.0, 900.0, 7 * 86400.0)
        assert taken is not None and taken.orphan is not None
        go.touch()  # the driver ends now, its coordinator's claim lost
        while "claim_lost" not in kinds(store, "s"):
            assert time.monotonic() < deadline, kinds(store, "s")
            time.sleep(0.02)
    finally:
        stop.set()
        thread.join()
    exited = [e.data for e in store.events("s") if e.kind == "exited"]
    assert [(e["epoch"], e["exit"]) for e in exited] == [(1, 0)], exited
    rec = store.get("s")
    assert (rec.state, rec.owner) == ("running", "b"), rec


def test_the_epoch_is_above_the_spaces_floor_and_the_lease_token(
        store: CoordinatorStore, spaces: LocalSpaces, tmp_path: Path) -> None:
    spaces.create("ws")
    spaces.connect("ws", epoch=7).advance_epoch(7)
    store.acquire_lease("ws2", "earlier", 0.0, 0.001)  # tokens 1..4 of ws2 went before
    for _ in range(3):
        store.acquire_lease("ws2", "earlier", 10.0 + _, 0.001)
    store.submit(fake("s", tmp_path, spaces, [{"exit": 1}, {"exit": 0}]), 100.0)
    store.submit(fake("t", tmp_path, spaces, [{"exit": 0}], space="ws2"), 100.0)
    serve(store, spaces)
    drives = [e.data for e in store.events("s") if e.kind == "drive"]
    assert [(d["epoch"], d["floor"]) for d in drives] == [(8, 7), (9, 7)]
    (t,) = [e.data for e in store.events("t") if e.kind == "drive"]
    assert (t["token"], t["epoch"]) == (5, 5)  # max(previous + 1, lease token)


def test_a_second_session_for_a_space_waits_and_starts_when_the_first_ends(
        store: CoordinatorStore, spaces: LocalSpaces, tmp_path: Path) -> None:
    store.submit(fake("first", tmp_path, spaces, [{"sleep": 1.0, "exit": 0}]), 0.0)
    store.submit(fake("second", tmp_path, spaces, [{"exit": 0}]), 1.0)
    serve(store, spaces)
    assert store.get("first").state == store.get("second").state == "done"
    held = [e for e in store.events("second") if e.kind == "held"]
    assert held and held[0].data["holder"] == "first"
    first_end = journal(tmp_path, "first")[-1]["t"]
    second_start = journal(tmp_path, "second")[0]["t"]
    assert second_start > first_end, (first_end, second_start)  # how soon is the machine's
    tokens = {n: store.get(n).lease_token for n in ("first", "second")}
    assert tokens == {"first": 1, "second": 2}
    assert journal(tmp_path, "second")[0]["epoch"] > journal(tmp_path, "first")[0]["epoch"]


def test_cancel_kills_the_driver_and_ends_the_session(store: CoordinatorStore,
                                                      spaces: LocalSpaces,
                                                      tmp_path: Path) -> None:
    store.submit(fake("s", tmp_path, spaces, [{"sleep": 60}]), 0.0)

    sent: list[str] = []

    def cancel_once_the_driver_runs() -> None:
        """The cancel must find a driver to kill: it is sent once the coordinator recorded
        the driver's launch (a fixed delay raced the launch on a busy machine)."""
        deadline = time.monotonic() + 120
        while "launched" not in kinds(store, "s") and time.monotonic() < deadline:
            time.sleep(0.02)
        sent.append(store.cancel("s", time.time()).state)

    canceller = threading.Thread(target=cancel_once_the_driver_runs)
    canceller.start()
    # A claim only a hang lets expire: with 0.6 s a busy machine let it lapse, the session
    # was claimed again and its next driver finished before the cancel was seen. A cancel
    # is seen at the next renewal (a third of the claim).
    config = CoordinatorConfig(backoff=Backoff(0.0), stall_secs=30.0, heartbeat_secs=0.2,
                               poll_secs=0.05, claim_secs=15.0)
    serve(store, spaces, config)
    canceller.join(timeout=120)
    rec = store.get("s")
    assert sent, "the cancel was never sent"
    assert (rec.state, rec.reason) == ("failed", "cancelled"), (sent, kinds(store, "s"))
    assert not running(journal(tmp_path, "s")[0]["pid"])


# ---------------------------------------------------------------- the coordinator as a process


class CoordinatorProcess:
    """``python -m durable.coordinator serve`` on the test's store, ended by its pid."""

    def __init__(self, url: str, spaces: LocalSpaces, tmp: Path, ident: str,
                 *extra: str) -> None:
        self.log = tmp / f"coordinator-{ident}-{time.monotonic_ns()}.log"
        argv = [sys.executable, "-m", "durable.coordinator", "--store", url, "serve",
                "--spaces", "backends.local:LocalSpaces",
                "--spaces-arg", f"base_dir={spaces.base_dir}", "--id", ident,
                "--poll-secs", "0.05", "--heartbeat-secs", "0.2", "--stall-secs", "10",
                *extra]
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.kill()


@pytest.fixture
def procs() -> Iterator[list[CoordinatorProcess]]:
    started: list[CoordinatorProcess] = []
    yield started
    for p in started:
        p.kill()


def wait_for(what: str, cond, timeout: float = 300.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return
        time.sleep(0.05)
    pytest.fail(f"timed out waiting for {what}")


def test_a_coordinator_sigkilled_in_a_backoff_restarts_from_its_store(
        url: str, store: CoordinatorStore, spaces: LocalSpaces, tmp_path: Path,
        procs: list[CoordinatorProcess]) -> None:
    store.submit(fake("s", tmp_path, spaces, [{"exit": 1}, {"exit": 0}]), time.time())
    # A backoff of 10 s: a poll of the store misses none on a busy machine (2 s once could).
    procs.append(CoordinatorProcess(url, spaces, tmp_path, "c1", "--backoff", "10"))
    wait_for("the backoff", lambda: store.get("s").state == "backoff")
    procs[-1].kill()
    procs.append(CoordinatorProcess(url, spaces, tmp_path, "c1", "--backoff", "10",
                                    "--until-idle"))
    assert procs[-1].proc.wait(timeout=300) == 0, procs[-1].log.read_text()
    rec = store.get("s")
    assert (rec.state, rec.attempts) == ("done", 2)
    starts = [e for e in journal(tmp_path, "s") if e["event"] == "start"]
    assert [e["epoch"] for e in starts] == [1, 2]  # no epoch launched twice
    launched = [e.data["epoch"] for e in store.events("s") if e.kind == "launched"]
    assert launched == [1, 2]


def test_a_coordinator_sigkilled_mid_drive_takes_its_driver_with_it(
        url: str, store: CoordinatorStore, spaces: LocalSpaces, tmp_path: Path,
        procs: list[CoordinatorProcess]) -> None:
    """The driver dies with the coordinator; another coordinator takes the session over
    when the claim expires and drives it at a newer epoch: never two live drivers."""
    store.submit(fake("s", tmp_path, spaces, [{"sleep": 60}, {"exit": 0}]), time.time())
    # Claims only a hang lets expire (c2 waits out c1's): with 1.5 s a busy machine let c1's
    # lapse before the test saw its first driver, and a second one started.
    procs.append(CoordinatorProcess(url, spaces, tmp_path, "c1", "--claim-secs", "10"))
    wait_for("the first driver", lambda: len(journal(tmp_path, "s")) >= 1)
    driver = journal(tmp_path, "s")[0]["pid"]
    procs[-1].kill()
    wait_for("the driver to die with its coordinator", lambda: not running(driver),
             timeout=120)
    procs.append(CoordinatorProcess(url, spaces, tmp_path, "c2", "--claim-secs", "10",
                                    "--until-idle"))
    assert procs[-1].proc.wait(timeout=300) == 0, procs[-1].log.read_text()
    rec = store.get("s")
    assert (rec.state, rec.attempts) == ("done", 2)
    starts = [e["epoch"] for e in journal(tmp_path, "s") if e["event"] == "start"]
    assert starts == [1, 2]
    claims = [e.data for e in store.events("s") if e.kind == "claimed"]
    assert claims[-1]["coordinator"] == "c2" and claims[-1]["from_owner"] == "c1"


def test_two_coordinators_on_one_postgresql_store_never_drive_a_session_twice(
        spaces: LocalSpaces, tmp_path: Path, procs: list[CoordinatorProcess],
        request: pytest.FixtureRequest, stores: Callable[..., CoordinatorStore]) -> None:
    url = store_url("postgresql", tmp_path, request)
    store = stores(url)
    names = [f"s{i}" for i in range(6)]
    for n in names:
        store.submit(fake(n, tmp_path, spaces, [{"sleep": 0.3, "exit": 1},
                                                {"sleep": 0.3, "exit": 0}], space=f"ws-{n}"),
                     time.time())

    def launched_by(ident: str) -> bool:
        return any(e.data["coordinator"] == ident for e in store.events() if e.kind == "launched")

    def coordinator(ident: str) -> CoordinatorProcess:
        # Claims of 10 s: a 2 s one lapsed under load while its coordinator lived, and the
        # other took the session over mid-drive.
        return CoordinatorProcess(url, spaces, tmp_path, ident, "--backoff", "0",
                                  "--claim-secs", "10", "--max-drives", "2")

    # b starts once a drives: on a busy machine b alone once drove every session before a
    # had started, and a's death then tested nothing (the test failed under load).
    procs.append(coordinator("a"))
    wait_for("coordinator a's first driver", lambda: launched_by("a"))
    procs.append(coordinator("b"))
    wait_for("a few drives", lambda: sum(len(journal(tmp_path, n)) for n in names) >= 6)
    procs[0].kill()  # a dies mid-campaign: its drivers with it; b takes its sessions over
    a_died = time.time()
    wait_for("every session", lambda: all(r.ended for r in store.sessions()), timeout=300)
    for n in names:
        rec = store.get(n)
        assert rec.state == "done", rec
        by = {e.data["pid"]: e.data["coordinator"] for e in store.events(n)
              if e.kind == "launched"}
        starts = {e["pid"]: e for e in journal(tmp_path, n) if e["event"] == "start"}
        ends = {e["pid"]: e["t"] for e in journal(tmp_path, n) if e["event"] == "end"}
        lives = []
        drives = [e.data["epoch"] for e in store.events(n) if e.kind == "drive"]
        for pid, start in starts.items():
            assert start["epoch"] in drives, (n, start)  # every driver's epoch was recorded
            if pid not in ends:  # killed with coordinator a (it was a's driver): launched,
                # or started in the instant before a could record its launch (once in CI)
                assert by.get(pid, "a") == "a" and not running(pid), (n, pid)
            lives.append((start["t"], ends.get(pid, a_died), start["epoch"]))
        lives.sort()
        for (_, end, _), (start, _, _) in itertools.pairwise(lives):
            assert start >= end, (n, lives)  # no two drivers of a session alive at once
        epochs = [e for _, _, e in lives]
        assert epochs == sorted(set(epochs)), (n, epochs)  # every epoch once, growing
    drivers = {e.data["coordinator"] for e in store.events() if e.kind == "launched"}
    assert drivers == {"a", "b"}


# ---------------------------------------------------------------- the store goes away


def _terminate_coordinator_connections(url: str) -> int:
    """Drop every connection of the store's coordinators on the server (as a restarting
    server or a network cut would); returns how many."""
    from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

    import psycopg

    parts = urlsplit(url)
    query = dict(parse_qsl(parts.query))
    schema = query.pop("schema")
    with psycopg.connect(urlunsplit(parts._replace(query=urlencode(query))),
                         autocommit=True) as admin:
        rows = admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE "
                             "application_name = %s", (f"durable.coordinator:{schema}",))
        return sum(1 for (done,) in rows.fetchall() if done)


def test_a_dropped_store_connection_keeps_the_coordinator_and_its_driver(
        spaces: LocalSpaces, tmp_path: Path, procs: list[CoordinatorProcess],
        request: pytest.FixtureRequest, stores: Callable[..., CoordinatorStore]) -> None:
    """Before, one dropped PostgreSQL connection ended the coordinator with a traceback and
    its drivers with it. Now it connects again and the drive goes on: one driver, one
    attempt, done."""
    url = store_url("postgresql", tmp_path, request)
    stores(url).submit(fake("s", tmp_path, spaces, [{"sleep": 3, "exit": 0}]), time.time())
    procs.append(CoordinatorProcess(url, spaces, tmp_path, "c1", "--claim-secs", "30",
                                    "--until-idle"))
    wait_for("the driver", lambda: len(journal(tmp_path, "s")) >= 1)
    assert _terminate_coordinator_connections(url) >= 1
    wait_for("the coordinator to write again", lambda: "answers again" in
             procs[-1].log.read_text() or procs[-1].proc.poll() is not None)
    assert procs[-1].proc.wait(timeout=300) == 0, procs[-1].log.read_text()
    rec = stores(url, create=False).get("s")
    assert (rec.state, rec.attempts) == ("done", 1), rec
    events = journal(tmp_path, "s")
    assert [e["event"] for e in events] == ["start", "end"], events  # the same driver
    log = procs[-1].log.read_text()
    assert "is unreachable" in log and "Traceback" not in log, log


class Unplugged:
    """A store that stops answering while ``away`` is set (a fault, as the nemesis would
    inject it): every operation raises ``StoreUnavailable``."""

    def __init__(self, store: CoordinatorStore) -> None:
        self.store, self.away = store, threading.Event()

    def __getattr__(self, name: str):
        attr = getattr(self.store, name)

        def call(*args, **kwargs):
            if self.away.is_set():
                raise StoreUnavailable("the store is unplugged (test)")
            return attr(*args, **kwargs)

        return call


def test_a_store_away_longer_than_a_claim_ends_the_drivers_and_says_so(
        store: CoordinatorStore, spaces: LocalSpaces, tmp_path: Path) -> None:
    """Its claims lapsed, so another coordinator may drive its sessions: the coordinator
    ends its drivers and stops with the reason; the session is resumed later."""
    store.submit(fake("s", tmp_path, spaces, [{"sleep": 120}, {"exit": 0}]), 0.0)
    unplugged = Unplugged(store)
    config = CoordinatorConfig(backoff=Backoff(0.0), stall_secs=60.0, heartbeat_secs=0.2,
                               poll_secs=0.05, claim_secs=2.0)
    coordinator = Coordinator(unplugged, spaces, config=config, id="c1")  # type: ignore[arg-type]
    failed: list[BaseException] = []

    def serve_until_it_fails() -> None:
        try:
            coordinator.serve(threading.Event())
        except BaseException as exc:  # noqa: BLE001 - the test looks at it
            failed.append(exc)

    thread = threading.Thread(target=serve_until_it_fails)
    thread.start()
    wait_for("the driver", lambda: "launched" in kinds(store, "s"))
    unplugged.away.set()
    thread.join(timeout=300)
    assert not thread.is_alive(), "the coordinator kept going without its store"
    assert failed and isinstance(failed[0], StoreUnavailable), failed
    assert "claims (2 s) lapse" in str(failed[0])
    for start in (e for e in journal(tmp_path, "s") if e["event"] == "start"):
        assert not running(start["pid"]), start
    unplugged.away.clear()
    serve(store, spaces, CoordinatorConfig(backoff=Backoff(0.0), stall_secs=60.0,
                                           heartbeat_secs=0.2, poll_secs=0.05,
                                           claim_secs=30.0))
    assert store.get("s").state == "done"
