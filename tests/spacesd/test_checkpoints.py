"""Directory checkpoints: exact restore, content addressing, export and import."""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings, strategies

from backends.local import LocalSpace, LocalSpaces
from backends.space_client import HttpSpaceClient
from durable.errors import SpaceError
from spacesd.daemon import Daemon
from spacesd.manifest import checksum_of
from spacesd.protocol import workspace_hash
from spacesd.workspace_scan import Scanner
from tests.odd_shapes import MUTATE, ODD_SHAPES
from tests.spacesd.conftest import run_command
from tests.spacesd.workspace_changes import OPS, change, dirs

ROOT = Path(__file__).resolve().parents[2]


def fill(client: HttpSpaceClient) -> None:
    client.write_file("src/main.py", b"print(1)\n")
    client.write_file("bin/run", b"#!/bin/sh\n", mode=0o755)
    client.symlink("latest", "src/main.py")
    client.mkdir("empty/dir")


def state(client: HttpSpaceClient) -> tuple[str, list]:
    scan = client.scan()
    return workspace_hash(scan.entries), [(e.path, e.kind) for e in scan.entries]


def objects(space: LocalSpace) -> list[str]:
    return sorted(p.name for p in (space.state / "checkpoints/objects").rglob("*")
                  if p.is_file())


def test_restore_makes_the_workspace_exactly_equal(client: HttpSpaceClient,
                                                   space: LocalSpace) -> None:
    fill(client)
    before = state(client)
    info = client.checkpoint_create("cp1")
    assert (info.id, info.files, info.bytes) == ("cp1", 2, 19)
    # Change everything: content, exec bit, link target, extra files and dirs, removals.
    client.write_file("src/main.py", b"print(2)\n")
    os.chmod(space.work / "bin/run", 0o644)
    client.symlink("latest", "elsewhere")
    client.write_file("extra/new.txt", b"new")
    client.remove("empty", recursive=True)
    (space.work / "src/main.py").rename(space.work / "src/moved.py")
    assert state(client) != before
    client.checkpoint_restore("cp1")
    assert state(client) == before
    assert (space.work / "bin/run").stat().st_mode & 0o777 == 0o755
    assert client.checkpoint_restore("cp1").id == "cp1"  # again: nothing changes
    assert state(client) == before


def test_restore_replaces_entries_of_another_kind(client: HttpSpaceClient,
                                                  space: LocalSpace) -> None:
    fill(client)
    before = state(client)
    client.checkpoint_create("cp")
    client.remove("src", recursive=True)
    client.write_file("src", b"now a file")
    client.remove("latest")
    client.mkdir("latest/sub")
    client.checkpoint_restore("cp")
    assert state(client) == before


def test_unchanged_files_cost_nothing(client: HttpSpaceClient, space: LocalSpace) -> None:
    for n in range(10):
        client.write_file(f"f{n}", b"%d" % n)
    client.checkpoint_create("a")
    stored = objects(space)
    assert len(stored) == 10
    client.write_file("f0", b"changed")
    client.checkpoint_create("b")
    assert len(objects(space)) == 11
    assert [c.id for c in client.checkpoint_list()] == ["a", "b"]
    client.checkpoint_delete("a")
    assert len(objects(space)) == 10  # the old f0 is no longer used
    client.checkpoint_delete("a")  # deleting twice is fine
    with pytest.raises(SpaceError) as exc:
        client.checkpoint_restore("a")
    assert exc.value.code == "not_found"


def test_export_and_import_into_another_space(spaces: LocalSpaces, client: HttpSpaceClient) -> None:
    fill(client)
    client.write_file("big.bin", os.urandom(3 * 1024 * 1024))
    before = state(client)
    client.checkpoint_create("cp")
    tar = b"".join(client.checkpoint_export("cp"))
    with tarfile.open(fileobj=io.BytesIO(tar)) as t:  # the manifest as the daemon keeps it
        manifest = json.loads(t.extractfile("manifest.json").read())  # type: ignore[union-attr]
    assert manifest.pop("checksum") == checksum_of(manifest) and manifest["id"] == "cp"
    spaces.create("other")
    other = spaces.connect("other", epoch=1)
    other.write_file("junk", b"junk")
    assert other.checkpoint_import("copy", io.BytesIO(tar)).files == 3
    other.checkpoint_restore("copy")
    assert state(other) == before


