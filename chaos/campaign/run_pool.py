"""Where a campaign's runs execute: the pool it submits run specs to and takes records from.

A campaign talks to its pool in plain data: it submits ``RunSpec``s and takes the finished
runs' records (``RunRecord.to_json()`` dicts, their ``run_dir`` on this machine). Two pools:

- ``LocalPool`` (the embedded default): ``--jobs`` runs at once in threads of this process,
  each run's drivers and Spaces children of it;
- ``chaos.cluster.dask_pool.ClusterPool`` (``--cluster``): each run a task on a Dask cluster.
"""

from __future__ import annotations

from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from typing import Any, Protocol, Self

from chaos.campaign import live
from chaos.run.runner import Run
from chaos.run.spec import RunSpec


class RunPool(Protocol):
    def capacity(self) -> int:
        """How many runs execute at once (the campaign keeps twice as many submitted)."""
        ...

    def in_flight(self) -> int:
        """Runs submitted whose records ``finished`` has not given back yet."""
        ...

    def submit(self, spec: RunSpec) -> None: ...

    def finished(self, timeout: float) -> list[dict[str, Any]]:
        """The records of runs that ended, waiting up to ``timeout`` s for the first."""
        ...

    def run(self, spec: RunSpec) -> dict[str, Any]:
        """One run, to its end (the exhaustive campaign's reference run)."""
        ...

    def abort(self) -> None:
        """End every running run now (Ctrl-C); none starts any more. Their records still
        come back through ``finished``, marked ``interrupted``."""
        ...

    def close(self) -> None: ...

    def __enter__(self) -> Self: ...

    def __exit__(self, *exc: object) -> None: ...


class LocalPool:
    """``jobs`` runs at once, each in a thread of this process."""

    def __init__(self, jobs: int, note: live.Campaign) -> None:
        self._jobs = max(1, jobs)
        self._note = note
        self._executor = ThreadPoolExecutor(max_workers=self._jobs)
        self._running: dict[Future[dict[str, Any]], Run] = {}

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def capacity(self) -> int:
        return self._jobs

    def in_flight(self) -> int:
        return len(self._running)

    def submit(self, spec: RunSpec) -> None:
        run = Run(spec, self._note)
        self._running[self._executor.submit(lambda: run.execute().to_json())] = run

    def finished(self, timeout: float) -> list[dict[str, Any]]:
        done, _ = wait(list(self._running), timeout=timeout, return_when=FIRST_COMPLETED)
        records = []
        for fut in done:
            run = self._running.pop(fut)
            records.append({"index": run.spec.index, "interrupted": True} if fut.cancelled()
                           else fut.result())
        return records

    def run(self, spec: RunSpec) -> dict[str, Any]:
        return Run(spec, self._note).execute().to_json()

    def abort(self) -> None:
        """A run still waiting for a thread never starts (it made a Space first, and a
        microVM's boot held the Ctrl-C up for minutes); a running one is ended."""
        for fut, run in self._running.items():
            if not fut.cancel():
                run.abort()

    def close(self) -> None:
        self._executor.shutdown(wait=True)
