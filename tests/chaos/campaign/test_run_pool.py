"""The local run pool under Ctrl-C: what it starts and what it gives back."""

from __future__ import annotations

import threading
from types import SimpleNamespace
from typing import Any, ClassVar, cast

import pytest

from chaos.campaign import run_pool
from chaos.campaign.run_pool import LocalPool
from chaos.run.spec import RunSpec


class _HeldRun:
    """A run that holds its thread until it is aborted; records which ones started."""

    started: ClassVar[list[int]] = []
    began: ClassVar[threading.Event] = threading.Event()

    def __init__(self, spec: Any, _note: object) -> None:
        self.spec = spec
        self._aborted = threading.Event()

    def execute(self) -> SimpleNamespace:
        _HeldRun.started.append(self.spec.index)
        _HeldRun.began.set()
        assert self._aborted.wait(300), "never aborted"
        record = {"index": self.spec.index, "interrupted": True}
        return SimpleNamespace(to_json=lambda: record)

    def abort(self) -> None:
        self._aborted.set()


def test_an_abort_never_starts_a_run_still_waiting_for_a_thread(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A run queued behind the running one started after the Ctrl-C all the same and made
    its Space first: on microvm, a machine's boot held the campaign's exit up for minutes
    (found by a microvm campaign stopped with SIGTERM)."""
    monkeypatch.setattr(run_pool, "Run", _HeldRun)
    _HeldRun.started.clear()
    _HeldRun.began.clear()
    with LocalPool(1, cast(Any, None)) as pool:
        for index in (0, 1):
            pool.submit(cast(RunSpec, SimpleNamespace(index=index)))
        assert _HeldRun.began.wait(300)
        pool.abort()
        records: list[dict[str, Any]] = []
        while pool.in_flight():
            records += pool.finished(timeout=300)
    assert _HeldRun.started == [0]
    assert sorted(r["index"] for r in records) == [0, 1]
    assert all(r["interrupted"] for r in records)