def test_import_refuses_a_tampered_or_hostile_tar(client: HttpSpaceClient) -> None:
    fill(client)
    client.checkpoint_create("cp")
    tar = b"".join(client.checkpoint_export("cp"))

    def rewrite(change) -> bytes:
        out = io.BytesIO()
        with tarfile.open(fileobj=io.BytesIO(tar)) as src, tarfile.open(fileobj=out,
                                                                         mode="w") as dst:
            for member in src:
                data = src.extractfile(member).read()
                data = change(member.name, data)
                member.size = len(data)
                dst.addfile(member, io.BytesIO(data))
        return out.getvalue()

    def corrupt(name: str, data: bytes) -> bytes:
        return data if name == "manifest.json" else b"evil" + data

    def escape(name: str, data: bytes) -> bytes:
        return data.replace(b'"src/main.py"', b'"../escape.py"') if name == "manifest.json" \
            else data

    for bad, code in ((rewrite(corrupt), "bad_request"), (rewrite(escape), "outside_root"),
                      (b"not a tar at all", "bad_request")):
        with pytest.raises(SpaceError) as exc:
            client.checkpoint_import("bad", io.BytesIO(bad))
        assert exc.value.code == code, exc.value
    assert [c.id for c in client.checkpoint_list()] == ["cp"]
    with pytest.raises(SpaceError) as exc:
        list(client.checkpoint_export("missing"))
    assert exc.value.code == "not_found"


def test_a_restore_cut_short_converges_when_run_again(tmp_path, monkeypatch) -> None:
    """In-process: the restore fails after a few files (as a crash would leave it)."""
    (tmp_path / "work").mkdir()
    daemon = Daemon(str(tmp_path / "work"), str(tmp_path / "state"))
    try:
        ws = tmp_path / "work"
        for n in range(10):
            (ws / f"f{n}").write_text(f"v1 {n}")
        cps = daemon.checkpoints
        cps.create("cp")
        want, _ = daemon.scanner.scan()
        for n in range(10):
            (ws / f"f{n}").write_text(f"v2 {n}")
        (ws / "extra").write_text("x")
        real_write, calls = daemon.writer.write, [0]

        def crashing_write(*args, **kwargs):
            calls[0] += 1
            if calls[0] > 3:
                raise OSError("simulated crash")
            real_write(*args, **kwargs)

        monkeypatch.setattr(daemon.writer, "write", crashing_write)
        with pytest.raises(OSError):
            cps.restore("cp")
        monkeypatch.setattr(daemon.writer, "write", real_write)
        cps.restore("cp")
        assert daemon.scanner.scan()[0] == want
    finally:
        daemon.close()


def test_a_manifest_is_parsed_once_while_its_file_holds_the_same_bytes(tmp_path, monkeypatch
                                                                      ) -> None:
    """Export, list and each delete's garbage collection load manifests right after they
    were made: a daemon keeps them parsed, by their bytes (damage on disk is judged again:
    ``test_a_damaged_manifest_is_refused_and_keeps_its_objects``), within a budget."""
    from spacesd import checkpoints
    from spacesd.errors import NotFound

    monkeypatch.setattr(checkpoints, "PARSED_MANIFEST_ENTRIES", 10)
    (tmp_path / "work").mkdir()
    for n in range(3):
        (tmp_path / "work" / f"f{n}").write_text(f"v {n}")
    daemon = Daemon(str(tmp_path / "work"), str(tmp_path / "state"))
    try:
        cps = daemon.checkpoints
        cps.create("a")
        m = cps.load("a")
        assert cps.load("a") is m  # as saved: not parsed again
        path = tmp_path / "state" / "checkpoints" / "manifests" / "a.json"
        path.write_bytes(path.read_bytes())  # the same bytes, a new mtime: still known
        assert cps.load("a") is m
        cps.create("b")  # 3 files each, counted 4 with the manifest: two fit in 10
        cps.create("c")
        b = cps.load("b")
        assert cps.load("b") is b and cps.load("c") is cps.load("c")
        again = cps.load("a")  # the oldest, let go for the budget: parsed again, equal
        assert again is not m and again == m
        assert cps.delete("a")
        with pytest.raises(NotFound):
            cps.load("a")
    finally:
        daemon.close()
    restarted = Daemon(str(tmp_path / "work"), str(tmp_path / "state"))
    try:
        assert restarted.checkpoints.load("b") == b
    finally:
        restarted.close()


