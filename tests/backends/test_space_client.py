"""The host-side client: the protocol it satisfies, errors, and finding a moved daemon."""

from __future__ import annotations

import pytest

from backends.local import LocalSpaces
from backends.local.procs import kill_process
from backends.space_client import Endpoint, HttpSpaceClient, RequestRetries
from durable.errors import SpaceError, SpaceNotFound, SpaceUnavailable, StaleEpochError
from durable.spaces import SpaceClient as SpaceClientProtocol


@pytest.fixture
def client(spaces: LocalSpaces) -> HttpSpaceClient:
    spaces.create("s")
    return spaces.connect("s", epoch=1)


def test_is_a_space_client_bound_to_an_epoch(client: HttpSpaceClient) -> None:
    assert isinstance(client, SpaceClientProtocol)
    other = client.with_epoch(2)
    assert (client.epoch, other.epoch, other.name) == (1, 2, "s")
    assert client.capabilities() == {"process.exec_ledger", "process.epoch",
                                     "process.epoch.own", "fs", "workspace.scan",
                                     "workspace.checkpoint"}


def test_the_client_follows_a_restarted_daemon(spaces: LocalSpaces,
                                               client: HttpSpaceClient) -> None:
    client.write_file("f", b"1")
    for _ in range(3):
        spaces.kill_daemon("s")
        assert client.read_file("f") == b"1"
    spaces.restart("s")
    assert client.read_file("f") == b"1"


def test_a_dead_daemon_is_unavailable_and_a_deleted_space_not_found(
    spaces: LocalSpaces, client: HttpSpaceClient
) -> None:
    space = spaces.get("s")
    quick = HttpSpaceClient("s", 1, space.endpoint, retry_for=0.3)
    kill_process(*space.daemon())
    with pytest.raises(SpaceUnavailable):
        quick.stat("f")
    spaces.delete("s")
    with pytest.raises(SpaceNotFound):
        quick.stat("f")


def test_refusals_carry_their_code(client: HttpSpaceClient) -> None:
    client.advance_epoch(3)
    with pytest.raises(StaleEpochError) as stale:
        client.stat("f")
    assert (stale.value.epoch, stale.value.floor) == (1, 3)
    with pytest.raises(SpaceError) as exc:
        client.with_epoch(3).read_file("missing")
    assert (exc.value.code, exc.value.status) == ("not_found", 404)


def test_a_wrong_token_is_resolved_again_once(spaces: LocalSpaces, client: HttpSpaceClient) -> None:
    """A port reused by another Space's daemon answers 401: the client looks again."""
    right = spaces.get("s").endpoint()
    answers = iter([Endpoint(right.host, right.port, "stale-token"), right])
    flaky = HttpSpaceClient("s", 1, lambda: next(answers))
    assert flaky.stat("") is not None
    wrong = HttpSpaceClient("s", 1, lambda: Endpoint(right.host, right.port, "wrong"))
    with pytest.raises(SpaceError) as exc:
        wrong.stat("")
    assert exc.value.code == "unauthorized"


def retries(*, idempotent: bool = True, rewindable: bool = True) -> RequestRetries:
    return RequestRetries(idempotent=idempotent, rewindable=rewindable, reach_until=10.0,
                          busy_until=20.0)


def test_an_unreachable_daemon_is_looked_for_until_the_reach_deadline() -> None:
    r = retries()
    assert r.after_unreachable(9.9) == 0.05
    assert r.after_unreachable(10.0) is None


def test_a_broken_request_is_sent_again_only_where_that_is_safe() -> None:
    # a kept connection the daemon had closed: again, at the same daemon, every time
    r = retries(idempotent=False)
    assert r.after_break(kept=True, timed_out=False) == "same_daemon"
    assert r.after_break(kept=True, timed_out=False) == "same_daemon"
    # a timeout or a new connection: an idempotent request once, another never
    assert r.after_break(kept=True, timed_out=True) is None
    assert r.after_break(kept=False, timed_out=False) is None
    r = retries(idempotent=True)
    assert r.after_break(kept=False, timed_out=True) == "resolve"
    assert r.after_break(kept=False, timed_out=False) is None


def test_a_refused_token_looks_for_the_daemon_once() -> None:
    r = retries()
    assert r.look_again_after_refusal() is True
    assert r.look_again_after_refusal() is False


def test_a_busy_daemon_is_asked_again_until_the_busy_deadline_with_a_rewindable_body() -> None:
    r = retries()
    assert r.after_busy(1.5, now=0.0) == 1.5
    assert r.after_busy(1.5, now=19.0) == pytest.approx(1.0)  # never past the deadline
    assert r.after_busy(1.5, now=20.0) is None
    assert r.after_busy(None, now=0.0) is None  # a 503 that is not busy
    assert retries(rewindable=False).after_busy(1.5, now=0.0) is None
