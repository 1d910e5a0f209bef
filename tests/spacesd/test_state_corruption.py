"""Damaged daemon state is detected, never silently reset or dropped: real daemons, real
files damaged the way a power cut or a failing disk leaves them.

A damaged claim file makes its key ``lost`` (it may have run), never a 500 and never "not
started"; a damaged floor or a damaged complete ledger record stops the daemon from starting
with a message naming the file, and the file is left as it was. A damaged checkpoint
(manifest or object) is refused as ``damaged``: never restored, its objects never collected.
(``containment.json``: ``tests/backends/test_local_escape.py``.)"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

from backends.local import LocalSpace, LocalSpaces
from backends.space_client import HttpSpaceClient
from durable.errors import SpaceError, SpaceUnavailable
from spacesd import journal, procfs, protocol


def _ran(client: HttpSpaceClient, key: str, command: str) -> None:
    client.exec_start(key, command)
    assert client.exec_wait(key, timeout=60).state == "exited"


def _claim(space: LocalSpace, key: str) -> Path:
    ledger = (space.state / "ledger.jsonl").read_text().splitlines()
    rec = next(json.loads(line) for line in ledger if json.loads(line).get("key") == key)
    return space.state / "exec" / f"{rec['id']}.claim"


@pytest.mark.parametrize("content", [b"", b"\x00\x00\x00", b"12 not-a-start-time\n"])
def test_a_damaged_claim_makes_its_key_lost_never_a_500(spaces: LocalSpaces, space: LocalSpace,
                                                       client: HttpSpaceClient,
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
                                                             client: HttpSpaceClient,
                                                             content: bytes) -> None:
    _ran(client, "k@1", "echo ran >> runs.txt; exit 3")
    _claim(space, "k@1").with_suffix(".exit").write_bytes(content)
    spaces.restart(space.name)
    info = client.exec_status("k@1")
    assert info.state == "lost" and info.exit_code is None, info  # never a made-up status
    assert client.scan().entries is not None
    assert (space.work / "runs.txt").read_text() == "ran\n"


def test_a_damaged_fence_journal_stops_the_daemon(spaces: LocalSpaces, space: LocalSpace,
                                                  client: HttpSpaceClient) -> None:
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
                                                        client: HttpSpaceClient,
                                                        content: bytes) -> None:
    client.with_epoch(5).advance_epoch(5)
    floor = space.state / "epoch"
    floor.write_bytes(content)
    with pytest.raises(SpaceUnavailable, match=r"does not hold an epoch floor|not '<epoch>"):
        spaces.restart(space.name)
    assert floor.read_bytes() == content  # left for a person to look at


@pytest.mark.parametrize("content", [b"", b"\n", b"not-an-id\n", b"\xff" * 32])
def test_a_damaged_space_id_stops_the_daemon_from_starting(spaces: LocalSpaces,
                                                           space: LocalSpace,
                                                           content: bytes) -> None:
    """A new id would make the host take this Space for another one and rebuild it over
    its files; a made-up old one cannot be: the daemon stops, the file left as it is."""
    ident = space.state / "space_id"
    assert len(ident.read_text().strip()) == 32
    ident.write_bytes(content)
    with pytest.raises(SpaceUnavailable, match="does not hold a Space id"):
        spaces.restart(space.name)
    assert ident.read_bytes() == content


def _ledger_with_two_keys(client: HttpSpaceClient, space: LocalSpace) -> Path:
    _ran(client, "a@1", "echo a >> runs.txt")
    _ran(client, "b@1", "echo b >> runs.txt")
    return space.state / "ledger.jsonl"


def test_a_flipped_bit_in_a_complete_ledger_record_is_detected(spaces: LocalSpaces,
                                                               space: LocalSpace,
                                                               client: HttpSpaceClient) -> None:
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
                                                  client: HttpSpaceClient, damage: str) -> None:
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


def test_no_flipped_bit_of_the_last_ledger_record_runs_a_command_twice(
        space: LocalSpace, client: HttpSpaceClient) -> None:
    """200 seeded flips of one bit of the last complete record (its newline included): the
    journal either refuses the file or reads every record as written; before, a flip that
    broke the JSON was taken for a torn write and the key dropped (87 of 200 ran twice)."""
    ledger = _ledger_with_two_keys(client, space)
    raw = ledger.read_bytes()
    last = raw.rstrip(b"\n").rfind(b"\n") + 1
    intact = journal.load(str(ledger)).records
    rng = random.Random(28)
    outcomes = {"refused": 0, "read as written": 0}
    for _ in range(200):
        at = rng.randrange(last, len(raw))
        copy = space.state / "flipped.jsonl"
        copy.write_bytes(raw[:at] + bytes([raw[at] ^ 1 << rng.randrange(8)]) + raw[at + 1:])
        try:
            records = journal.load(str(copy)).records
        except journal.DamagedJournal:
            outcomes["refused"] += 1
        else:
            assert records == intact, f"a flip at byte {at - last} of the last record"
            outcomes["read as written"] += 1
    assert outcomes["refused"] > 150, outcomes


@pytest.mark.parametrize("where", ["its newline", "its key", "its last brace"])
def test_a_damaged_last_ledger_record_never_reruns_its_command(
        spaces: LocalSpaces, space: LocalSpace, client: HttpSpaceClient, where: str) -> None:
    """Through a real daemon: a flipped bit anywhere in the last record stops the daemon
    with the file left as it was; nothing runs twice."""
    ledger = _ledger_with_two_keys(client, space)
    raw = ledger.read_bytes()
    last = raw.rstrip(b"\n").rfind(b"\n") + 1
    at = {"its newline": len(raw) - 1, "its key": raw.index(b'"key"', last) + 2,
          "its last brace": len(raw) - 2}[where]
    damaged = raw[:at] + bytes([raw[at] ^ 0x10]) + raw[at + 1:]
    ledger.write_bytes(damaged)
    with pytest.raises(SpaceUnavailable, match=r"unreadable|fails its checksum|is damaged"):
        spaces.restart(space.name)
    assert ledger.read_bytes() == damaged
    assert (space.work / "runs.txt").read_text() == "a\nb\n"


def test_a_last_record_whose_newline_was_never_written_is_kept(
        spaces: LocalSpaces, space: LocalSpace, client: HttpSpaceClient) -> None:
    """A tear just before the newline leaves a whole record: kept (its key is known, so it
    never runs again) and the newline written back."""
    ledger = _ledger_with_two_keys(client, space)
    raw = ledger.read_bytes()
    ledger.write_bytes(raw[:-1])
    spaces.restart(space.name)
    assert ledger.read_bytes().startswith(raw)
    assert client.exec_status("b@1").state == "exited"
    client.exec_start("b@1", "echo b >> runs.txt")
    assert client.exec_wait("b@1", timeout=60).state == "exited"
    assert (space.work / "runs.txt").read_text() == "a\nb\n"


@pytest.mark.parametrize("tear", ["cut short", "a block never written"])
def test_a_torn_last_record_is_still_only_a_torn_write(spaces: LocalSpaces, space: LocalSpace,
                                                       client: HttpSpaceClient,
                                                       tear: str) -> None:
    ledger = _ledger_with_two_keys(client, space)
    before = ledger.read_bytes()
    with open(ledger, "ab") as f:
        f.write(b'{"t":"start","key":"half' if tear == "cut short" else
                b'\0' * 40 + b'","cwd":"","env":{},"epoch":1}\n')
    spaces.restart(space.name)
    assert client.exec_status("b@1").state == "exited"
    assert ledger.read_bytes() == before


# ---------------------------------------------------------------- checkpoints


def _checkpointed(client: HttpSpaceClient, space: LocalSpace) -> Path:
    """Checkpoint ``c1`` of a small workspace, then change it; returns the store."""
    client.write_file("a.txt", b"alpha\n" * 100, mode=0o640)
    client.mkdir("d")
    client.write_file("d/b.bin", bytes(range(256)) * 10)
    client.checkpoint_create("c1")
    client.write_file("a.txt", b"changed since\n")
    client.remove("d", recursive=True)
    return space.state / "checkpoints"


def _refused_as_damaged(client: HttpSpaceClient, space: LocalSpace, call, what: str) -> None:
    before = sorted((p.relative_to(space.work), p.read_bytes() if p.is_file() else None)
                    for p in space.work.rglob("*"))
    with pytest.raises(SpaceError) as refused:
        call()
    assert refused.value.code == protocol.ERR_DAMAGED, refused.value
    assert what in str(refused.value) and "checkpoint_delete" in str(refused.value)
    after = sorted((p.relative_to(space.work), p.read_bytes() if p.is_file() else None)
                   for p in space.work.rglob("*"))
    assert after == before  # nothing restored from it


def _flip_a_digit(data: bytes, field: bytes) -> bytes:
    """``data`` with the first digit after ``field`` changed: still valid JSON."""
    at = data.index(field) + len(field)
    while not data[at:at + 1].isdigit():
        at += 1
    return data[:at] + bytes([ord("0") + (data[at] - ord("0") + 1) % 10]) + data[at + 1:]


@pytest.mark.parametrize("damage", ["mode-flipped", "digest-flipped", "truncated", "empty",
                                    "garbage", "fields-missing"])
def test_a_damaged_manifest_is_refused_and_keeps_its_objects(client: HttpSpaceClient,
                                                            space: LocalSpace,
                                                            damage: str) -> None:
    store = _checkpointed(client, space)
    client.checkpoint_create("c2")
    manifest = store / "manifests" / "c1.json"
    data = manifest.read_bytes()
    damaged = {
        "mode-flipped": lambda: _flip_a_digit(data, b'"mode":'),
        "digest-flipped": lambda: _flip_a_digit(data, b'"sha256":"'),
        "truncated": lambda: data[: len(data) // 2],
        "empty": lambda: b"",
        "garbage": lambda: b"\x00\xff{]",
        "fields-missing": lambda: json.dumps({"id": "c1", "checksum": "0" * 64}).encode(),
    }[damage]()
    assert damaged != data
    manifest.write_bytes(damaged)
    objects = sorted(p.name for p in (store / "objects").rglob("*") if p.is_file())
    _refused_as_damaged(client, space, lambda: client.checkpoint_restore("c1"), "c1.json")
    _refused_as_damaged(client, space, client.checkpoint_list, "c1.json")
    client.checkpoint_delete("c2")  # the garbage collector must not take c1's objects
    assert sorted(p.name for p in (store / "objects").rglob("*") if p.is_file()) == objects
    assert manifest.read_bytes() == damaged  # left as it was
    client.checkpoint_delete("c1")  # the way out the message names
    assert client.checkpoint_list() == []


@pytest.mark.parametrize("damage", ["flipped", "truncated", "missing"])
def test_a_damaged_object_is_never_copied_back(client: HttpSpaceClient, space: LocalSpace,
                                              damage: str) -> None:
    store = _checkpointed(client, space)
    target = max((p for p in (store / "objects").rglob("*") if p.is_file()),
                 key=lambda p: p.stat().st_size)  # d/b.bin's
    target.chmod(0o600)
    data = target.read_bytes()
    if damage == "flipped":
        target.write_bytes(data[:100] + bytes([data[100] ^ 0x04]) + data[101:])
    elif damage == "truncated":
        target.write_bytes(data[:-1])
    else:
        target.unlink()
    with pytest.raises(SpaceError) as refused:
        client.checkpoint_restore("c1")
    assert refused.value.code == protocol.ERR_DAMAGED and "d/b.bin" in str(refused.value)
    assert not (space.work / "d" / "b.bin").exists()  # never a wrong copy


def test_a_manifest_from_before_checksums_still_restores(client: HttpSpaceClient,
                                                         space: LocalSpace) -> None:
    store = _checkpointed(client, space)
    manifest = store / "manifests" / "c1.json"
    raw = json.loads(manifest.read_bytes())
    del raw["checksum"]
    manifest.write_text(json.dumps(raw))
    client.checkpoint_restore("c1")
    assert (space.work / "a.txt").read_bytes() == b"alpha\n" * 100
    assert (space.work / "d" / "b.bin").read_bytes() == bytes(range(256)) * 10


# ---------------------------------------------------------------- the provider's files


@pytest.mark.parametrize("name", ["daemon.pid", "token", "port"])
@pytest.mark.parametrize("content", [b"", b"\x00\xffgarbage", b"99999 1\n"])
def test_a_damaged_provider_file_never_leaves_two_daemons(spaces: LocalSpaces,
                                                          space: LocalSpace,
                                                          client: HttpSpaceClient,
                                                          name: str, content: bytes) -> None:
    """A damaged pid file must not hide the live daemon (a restart would start a second
    one on the same ledger); a damaged token or port file is replaced on restart."""
    _ran(client, "k@1", "echo ran >> runs.txt")
    first = space.daemon()
    assert first is not None
    (space.state / name).write_bytes(content)
    assert space.daemon() == first  # found by its marker when the pid file cannot say
    spaces.restart(space.name)
    assert not procfs.is_alive(*first)
    assert spaces.connect(space.name, epoch=1).exec_status("k@1").state == "exited"
    second = space.daemon()
    assert second is not None and second != first
    assert (space.work / "runs.txt").read_text() == "ran\n"
    spaces.delete(space.name)
    assert not procfs.is_alive(*second)


def test_a_second_daemon_on_the_same_state_refuses_to_start(space: LocalSpace,
                                                            tmp_path: Path) -> None:
    first = space.daemon()
    assert first is not None
    second = subprocess.run(
        [sys.executable, "-m", "spacesd", "--root", str(space.work), "--state",
         str(space.state), "--token-file", str(space.token_file)],
        check=False, capture_output=True, text=True, timeout=60, cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])})
    assert second.returncode != 0
    assert f"another daemon (pid {first[0]}) serves" in second.stderr, second.stderr
    assert "Traceback" not in second.stderr
    assert space.daemon() == first


def test_what_an_unwritten_block_leaves_is_told_from_damage(tmp_path: Path) -> None:
    """Zeros are what a block the disk never wrote reads as: after a whole record (its
    newline's block) the record is kept and the newline written back; a single NUL at a
    block boundary is a torn record; zeros over several synced records are damage."""
    path = tmp_path / "j.jsonl"
    j = journal.Journal(str(path))
    for key in ("a", "b", "c"):
        j.append({"t": "start", "key": key})
    j.close()
    whole = path.read_bytes()
    path.write_bytes(whole[:-1] + b"\0" * 7)  # the last newline's block never written
    j = journal.Journal(str(path))
    assert [r["key"] for r in j.records] == ["a", "b", "c"]
    j.close()
    assert path.read_bytes() == whole
    # a record starting exactly at a block boundary whose first byte was never written
    pad = 512 - len(whole) % 512
    lines = whole + b'{"t":"pad","x":"' + b"p" * (pad - 20) + b'"}\n'
    lines = lines[:len(lines) - (len(lines) % 512)] if len(lines) % 512 else lines
    assert len(lines) % 512 == 0
    torn = b"\0" + b'"t":"start","key":"d","c":"00000000"}\n'
    path.write_bytes(lines + torn)
    assert journal.load(str(path)).end == len(lines)
    # zeros over the end of one synced record and the start of the next: the line holds
    # more than one record's checksum, so it is not one torn append
    b_at = whole.index(b"\n") + 1
    c_at = whole.index(b"\n", b_at) + 1
    start, stop = whole.index(b'"c":"', b_at) + 6, c_at + 5
    path.write_bytes(whole[:start] + b"\0" * (stop - start) + whole[stop:])
    with pytest.raises(journal.DamagedJournal):
        journal.load(str(path))
