"""The workspace scan: entries, excludes, refused names, the stat cache, the hash."""

from __future__ import annotations

import hashlib
import os
import socket
import time
from dataclasses import replace

import pytest

from backends.local import LocalSpace, LocalSpaces
from backends.space_client import HttpSpaceClient
from spacesd import workspace_scan
from spacesd.protocol import ScanEntry, ScanResult, workspace_hash
from spacesd.workspace_scan import Scanner
from tests.spacesd.conftest import run_command


def test_scan_lists_every_entry(client: HttpSpaceClient, space: LocalSpace) -> None:
    client.write_file("a/b.txt", b"hello")
    client.write_file("run.sh", b"#!/bin/sh\n", mode=0o755)
    client.symlink("link", "a/b.txt")
    client.mkdir("empty")
    client.write_file(".git/HEAD", b"ref")
    client.write_file("node_modules/x/y.js", b"y")
    (space.work / "new\nname").write_bytes(b"x")
    (space.work / "back\\slash").write_bytes(b"x")
    os.mkfifo(space.work / "fifo", 0o640)
    os.symlink("/usr/bin/python3", space.work / "abs")
    os.chmod(space.work / "empty", 0o750)
    with socket.socket(socket.AF_UNIX) as s:
        s.bind(str(space.work / "sock"))
    scan = client.scan(exclude=[".git/**", "node_modules"])
    x = hashlib.sha256(b"x").hexdigest()
    assert [replace(e, mtime_ns=None) for e in scan.entries] == [
        ScanEntry("a", "dir", mode=0o755),
        ScanEntry("a/b.txt", "file", False, 5, hashlib.sha256(b"hello").hexdigest(),
                  mode=0o644),
        ScanEntry("abs", "symlink", target="/usr/bin/python3"),
        ScanEntry("back\\slash", "file", False, 1, x, mode=0o644),
        ScanEntry("empty", "dir", mode=0o750),
        ScanEntry("fifo", "fifo", mode=0o640),
        ScanEntry("link", "symlink", target="a/b.txt"),
        ScanEntry("new\nname", "file", False, 1, x, mode=0o644),
        ScanEntry("run.sh", "file", True, 10, hashlib.sha256(b"#!/bin/sh\n").hexdigest(),
                  mode=0o755),
    ]
    assert all(e.mtime_ns == os.lstat(space.work / e.path).st_mtime_ns for e in scan.entries)
    assert len(scan.refused) == 1 and scan.refused[0].startswith("sock: a socket")
    assert not scan.running and scan.running_keys == []
    assert workspace_hash(scan.entries) != workspace_hash(
        [replace(e, mtime_ns=e.mtime_ns + 1) if e.path == "empty" else e for e in scan.entries])


def test_scan_sees_hardlinks_and_holes(client: HttpSpaceClient, space: LocalSpace) -> None:
    """Hardlink groups (``cp -al``, a git clone's objects) and sparse files (``truncate``)
    are state: a copy that splits the one or fills the other differs."""
    (space.work / "h1").write_bytes(b"shared")
    os.mkdir(space.work / "sub")
    os.link(space.work / "h1", space.work / "sub" / "h3")
    os.link(space.work / "h1", space.work / "h0")
    with open(space.work / "sparse", "wb") as f:
        f.write(b"head")
        f.truncate(1 << 20)
    entries = {e.path: e for e in client.scan().entries}
    assert entries["h0"].link is None
    assert entries["h1"].link == "h0" and entries["sub/h3"].link == "h0"
    assert entries["sparse"].extents == ((0, 4096),), entries["sparse"]
    assert entries["sparse"].size == 1 << 20
    assert entries["h0"].extents is None
    dense = space.work / "dense"
    dense.write_bytes(b"head" + bytes((1 << 20) - 4))
    assert client.scan().entries[0].path == "dense"
    assert {e.path: e for e in client.scan().entries}["dense"].extents is None
    assert {e.path: e for e in client.scan().entries}["dense"].sha256 == entries["sparse"].sha256