def test_a_hardlink_group_whose_first_file_changed_after_the_scan_is_kept_whole(
        tmp_path, monkeypatch) -> None:
    """The first file of a hardlink group rewritten between the scan and its copy: the
    later members take its new content and its extents, so the manifest is one every
    later daemon reads (found by review: the members kept the sparse extents of the
    scan, which a restarted daemon refused as damaged)."""
    (tmp_path / "work").mkdir()
    a = tmp_path / "work" / "a"
    with open(a, "wb") as f:  # sparse: data, a hole, data
        f.write(b"x" * 4096)
        f.seek(1 << 20)
        f.write(b"y" * 4096)
    os.link(a, tmp_path / "work" / "b")
    daemon = Daemon(str(tmp_path / "work"), str(tmp_path / "state"))
    try:
        scan = daemon.checkpoints._workspace

        def then_rewritten():
            seen = scan()
            a.write_bytes(b"z" * 100)  # the same inode: both names change
            return seen

        monkeypatch.setattr(daemon.checkpoints, "_workspace", then_rewritten)
        daemon.checkpoints.create("c")
    finally:
        daemon.close()
    restarted = Daemon(str(tmp_path / "work"), str(tmp_path / "state"))
    try:
        m = restarted.checkpoints.load("c")  # Damaged before the fix
        assert {(f.path, f.size, f.extents) for f in m.files} == {("a", 100, None),
                                                                  ("b", 100, None)}
    finally:
        restarted.close()


def test_restore_keeps_every_shape_real_programs_make(client: HttpSpaceClient,
                                                       space: LocalSpace) -> None:
    """Empty directories (git's refs), FIFOs, absolute, dangling and looping links,
    hardlinks, sparse files, set mtimes, set-id, sticky and 000 modes, names with a
    newline, a backslash, a leading dash, bytes that are not UTF-8, 255 bytes: a restore
    brings back each exactly, mtimes included (the whole state hash)."""
    run_command(client, "make", ODD_SHAPES)
    made = client.scan()
    assert made.refused == []
    kinds = {e.kind for e in made.entries}
    assert kinds == {"file", "dir", "symlink", "fifo"}
    client.checkpoint_create("cp")
    run_command(client, "mutate", MUTATE)
    assert workspace_hash(client.scan().entries) != workspace_hash(made.entries)
    client.checkpoint_restore("cp")
    back = client.scan()
    diff = {e.path for e in set(back.entries) ^ set(made.entries)}
    assert workspace_hash(back.entries) == workspace_hash(made.entries), sorted(diff)
    h1, h3 = os.stat(space.work / "h1"), os.stat(space.work / "sub" / "h3")
    assert (h1.st_ino, h1.st_nlink) == (h3.st_ino, 3)
    assert os.stat(space.work / "sparse").st_blocks * 512 < 1 << 20
    assert os.readlink(space.work / "py") == "/usr/bin/python3"
    assert os.stat(space.work / "suid").st_mode & 0o7777 == 0o4755


