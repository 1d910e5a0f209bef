"""The image keeper (``durable.adapter.image_keeper``): its fold of the log catches up with
only the entries after the last one folded, and equals a fold of the whole history, forks
included; the rows of a Space's scans are made only for what changed."""

from __future__ import annotations

import pytest

from backends.local import LocalSpaces
from durable.adapter import image as image_module
from durable.adapter.image import IMAGE_KEY, Image, Row, RowMemo, TransactionalLimits, row_of
from durable.adapter.image_keeper import ImageKeeper
from durable.log import Log
from durable.storage import MemoryStorage
from spacesd.protocol import ScanEntry, ScanResult


def _change(log: Log, conv: int, path: str, sha: str) -> int:
    with log.transaction() as tx:
        tx.append(conv, "input", {"content": "noise"})
        return tx.append(conv, "system", {"hidden": True, IMAGE_KEY: {
            "call_id": None, "set": {path: ["file", 0o644, sha]}, "del": [], "blobs": {}}})


def _whole(log: Log, conv: int) -> Image:
    image = Image()
    for e in log.entries(conv):
        if e.kind == "system" and IMAGE_KEY in e.data:
            image.fold(e.id, e.data[IMAGE_KEY])
    return image


def test_catch_up_folds_only_what_is_new_and_equals_the_whole_fold() -> None:
    log = Log.open(MemoryStorage())
    conv = log.create_root("a")
    keeper = ImageKeeper(TransactionalLimits())
    first = _change(log, conv, "a.txt", "1" * 64)
    keeper.catch_up(log, conv)
    assert keeper.image(conv).upto == first
    folded: list[int] = []
    real_fold = keeper.image(conv).fold

    def counting_fold(entry_id: int, payload: dict) -> None:
        folded.append(entry_id)
        real_fold(entry_id, payload)

    keeper.image(conv).fold = counting_fold  # type: ignore[method-assign]
    second = _change(log, conv, "a.txt", "2" * 64)
    third = _change(log, conv, "b.txt", "3" * 64)
    keeper.catch_up(log, conv)
    keeper.catch_up(log, conv)
    assert folded == [second, third]
    assert keeper.image(conv).table == _whole(log, conv).table


def test_a_fork_folds_its_parents_image_up_to_the_fork() -> None:
    log = Log.open(MemoryStorage())
    conv = log.create_root("a")
    at = _change(log, conv, "a.txt", "1" * 64)
    _change(log, conv, "a.txt", "2" * 64)
    child = log.fork(conv, at)
    _change(log, child, "c.txt", "4" * 64)
    keeper = ImageKeeper(TransactionalLimits())
    keeper.catch_up(log, child)
    assert keeper.image(child).table == _whole(log, child).table == {
        "a.txt": Row("file", 0o644, "1" * 64), "c.txt": Row("file", 0o644, "4" * 64)}


def test_a_scans_rows_are_made_only_for_what_changed_and_equal_rows_made_anew(
        local_spaces: LocalSpaces, monkeypatch: pytest.MonkeyPatch) -> None:
    """``RowMemo`` against a real Space's scans: after the first, only the entries the
    daemon reported changed get a row made; every answer equals a row made for each entry
    (including when the entries are equal objects of another scan, a whole rescan)."""
    local_spaces.create("rows")
    client = local_spaces.connect("rows", epoch=1)
    for i in range(50):
        client.write_file(f"d/f{i:02d}", b"x" * i)
    made: list[str] = []

    def counting(entry: ScanEntry) -> Row:
        made.append(entry.path)
        return row_of(entry)

    monkeypatch.setattr(image_module, "row_of", counting)
    memo = RowMemo()

    def rows_checked(scan: ScanResult) -> dict[str, Row]:
        made.clear()
        rows = memo.rows(scan)
        assert rows == {e.path: row_of(e) for e in scan.entries}
        return rows

    first = rows_checked(client.scan())
    assert len(made) == len(first) == 51  # d and its 50 files
    client.write_file("d/f07", b"changed")
    client.remove("d/f08")
    client.mkdir("e")
    client.write_file("d/f09", b"x" * 9, mode=0o700)
    rows = rows_checked(client.scan())
    assert sorted(made) == ["d", "d/f07", "d/f09", "e"], made  # d: its mtime moved
    assert "d/f08" not in rows and rows["d/f09"].mode == 0o700
    rows_checked(client.scan())
    assert made == []
    fresh = local_spaces.connect("rows", epoch=1)  # a new client: a full answer
    rows_checked(fresh.scan())
    assert len(made) == len(rows)
