"""Campaigns on a Dask cluster (``chaos run --cluster``): a real scheduler and two real
``chaos worker`` processes on 127.0.0.1 with mutual TLS, started and ended by pid."""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from chaos.campaign import live
from chaos.campaign.campaign import CampaignConfig, run_campaign
from chaos.campaign.records import ResultsDir
from chaos.campaign.summary import parse_summary
from chaos.cli import main
from chaos.cluster.dask_pool import EXTRA_HINT
from tests.chaos.campaign.test_campaign import BROKEN

distributed = pytest.importorskip("distributed", reason=f"Dask is not installed: {EXTRA_HINT}")
dask = pytest.importorskip("dask")

ROOT = Path(__file__).resolve().parents[3]
#: An exhaustive campaign's first 20 plans: every fault at a failpoint, no timing can change
#: a run's path, so the same seeds give the same fault counts wherever they run.
TWENTY: dict[str, Any] = {"mode": "exhaustive", "durable_mode": "checkpoint", "runs": 20}
FAULTS = ("kills", "daemon_kills", "space_restarts", "lost_spaces", "process_kills",
          "timeouts")


def _tls_env(directory: Path) -> dict[str, str]:
    """Throwaway certificates for every role, as Dask's configuration in the environment."""
    security = distributed.security.Security.temporary()
    directory.mkdir(mode=0o700)
    env = {"DASK_DISTRIBUTED__COMM__REQUIRE_ENCRYPTION": "True"}
    for name, pem in (("ca_file", security.tls_ca_file),
                      ("scheduler__cert", security.tls_scheduler_cert),
                      ("scheduler__key", security.tls_scheduler_key),
                      ("worker__cert", security.tls_worker_cert),
                      ("worker__key", security.tls_worker_key),
                      ("client__cert", security.tls_client_cert),
                      ("client__key", security.tls_client_key)):
        path = directory / f"{name}.pem"
        path.write_text(pem)
        path.chmod(0o600)
        env[f"DASK_DISTRIBUTED__COMM__TLS__{name.upper()}"] = str(path)
    return env


