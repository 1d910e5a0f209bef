"""The host-side client: the protocol it satisfies, errors, and finding a moved daemon."""

from __future__ import annotations

import pytest

from backends.local import LocalSpaces
from backends.local.procs import kill_process
from backends.space_client import Endpoint, HttpSpaceClient
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
