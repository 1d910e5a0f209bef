"""A Space whose disk fills: on a real filesystem of its own (a tmpfs with ``size=``, mounted
by the test as root), filled whole with a ballast file and freed again. A full disk must
never leave the daemon's own records torn, never drop a request's answer, and never leave a
Space that refuses to start once there is room again."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from backends.local import LocalSpaces, own_disks
from durable.errors import SpaceError, SpaceUnavailable
from spacesd.journal import Journal, load
from tests.spacesd.conftest import DISK_BYTES

PAGE = 4096


def fill(disk: Path) -> Path:
    """Take every free block of ``disk`` with one ballast file (outside what it holds)."""
    ballast = disk / "ballast"
    fd = os.open(ballast, os.O_CREAT | os.O_WRONLY, 0o600)
    try:
        st = os.statvfs(disk)
        os.posix_fallocate(fd, 0, st.f_bavail * st.f_frsize)
    finally:
        os.close(fd)
    assert os.statvfs(disk).f_bavail == 0
    return ballast


def test_a_journal_record_a_full_disk_cut_short_is_not_kept(disk: Path) -> None:
    """A full disk takes what fits of a write and returns a short count, without an error.
    Kept, that prefix would be followed by the next record, and a torn record in the middle
    of a journal reads as damage: the Space would refuse to start."""
    path = str(disk / "journal")
    journal = Journal(path)
    kept = []
    while os.path.getsize(path) < PAGE - 200:  # the file's one page nearly full
        kept.append({"n": len(kept), "pad": "x" * 40})
        journal.append(kept[-1])
    ballast = fill(disk)
    with pytest.raises(OSError) as raised:  # the rest of the page fits; the record does not
        journal.append({"n": "cut", "pad": "y" * 400})
    assert raised.value.errno == errno.ENOSPC
    assert os.path.getsize(path) < PAGE, "the record was written whole on a full disk?"
    ballast.unlink()
    kept.append({"n": "after"})
    journal.append(kept[-1])
    journal.close()
    assert load(path).records == kept
    assert Journal(path).records == kept


def test_a_space_whose_disk_fills_answers_every_request_and_starts_once_freed(
        disk: Path) -> None:
    spaces = LocalSpaces(disk / "spaces")
    try:
        spaces.create("s1")
        state = spaces.get("s1").state
        client = spaces.connect("s1", epoch=1)
        client.exec_start("before@1", "echo one > a.txt")
        assert client.exec_wait("before@1", timeout=60).exit_code == 0
        ballast = fill(disk)
        for n in range(2, 6):  # each refused with a reason, none left unanswered
            with pytest.raises(SpaceError) as refused:
                client.exec_start(f"full@{n}", f"echo {n} >> a.txt")
                client.exec_wait(f"full@{n}", timeout=60)
            assert not isinstance(refused.value, SpaceUnavailable), refused.value
            assert refused.value.code == "no_space", refused.value
            assert "disk is full" in str(refused.value), refused.value
        with pytest.raises(SpaceError, match="No space left on device") as refused:
            client.write_file("b.txt", b"b" * 2 * PAGE)
        assert refused.value.code == "conflict"  # the write tool's own error, for the model
        assert not (spaces.get("s1").work / "b.txt").exists()
        ballast.unlink()
        leftovers = [p.name for p in state.rglob("*.tmp")]
        assert leftovers == [], f"a full disk left half-written files behind: {leftovers}"
        spaces.restart("s1")  # the daemon reads its ledger and fence journal again
        client = spaces.connect("s1", epoch=2)
        assert client.advance_epoch(2)
        for n in range(2, 6):
            assert client.exec_wait(f"full@{n}", timeout=60).state in ("lost", "unknown")
        client.exec_start("after@2", "cat a.txt")
        assert client.exec_wait("after@2", timeout=60).output == "one\n"
    finally:
        spaces.delete_all()


def test_output_a_full_disk_lost_is_said_in_the_output_before_the_exit(disk: Path) -> None:
    """A command runs on when its output finds no room (the output is lost, never the
    command), but its result must not pass for whole: the output ends saying what was lost,
    and its exit is recorded only once that is said."""
    spaces = LocalSpaces(disk / "spaces")
    try:
        spaces.create("s1")
        work = spaces.get("s1").work
        client = spaces.connect("s1", epoch=1)
        client.exec_start("loud@1", "echo start; until [ -e go ]; do sleep 0.05; done; "
                                    "head -c 100000 /dev/zero | tr '\\0' x; touch wrote; "
                                    "until [ -e done ]; do sleep 0.05; done; echo end")
        info = client.exec_wait("loud@1", timeout=0.5)
        while "start" not in info.output:  # the output file has its first page
            info = client.exec_wait("loud@1", timeout=0.5)
        ballast = fill(disk)
        (work / "go").touch()  # an empty file takes no block
        while not (work / "wrote").exists():
            assert client.exec_wait("loud@1", timeout=0.5).state == "running"
        ballast.unlink()
        (work / "done").touch()
        info = client.exec_wait("loud@1", timeout=60)
        while info.state == "running":
            info = client.exec_wait("loud@1", timeout=60)
        assert info.state == "exited" and info.exit_code == 0, info
        assert info.output.startswith("start\n"), info.output[:200]
        assert info.output.endswith(" on was lost: the state disk was full\n"), \
            f"the result passes for whole output: {info.output[-200:]!r}"
        assert len(info.output) < 100000
    finally:
        spaces.delete_all()


def test_local_spaces_get_a_state_disk_of_their_own_to_fill_and_free(tmp_path: Path) -> None:
    """``LocalSpaces(state_disk=...)``: every Space made in its directory, by any process's
    provider, keeps its daemon's state on a tmpfs of that size (the campaign's
    ``fill_state_disk``); filled, the daemon refuses what needs room in its state (a start,
    a write's record), nothing half done; freed, it runs on; deleted, nothing stays
    mounted."""
    if os.geteuid() != 0:
        pytest.skip("a state disk of its own is a tmpfs mount, which needs root")
    LocalSpaces(tmp_path / "spaces", state_disk=DISK_BYTES)
    spaces = LocalSpaces(tmp_path / "spaces")  # as a driver makes it: no size of its own
    try:
        spaces.create("s1")
        state = spaces.get("s1").state
        assert os.path.ismount(state)
        assert os.statvfs(state).f_blocks * os.statvfs(state).f_frsize == DISK_BYTES
        client = spaces.connect("s1", epoch=1)
        spaces.fill_disk("s1", "state")
        assert os.statvfs(state).f_bavail == 0
        with pytest.raises(SpaceError) as refused:
            client.exec_start("k@1", "echo one > a.txt")
        assert refused.value.code == "no_space", refused.value
        # The workspace has room, but a write there keeps a record in the daemon's state
        # while its temp file exists (another filesystem: spacesd.fsio): refused whole.
        with pytest.raises(SpaceError) as refused:
            client.write_file("b.txt", b"the workspace has room")
        assert refused.value.code == "no_space", refused.value
        assert not (spaces.get("s1").work / "b.txt").exists()
        assert [p.name for p in spaces.get("s1").work.iterdir()] == []
        spaces.free_disk("s1", "state")
        client.write_file("b.txt", b"the workspace has room")
        client.exec_start("k@2", "cat b.txt")
        assert client.exec_wait("k@2", timeout=60).output == "the workspace has room"
    finally:
        spaces.delete_all()
    assert not state.exists(), "the Space's state disk stayed behind"
    plain = LocalSpaces(tmp_path / "plain")
    try:
        plain.create("s2")
        with pytest.raises(SpaceError, match="no disk of its own"):
            plain.fill_disk("s2", "state")
    finally:
        plain.delete_all()


def test_a_create_after_a_failed_state_disk_mount_mounts_it(tmp_path: Path) -> None:
    """A ``create`` whose state-disk mount failed left the Space's state directory behind;
    the next ``create`` must still mount the disk there, not start the daemon on the
    host's disk (it did: the mount was tried only where the directory was new)."""
    if os.geteuid() != 0:
        pytest.skip("a state disk of its own is a tmpfs mount, which needs root")
    base = tmp_path / "spaces"
    spaces = LocalSpaces(base, state_disk=DISK_BYTES)
    own_disks.marker(base, "state").write_text("-1\n")  # a size mount(8) refuses
    try:
        with pytest.raises(SpaceError, match=r"cannot give .* a disk of its own"):
            spaces.create("s1")
        state = base / "s1" / "state"
        assert state.is_dir() and not os.path.ismount(state)
        own_disks.marker(base, "state").write_text(f"{DISK_BYTES}\n")
        spaces.create("s1")
        assert os.path.ismount(state), "the second create ran the Space on the host's disk"
        assert os.statvfs(state).f_blocks * os.statvfs(state).f_frsize == DISK_BYTES
    finally:
        spaces.delete_all()


def test_a_workspace_on_a_disk_of_its_own_fills_and_every_tool_says_so(tmp_path: Path) -> None:
    """``LocalSpaces(work_disk=...)``: the workspace on a tmpfs of its own, as a mounted
    volume. Filled, a write and an edit fail as the tool's own error and leave the file as
    it was (no part of the new content, no temp file in the workspace); a command that
    meets the full disk exits non-zero as bash does; freed, each works again."""
    if os.geteuid() != 0:
        pytest.skip("a workspace disk of its own is a tmpfs mount, which needs root")
    spaces = LocalSpaces(tmp_path / "spaces", work_disk=DISK_BYTES)
    try:
        spaces.create("s1")
        work = spaces.get("s1").work
        assert os.path.ismount(work) and not os.path.ismount(spaces.get("s1").state)
        client = spaces.connect("s1", epoch=1)
        client.write_file("a.txt", b"old line\n")
        spaces.fill_disk("s1", "work")
        assert os.statvfs(work).f_bavail * os.statvfs(work).f_frsize <= PAGE
        with pytest.raises(SpaceError, match="No space left on device") as refused:
            client.write_file("a.txt", b"n" * 4 * PAGE)
        assert refused.value.code == "conflict"  # the write tool's own error, for the model
        with pytest.raises(SpaceError, match="No space left on device"):
            client.edit_file("a.txt", "old line", "new line " + "m" * 4 * PAGE)
        assert (work / "a.txt").read_bytes() == b"old line\n"
        client.exec_start("k@1", f"head -c {4 * PAGE} /dev/zero > b.bin")
        done = client.exec_wait("k@1", timeout=60)
        assert done.state == "exited" and done.exit_code != 0, done
        assert "No space left on device" in done.output, done.output
        assert sorted(p.name for p in work.iterdir()) == ["a.txt", "b.bin"], \
            "a full workspace kept a temp file of a failed write"
        spaces.free_disk("s1", "work")
        client.edit_file("a.txt", "old line", "new line")
        assert (work / "a.txt").read_bytes() == b"new line\n"
    finally:
        spaces.delete_all()
    assert not work.exists(), "the Space's workspace disk stayed behind"
