"""The directory checkpoint store on real local Spaces: objects copied once, manifests last,
a copy cut short never taken for a checkpoint, damage detected, old stores still read."""

from __future__ import annotations

import io
import json
import os
import tarfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from backends.local import LocalSpaces
from durable import atomic_file
from durable.adapter import DirectoryCheckpointStore, WorkspaceSnapshots, checkpoint_store
from durable.adapter.checkpoint_store import DELTA_FRACTION, DamagedStore
from durable.adapter.snapshots import CheckpointRef
from durable.spaces import SpaceClient

FILES = 200
#: The fields of a stat result beyond its tuple, but the ctime in ns.
_STAT_EXTRAS = ("st_atime", "st_mtime", "st_ctime", "st_atime_ns", "st_mtime_ns", "st_blksize",
                "st_blocks", "st_rdev")


@pytest.fixture
def spaces(tmp_path: Path) -> Iterator[LocalSpaces]:
    s = LocalSpaces(tmp_path / "spaces")
    yield s
    s.delete_all()


def _space(spaces: LocalSpaces, name: str) -> SpaceClient:
    spaces.create(name)
    client = spaces.connect(name, epoch=1)
    for i in range(FILES):
        client.write_file(f"src/f{i:03d}.txt", f"file {i}\n".encode() * 400)
    return client


def _size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def _members(chunks: Iterator[bytes]) -> list[str]:
    with tarfile.open(fileobj=io.BytesIO(b"".join(chunks)), mode="r:") as tar:
        return tar.getnames()


def test_a_store_grows_by_what_changed(tmp_path: Path, spaces: LocalSpaces) -> None:
    client = _space(spaces, "a")
    store = DirectoryCheckpointStore(tmp_path / "store")
    snapshots = WorkspaceSnapshots(spaces, "", store)
    snapshots.take(client, "c1")
    first = _size(tmp_path / "store")
    assert first > FILES * 3000  # every object once
    client.write_file("src/f000.txt", b"changed\n")
    snapshots.take(client, "c2")
    growth = _size(tmp_path / "store") - first
    delta = (tmp_path / "store" / "c2.delta.json").stat().st_size
    assert growth == delta + len(b"changed\n")  # one new object and the manifest's change
    assert delta < 600 < (tmp_path / "store" / "c1.manifest.json").stat().st_size / 20
    # the daemon left out what the store said it had
    have = store.known()
    assert len(have) == FILES
    assert _members(client.checkpoint_export("c2", have=have)) == ["manifest.json"]


def _manifest(chunks: Iterator[bytes]) -> dict:
    """The export's manifest, its files in path order (the daemon lists them as it walked)."""
    with tarfile.open(fileobj=io.BytesIO(b"".join(chunks)), mode="r:") as tar:
        member = tar.extractfile("manifest.json")
        assert member is not None
        manifest = json.loads(member.read())
    return {**manifest, "files": sorted(manifest["files"], key=lambda f: f["path"])}


def test_a_chain_of_differences_gives_back_each_manifest(tmp_path: Path,
                                                         spaces: LocalSpaces) -> None:
    """Files, links and directories added, changed and removed over many checkpoints, until
    the difference has grown enough to store a whole manifest again: each one opened is the
    manifest the daemon exported, also by another store object; a missing base is named."""
    client = _space(spaces, "a")
    store = DirectoryCheckpointStore(tmp_path / "store")
    exported = {}
    for n in range(40):
        client.write_file(f"src/f{n:03d}.txt", f"v{n}\n".encode())  # changed
        client.write_file(f"new/d{n}/g.txt", b"g")  # a file in a new directory
        client.symlink(f"links/l{n}", f"../src/f{n:03d}.txt")
        if n % 3 == 2:
            client.remove(f"new/d{n - 1}", recursive=True)  # a file and its directory go
            client.remove(f"links/l{n - 2}")
        client.write_file(f"src/f{n + 50:03d}.txt", f"file {n + 50}\n".encode() * 400,
                          mode=0o755)  # the same content, another mode
        client.checkpoint_create(f"c{n}")
        exported[f"c{n}"] = _manifest(client.checkpoint_export(f"c{n}"))
        store.put(f"c{n}", client.checkpoint_export(f"c{n}", have=store.known()))
    stored = tmp_path / "store"
    whole = sorted(int(p.name[1:].split(".")[0]) for p in stored.glob("c*.manifest.json"))
    assert whole[0] == 0 and len(whole) >= 2  # the first, and another once changes piled up
    for delta in stored.glob("c*.delta.json"):
        base = json.loads(delta.read_bytes())["base"]
        base_size = (stored / f"{base}.manifest.json").stat().st_size
        assert delta.stat().st_size * DELTA_FRACTION < base_size
    reader = DirectoryCheckpointStore(tmp_path / "store")
    for name, manifest in exported.items():
        with reader.open(name) as tar:  # type: ignore[union-attr]
            assert _manifest(iter([tar.read()])) == manifest, name
    assert reader.known() == {f["sha256"] for f in manifest["files"]}
    (stored / "c0.manifest.json").unlink()
    with pytest.raises(DamagedStore, match="difference from c0, which is missing"):
        reader.open("c1")