def test_scan_sees_every_change(client: HttpSpaceClient, space: LocalSpace) -> None:
    client.write_file("f", b"aaaa")
    first = client.scan().entries
    # Same size, rewritten at once: the mtime may not change, the content does.
    (space.work / "f").write_bytes(b"bbbb")
    assert client.scan().entries != first
    os.chmod(space.work / "f", 0o755)
    assert client.scan().entries[0].exec
    before = workspace_hash(client.scan().entries)
    os.chmod(space.work / "f", 0o750)  # the exec bit stays; the mode changed
    assert client.scan().entries[0].mode == 0o750
    assert workspace_hash(client.scan().entries) != before, "the hash covers every mode bit"


@pytest.fixture
def counted_hashing(monkeypatch) -> list[int]:
    calls = [0]
    real = workspace_scan._digest_of

    def counting(f):
        calls[0] += 1
        return real(f)

    monkeypatch.setattr(workspace_scan, "_digest_of", counting)
    return calls


def test_the_stat_cache_skips_unchanged_files(tmp_path, counted_hashing) -> None:
    for n in range(20):
        (tmp_path / f"f{n}").write_bytes(b"x" * 4096)
    time.sleep(workspace_scan.RACY_NS / 1e9 * 2)  # let the files leave the racy window
    scanner = Scanner(str(tmp_path))
    first, _ = scanner.scan()
    assert counted_hashing[0] == 20
    (tmp_path / "f3").write_bytes(b"y" * 4096)
    second, _ = scanner.scan()
    assert counted_hashing[0] == 21
    assert [e.sha256 for e in first] != [e.sha256 for e in second]
    assert {e.path: e.sha256 for e in second}["f3"] == hashlib.sha256(b"y" * 4096).hexdigest()


def test_racy_files_are_hashed_again(tmp_path, counted_hashing) -> None:
    """A file changed within the coarse clock's tick keeps mtime and ctime: never trust
    the cache for files younger than the racy window."""
    (tmp_path / "f").write_bytes(b"aaaa")
    scanner = Scanner(str(tmp_path))
    scanner.scan()
    (tmp_path / "f").write_bytes(b"bbbb")
    entries, _ = scanner.scan()
    assert entries[0].sha256 == hashlib.sha256(b"bbbb").hexdigest()
    assert counted_hashing[0] == 2


def test_a_client_rebuilds_the_state_from_differences_across_calls_commands_and_restarts(
        spaces: LocalSpaces, space: LocalSpace, client: HttpSpaceClient) -> None:
    """Each scan after the first is answered as a difference (``spacesd.watched_scan``);
    what the client makes of it equals a new client's full answer, whatever changed the
    workspace: a file tool, a command (git-like trees, hardlinks, a FIFO, odd names, set
    times), or a daemon restart (whose tokens the next daemon does not know)."""
    def fresh() -> ScanResult:
        return spaces.connect(space.name, epoch=1).scan(exclude=["cache/**"])

    steps = [
        lambda: client.write_file("src/main.py", b"print(1)\n"),
        lambda: run_command(client, "k1", "mkdir -p empty .git/objects/ab cache/x && "
                    "printf x > .git/objects/ab/cd && ln .git/objects/ab/cd hard && "
                    "mkfifo pipe && printf y > $'new\\nline' && touch -d @5 src/main.py && "
                    "printf z > cache/x/ignored"),
        lambda: client.edit_file("src/main.py", "1", "2"),
        lambda: run_command(client, "k2", "mv src lib && ln -s /etc/hostname abs && rm hard && "
                    "chmod 700 empty && truncate -s 1M lib/sparse"),
        lambda: spaces.restart(space.name),
        lambda: run_command(client, "k3", "rm -rf lib && cp -a .git copy && "
                            "echo w >> copy/objects/ab/cd"),
    ]
    assert client.scan(exclude=["cache/**"]) == fresh()
    for step in steps:
        step()
        assert client.scan(exclude=["cache/**"]) == fresh()