def _address_in(scheduler_file: Path, timeout: float = 300.0) -> str:
    """The scheduler's address, once its file holds it whole (the scheduler creates the
    file, then writes it: an empty or half-written one is read again)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return str(json.loads(scheduler_file.read_text())["address"])
        except (FileNotFoundError, ValueError, KeyError):
            assert time.monotonic() < deadline, f"no scheduler address in {scheduler_file}"
            time.sleep(0.2)


class Cluster:
    def __init__(self, tmp: Path, env: dict[str, str]) -> None:
        self.tmp, self.env = tmp, env
        self.procs: list[subprocess.Popen[bytes]] = []
        scheduler_file = tmp / "scheduler.json"
        self.spawn([sys.executable, "-m", "distributed.cli.dask_scheduler", "--host",
                    "127.0.0.1", "--port", "0", "--protocol", "tls", "--no-dashboard",
                    "--scheduler-file", str(scheduler_file)], "scheduler")
        self.address = _address_in(scheduler_file)
        self.workers = [self.spawn([sys.executable, "-m", "chaos", "worker", self.address,
                                    "--no-nanny", "--nworkers", "1", "--dir",
                                    str(tmp / f"w{i}")], f"worker{i}") for i in (1, 2)]
        with distributed.Client(self.address, timeout=300) as client:
            client.wait_for_workers(2, timeout=300)  # only a hang takes minutes

    def spawn(self, argv: list[str], name: str) -> subprocess.Popen[bytes]:
        log = open(self.tmp / f"{name}.log", "wb")  # noqa: SIM115 - closed with the process
        proc = subprocess.Popen(argv, cwd=ROOT, env=self.env, stdout=log,
                                stderr=subprocess.STDOUT)
        log.close()
        self.procs.append(proc)
        return proc

    def end(self) -> None:
        for proc in reversed(self.procs):
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


@pytest.fixture
def cluster(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Cluster]:
    tls = _tls_env(tmp_path / "tls")
    monkeypatch.setenv(live.LIVE_DIR_ENV, str(tmp_path / "live"))
    env = {**os.environ, **tls, live.LIVE_DIR_ENV: str(tmp_path / "live")}
    config = {"distributed.comm.require-encryption": True,
              "distributed.comm.tls.ca-file": tls["DASK_DISTRIBUTED__COMM__TLS__CA_FILE"],
              "distributed.comm.tls.client.cert":
                  tls["DASK_DISTRIBUTED__COMM__TLS__CLIENT__CERT"],
              "distributed.comm.tls.client.key":
                  tls["DASK_DISTRIBUTED__COMM__TLS__CLIENT__KEY"]}
    c = None
    with dask.config.set(config):
        try:
            c = Cluster(tmp_path, env)
            yield c
        finally:
            if c is not None:
                c.end()
            live.clean_dead()  # what a SIGKILLed worker's runs left: Spaces, by pid


def _campaign(tmp: Path, **kw: Any) -> tuple[int, dict[str, str], Path, str]:
    out = io.StringIO()
    code = run_campaign(CampaignConfig(results_root=tmp, jobs=2, **kw), out)
    text = out.getvalue()
    summary = parse_summary(next(x for x in text.splitlines() if x.startswith("SUMMARY ")))
    results = Path(next(x for x in text.splitlines() if x.startswith("results: "))[9:])
    return code, summary, results, text


def _by_seed(results: Path) -> dict[tuple[int, int], Any]:
    return {(r["index"], r["seed"]): (r["plan"], r["verdict"]["valid"], r["fired"],
                                      {k: r["counts"][k] for k in FAULTS})
            for r in ResultsDir.open(results).runs()}


def test_a_campaign_through_the_cluster_equals_it_run_locally(tmp_path: Path,
                                                              cluster: Cluster) -> None:
    code, there, results, text = _campaign(tmp_path / "cluster", cluster=cluster.address,
                                           **TWENTY)
    assert code == 0, text
    local_code, here, local, local_text = _campaign(tmp_path / "local", **TWENTY)
    assert local_code == 0, local_text
    assert there["runs"] == "20" and there["failed"] == "0"
    assert {k: there[k] for k in ("runs", "ok", "covered", *FAULTS)} == \
        {k: here[k] for k in ("runs", "ok", "covered", *FAULTS)}
    assert _by_seed(results) == _by_seed(local)
    workers = {r["worker"] for r in ResultsDir.open(results).runs()}
    assert len(workers) == 2, "both workers ran runs"


def test_a_failing_runs_directory_comes_back_with_its_record(tmp_path: Path,
                                                            cluster: Cluster) -> None:
    code, summary, results, text = _campaign(
        tmp_path, cluster=cluster.address, mode="exhaustive", durable_mode="checkpoint",
        points=("space.exited",), driver=BROKEN)
    assert code == 1 and int(summary["failed"]) > 0, text
    assert f"reproduce: python -m chaos repro {results}" in text
    failing = next(r for r in ResultsDir.open(results).runs() if r["verdict"]["valid"] is False)
    kept = Path(failing["run_dir"])
    assert kept.parent == results / "runs"  # unpacked here, not a path on the worker
    for artifact in ("state/log.sqlite", "workspace.tar", "plan.json"):
        assert (kept / artifact).is_file(), artifact
    assert not list(tmp_path.glob("w*/runs/*")), "nothing left on the workers"
    assert main(["repro", str(results), "--run", str(failing["index"])]) == 1


def test_a_worker_killed_mid_campaign_loses_no_run(tmp_path: Path, cluster: Cluster) -> None:
    campaign = subprocess.Popen(
        [sys.executable, "-m", "chaos", "run", "--mode", "transactional", "--runs", "10",
         "--steps", "4", "--cluster", cluster.address, "--results", str(tmp_path / "r")],
        cwd=ROOT, env=cluster.env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        victim, runs = cluster.workers[0], tmp_path / "w1" / "runs"
        deadline = time.time() + 300  # only a hang takes minutes
        while not list(runs.glob("*/run-*/driver-*.log")) and time.time() < deadline:
            time.sleep(0.05)  # in the middle of a run: a driver of it was launched
        assert list(runs.glob("*/run-*/driver-*.log")), "worker 1 never ran a run"
        victim.send_signal(signal.SIGKILL)
        victim.wait()
        out, _ = campaign.communicate(timeout=900)
    finally:
        if campaign.poll() is None:
            campaign.kill()
            campaign.wait()
    text = out.decode()
    assert campaign.returncode == 0, text
    summary = parse_summary(next(x for x in text.splitlines() if x.startswith("SUMMARY ")))
    assert summary["runs"] == "10" and summary["failed"] == "0", text
    records = ResultsDir.open(tmp_path / "r" / "latest").runs()
    assert sorted(r["index"] for r in records) == list(range(10))  # each exactly once
    retried = [r for r in records if r.get("retried")]
    assert retried, "the run on the killed worker ran again, and its record says so"
    assert "died" in retried[0]["retried"]["why"]
    # the killed worker's note named what its run left (its Spaces, their daemons): the
    # campaign's end had its host's workers end them (before, they outlived it)
    assert list(live.dead_campaigns()) == [], "a dead worker's note outlived the campaign"


def test_cluster_addresses_are_checked(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    assert main(["run", "--mode", "transactional", "--cluster", "local:0"]) == 254
    assert "is neither a scheduler address" in capsys.readouterr().err
    assert main(["run", "--mode", "transactional", "--cluster", "http://x:1"]) == 254
    assert "tcp://HOST:8786" in capsys.readouterr().err
    monkeypatch.setitem(sys.modules, "distributed", None)  # the extra not installed
    assert main(["run", "--mode", "transactional", "--runs", "1", "--cluster", "local:1",
                 "--results", str(tmp_path)]) == 254
    err = capsys.readouterr().err
    assert EXTRA_HINT in err and "Traceback" not in err
    assert not list(tmp_path.iterdir()), "refused before anything ran"