def test_a_restore_leaves_what_it_need_not_touch_alone(client: HttpSpaceClient,
                                                       space: LocalSpace) -> None:
    """Set-id and sticky bits, inodes and ctimes of entries that equal the checkpoint stay
    as they are: a restore rewrites only what differs (it used to rewrite every set-id
    file without its bits)."""
    run_command(client, "make", ODD_SHAPES)
    client.checkpoint_create("cp")
    before = {name: os.lstat(space.work / name) for name in ("suid", "shared", "h1", "dated")}
    client.write_file("unrelated.txt", b"x")
    client.checkpoint_restore("cp")
    for name, st in before.items():
        now = os.lstat(space.work / name)
        assert (now.st_ino, now.st_mode, now.st_ctime_ns, now.st_mtime_ns) == \
            (st.st_ino, st.st_mode, st.st_ctime_ns, st.st_mtime_ns), name
    assert not (space.work / "unrelated.txt").exists()


#: Run by a daemon user that is not root (as in docker Spaces): read-only directories in
#: the checkpoint, and in the workspace one of mode 000 and read-only ones with entries the
#: restore must remove.
AS_ANOTHER_USER = r"""
import os, sys
from spacesd.daemon import Daemon
from spacesd.protocol import workspace_hash
work, state = sys.argv[1], sys.argv[2]
d = Daemon(work, state)
w = lambda *p: os.path.join(work, *p)
os.makedirs(w("mod", "pkg")); open(w("mod", "pkg", "a.go"), "w").write("package a\n")
os.makedirs(w("closed")); open(w("closed", "inside"), "w").write("x\n")
os.chmod(w("mod", "pkg"), 0o555); os.chmod(w("mod"), 0o555); os.chmod(w("closed"), 0o500)
d.checkpoints.create("cp")
os.chmod(w("mod", "pkg"), 0o755); open(w("mod", "pkg", "extra.go"), "w").write("x\n")
os.chmod(w("mod", "pkg"), 0o555)
os.chmod(w("closed"), 0o700); open(w("closed", "extra"), "w").write("x\n")
os.chmod(w("closed"), 0o000)
os.makedirs(w("gone")); open(w("gone", "f"), "w").write("f\n"); os.chmod(w("gone"), 0o500)
d.checkpoints.restore("cp")
assert sorted(os.listdir(w("closed"))) == ["inside"]
assert sorted(os.listdir(w("mod", "pkg"))) == ["a.go"]
assert not os.path.exists(w("gone"))
print("ok", oct(os.stat(w("mod")).st_mode & 0o7777), oct(os.stat(w("closed")).st_mode & 0o7777))
"""


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("setpriv") is None,
                    reason="needs root and setpriv to run a daemon as another user")
def test_a_daemon_that_is_not_root_restores_read_only_and_closed_directories() -> None:
    """A daemon that is not root (docker Spaces run as a user) can neither remove from a
    read-only directory (a Go module cache) nor enter one of mode 000: the restore opens
    each up first and sets the checkpoint's modes last (it used to fail, every retry)."""
    top = Path(tempfile.mkdtemp(prefix="nonroot-"))  # not under pytest's 0700 directory
    try:
        top.chmod(0o755)
        for d in ("work", "state"):
            (top / d).mkdir()
            os.chown(top / d, 65534, 65534)
        done = subprocess.run(
            ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", sys.executable,
             "-c", AS_ANOTHER_USER, str(top / "work"), str(top / "state")],
            capture_output=True, text=True, timeout=120, cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT), "PYTHONDONTWRITEBYTECODE": "1"})
        assert done.returncode == 0, done.stderr
        assert done.stdout.split() == ["ok", "0o555", "0o500"]
    finally:
        subprocess.run(["chmod", "-R", "u+rwx", str(top)], check=False)
        shutil.rmtree(top, ignore_errors=True)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=strategies.lists(OPS | strategies.tuples(strategies.just("restore"),
                                                     strategies.integers(0, 10)), max_size=10))
