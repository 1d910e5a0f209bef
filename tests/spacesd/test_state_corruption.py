"""Damaged daemon state is detected, never silently reset or dropped: real daemons, real
files damaged the way a power cut or a failing disk leaves them.

A damaged claim file makes its key ``lost`` (it may have run), never a 500 and never "not
started"; a damaged floor or a damaged complete ledger record stops the daemon from starting
with a message naming the file, and the file is left as it was."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from backends.local import LocalSpace, LocalSpaces
from backends.space_client import SpaceClient
from durable.errors import SpaceUnavailable


def _ran(client: SpaceClient, key: str, command: str) -> None:
    client.exec_start(key, command)
    assert client.exec_wait(key, timeout=60).state == "exited"


def _claim(space: LocalSpace, key: str) -> Path:
    ledger = (space.state / "ledger.jsonl").read_text().splitlines()
    rec = next(json.loads(line) for line in ledger if json.loads(line).get("key") == key)
    return space.state / "exec" / f"{rec['id']}.claim"


@pytest.mark.parametrize("content", [b"", b"\x00\x00\x00", b"12 not-a-start-time\n"])
def test_a_damaged_claim_makes_its_key_lost_never_a_500(spaces: LocalSpaces, space: LocalSpace,
                                                       client: SpaceClient,
                                                       content: bytes) -> None:
    _ran(client, "k@1", "echo ran >> runs.txt")
    claim = _claim(space, "k@1")
    claim.with_suffix(".exit").unlink()  # the power cut took the exit status too
    claim.write_bytes(content)
    spaces.restart(space.name)
    info = client.exec_status("k@1")
    assert info.state == "lost", info  # may have run: never "unknown" (not started)
    assert client.exec_start("k@1", "echo ran >> runs.txt").state == "lost"
    assert client.scan().entries is not None
    assert client.with_epoch(2).advance_epoch(2)["floor"] == 2
    assert (space.work / "runs.txt").read_text() == "ran\n"  # never twice


@pytest.mark.parametrize("content", [b"", b"{\"exit_code\": 0", b"[]", b"\xff\xfe",
                                     b'{"exit_code": "0", "signal": null, "ended_ms": 1}'])
def test_a_damaged_exit_record_makes_its_key_lost_never_a_500(spaces: LocalSpaces,
                                                             space: LocalSpace,
                                                             client: SpaceClient,
                                                             content: bytes) -> None:
    _ran(client, "k@1", "echo ran >> runs.txt; exit 3")
    _claim(space, "k@1").with_suffix(".exit").write_bytes(content)
    spaces.restart(space.name)
    info = client.exec_status("k@1")
    assert info.state == "lost" and info.exit_code is None, info  # never a made-up status
    assert client.scan().entries is not None
    assert (space.work / "runs.txt").read_text() == "ran\n"


def test_a_damaged_fence_journal_stops_the_daemon(spaces: LocalSpaces, space: LocalSpace,
                                                  client: SpaceClient) -> None:
    client.with_epoch(2).advance_epoch(2)
    client.with_epoch(3).advance_epoch(3)
    journal = space.state / "fences.jsonl"
    lines = journal.read_bytes().splitlines(keepends=True)
    lines[0] = lines[0].replace(b'"floor"', b'"flour"')  # still JSON: only the CRC tells
    journal.write_bytes(b"".join(lines))
    before = journal.read_bytes()
    with pytest.raises(SpaceUnavailable, match="fails its checksum"):
        spaces.restart(space.name)
    assert journal.read_bytes() == before


@pytest.mark.parametrize("content", [b"", b"\n", b"seven\n", b"-3\n", b"\xff\xfe"])
def test_a_damaged_floor_stops_the_daemon_from_starting(spaces: LocalSpaces,
                                                        space: LocalSpace,
                                                        client: SpaceClient,
                                                        content: bytes) -> None:
    client.with_epoch(5).advance_epoch(5)
    floor = space.state / "epoch"
    floor.write_bytes(content)
    with pytest.raises(SpaceUnavailable, match="does not hold an epoch floor|not '<epoch>"):
        spaces.restart(space.name)
    assert floor.read_bytes() == content  # left for a person to look at


def _ledger_with_two_keys(client: SpaceClient, space: LocalSpace) -> Path:
    _ran(client, "a@1", "echo a >> runs.txt")
    _ran(client, "b@1", "echo b >> runs.txt")
    return space.state / "ledger.jsonl"


def test_a_flipped_bit_in_a_complete_ledger_record_is_detected(spaces: LocalSpaces,
                                                               space: LocalSpace,
                                                               client: SpaceClient) -> None:
    """The flip keeps the line valid JSON and changes the key: read as it is, the daemon
    would forget ``a@1`` and run it a second time."""
    ledger = _ledger_with_two_keys(client, space)
    raw = ledger.read_bytes()
    at = raw.index(b'"a@1"') + 1
    damaged = raw[:at] + bytes([raw[at] ^ 0x02]) + raw[at + 1:]  # "a@1" -> "c@1"
    assert b'"c@1"' in damaged
    ledger.write_bytes(damaged)
    with pytest.raises(SpaceUnavailable, match="fails its checksum"):
        spaces.restart(space.name)
    assert ledger.read_bytes() == damaged
    assert (space.work / "runs.txt").read_text() == "a\nb\n"


@pytest.mark.parametrize("damage", ["garbage in the middle", "a record without its fields"])
def test_a_damaged_middle_record_stops_the_daemon(spaces: LocalSpaces, space: LocalSpace,
                                                  client: SpaceClient, damage: str) -> None:
    ledger = _ledger_with_two_keys(client, space)
    lines = ledger.read_text().splitlines()
    if damage == "garbage in the middle":
        lines[0] = "{\"t\": \"start\", \"key\": \"a@1\", garbage"
        expected = "is unreadable"
    else:  # an old-format record (no checksum) that lost its command
        rec = json.loads(lines[0])
        lines[0] = json.dumps({k: v for k, v in rec.items() if k not in ("c", "command")})
        expected = "lacks or mistypes command"
    ledger.write_text("\n".join(lines) + "\n")
    before = ledger.read_bytes()
    with pytest.raises(SpaceUnavailable, match=expected):
        spaces.restart(space.name)
    assert ledger.read_bytes() == before


def test_a_torn_last_record_is_still_only_a_torn_write(spaces: LocalSpaces, space: LocalSpace,
                                                       client: SpaceClient) -> None:
    ledger = _ledger_with_two_keys(client, space)
    with open(ledger, "ab") as f:
        f.write(b'{"t":"start","key":"half')
    spaces.restart(space.name)
    assert client.exec_status("b@1").state == "exited"
    assert not ledger.read_bytes().endswith(b"half")
