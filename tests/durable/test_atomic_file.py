"""Atomic writes: the file appears whole or not at all, and a staged write that is not
committed leaves nothing behind."""

from __future__ import annotations

from pathlib import Path

import pytest

from durable.atomic_file import StagedWrite, write_atomic


def test_a_write_replaces_the_file_whole(tmp_path: Path) -> None:
    target = tmp_path / "m.json"
    write_atomic(target, b"old")
    write_atomic(target, [b"n", b"ew"])
    assert target.read_bytes() == b"new"
    assert [p.name for p in tmp_path.iterdir()] == ["m.json"]


def test_a_staged_write_appears_only_at_its_commit(tmp_path: Path) -> None:
    target = tmp_path / "m.json"
    with StagedWrite(target, b"manifest") as staged:
        assert not target.exists()
        staged.commit()
        assert target.read_bytes() == b"manifest"
    assert [p.name for p in tmp_path.iterdir()] == ["m.json"]


def test_a_staged_write_left_uncommitted_leaves_nothing(tmp_path: Path) -> None:
    target = tmp_path / "m.json"
    with pytest.raises(ValueError, match="the objects were cut short"), \
            StagedWrite(target, b"manifest"):
        raise ValueError("the objects were cut short")
    assert list(tmp_path.iterdir()) == []


def test_a_staged_write_that_failed_says_why_at_its_commit(tmp_path: Path) -> None:
    with StagedWrite(tmp_path / "gone" / "m.json", b"manifest") as staged, \
            pytest.raises(FileNotFoundError):
        staged.commit()
    assert list(tmp_path.iterdir()) == []
