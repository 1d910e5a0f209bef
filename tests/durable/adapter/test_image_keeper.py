"""The image keeper's fold of the log (``durable.adapter.image_keeper``), without a Space:
it catches up with only the entries after the last one folded, and equals a fold of the
whole history, forks included."""

from __future__ import annotations

from durable.adapter.image import IMAGE_KEY, Image, Row, TransactionalLimits
from durable.adapter.image_keeper import ImageKeeper
from durable.log import Log
from durable.storage import MemoryStorage


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
