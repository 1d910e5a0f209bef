"""The directory checkpoint store on real local Spaces: objects copied once, manifests last,
a copy cut short never taken for a checkpoint, damage detected, old stores still read."""

from __future__ import annotations

import io
import tarfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from backends.local import LocalSpaces
from durable.adapter import DirectoryCheckpointStore, WorkspaceSnapshots
from durable.adapter.checkpoint_store import DamagedStore
from durable.adapter.snapshots import CheckpointRef
from durable.spaces import SpaceClient

FILES = 200


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
    manifest = (tmp_path / "store" / "c2.manifest.json").stat().st_size
    assert growth == manifest + len(b"changed\n")  # one new object and the manifest
    # the daemon left out what the store said it had
    have = store.known()
    assert len(have) == FILES
    assert _members(client.checkpoint_export("c2", have=have)) == ["manifest.json"]


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