def test_every_checkpoint_records_what_a_full_scan_sees(ops: list[tuple]) -> None:
    """A checkpoint is made from the daemon's watched state and from the parts of the
    manifest before it that did not change (``ManifestEncoder``): after any mix of
    changes, restores and daemon restarts, its manifest must list exactly what a new full
    scan sees, and read back the same from its file (checksum and all)."""
    with dirs() as (root, outside), tempfile.TemporaryDirectory() as state:
        daemon = Daemon(root, state)
        made: list[str] = []
        try:
            for n, op in enumerate([("scan",), *ops]):
                if op[0] == "restart":
                    daemon.close()
                    daemon = Daemon(root, state)
                elif op[0] == "restore":
                    if made:
                        daemon.checkpoints.restore(made[op[1] % len(made)])
                elif op[0] != "scan":
                    change(root, outside, op)
                cps = daemon.checkpoints
                cps.create(f"c{n}")
                made.append(f"c{n}")
                m = cps.load(f"c{n}")
                assert m.entries() == Scanner(root).scan()[0], op
                cps._parsed.drop(f"c{n}")  # read from its file, as a restarted daemon would
                assert cps.load(f"c{n}") == m
        finally:
            daemon.close()


def test_an_object_collected_is_stored_again_when_its_content_comes_back(tmp_path) -> None:
    """``create`` skips the store for content it knows is there; the garbage collector's
    deletions must make it forget, or a checkpoint would name an object that is gone."""
    (tmp_path / "work").mkdir()
    f = tmp_path / "work" / "f"
    daemon = Daemon(str(tmp_path / "work"), str(tmp_path / "state"))
    try:
        cps = daemon.checkpoints
        f.write_text("one")
        cps.create("a")
        f.write_text("two")
        cps.create("b")
        assert cps.delete("a")  # "one" is no longer used: collected
        f.write_text("one")
        cps.create("c")
        f.write_text("three")
        cps.restore("c")
        assert f.read_text() == "one"
    finally:
        daemon.close()


def test_an_object_removed_behind_the_daemons_back_is_stored_again(tmp_path) -> None:
    """``create`` trusts the objects it stored; one removed by hand (or lost to damage)
    is found by the restore that needs it, and the daemon then looks again, so the advice
    of the error (delete the checkpoint, make a new one) works (found by review: it kept
    trusting the object until the daemon restarted)."""
    from spacesd.errors import Damaged

    (tmp_path / "work").mkdir()
    f = tmp_path / "work" / "f"
    f.write_text("content")
    daemon = Daemon(str(tmp_path / "work"), str(tmp_path / "state"))
    try:
        cps = daemon.checkpoints
        cps.create("a")
        for obj in (tmp_path / "state" / "checkpoints" / "objects").rglob("*"):
            if obj.is_file():
                obj.unlink()
        cps.create("b")  # the same content: trusted, not stored again
        f.write_text("changed")
        with pytest.raises(Damaged, match="is missing"):
            cps.restore("b")
        f.write_text("content")
        cps.create("c")  # looked for again: stored
        f.write_text("changed")
        cps.restore("c")
        assert f.read_text() == "content"
        for obj in (tmp_path / "state" / "checkpoints" / "objects").rglob("*"):
            if obj.is_file():
                obj.unlink()
        for checkpoint_id in ("a", "b", "c"):  # the collector finds it gone too
            assert cps.delete(checkpoint_id)
        cps.create("d")
        f.write_text("changed")
        cps.restore("d")
        assert f.read_text() == "content"
    finally:
        daemon.close()


def test_a_store_that_fails_fails_the_checkpoint_and_a_file_that_vanished_is_left_out(
        tmp_path, monkeypatch) -> None:
    """Storing a file's content can fail for the store's own disk (full, failing): the
    checkpoint must fail, not leave the file out, or its restore would delete the file
    (found by review: every OSError read as "removed meanwhile"). A file that did go
    away between the scan and its copy is left out, as before."""
    import errno

    from spacesd.errors import NotFound

    (tmp_path / "work").mkdir()
    (tmp_path / "work" / "big").write_bytes(b"b" * 100_000)
    (tmp_path / "work" / "gone").write_bytes(b"g")
    daemon = Daemon(str(tmp_path / "work"), str(tmp_path / "state"))
    try:
        cps = daemon.checkpoints
        store = cps._store

        def full(chunks, expect=None):
            raise OSError(errno.ENOSPC, "No space left on device")

        monkeypatch.setattr(cps, "_store", full)
        with pytest.raises(OSError) as failed:
            cps.create("c")
        assert failed.value.errno == errno.ENOSPC
        with pytest.raises(NotFound):
            cps.load("c")
        monkeypatch.setattr(cps, "_store", store)
        scan = cps._workspace

        def then_removed():
            seen = scan()
            (tmp_path / "work" / "gone").unlink()
            return seen

        monkeypatch.setattr(cps, "_workspace", then_removed)
        cps.create("c")
        assert [f.path for f in cps.load("c").files] == ["big"]
    finally:
        daemon.close()


