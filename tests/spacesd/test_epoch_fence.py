"""The epoch fence: advance_epoch kills older process trees and refuses older requests."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from backends.local import LocalSpace, LocalSpaces
from backends.local.procs import kill_process
from backends.space_client import HttpSpaceClient
from durable.errors import StaleEpochError
from spacesd.epoch_fence import DamagedFloor, EpochFence
from spacesd.errors import StaleEpoch
from tests.liveness import running


def read_pids(work: Path, *names: str, timeout: float = 120.0) -> list[int]:
    deadline = time.monotonic() + timeout
    while not all((work / n).exists() and (work / n).read_text().strip() for n in names):
        assert time.monotonic() < deadline, "the command did not write its pids"
        time.sleep(0.01)
    return [int((work / n).read_text()) for n in names]


def test_advance_kills_an_older_process_tree_and_refuses_older_writes(
    spaces: LocalSpaces, space: LocalSpace
) -> None:
    old = spaces.connect(space.name, epoch=1)
    # A child shell that starts a grandchild sleep; both write their pids.
    old.exec_start("c:1:0@1", "bash -c 'sleep 300 & echo $! > grandchild.pid; wait' & "
                              "echo $! > child.pid; wait")
    child, grandchild = read_pids(space.work, "child.pid", "grandchild.pid")
    assert running(child) and running(grandchild)
    old.write_file("f.txt", b"before")

    new = old.with_epoch(2)
    result = new.advance_epoch(2)
    assert result == {"floor": 2, "round": 0, "killed": ["c:1:0@1"]}
    assert not running(child) and not running(grandchild)
    info = new.exec_status("c:1:0@1")
    assert (info.state, info.signal, info.fenced_by) == ("exited", 9, 2)

    with pytest.raises(StaleEpochError) as exc:
        old.write_file("f.txt", b"after")
    assert (exc.value.epoch, exc.value.floor) == (1, 2)
    assert (space.work / "f.txt").read_bytes() == b"before"
    with pytest.raises(StaleEpochError):
        old.exec_start("c:1:1@1", "echo x > g.txt")
    assert not (space.work / "g.txt").exists()
    with pytest.raises(StaleEpochError):
        old.scan()


def test_advance_is_monotonic_and_persisted(spaces: LocalSpaces, space: LocalSpace,
                                            client: HttpSpaceClient) -> None:
    assert client.advance_epoch(5) == {"floor": 5, "round": 0, "killed": []}
    assert client.advance_epoch(5) == {"floor": 5, "round": 0, "killed": []}  # a no-op
    with pytest.raises(StaleEpochError) as exc:
        client.advance_epoch(4)
    assert (exc.value.epoch, exc.value.floor) == (4, 5)
    # A higher epoch than the floor is served without raising it.
    higher = client.with_epoch(9)
    higher.write_file("x", b"1")
    assert client.with_epoch(5).advance_epoch(5)["floor"] == 5
    spaces.kill_daemon(space.name)
    with pytest.raises(StaleEpochError):
        client.with_epoch(4).stat("x")
    assert client.with_epoch(5).stat("x")["size"] == 1


def test_advance_spares_processes_of_newer_epochs(client: HttpSpaceClient) -> None:
    e3 = client.with_epoch(3)
    e3.exec_start("k@3", "sleep 30")
    assert client.with_epoch(2).advance_epoch(2)["killed"] == []
    assert e3.exec_status("k@3").state == "running"
    assert e3.advance_epoch(4)["killed"] == ["k@3"]


def test_old_leftovers_are_killed_too(client: HttpSpaceClient, space: LocalSpace) -> None:
    client.exec_start("k", "sleep 300 & echo $! > bg.pid")
    assert client.exec_wait("k", timeout=60).exit_code == 0
    (bg,) = read_pids(space.work, "bg.pid")
    assert running(bg)
    assert client.with_epoch(2).advance_epoch(2)["killed"] == ["k"]
    assert not running(bg)
    # The command itself had exited normally: its record keeps its own exit status.
    info = client.with_epoch(2).exec_status("k")
    assert (info.exit_code, info.fenced_by) == (0, None)


def test_a_floor_raised_by_a_crashed_advance_is_enforced_at_start(
    spaces: LocalSpaces, space: LocalSpace, client: HttpSpaceClient
) -> None:
    """A daemon killed after persisting the floor but before killing: the next one kills."""
    client.exec_start("k", "echo $$ > sh.pid; sleep 300")
    (sh,) = read_pids(space.work, "sh.pid")
    kill_process(*space.daemon())
    (space.state / "epoch").write_text("2\n")
    spaces.create(space.name)  # starts the dead daemon again
    assert not running(sh)
    info = client.with_epoch(2).exec_status("k")
    assert (info.state, info.fenced_by) == ("exited", 2)


def test_a_request_that_arrives_during_an_advance_meets_the_raised_floor(tmp_path: Path) -> None:
    """A request that arrives while an advance waits for the requests in flight to end must
    be checked once the advance ended, against the floor it raised: checked on arrival
    (against the floor before), it would wait out the advance and then write after the
    fence. It waits (writer preference), then is refused; one of the new epoch is let in."""
    fence = EpochFence(str(tmp_path / "epoch"))
    with fence.advancing(1):
        pass
    in_flight, finish = threading.Event(), threading.Event()
    outcome: list[object] = []

    def request_in_flight() -> None:
        with fence.admit(1):
            in_flight.set()
            finish.wait(timeout=300)

    def advance() -> None:
        with fence.advancing(2):
            pass

    def late_request() -> None:
        try:
            with fence.admit(1):
                outcome.append("admitted")
        except StaleEpoch as exc:
            outcome.append(exc)

    def waiting(n: int, what: str) -> None:
        deadline = time.monotonic() + 300
        while len(fence._cond._waiters) < n:  # type: ignore[attr-defined]  # CPython's list
            assert time.monotonic() < deadline, f"{what} never waited on the fence"
            time.sleep(0.001)

    threads = [threading.Thread(target=request_in_flight)]
    threads[0].start()
    assert in_flight.wait(timeout=300), "the first request was never admitted"
    threads.append(threading.Thread(target=advance))
    threads[1].start()
    waiting(1, "the advance")
    threads.append(threading.Thread(target=late_request))
    threads[2].start()
    waiting(2, "the late request")
    finish.set()
    for thread in threads:
        thread.join(timeout=300)
    assert len(outcome) == 1 and isinstance(outcome[0], StaleEpoch), outcome


def test_an_own_fence_refuses_what_its_driver_sent_before_it(
        spaces: LocalSpaces, space: LocalSpace, client: HttpSpaceClient) -> None:
    """A request its driver gave up on (timed out, outcome unknown) that a slow network
    delivers after the driver's own fence (taken before it restores or reverts) must change
    nothing: it carries the round it was sent in, and the fence began a later one (found
    by the slow-links fault once its delayed bursts kept their delay: a late write landed
    over the workspace its driver's recovery had put back)."""
    assert client.advance_epoch(1, owner="d")["round"] == 0
    client.write_file("f.txt", b"before")
    in_flight = client.with_epoch(1)  # a request of round 0, delivered late
    assert in_flight.round == 0
    assert client.advance_epoch(1, owner="d", own=True)["round"] == 1
    assert client.round == 1
    with pytest.raises(StaleEpochError, match="sent before its own driver fenced"):
        in_flight.write_file("f.txt", b"late")
    client.write_file("f.txt", b"after")  # the driver's own requests of round 1 pass
    spaces.kill_daemon(space.name)  # the round is persisted with the floor
    with pytest.raises(StaleEpochError):
        in_flight.exec_start("late@1", "echo late > g.txt")
    assert (space.work / "f.txt").read_bytes() == b"after"
    assert not (space.work / "g.txt").exists()
    # A client that never advanced carries no round: judged by its epoch (a campaign's
    # checks, a copy's source); reads are never refused for their round.
    spaces.connect(space.name, epoch=1).write_file("h.txt", b"checked")
    assert in_flight.read_file("f.txt") == b"after"
    # A later advance by the same owner answers the current round, which a new client of
    # the driver adopts; a newer epoch starts at round 0.
    fresh = spaces.connect(space.name, epoch=1)
    assert fresh.advance_epoch(1, owner="d")["round"] == 1 and fresh.round == 1
    fresh.write_file("f.txt", b"fresh")
    assert client.with_epoch(2).advance_epoch(2, owner="e")["round"] == 0


def test_the_floor_file_keeps_the_round_and_reads_older_ones(tmp_path: Path) -> None:
    path = tmp_path / "epoch"
    fence = EpochFence(str(path))
    with fence.advancing(3, "d"):
        pass
    assert path.read_text() == "3 d\n"  # as written before rounds
    with fence.advancing(3, "d", own=True):
        pass
    with fence.advancing(3, "d", own=True):
        pass
    assert path.read_text() == "3 d 2\n"
    assert EpochFence(str(path)).round == 2
    with pytest.raises(StaleEpoch):
        fence.check(3, 1)
    fence.check(3, 2)
    fence.check(3)  # no round: its epoch alone
    fence.check(4, 0)  # above the floor: its round is not the floor's
    with fence.advancing(4, "e"):
        pass
    assert (path.read_text(), fence.round) == ("4 e\n", 0)
    path.write_text("4 e two\n")
    with pytest.raises(DamagedFloor, match="<round>"):
        EpochFence(str(path))


def test_a_late_copy_of_an_own_fence_changes_nothing(
        spaces: LocalSpaces, space: LocalSpace, client: HttpSpaceClient) -> None:
    """An own fence is sent again after a timeout (advance_epoch is idempotent to its
    client): a copy of an earlier round that arrives after the fence was taken begins no
    round and kills nothing, or every later request of the driver would be refused as
    stale and its rerun command killed (found by review)."""
    client.advance_epoch(1, owner="d")
    late_copy = client.with_epoch(1)  # the copy, sent in round 0
    assert client.advance_epoch(1, owner="d", own=True)["round"] == 1
    client.exec_start("rerun@1", "sleep 300")
    assert late_copy.advance_epoch(1, owner="d", own=True) == \
        {"floor": 1, "round": 1, "killed": []}
    assert late_copy.round == 1  # its client learns the round it is in
    assert client.exec_status("rerun@1").state == "running"
    client.write_file("f.txt", b"still the driver's")
    client.exec_kill("rerun@1")


def test_a_restored_floor_file_never_takes_the_round_back(
        spaces: LocalSpaces, space: LocalSpace, client: HttpSpaceClient) -> None:
    """A machine restore brings back the floor file of the checkpoint's time; the driver's
    next advance carries the round it was told, and the floor's round goes back up to it,
    so requests of earlier rounds stay refused (found by review)."""
    client.advance_epoch(1, owner="d")
    earlier = client.with_epoch(1)
    client.advance_epoch(1, owner="d", own=True)
    spaces.kill_daemon(space.name)
    (space.state / "epoch").write_text("1 d\n")  # as a restored machine has it
    spaces.create(space.name)
    assert client.advance_epoch(1, owner="d")["round"] == 1
    with pytest.raises(StaleEpochError):
        earlier.write_file("f.txt", b"late")
    assert not (space.work / "f.txt").exists()
