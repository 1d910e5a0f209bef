"""The store's rules, one suite run on SQLite and on PostgreSQL: submission, claims (one
coordinator at a time, expiry, release), leases (held, released with the session, tokens
that only grow, superseded tokens refused), cancel, and two stores on one database."""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Callable

import pytest

from durable.coordinator import (
    ClaimLost,
    CoordinatorStore,
    LeaseHeld,
    LeaseSuperseded,
    SessionConflict,
    SessionSpec,
    UnknownSession,
    open_store,
)

CLAIM, LEASE = 10.0, 1000.0


def spec(name: str, space: str = "sp") -> SessionSpec:
    return SessionSpec(name, space, ("driver", name), f"/state/{name}")


def test_submitting_is_idempotent_for_the_same_spec_only(store: CoordinatorStore) -> None:
    first = store.submit(spec("a"), 1.0)
    assert (first.state, first.reason) == ("pending", "submitted")
    assert store.submit(spec("a"), 2.0) == first
    with pytest.raises(SessionConflict, match="another spec"):
        store.submit(SessionSpec("a", "other", ("driver",), "/s"), 3.0)
    with pytest.raises(UnknownSession, match="lists them"):
        store.get("nope")
    assert [r.name for r in store.sessions()] == ["a"]
    with pytest.raises(ValueError, match="driver's command"):
        SessionSpec("b", "sp", (), "/s")
    with pytest.raises(ValueError, match="a Space's name"):
        SessionSpec("b", "a/b", ("d",), "/s")
    with pytest.raises(ValueError, match="CUA_"):
        SessionSpec("b", "sp", ("d",), "/s", env={"CUA_SESSION_EPOCH": "9"})


def test_a_claim_is_one_coordinators_until_it_expires(store: CoordinatorStore) -> None:
    store.submit(spec("a"), 1.0)
    got = store.claim("c1", 2.0, CLAIM, LEASE)
    assert got is not None and got.record.owner == "c1" and got.record.lease_token == 1
    assert store.claim("c2", 3.0, CLAIM, LEASE) is None  # c1's until 12.0
    with pytest.raises(ClaimLost):
        store.save(got.record.evolve(reason="x"), "c2", 3.0)
    assert "a" in store.renew("c1", ["a"], 11.0, CLAIM, LEASE)  # now until 21.0
    assert store.claim("c2", 20.0, CLAIM, LEASE) is None
    stolen = store.claim("c2", 21.5, CLAIM, LEASE)  # expired: c1 died
    assert stolen is not None and stolen.record.owner == "c2"
    assert store.renew("c1", ["a"], 22.0, CLAIM, LEASE) == {}  # c1 learns it lost it
    with pytest.raises(ClaimLost, match="no longer claimed by c1"):
        store.save(got.record.evolve(state="done"), "c1", 22.0)
    kinds = [(e.kind, e.data.get("from_owner")) for e in store.events("a")]
    assert ("claimed", "c1") in kinds  # the takeover names the coordinator it took from


def test_a_drives_save_keeps_the_claim_its_coordinator_renewed(store: CoordinatorStore) -> None:
    """A drive's record is as old as its claim: saved late (its Space was frozen while it
    read the floor), it must not write its claim's first expiry back over the renewals'.
    It did, the claim lapsed under a live drive, and the session was claimed again: found
    by a redrive campaign with --pause-spaces (two drivers of one Space at once)."""
    store.submit(spec("a"), 1.0)
    got = store.claim("c1", 2.0, CLAIM, LEASE)  # until 12.0
    assert got is not None
    assert "a" in store.renew("c1", ["a"], 11.0, CLAIM, LEASE)  # until 21.0
    saved = store.save(got.record.evolve(attempts=1, epoch=1), "c1", 11.5)
    assert saved.claim_until == 21.0
    assert store.claim("c2", 15.0, CLAIM, LEASE) is None