def test_a_file_appended_to_while_read_is_kept_as_read(tmp_path, monkeypatch) -> None:
    """A file that grows while the scan reads it (a log, a build's output): its entry has
    the size of the bytes its digest is of, so the checkpoint restores (found by review:
    the entry took the lstat's size from before the read, and every restore, by this
    daemon or a restarted one, refused the checkpoint as damaged)."""
    from spacesd import workspace_scan

    (tmp_path / "work").mkdir()
    log = tmp_path / "work" / "build.log"
    log.write_bytes(b"line 1\n")
    real = workspace_scan._digest_of

    def appended_first(f):
        with open(log, "ab") as w:
            w.write(b"line 2\n")
        return real(f)

    daemon = Daemon(str(tmp_path / "work"), str(tmp_path / "state"))
    try:
        monkeypatch.setattr(workspace_scan, "_digest_of", appended_first)
        daemon.checkpoints.create("c")
        monkeypatch.setattr(workspace_scan, "_digest_of", real)
        [kept] = daemon.checkpoints.load("c").files
        assert kept.size == len(log.read_bytes()) == 14
        log.write_bytes(b"other\n")
        daemon.checkpoints.restore("c")
        assert log.read_bytes() == b"line 1\nline 2\n"
    finally:
        daemon.close()
    restarted = Daemon(str(tmp_path / "work"), str(tmp_path / "state"))
    try:
        log.write_bytes(b"other\n")
        restarted.checkpoints.restore("c")
        assert log.read_bytes() == b"line 1\nline 2\n"
    finally:
        restarted.close()


@pytest.mark.parametrize("damage", ["removed", "truncated"])
def test_a_restore_that_would_need_a_damaged_object_changes_nothing(tmp_path, damage) -> None:
    """A restore checks every object it names before it touches the workspace (found by
    review: it removed what the checkpoint lacked and rewrote the files before the
    damaged one, then stopped, the workspace half one state and half the other)."""
    from spacesd.errors import Damaged

    ws = tmp_path / "work"
    ws.mkdir()
    for n in range(5):
        (ws / f"f{n}").write_text(f"v1 {n}")
    daemon = Daemon(str(ws), str(tmp_path / "state"))
    try:
        daemon.checkpoints.create("c")
        [obj] = [o for o in (tmp_path / "state" / "checkpoints" / "objects").rglob("*")
                 if o.is_file() and o.read_bytes() == b"v1 4"]
        if damage == "removed":
            obj.unlink()
        else:
            obj.chmod(0o600)
            obj.write_bytes(b"v1")
        for n in range(5):
            (ws / f"f{n}").write_text(f"v2 {n}")
        (ws / "extra").write_text("x")
        before, _ = daemon.scanner.scan()
        with pytest.raises(Damaged, match="the restore changed nothing"):
            daemon.checkpoints.restore("c")
        assert daemon.scanner.scan()[0] == before
        # The error's advice works: a new checkpoint of that content stores it again (a
        # damaged object was kept and taken as stored, and the new checkpoint as damaged).
        (ws / "f4").write_text("v1 4")
        daemon.checkpoints.create("again")
        (ws / "f4").write_text("v3 4")
        daemon.checkpoints.restore("again")
        assert (ws / "f4").read_text() == "v1 4"
    finally:
        daemon.close()
