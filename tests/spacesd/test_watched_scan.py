"""Scans that cost what changed (``spacesd.watched_scan``): after any mix of changes, the
state a client rebuilds from the answers equals a full scan's, always."""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from spacesd.protocol import ScanEntry, applied_scan
from spacesd.watched_scan import ScanAnswer, WatchedScan
from spacesd.workspace_scan import Scanner
from tests.spacesd.workspace_changes import OPS, change, dirs

EXCLUDES = st.sampled_from([(), ("b/**",), ("a",)])


@dataclass
class Client:
    """What a client does with the answers: keep the state, apply each difference."""

    token: str | None = None
    entries: dict[str, ScanEntry] | None = None

    def apply(self, answer: ScanAnswer) -> list[ScanEntry]:
        self.entries = applied_scan(self.entries, answer.full, answer.entries, answer.removed)
        self.token = answer.token
        return sorted(self.entries.values(), key=lambda e: e.path)


def _full(root: str, exclude: tuple[str, ...]) -> tuple[list[ScanEntry], list[str]]:
    return Scanner(root).scan(list(exclude))


@settings(max_examples=2000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=st.lists(OPS, max_size=12), exclude=EXCLUDES)
# cp -a of a directory into its own subtree: copytree, unlike cp, recursed into its own
# copy until a RecursionError (found by ci/stress.sh: a draw of one run in many).
@example(ops=[("mkdir", "a/a"), ("copy_tree", "a", "a/a/a"), ("scan",)], exclude=())
def test_the_state_rebuilt_from_differences_equals_a_full_scan(ops: list[tuple],
                                                               exclude: tuple[str, ...]) -> None:
    with dirs() as (root, outside):
        watched = WatchedScan(Scanner(root))
        client = Client()
        try:
            client.apply(watched.scan(exclude, client.token))
            for op in ops:
                if op[0] == "restart":
                    watched.close()
                    watched = WatchedScan(Scanner(root))
                elif op[0] != "scan":
                    change(root, outside, op)
                answer = watched.scan(exclude, client.token)
                entries = client.apply(answer)
                assert (entries, answer.refused) == _full(root, exclude), op
        finally:
            watched.close()


def test_an_unchanged_workspace_answers_nothing_and_walks_nothing(tmp_path) -> None:
    for i in range(50):
        (tmp_path / f"f{i}").write_bytes(b"x")
    watched = WatchedScan(Scanner(str(tmp_path)))
    try:
        first = watched.scan()
        assert first.full and len(first.entries) == 50 and watched.last_walk == "first scan"
        again = watched.scan(since=first.token)
        assert (again.full, again.entries, again.removed) == (False, [], [])
        assert watched.last_walk == ""
        (tmp_path / "f7").write_bytes(b"changed")
        (tmp_path / "f8").unlink()
        diff = watched.scan(since=again.token)
        assert [e.path for e in diff.entries] == ["f7"] and diff.removed == ["f8"]
        assert watched.last_walk == ""
        # A token two scans old is still answered as a difference; an unknown one is not.
        assert watched.scan(since=again.token).removed == ["f8"]
        assert watched.scan(since="another-daemon.3").full
        # This daemon's boot and generation through another state (a daemon brought back
        # from a machine checkpoint counts the same generations again): a full answer.
        boot, gen, digest = watched.scan().token.split(".")
        assert not watched.scan(since=f"{boot}.{gen}.{digest}").full
        assert watched.scan(since=f"{boot}.{gen}.{int(digest, 16) ^ 1:x}").full
    finally:
        watched.close()


def test_a_path_it_cannot_watch_makes_every_scan_a_full_one(tmp_path, monkeypatch) -> None:
    """The fallback: the watch limit reached (ENOSPC) still answers the full scan's state."""
    from spacesd import inotify

    (tmp_path / "f").write_bytes(b"x")

    def no_room(self: inotify.Inotify, path: str, mask: int) -> int:
        raise OSError(28, "No space left on device", path)

    monkeypatch.setattr(inotify.Inotify, "add_watch", no_room)
    watched = WatchedScan(Scanner(str(tmp_path)))
    try:
        first = watched.scan()
        assert "fs.inotify.max_user_watches reached" in watched.last_walk
        (tmp_path / "g").write_bytes(b"y")
        diff = watched.scan(since=first.token)
        assert watched.last_walk.startswith("not watching: cannot watch")
        assert [e.path for e in diff.entries] == ["g"] and not diff.full
    finally:
        watched.close()