def test_a_drive_of_an_earlier_claim_saves_nothing_even_from_its_own_coordinator(
        store: CoordinatorStore) -> None:
    """A coordinator that stalled past its claim and claimed its session again has two
    drives of it; only the newer claim's may save (the older's driver may report a clean
    exit that is not the session's)."""
    store.submit(spec("a"), 1.0)
    first = store.claim("c1", 2.0, CLAIM, LEASE)
    again = store.claim("c1", 13.0, CLAIM, LEASE)  # the first lapsed at 12.0
    assert first is not None and again is not None
    assert again.record.claim == first.record.claim + 1
    with pytest.raises(ClaimLost, match="under the claim its drive started with"):
        store.save(first.record.evolve(state="done", reason="finished"), "c1", 13.5)
    assert store.get("a").state == "running"
    assert store.save(again.record.evolve(state="done", reason="finished"), "c1",
                      14.0).state == "done"


def test_released_claims_are_due_at_once(store: CoordinatorStore) -> None:
    store.submit(spec("a"), 1.0)
    store.claim("c1", 2.0, CLAIM, LEASE)
    assert store.release_claims("c1", 3.0) == ["a"]
    again = store.claim("c1", 3.1, CLAIM, LEASE)
    assert again is not None and again.record.lease_token == 1  # the same lease


def test_a_session_waits_for_its_spaces_lease_and_gets_the_next_token(
        store: CoordinatorStore) -> None:
    store.submit(spec("first"), 1.0)
    store.submit(spec("second"), 1.5)
    first = store.claim("c1", 2.0, CLAIM, LEASE)
    assert first is not None and first.record.name == "first"
    assert store.claim("c2", 2.1, CLAIM, LEASE) is None
    assert store.get("second").reason == "held by session:first"
    store.save(first.record.evolve(state="done", reason="finished"), "c1", 3.0)
    assert store.lease("sp").session is None  # released with the session's end
    second = store.claim("c2", 3.1, CLAIM, LEASE)
    assert second is not None and second.record.name == "second"
    assert second.record.lease_token == 2
    with pytest.raises(LeaseSuperseded, match="token 1 of Space sp is superseded"):
        store.renew_lease("sp", 1, 4.0, LEASE)
    with pytest.raises(LeaseSuperseded):
        store.release_lease("sp", 1, 4.0)
    assert store.renew_lease("sp", 2, 4.0, LEASE).session == "second"


def test_lease_operations_carry_their_token(store: CoordinatorStore) -> None:
    a = store.acquire_lease("sp", "a", 1.0, 10.0)
    assert a.token == 1 and store.acquire_lease("sp", "a", 2.0, 10.0).token == 1  # renewed
    with pytest.raises(LeaseHeld) as held:
        store.acquire_lease("sp", "b", 3.0, 10.0)
    assert held.value.holder == "a"
    b = store.acquire_lease("sp", "b", 13.0, 10.0)  # a's expired
    assert b.token == 2
    for op in (lambda: store.renew_lease("sp", 1, 14.0, 10.0),
               lambda: store.release_lease("sp", 1, 14.0)):
        with pytest.raises(LeaseSuperseded):
            op()
    store.release_lease("sp", 2, 15.0)
    with pytest.raises(LeaseSuperseded, match="released"):
        store.release_lease("sp", 2, 15.0)
    assert store.acquire_lease("sp", "c", 16.0, 10.0).token == 3  # tokens only grow


def test_a_session_whose_lease_was_superseded_ends(store: CoordinatorStore) -> None:
    store.submit(spec("a"), 1.0)
    got = store.claim("c1", 2.0, CLAIM, 5.0)
    assert got is not None
    store.save(got.record.evolve(state="backoff", owner=None, next_retry=3.0), "c1", 2.5)
    store.acquire_lease("sp", "intruder", 8.0, 100.0)  # a's lease expired at 7.0
    assert store.claim("c1", 9.0, CLAIM, 5.0) is None
    rec = store.get("a")
    assert rec.state == "failed" and "lease lost" in rec.reason, rec


