"""``chaos run --cluster``: the campaign's runs as tasks on a Dask cluster.

The campaign (this side) makes the run specs, submits each as one task
(``chaos.cluster.worker.execute_run``) and takes the records as they finish, writing the
same results directory, SUMMARY and exit code as a local campaign; a failing run's
directory (log, workspace tarball, plan, driver logs) comes back with its record and is
unpacked under ``runs/`` as a local campaign keeps it.

- ``tcp://HOST:PORT`` / ``tls://HOST:PORT``: an existing scheduler, its workers started with
  ``chaos worker`` on any number of hosts. The connection's security is Dask's own
  configuration (``distributed.comm.tls.*``, e.g. ``DASK_DISTRIBUTED__COMM__TLS__CA_FILE``):
  use TLS with client certificates wherever the scheduler is reachable by others.
- ``local:N``: a ``LocalCluster`` of N single-threaded worker processes on 127.0.0.1, with
  mutual TLS on throwaway certificates (``Security.temporary``), for trying it on one
  machine.

A worker that dies in the middle of a run: the scheduler reschedules the task (up to its
``allowed-failures``); the run starts again from scratch and is recorded once, saying so.
Ctrl-C sets the campaign's abort event: a running task ends its run, one not started yet
returns without running.
"""

from __future__ import annotations

import io
import re
import sys
import tarfile
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any, Self

from chaos.campaign.records import ResultsDir
from chaos.errors import BackendUnavailable, BadArguments
from chaos.run.spec import RunSpec

EXTRA_HINT = "install the cluster extra: pip install -e '.[cluster]'"
#: How long the campaign waits for a scheduler to answer before it refuses to start.
CONNECT_TIMEOUT_S = 20.0
_LOCAL = re.compile(r"local:([0-9]+)")
_ADDRESS = re.compile(r"(tcp|tls)://[^/\s]+:[0-9]+")


def check_address(text: str) -> str:
    """``--cluster``'s value, checked before anything runs (``BadArguments``), and Dask
    importable (``BackendUnavailable``)."""
    local = _LOCAL.fullmatch(text)
    if (local and 1 <= int(local.group(1)) <= 256) or (not local and _ADDRESS.fullmatch(text)):
        _import_distributed()
        return text
    raise BadArguments(f"--cluster {text!r} is neither a scheduler address "
                       "(tcp://HOST:8786 or tls://HOST:8786) nor local:N (N from 1 to 256 "
                       "worker processes on this machine)")


def _import_distributed() -> Any:
    try:
        import distributed
    except ImportError as exc:
        raise BackendUnavailable(f"--cluster needs Dask's distributed ({exc}); "
                                 f"{EXTRA_HINT}") from None
    return distributed


class ClusterPool:
    """The ``RunPool`` of a Dask cluster; ``results`` receives the failing runs' directories."""

    def __init__(self, address: str, results: ResultsDir) -> None:
        distributed = _import_distributed()
        import dask

        from chaos.cluster.worker import WORKER_CONFIG, abort_event_name, clean_left, execute_run

        self._execute = execute_run
        self._clean_left = clean_left
        self._results = results
        self._campaign = f"{results.path.name}-{uuid.uuid4().hex[:8]}"
        self._cluster = None
        #: The workers' directory of a ``local:N`` cluster (their runs, Dask's files).
        self._scratch = tempfile.TemporaryDirectory(prefix="chaos-cluster-")
        local = _LOCAL.fullmatch(address)
        try:
            if local:
                with dask.config.set(WORKER_CONFIG):  # the nannies pass it on
                    self._cluster = distributed.LocalCluster(
                        n_workers=int(local.group(1)), threads_per_worker=1,
                        processes=True, host="127.0.0.1", dashboard_address=None,
                        protocol="tls", security=distributed.security.Security.temporary(),
                        local_directory=self._scratch.name)
                self._client = distributed.Client(self._cluster)
            else:
                self._client = distributed.Client(address, timeout=CONNECT_TIMEOUT_S)
        except (OSError, TimeoutError) as exc:
            self.close()
            raise BackendUnavailable(
                f"cannot reach a Dask scheduler at {address} ({type(exc).__name__}: {exc}); "
                "start one (`dask scheduler`) and workers (`chaos worker ADDRESS`), or use "
                "--cluster local:N") from None
        self._abort = distributed.Event(abort_event_name(self._campaign), client=self._client)
        self._abort.clear()
        self._wait = distributed.wait
        self._futures: dict[Any, int] = {}
        self._threads = 1
        self._threads_at = 0.0

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def capacity(self) -> int:
        if time.monotonic() - self._threads_at > 5.0:  # workers come and go
            self._threads = max(1, sum(self._client.nthreads().values()))
            self._threads_at = time.monotonic()
        return self._threads

    def in_flight(self) -> int:
        return len(self._futures)

    def submit(self, spec: RunSpec) -> None:
        fut = self._client.submit(self._execute, spec, self._campaign, pure=False,
                                  key=f"chaos-run-{self._campaign}-{spec.index}")
        self._futures[fut] = spec.index

    def finished(self, timeout: float) -> list[dict[str, Any]]:
        try:
            done, _ = self._wait(list(self._futures), timeout=timeout,
                                 return_when="FIRST_COMPLETED")
        except TimeoutError:
            return []
        records = []
        for fut in done:
            del self._futures[fut]
            result = fut.result()
            if result["record"] is not None:  # None: not started, Ctrl-C came first
                records.append(self._received(result))
        return records

    def run(self, spec: RunSpec) -> dict[str, Any]:
        fut = self._client.submit(self._execute, spec, self._campaign, pure=False,
                                  key=f"chaos-reference-{self._campaign}")
        return self._received(fut.result())

    def abort(self) -> None:
        # Nothing is cancelled: a cancelled task that already runs goes on unseen on its
        # worker. Every task sees the event (a running one ends its run, one not started
        # returns at once), so each comes back, and the running ones' Spaces are deleted.
        self._abort.set()

    def close(self) -> None:
        client, cluster = getattr(self, "_client", None), self._cluster
        if client is not None:
            try:  # a worker SIGKILLed mid-run left its run's Spaces: its host's workers end them
                client.run(self._clean_left, wait=True)
            except Exception as exc:  # noqa: BLE001 - the campaign's result stands; say why
                print(f"chaos: could not ask the workers to end what dead workers left "
                      f"({type(exc).__name__}: {exc}); run `chaos clean` on their hosts",
                      file=sys.stderr)
            client.close()
        if cluster is not None:
            cluster.close()
        self._scratch.cleanup()

    def _received(self, result: dict[str, Any]) -> dict[str, Any]:
        """The record of a finished task, its run directory unpacked under ``runs/``."""
        record: dict[str, Any] = result["record"]
        if result["artifacts"] is not None:
            kept = self._results.runs_dir / Path(record["run_dir"]).name
            kept.mkdir(parents=True, exist_ok=True)
            with tarfile.open(fileobj=io.BytesIO(result["artifacts"]), mode="r:gz") as tar:
                tar.extractall(kept, filter="tar")
            record["run_dir"] = str(kept)
        return record