def test_an_overflowed_event_queue_is_a_full_walk_of_the_same_state(tmp_path) -> None:
    with open("/proc/sys/fs/inotify/max_queued_events") as f:
        files = int(f.read()) + 100  # each makes at least one event: IN_CREATE
    if files > 200_000:
        pytest.skip(f"fs.inotify.max_queued_events is {files - 100}: too many files to fill it")
    watched = WatchedScan(Scanner(str(tmp_path)))
    try:
        first = watched.scan()
        for i in range(files):
            (tmp_path / f"f{i}").touch()
        answer = watched.scan(since=first.token)
        assert watched.last_walk == "event queue overflow"
        assert not answer.full and answer.entries == _full(str(tmp_path), ())[0]
        (tmp_path / "f1").write_bytes(b"x")  # and the next scan is a difference again
        assert [e.path for e in watched.scan(since=answer.token).entries] == ["f1"]
        assert watched.last_walk == ""
    finally:
        watched.close()


def _equal_to_a_full_scan(watched: WatchedScan, client: Client, root: str,
                          exclude: tuple[str, ...] = ()) -> None:
    answer = watched.scan(exclude, client.token)
    assert (client.apply(answer), answer.refused) == _full(root, exclude)


def test_a_change_in_the_middle_of_a_scan_leaves_no_state_behind(tmp_path) -> None:
    """An editor's save replaces a symlink by a file between the scan's lstat and its
    readlink (EINVAL): that scan still answers, and every later one equals a full scan
    (before, the events read were lost with the exception, and the state stayed stale).
    Found by review."""
    root = str(tmp_path)
    os.symlink("t1", tmp_path / "s")
    (tmp_path / "f").write_bytes(b"1")
    scanner = Scanner(root)
    watched, client = WatchedScan(scanner), Client()
    try:
        client.apply(watched.scan())
        entry_of, armed = scanner.entry_of, [True]

        def racing(rel: str, st: os.stat_result, start_ns: int):  # type: ignore[no-untyped-def]
            if rel == "s" and armed[0]:
                armed[0] = False
                (tmp_path / "tmp").write_bytes(b"now a file")
                os.replace(tmp_path / "tmp", tmp_path / "s")
            return entry_of(rel, st, start_ns)

        scanner.entry_of = racing  # type: ignore[method-assign]
        os.unlink(tmp_path / "s")
        os.symlink("t2", tmp_path / "s")
        (tmp_path / "f").write_bytes(b"2")
        client.apply(watched.scan(since=client.token))
        assert not armed[0], "the race was not run"
        for _ in range(2):
            _equal_to_a_full_scan(watched, client, root)
    finally:
        watched.close()


def test_a_tree_deeper_than_python_recursion_leaves_in_one_scan(tmp_path) -> None:
    root, deep = str(tmp_path), tmp_path / "d"
    watched, client = WatchedScan(Scanner(root)), Client()
    try:
        client.apply(watched.scan())
        level = deep
        for _ in range(1200):  # os.makedirs and shutil.rmtree recurse too
            level.mkdir(parents=level == deep)
            level = level / "a"
        _equal_to_a_full_scan(watched, client, root)
        subprocess.run(["rm", "-rf", str(deep)], check=True)
        _equal_to_a_full_scan(watched, client, root)
        assert watched.last_walk == ""
    finally:
        watched.close()


def test_a_hardlinked_symlink_touched_through_its_other_name(tmp_path) -> None:
    """``cp -al`` of a tree with a symlink, then ``touch -h`` through one name: the other
    name's mtime changed with no event naming it, but its inode's watch saw it. Found by
    review."""
    root = str(tmp_path)
    (tmp_path / "src").mkdir()
    os.symlink("target", tmp_path / "src" / "link")
    watched, client = WatchedScan(Scanner(root)), Client()
    try:
        client.apply(watched.scan())
        (tmp_path / "dst").mkdir()
        os.link(tmp_path / "src" / "link", tmp_path / "dst" / "link", follow_symlinks=False)
        _equal_to_a_full_scan(watched, client, root)
        os.utime(tmp_path / "src" / "link", ns=(10**12, 10**12), follow_symlinks=False)
        _equal_to_a_full_scan(watched, client, root)
        assert watched.last_walk == ""
    finally:
        watched.close()


def _with_a_cache(tmp_path) -> tuple[str, WatchedScan, Client]:
    """A workspace with ``cache/x``, scanned once by an adapter that excludes ``cache``."""
    (tmp_path / "cache").mkdir()
    (tmp_path / "cache" / "x").write_bytes(b"x")
    watched, adapter = WatchedScan(Scanner(str(tmp_path))), Client()
    adapter.apply(watched.scan(("cache/**",)))
    return str(tmp_path), watched, adapter