def test_a_range_allocated_but_never_written_reads_the_same_at_every_scan(tmp_path) -> None:
    """``fallocate`` past a hole leaves a range allocated and unwritten, which ext4's
    ``SEEK_DATA`` calls a hole only while none of its pages is cached: sought before the
    file was read, the first scan said hole and every later one data (the hash had cached
    it), and after the cache let it go, hole again. Found by a helper driving the watched
    scan with real programs. Every fresh scan must say the same."""
    f = tmp_path / "f"
    fd = os.open(f, os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        os.posix_fallocate(fd, 1 << 20, 64 * 1024)
    finally:
        os.close(fd)
    seen = []
    for evict in (False, False, True, False):
        if evict:  # the page cache lets the file go, as memory pressure would
            fd = os.open(f, os.O_RDONLY)
            try:
                os.fsync(fd)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)
        [entry], _ = Scanner(str(tmp_path)).scan()
        seen.append(entry.extents)
    assert seen == [seen[0]] * len(seen), seen


def test_a_path_longer_than_the_kernel_takes_is_refused_and_the_rest_kept(tmp_path) -> None:
    """A tree deeper than PATH_MAX (4096 bytes, a program's nesting can make one) made
    every scan raise, so the Space could neither be scanned nor checkpointed until it was
    removed (found by a helper driving the watched scan with real programs). It is now a
    refused entry saying why, the rest of the workspace is scanned, and a checkpoint, which
    would lose its content, refuses to be made."""
    from spacesd.daemon import Daemon
    from spacesd.errors import Conflict
    from spacesd.watched_scan import WatchedScan

    work = tmp_path / "work"
    work.mkdir()
    (work / "kept").write_text("k")
    fd = os.open(work, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for _ in range(25):  # 25 levels of 200-byte names: past 4096 bytes
            os.mkdir("d" * 200, dir_fd=fd)
            deeper = os.open("d" * 200, os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = deeper
    finally:
        os.close(fd)
    entries, refused = Scanner(str(work)).scan()
    assert "kept" in [e.path for e in entries]
    assert len(refused) == 1 and refused[0].endswith(workspace_scan.TOO_LONG), refused
    watched = WatchedScan(Scanner(str(work)))
    try:
        answer = watched.scan()
        assert (answer.entries, answer.refused) == (entries, refused)
    finally:
        watched.close()
    daemon = Daemon(str(work), str(tmp_path / "state"))
    try:
        with pytest.raises(Conflict, match="path is longer than the kernel takes"):
            daemon.checkpoints.create("c")
    finally:
        daemon.close()


def test_a_file_written_to_while_read_has_the_size_its_digest_is_of(tmp_path, monkeypatch
                                                                    ) -> None:
    """Appended to, or truncated, between the lstat and the read: the entry pairs the
    digest with the bytes read (found by review: it paired them with the lstat's size)."""
    grows, shrinks = tmp_path / "grows", tmp_path / "shrinks"
    grows.write_bytes(b"a" * 10)
    shrinks.write_bytes(b"b" * 10)
    real = workspace_scan._digest_of

    def changed_first(f):
        with open(grows, "ab") as w:
            w.write(b"a" * 5)
        os.truncate(shrinks, 3)
        return real(f)

    monkeypatch.setattr(workspace_scan, "_digest_of", changed_first)
    entries, _ = Scanner(str(tmp_path)).scan()
    sizes = {e.path: (e.size, e.sha256) for e in entries}
    assert sizes["grows"][0] >= 15 and sizes["shrinks"] == (
        3, hashlib.sha256(b"bbb").hexdigest())
    assert sizes["grows"][1] == hashlib.sha256(b"a" * sizes["grows"][0]).hexdigest()