def test_cancel_ends_a_waiting_session_or_asks_its_coordinator(store: CoordinatorStore) -> None:
    store.submit(spec("idle"), 1.0)
    assert store.cancel("idle", 2.0).state == "failed"
    store.submit(spec("busy", "sp2"), 1.0)
    store.claim("c1", 2.0, CLAIM, LEASE)
    rec = store.cancel("busy", 3.0)
    assert rec.state == "running" and rec.cancel_requested
    assert store.renew("c1", ["busy"], 3.5, CLAIM, LEASE)["busy"].cancel_requested
    done = store.save(rec.evolve(state="failed", reason="cancelled"), "c1", 4.0)
    assert done.state == "failed" and store.lease("sp2").session is None


def test_two_stores_on_one_database_never_claim_one_session_twice(
        url: str, stores: Callable[..., CoordinatorStore]) -> None:
    """Eight coordinators race for 20 sessions on separate connections: each session is
    claimed exactly once."""
    setup = stores(url)
    for i in range(20):
        setup.submit(spec(f"s{i}", f"sp{i}"), 1.0)
    claims: list[tuple[str, str]] = []
    lock = threading.Lock()

    def coordinator(name: str) -> None:
        store = open_store(url)
        try:
            while (got := store.claim(name, 2.0, CLAIM, LEASE)) is not None:
                with lock:
                    claims.append((got.record.name, name))
        finally:
            store.close()

    threads = [threading.Thread(target=coordinator, args=(f"c{i}",)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    names = [n for n, _ in claims]
    assert sorted(names) == sorted(f"s{i}" for i in range(20)) and len(set(names)) == 20
    assert {r.owner for r in setup.sessions()} == {c for _, c in claims}


def test_while_quiet_holds_every_other_writer_off_and_gives_way_to_one_queued(
        url: str) -> None:
    """The action runs while no other connection can write; on PostgreSQL, a connection
    that queued for the lock meanwhile (its server would take the lock for it next, whatever
    its client does) makes it undo the action and answer None, to try again."""
    quiet, other = open_store(url), open_store(url)
    other.submit(spec("a"), 1.0)
    undone: list[str] = []
    try:
        if not url.startswith("postgresql"):
            def locked_out() -> str:
                probe = sqlite3.connect(url, timeout=0.0, isolation_level=None)
                try:
                    probe.execute("BEGIN IMMEDIATE")
                    return "wrote"
                except sqlite3.OperationalError as exc:
                    return str(exc)
                finally:
                    probe.close()

            assert quiet.while_quiet(locked_out, undone.append) == "database is locked"
            assert undone == [] and locked_out() == "wrote"
            return
        import psycopg

        with psycopg.connect(url.split("?")[0], autocommit=True) as watcher:
            claimed: list[object] = []
            writer = threading.Thread(
                target=lambda: claimed.append(other.claim("c2", 2.0, CLAIM, LEASE)))

            def queue_a_writer() -> str:
                writer.start()
                deadline = time.monotonic() + 300  # only a hang takes this long
                while not watcher.execute("SELECT count(*) FROM pg_locks WHERE locktype = "
                                          "'advisory' AND NOT granted").fetchone()[0]:
                    assert time.monotonic() < deadline, "the writer never queued for the lock"
                    time.sleep(0.01)
                return "stopped"

            assert quiet.while_quiet(queue_a_writer, undone.append) is None
            assert undone == ["stopped"]
            writer.join()
            assert claimed and claimed[0] is not None  # it wrote once the action was undone
            assert quiet.while_quiet(lambda: "stopped", undone.append) == "stopped"
    finally:
        quiet.close()
        other.close()


def test_a_spec_stored_before_a_name_became_the_coordinators_still_loads() -> None:
    """``CUA_SESSION_MODE`` was a session's own ``--env`` name before the coordinator set it
    for every driver: a session stored then loads, that value left out, the rest kept."""
    raw = SessionSpec("s1", "ws1", ("python", "-m", "app"), "/tmp/s1",
                      env={"KEEP": "1"}).to_json()
    raw["env"]["CUA_SESSION_MODE"] = "checkpoint"
    spec = SessionSpec.from_json(raw)
    assert spec.env == {"KEEP": "1"} and spec.command == ("python", "-m", "app")