def test_another_exclude_list_once_leaves_the_kept_state_alone(tmp_path) -> None:
    """A checker's scan without the adapter's exclude list, between two of the adapter's,
    is a full walk of its own with no token; the adapter's next scan is still a
    difference. Asked twice in a row, the other list gets the kept state. Found by review
    (every scan rebuilt when two callers alternated)."""
    root, watched, adapter = _with_a_cache(tmp_path)
    try:
        other = watched.scan()
        assert other.token is None and [e.path for e in other.entries] == ["cache", "cache/x"]
        (tmp_path / "f").write_bytes(b"f")
        diff = watched.scan(("cache/**",), adapter.token)
        assert not diff.full and [e.path for e in diff.entries] == ["f"]
        adapter.apply(diff)
        watched.scan()
        assert watched.scan().token is not None  # twice in a row: it has the state now
        _equal_to_a_full_scan(watched, adapter, root, ("cache/**",))
    finally:
        watched.close()


def test_a_passing_scan_never_takes_the_kept_state(tmp_path) -> None:
    """A checkpoint's scan (no exclude list) between the adapter's (with one), followed by
    a checker's without one: neither takes the state from the adapter's list, which the
    checker's alone would have done had the checkpoint's counted as asked (found by
    review)."""
    _, watched, adapter = _with_a_cache(tmp_path)
    try:
        checkpoint = watched.scan(passing=True)
        assert checkpoint.token is None and [e.path for e in checkpoint.entries] == \
            ["cache", "cache/x"]
        assert watched.scan().token is None  # the checker's: once, on its own
        (tmp_path / "f").write_bytes(b"f")
        diff = watched.scan(("cache/**",), adapter.token)
        assert not diff.full and [e.path for e in diff.entries] == ["f"]
        assert watched.last_walk == ""
    finally:
        watched.close()


def test_a_mount_inside_the_workspace_makes_scans_full_walks(tmp_path) -> None:
    """A mount makes no inotify event, and changes under it none that reach the watches
    here: while one is inside the workspace, every scan walks. Found by review."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    root, inner = str(tmp_path), tmp_path / "inner"
    inner.mkdir()
    (inner / "old").write_bytes(b"o")
    watched, client = WatchedScan(Scanner(root)), Client()
    try:
        client.apply(watched.scan())
        subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m,mode=0700", "tmpfs",
                        str(inner)], check=True)
        try:
            (inner / "new").write_bytes(b"n")
            _equal_to_a_full_scan(watched, client, root)
            assert "mounts inside it changed" in watched.last_walk
            (inner / "new").write_bytes(b"changed")
            _equal_to_a_full_scan(watched, client, root)
            assert "a mount inside the workspace" in watched.last_walk
        finally:
            subprocess.run(["umount", str(inner)], check=True)
        _equal_to_a_full_scan(watched, client, root)
    finally:
        watched.close()


def test_a_workspace_past_its_watch_budget_is_walked_and_leaves_watches_to_others(
        tmp_path) -> None:
    """A watch per entry, at most a quarter of the user's limit (programs in the Space
    need watches too): past it, full walks, whose answers stay right."""
    root = str(tmp_path)
    for i in range(10):
        (tmp_path / f"f{i}").write_bytes(b"x")
    watched, client = WatchedScan(Scanner(root)), Client()
    watched.budget = 5
    try:
        client.apply(watched.scan())
        assert "more than 5 entries to watch" in watched.last_walk
        (tmp_path / "f3").write_bytes(b"changed")
        _equal_to_a_full_scan(watched, client, root)
        assert watched.last_walk.startswith("not watching: cannot watch: more than 5")
    finally:
        watched.close()


def test_no_inotify_leaves_full_walks_that_answer_the_same(tmp_path, monkeypatch) -> None:
    """A Python without ctypes, a libc without inotify, or the user's instance limit
    reached: the daemon still serves, and its scans walk."""
    from spacesd import inotify

    def missing() -> None:
        raise ImportError("No module named '_ctypes'")

    monkeypatch.setattr(inotify, "_libc", missing)
    (tmp_path / "f").write_bytes(b"x")
    watched, client = WatchedScan(Scanner(str(tmp_path))), Client()
    try:
        client.apply(watched.scan())
        assert "no inotify" in watched.last_walk
        (tmp_path / "g").write_bytes(b"y")
        _equal_to_a_full_scan(watched, client, str(tmp_path))
    finally:
        watched.close()
