"""Command output on the state disk is bounded however much a command writes: the shim
punches out the oldest blocks past its window, readers skip the hole, and an ended key keeps
only the tail a replay returns (``spacesd.shim.Output``)."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from backends.local import LocalSpace
from backends.space_client import HttpSpaceClient
from spacesd import shim
from spacesd.exec_ledger import MAX_READ
from spacesd.protocol import OUTPUT_TAIL_BYTES
from tests.spacesd.conftest import wait_relayed

#: Numbered 10-byte lines, so any window of the output tells where it stands.
LINES = "seq -f %09.0f 1 {n}"


def numbered(first: int, last: int) -> str:
    return "".join(f"{i:09d}\n" for i in range(first, last + 1))


def out_file(space: LocalSpace, key: str) -> Path:
    return space.state / "exec" / (hashlib.sha256(key.encode()).hexdigest()[:32] + ".out")


def on_disk(path: Path) -> int:
    return os.stat(path).st_blocks * 512


def test_the_ended_tail_equals_the_replayed_tail() -> None:
    from spacesd import protocol

    assert shim.ENDED_KEEP_BYTES == protocol.OUTPUT_TAIL_BYTES


def test_a_huge_output_costs_a_window_while_running_and_a_tail_once_ended(
        client: HttpSpaceClient, space: LocalSpace) -> None:
    n = 5_000_000  # 50 MB of output, over six windows
    gate = "until [ -f go ]; do sleep 0.02; done"
    client.exec_start("big", f"{LINES.format(n=n)}; touch printed; {gate}; echo done")
    path = out_file(space, "big")
    while not (space.work / "printed").exists():
        assert on_disk(path) <= shim.OUTPUT_WINDOW_BYTES + 2 * 65536
    wait_relayed(client, "big", n * 10)
    running = client.exec_wait("big", offset=0, timeout=0.5)
    assert running.state == "running" and running.output_size == n * 10
    # The reader skipped the hole: what it got is the true output from where it landed.
    assert running.output_offset >= n * 10 - shim.OUTPUT_WINDOW_BYTES
    whole = numbered(1, n)
    at = running.output_offset
    assert running.output == whole[at:at + len(running.output)]
    (space.work / "go").touch()
    ended = client.exec_wait("big", timeout=60)
    assert ended.exit_code == 0
    assert ended.output_size == n * 10 + len("done\n")
    # What the wait received, cut to at least its last OUTPUT_TAIL_BYTES at the start of one
    # of its answers (at most MAX_READ each), which the machine's speed decides (seen under
    # load: 3 bytes more)
    full = whole + "done\n"
    assert ended.output == full[ended.output_offset:]
    assert len(full) - OUTPUT_TAIL_BYTES - MAX_READ < ended.output_offset <= \
        len(full) - OUTPUT_TAIL_BYTES
    assert on_disk(path) <= OUTPUT_TAIL_BYTES + 2 * 4096
    assert os.stat(path).st_size == n * 10 + len("done\n")


def test_all_output_before_the_exit_is_in_before_its_record(client: HttpSpaceClient) -> None:
    for i in range(5):
        client.exec_start(f"k{i}", f"{LINES.format(n=3000)} >&2; echo last")
        info = client.exec_wait(f"k{i}", timeout=60)
        assert info.output.endswith(numbered(2995, 3000) + "last\n")
        assert info.output_size == 30000 + 5


def test_orphans_still_writing_are_relayed_after_the_exit(client: HttpSpaceClient,
                                                         space: LocalSpace) -> None:
    client.exec_start("k", "(until [ -f go ]; do sleep 0.02; done; echo late) & echo early")
    info = client.exec_wait("k", timeout=60)
    assert (info.state, info.exit_code, info.output) == ("exited", 0, "early\n")
    (space.work / "go").touch()
    wait_relayed(client, "k", len("early\nlate\n"))
    assert client.exec_wait("k", offset=0).output == "early\nlate\n"
