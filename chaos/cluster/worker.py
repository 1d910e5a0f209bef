"""The worker's side of a campaign on a Dask cluster: one run as one task, and ``chaos worker``.

A run is one task on a worker thread. It starts processes and SIGKILLs them, so ``chaos
worker`` gives every worker process one thread (a second run would be a second thread of the
same process, as ``--jobs`` is; never two runs in one thread). The task:

- runs the spec in a fresh directory of its own under the worker's runs directory
  (``CHAOS_WORKER_DIR``, which ``chaos worker --dir`` sets; otherwise ``chaos-runs`` under
  the worker's local directory), so a run started again after its worker died never meets
  the dead attempt's files;
- notes what it owns in the worker process's ``live`` note, so ``chaos clean`` (and the next
  ``chaos worker`` on the host) ends the drivers and Spaces of a worker that was SIGKILLed;
- asks the scheduler whether a worker died while running it before (the scheduler then
  reschedules it: the run starts again from scratch with the same seed) and says so in the
  record (``retried``);
- watches the campaign's abort event (Ctrl-C of the campaign) and ends the run when it is
  set;
- returns the record and, for a run that kept its directory (it did not pass, or ``--keep``),
  that directory as a gzipped tarball; the directory on the worker is then removed.
"""

from __future__ import annotations

import atexit
import io
import os
import shutil
import sys
import tarfile
import tempfile
import threading
from dataclasses import replace
from pathlib import Path
from typing import Any, NoReturn

from distributed import Event, get_client, get_worker

from chaos.campaign import live
from chaos.run.runner import Run
from chaos.run.spec import RunSpec

WORKER_DIR_ENV = "CHAOS_WORKER_DIR"
#: Dask settings of a worker that runs campaigns: no statistical profiler sampling the run's
#: thread every 10 ms, a system monitor every 2 s rather than 0.5 s (on a 2-core machine the
#: two cost a campaign about a tenth of its throughput). A setting in the environment wins.
WORKER_CONFIG = {"distributed.worker.profile.enabled": False,
                 "distributed.admin.system-monitor.interval": "2s"}

_note: live.Campaign | None = None
_note_lock = threading.Lock()


def abort_event_name(campaign: str) -> str:
    return f"chaos-abort-{campaign}"


def _worker_note() -> live.Campaign:
    """This worker process's note of what its runs own (one per process, removed at exit)."""
    global _note
    with _note_lock:
        if _note is None:
            _note = live.Campaign.open()
            atexit.register(_note.close)
        return _note


def clean_left() -> int:
    """On a worker, at the campaign's end: end what dead worker processes of this host left
    (a worker SIGKILLed mid-run leaves its run's Spaces and daemons, named in its note);
    how many processes were ended."""
    return live.clean_dead()[1]


def runs_dir() -> Path:
    configured = os.environ.get(WORKER_DIR_ENV)
    path = Path(configured) if configured else Path(get_worker().local_directory) / "chaos-runs"
    path.mkdir(parents=True, exist_ok=True)
    return path


def _times_its_worker_died(key: Any) -> int:
    def suspicious(dask_scheduler: Any) -> int:
        task = dask_scheduler.tasks.get(key)
        return 0 if task is None else task.suspicious

    return int(get_client().run_on_scheduler(suspicious))


def _tarball(directory: Path) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        tar.add(directory, arcname=".")
    return buf.getvalue()


def execute_run(spec: RunSpec, campaign: str) -> dict[str, Any]:
    """The Dask task of one run: ``{"record": ..., "artifacts": bytes | None}`` (the record
    None when the campaign was interrupted before the run started)."""
    worker = get_worker()
    if Event(abort_event_name(campaign)).is_set():
        return {"record": None, "artifacts": None}  # the campaign was interrupted
    died = _times_its_worker_died(worker.get_current_task())
    work = Path(tempfile.mkdtemp(prefix=f"{campaign}-run{spec.index}-", dir=runs_dir()))
    try:
        run = Run(replace(spec, work_dir=work), _worker_note())
        done = threading.Event()
        watcher = threading.Thread(target=_watch_abort, args=(campaign, run, done),
                                   daemon=True)
        watcher.start()
        try:
            record = run.execute().to_json()
        finally:
            # Not joined: it may be inside a wait of up to a second, and the worker's next
            # run need not wait for that; an abort it sees now ends a run already ended.
            done.set()
        record["worker"] = worker.address
        if died:
            record["retried"] = {
                "times": died,
                "why": f"the worker running it died or lost the scheduler {died} time(s); "
                       "the scheduler rescheduled it and it ran again from scratch with the "
                       "same seed in a fresh directory"}
        artifacts = _tarball(Path(record["run_dir"])) if record["run_dir"] else None
        return {"record": record, "artifacts": artifacts}
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _watch_abort(campaign: str, run: Run, done: threading.Event) -> None:
    abort = Event(abort_event_name(campaign))
    while not done.is_set():
        if abort.wait(timeout=1.0):
            run.abort()
            return


def worker_main(scheduler: str, directory: Path, nworkers: int, nanny: bool, backend: str,
                extra: list[str]) -> NoReturn:
    """``chaos worker``: end what dead campaigns and workers left on this host, check the
    backend, then become ``dask worker`` (same pid) with one thread per worker process."""
    from chaos.space_providers import probe_backend

    campaigns, killed = live.clean_dead()
    if campaigns:
        print(f"chaos worker: ended what {campaigns} dead campaign(s) or worker(s) left "
              f"({killed} process(es))", file=sys.stderr)
    directory.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="chaos-probe-", dir=directory) as probe:
        probe_backend(backend, Path(probe))  # BackendUnavailable: exit 254, nothing started
    os.environ[WORKER_DIR_ENV] = str((directory / "runs").resolve())
    for key, value in WORKER_CONFIG.items():
        os.environ.setdefault("DASK_" + key.upper().replace(".", "__").replace("-", "_"),
                              str(value))
    argv = [sys.executable, "-m", "distributed.cli.dask_worker", scheduler, "--nthreads", "1",
            "--nworkers", str(nworkers), "--local-directory", str(directory),
            "--nanny" if nanny else "--no-nanny", *extra]
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(sys.executable, argv)