def test_a_checkpoint_from_the_store_restores_in_another_space(
        tmp_path: Path, spaces: LocalSpaces) -> None:
    client = _space(spaces, "a")
    snapshots = WorkspaceSnapshots(spaces, "", DirectoryCheckpointStore(tmp_path / "store"))
    snapshots.take(client, "c1")
    client.write_file("src/f001.txt", b"later\n")
    snapshots.take(client, "c2")
    spaces.delete("a")
    spaces.create("b")
    other = spaces.connect("b", epoch=1)
    # a new store object (another process) on the same directory
    WorkspaceSnapshots(spaces, "", DirectoryCheckpointStore(tmp_path / "store")).restore(
        other, CheckpointRef("a", "c1"))
    assert other.read_file("src/f001.txt") == b"file 1\n" * 400
    assert len([e for e in other.scan().entries if e.kind == "file"]) == FILES


def test_a_copy_cut_short_is_no_checkpoint_and_a_lost_object_is_copied_again(
        tmp_path: Path, spaces: LocalSpaces) -> None:
    client = _space(spaces, "a")
    store = DirectoryCheckpointStore(tmp_path / "store")

    def cut(chunks: Iterator[bytes]) -> Iterator[bytes]:
        whole = b"".join(chunks)
        yield whole[:len(whole) // 2]  # the manifest and some of the objects
        raise ConnectionError("the export was cut")

    client.checkpoint_create("c1")
    with pytest.raises(ConnectionError):
        store.put("c1", cut(client.checkpoint_export("c1")))
    assert not store.has("c1") and store.open("c1") is None
    assert not [p.name for p in (tmp_path / "store").iterdir() if p.name.startswith(".")]
    WorkspaceSnapshots(spaces, "", store).take(client, "c2")
    assert store.has("c2")
    # an object the store believes it has is gone: the export that left it out is refused
    # and the checkpoint copied whole
    victim = next(p for p in (tmp_path / "store" / "objects").rglob("*") if p.is_file())
    victim.unlink()
    client.write_file("new.txt", b"n")
    WorkspaceSnapshots(spaces, "", store).take(client, "c3")
    assert victim.exists() and store.has("c3")
    with store.open("c3") as tar:  # type: ignore[union-attr]
        assert len(_members(iter([tar.read()]))) == FILES + 2  # manifest and every object


@pytest.mark.parametrize("listed", ["long after its last change", "in its last change's tick"])
def test_a_lost_object_is_noticed_through_a_listing_of_its_directory(
        tmp_path: Path, spaces: LocalSpaces, monkeypatch: pytest.MonkeyPatch,
        listed: str) -> None:
    """The store reads which objects it holds off listings of their directories, kept while
    a directory's ctime stays the same; a listing read within the racy window of its ctime
    is not kept, since a second change in the same tick of a coarse clock leaves the ctime
    as it was."""
    client = _space(spaces, "a")
    store = DirectoryCheckpointStore(tmp_path / "store")
    snapshots = WorkspaceSnapshots(spaces, "", store)
    snapshots.take(client, "c1")
    objects = tmp_path / "store" / "objects"
    victim = next(p for p in objects.rglob("*") if p.is_file())
    if listed == "long after its last change":  # every listing is kept
        monkeypatch.setattr(checkpoint_store, "RACY_NS", -1)
    else:  # a clock so coarse that the directories' ctimes never move: none is kept
        stat, frozen = os.stat, time.time_ns()

        def coarse_stat(path: str, *args: Any, **kwargs: Any) -> Any:
            st = stat(path, *args, **kwargs)
            if not str(path).startswith(f"{objects}/"):
                return st
            return os.stat_result(tuple(st), {**{f: getattr(st, f) for f in _STAT_EXTRAS},
                                              "st_ctime_ns": frozen})
        monkeypatch.setattr(os, "stat", coarse_stat)
    client.write_file("one.txt", b"1")
    snapshots.take(client, "c2")  # lists every object directory: the victim is there
    victim.unlink()
    client.write_file("two.txt", b"2")
    snapshots.take(client, "c3")
    assert victim.exists(), "the lost object was taken as stored and not copied again"
    with store.open("c3") as tar:  # type: ignore[union-attr]
        assert len(_members(iter([tar.read()]))) == FILES + 3  # manifest and every object


def test_a_manifest_is_renamed_into_place_once_its_objects_are_durable(
        tmp_path: Path, spaces: LocalSpaces, monkeypatch: pytest.MonkeyPatch) -> None:
    client = _space(spaces, "a")
    store = DirectoryCheckpointStore(tmp_path / "store")
    snapshots = WorkspaceSnapshots(spaces, "", store)
    snapshots.take(client, "c1")
    events: list[tuple[str, str]] = []
    replace, sync = os.replace, atomic_file.fsync_dir

    def logged_replace(src: Any, dst: Any) -> None:
        events.append(("rename", str(dst)))
        replace(src, dst)

    def logged_sync(directory: Path) -> None:
        sync(directory)
        events.append(("synced", str(directory)))
    monkeypatch.setattr(os, "replace", logged_replace)
    monkeypatch.setattr(atomic_file, "fsync_dir", logged_sync)
    monkeypatch.setattr(checkpoint_store, "fsync_dir", logged_sync)
    client.write_file("new.txt", b"new")
    snapshots.take(client, "c2")
    [obj] = [dst for kind, dst in events if kind == "rename" and "/objects/" in dst]
    manifest = events.index(("rename", str(tmp_path / "store" / "c2.delta.json")))
    assert events.index(("synced", str(Path(obj).parent))) < manifest
    assert events[manifest + 1:] == [("synced", str(tmp_path / "store"))]


def test_an_export_with_two_manifests_is_refused(tmp_path: Path, spaces: LocalSpaces) -> None:
    client = _space(spaces, "a")
    client.checkpoint_create("c1")
    out = io.BytesIO()
    with tarfile.open(fileobj=io.BytesIO(b"".join(client.checkpoint_export("c1")))) as src, \
            tarfile.open(fileobj=out, mode="w") as dst:
        for member in src:
            data = src.extractfile(member).read()  # type: ignore[union-attr]
            for _ in range(2 if member.name == "manifest.json" else 1):
                dst.addfile(member, io.BytesIO(data))
    store = DirectoryCheckpointStore(tmp_path / "store")
    with pytest.raises(DamagedStore, match="has two manifests"):
        store.put("c1", iter([out.getvalue()]))
    assert not store.has("c1")
    assert not [p.name for p in (tmp_path / "store").iterdir() if p.name.startswith(".")]


def test_a_damaged_object_is_detected_and_an_old_store_is_read(
        tmp_path: Path, spaces: LocalSpaces) -> None:
    client = _space(spaces, "a")
    store = DirectoryCheckpointStore(tmp_path / "store")
    WorkspaceSnapshots(spaces, "", store).take(client, "c1")
    victim = next(p for p in (tmp_path / "store" / "objects").rglob("*") if p.is_file())
    victim.chmod(0o600)
    victim.write_bytes(b"not what it was")
    with pytest.raises(DamagedStore, match="does not match its hash"):
        store.open("c1")
    # a store written as one tar per checkpoint
    old = tmp_path / "old"
    old.mkdir()
    (old / "c9.tar").write_bytes(b"".join(client.checkpoint_export("c1")))
    legacy = DirectoryCheckpointStore(old)
    assert legacy.has("c9")
    with legacy.open("c9") as tar:  # type: ignore[union-attr]
        assert "manifest.json" in _members(iter([tar.read()]))
