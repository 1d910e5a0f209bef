"""A campaign: many seeded runs in parallel, their records, the SUMMARY, plots, exit code.

Exit codes (Jepsen's): 0 every run consistent, 1 any run inconsistent, 2 a run whose verdict
is unknown (and none inconsistent). Bad arguments (254) and a crash of the harness itself
(255) are the CLI's.
"""

from __future__ import annotations

import signal
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, TextIO

from chaos.campaign import code_identity, live
from chaos.campaign.plots import campaign_plots
from chaos.campaign.progress import Progress, faults_fired
from chaos.campaign.records import ResultsDir
from chaos.campaign.run_pool import LocalPool, RunPool
from chaos.campaign.summary import campaign_cells, cells_hit, summarize, summary_line
from chaos.errors import BackendUnavailable
from chaos.exits import EXIT_INTERRUPTED, ctrl_c_deferred, raise_noted_ctrl_c, stopping
from chaos.faults.plans import FaultPlan, HeldAction, exhaustive_plans, held_flags, leads_exhaustive
from chaos.modes.mode import CampaignMode
from chaos.modes.registry import MODES
from chaos.run.bytecode import compile_packages
from chaos.run.spec import RunSpec
from chaos.space_providers import backend, probe_backend, programs_in_space
from durable.session_log import DEFAULT_LOG_STORAGE
from scenarios import workload

EXIT = {"valid": 0, "invalid": 1, "unknown": 2, "interrupted": EXIT_INTERRUPTED}
#: How long an interrupted campaign waits for its running runs to end their drivers and
#: delete their Spaces.
ABORT_WAIT_S = 20.0
DEFAULT_RUNS = 40


@dataclass(frozen=True)
class ScriptedRun:
    """One hand-written run: a fault plan (its seed draws the scenario), on the campaign's
    preset or on ``preset`` (an agent whose steps the plan's failpoints are aimed at)."""

    plan: FaultPlan
    preset: str | None = None
    #: Steps of the scenario: the campaign's, unless the run has a preset of its own
    #: (then that preset's).
    steps: int | None = None


@dataclass(frozen=True)
class CampaignConfig:
    mode: str
    backend: str = "local"
    #: Runs of the campaign; for exhaustive, a cap on the plans (None: all of them).
    runs: int | None = None
    steps: int | None = None
    seed_base: int = 1
    jobs: int = 2
    preset: str | None = None
    durable_mode: str | None = None
    results_root: Path = Path("results")
    keep: bool = False
    #: The driver program (module or .py path); see ``RunSpec.driver``.
    driver: str = "chaos.driver"
    #: Exhaustive only: restrict the plans to these failpoints.
    points: tuple[str, ...] = ()
    #: Exhaustive only: every kind of recovery fault after every first fault.
    pairs: bool = False
    #: Start no more runs once one failed (runs already started still finish).
    stop_on_failure: bool = False
    #: Explicit seeds, one run each (instead of ``runs`` seeds from ``seed_base``): the CI
    #: subset picks the seeds that reach the cells it must cover.
    seeds: tuple[int, ...] = ()
    #: Hand-written runs (a fault plan, with the plan's seed, on this campaign's preset or
    #: their own), after the drawn runs; with these and neither ``runs`` nor ``seeds``,
    #: only these run.
    plans: tuple[ScriptedRun, ...] = ()
    #: Stale mode only: who meets the run's session (``chaos.modes.stale_kinds.KINDS``).
    stale_kind: str = "race"
    #: ``(i, n)``: run only shard i of n (1-based): the runs whose index is i - 1 modulo n,
    #: with the indices and seeds they have in the whole campaign (``chaos merge`` joins
    #: the shards' results into the whole campaign's).
    shard: tuple[int, int] | None = None
    #: Run on a Dask cluster: a scheduler's address (``tcp://HOST:8786``, ``tls://...``)
    #: or ``local:N`` (a cluster of N workers on this machine); None: ``jobs`` threads here.
    cluster: str | None = None
    #: Checkpoints as ``workspace`` or ``machine`` snapshots (microvm); ``auto``: machine on
    #: microvm, else workspace.
    snapshots: str = "auto"
    #: Redrive mode only: one kind for every run (``chaos.modes.redrive.KINDS``); None: by seed.
    redrive_kind: str | None = None
    #: Redrive mode only: a PostgreSQL server for the runs' coordinator stores
    #: (``postgresql://...``, a schema per run); None: SQLite in each run's directory.
    store: str | None = None
    #: Redrive mode only: coordinators per run sharing its store (default: 2 with a
    #: PostgreSQL store, else 1).
    coordinators: int | None = None
    #: The drivers' log storage, each with its fence: ``sqlite`` or ``jsonl``.
    log_storage: str = DEFAULT_LOG_STORAGE
    #: Standard modes: each run's plan also holds these kinds of fault (``plans.HELD_KINDS``:
    #: a frozen Space, a cut link, a clock jump; ``plans.with_held_faults``).
    held: tuple[HeldAction, ...] = ()

    @property
    def coordinator_count(self) -> int:
        return self.coordinators or (2 if self.store else 1)

    def in_shard(self, index: int) -> bool:
        return self.shard is None or index % self.shard[1] == self.shard[0] - 1

    @property
    def preset_name(self) -> str:
        if (self.preset is None and not backend(self.backend).spaces
                and not self.chosen_mode.enumerates):
            return "virtual"  # the default agent's kinds a pure-Python shell runs as bash
        return self.preset or self.chosen_mode.default_preset(self.stale_kind)

    @property
    def chosen_mode(self) -> CampaignMode:
        """The campaign mode ``mode`` names."""
        return MODES[self.mode]

    @property
    def adapter_mode(self) -> str:
        if not backend(self.backend).spaces:
            return "transactional"  # the workspace is in the log, with each call's result
        return self.durable_mode or self.chosen_mode.durable

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["results_root"] = str(self.results_root)
        d["points"] = list(self.points)
        d["seeds"] = list(self.seeds)
        d["plans"] = [{"plan": p.plan.to_json(), "preset": p.preset} for p in self.plans]
        d["preset"] = self.preset_name
        d["durable_mode"] = self.adapter_mode
        d["store"] = redacted(self.store)
        d["coordinators"] = self.coordinator_count
        del d["held"]
        d.update(held_flags(self.held))  # one field per kind: older campaigns read the same
        return d


def redacted(url: str | None) -> str | None:
    """``url`` without its password (campaign.json is shared; the password is not)."""
    if url is None:
        return None
    from urllib.parse import urlsplit, urlunsplit

    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = f"{parts.username}:***@{parts.hostname}{f':{parts.port}' if parts.port else ''}"
    return urlunsplit(parts._replace(netloc=netloc))


def repro_command(results: Path, index: int) -> str:
    return f"python -m chaos repro {results} --run {index}"


def failure_line(record: dict[str, Any], results: Path) -> str:
    v = record["verdict"]
    first = v["errors"][0] if v["errors"] else "no detail"
    state = "FAILED" if v["valid"] is False else "UNKNOWN"
    checks = ",".join(v.get("checks") or []) or "-"
    return (f"{state} run={record['index']} seed={record['seed']} mode={record['campaign_mode']}"
            f" backend={record['backend']} check={checks}: {first}\n  reproduce: "
            f"{repro_command(results, record['index'])}")


def run_line(record: dict[str, Any]) -> str:
    """A finished run's plain progress line (``Progress`` adds the count, ``(6/10)``)."""
    ok = record["verdict"]["valid"] is True
    return (f"run {record['index']} seed={record['seed']} {'ok' if ok else 'NOT OK'} "
            f"kills={record['counts']['kills']} {record['seconds']:.1f}s")


def _specs(cfg: CampaignConfig, work: Path, pool: RunPool
           ) -> tuple[Iterator[RunSpec], int, int | None]:
    """The runs (made as they are taken, so a huge campaign is never all in memory), how
    many, and for exhaustive the reachable (point, occurrence) pairs."""
    base = RunSpec(index=0, seed=cfg.seed_base, campaign_mode=cfg.mode,
                   durable_mode=cfg.adapter_mode, backend=cfg.backend, preset=cfg.preset_name,
                   steps=cfg.steps, work_dir=work, keep=cfg.keep, driver=cfg.driver,
                   stale_kind=cfg.stale_kind, redrive_kind=cfg.redrive_kind,
                   snapshots=cfg.snapshots,
                   redrive_store=cfg.store, coordinators=cfg.coordinator_count,
                   log_storage=cfg.log_storage, held=cfg.held)
    if not cfg.chosen_mode.enumerates:
        drawn = 0 if cfg.plans and cfg.runs is None else cfg.runs or DEFAULT_RUNS
        seeds = cfg.seeds or range(cfg.seed_base, cfg.seed_base + drawn)

        def made() -> Iterator[RunSpec]:
            for i, seed in enumerate(seeds):
                if cfg.in_shard(i):
                    yield replace(base, index=i, seed=seed)
            for j, p in enumerate(cfg.plans):
                if cfg.in_shard(len(seeds) + j):
                    yield replace(base, index=len(seeds) + j, seed=p.plan.seed, plan=p.plan,
                                  preset=p.preset or base.preset,
                                  steps=p.steps if p.preset else base.steps)
        whole = len(seeds) + len(cfg.plans)
        return made(), sum(1 for i in range(whole) if cfg.in_shard(i)), None
    # measure every (point, occurrence) of one fault-free run, then kill at each in turn
    reference = pool.run(replace(base, plan=FaultPlan(cfg.seed_base, ()), keep=False))
    counts = {p: n for p, n in reference["points_hit"].items()
              if not cfg.points or p in cfg.points}
    plans = exhaustive_plans(cfg.seed_base, counts, pairs=cfg.pairs)
    if cfg.runs is not None:
        plans = plans[: cfg.runs]
    specs = [replace(base, index=i + 1, plan=p) for i, p in enumerate(plans)
             if cfg.in_shard(i + 1)]
    return iter(specs), len(specs), sum(n for p, n in counts.items() if leads_exhaustive(p))


def run_campaign(cfg: CampaignConfig, out: TextIO = sys.stdout) -> int:
    """Run the campaign; raises ``BackendUnavailable`` before any run when the backend
    cannot be had here (the CLI turns that into exit 254)."""
    t0 = time.time()
    compile_packages()
    with tempfile.TemporaryDirectory(prefix="chaos-probe-") as probe:
        probe_backend(cfg.backend, Path(probe))
        if cfg.preset_name == workload.REAL and backend(cfg.backend).spaces:
            cfg = replace(cfg, preset=real_for(cfg.backend, Path(probe) / "real"))
    results = ResultsDir.create(cfg.results_root, cfg.mode, cfg.backend)
    results.write_json("campaign.json", {**cfg.to_json(),
                                         "code": code_identity.current().to_json()})
    note = live.Campaign.open()
    try:
        return _run(cfg, results, note, t0, out)
    finally:
        note.close()


def real_for(backend: str, probe: Path) -> str:
    """The ``real`` preset as the bundled workloads a Space of ``backend`` can run
    (``real:<name>,...``): their programs are asked of a Space, not of this machine."""
    loaded = [workload.load(str(p)) for p in workload.bundled()]
    have = programs_in_space(backend, probe, sorted({r for w in loaded for r in w.requires}))
    usable = [w.name for w in loaded if set(w.requires) <= have]
    if not usable:
        raise BackendUnavailable(f"no bundled workload can run on {backend} Spaces (they "
                                 f"have none of {sorted({r for w in loaded for r in w.requires})})")
    return f"{workload.REAL}:{','.join(usable)}"


def _pool(cfg: CampaignConfig, results: ResultsDir, note: live.Campaign) -> RunPool:
    if cfg.cluster is None:
        return LocalPool(cfg.jobs, note)
    from chaos.cluster.dask_pool import (
        ClusterPool,  # the optional extra: imported only when asked for
    )

    return ClusterPool(cfg.cluster, results)


def _run(cfg: CampaignConfig, results: ResultsDir, note: live.Campaign, t0: float,
         out: TextIO) -> int:
    records: list[dict[str, Any]] = []
    with SigintHold() as hold:
        with _pool(cfg, results, note) as pool:
            specs, total, reachable = _specs(cfg, results.runs_dir, pool)
            with Progress(total, title=cfg.mode) as progress:
                interrupted = _drive(cfg, results, pool, specs, records, progress, out, hold)
        code = publish(cfg, results, records, time.time() - t0, reachable=reachable,
                       interrupted=interrupted, out=out)
    if not hold.came:
        return code
    print("chaos: interrupted after the runs ended (the SUMMARY was written whole, of every "
          "run)", file=sys.stderr, flush=True)
    return EXIT["interrupted"]


def _drive(cfg: CampaignConfig, results: ResultsDir, pool: RunPool, specs: Iterator[RunSpec],
           records: list[dict[str, Any]], progress: Progress, out: TextIO,
           hold: SigintHold) -> bool:
    """Run ``specs`` on ``pool`` to the end, or until Ctrl-C (then end the runs in flight),
    recording each finished run in ``records`` and ``results``; whether interrupted. Ctrl-C
    is held off (``hold``) from the moment the runs are over, so that the closing of the
    pool and the SUMMARY are never cut short."""
    taken: dict[int, RunSpec] = {}  # exhaustive: the runs whose lead may be retried

    def finished(record: dict[str, Any]) -> bool:
        """Record a run that ended by itself; whether it failed."""
        if record.get("interrupted"):
            return False  # cut short by Ctrl-C: proves nothing, recorded nowhere
        spec = taken.pop(record["index"], None)
        if spec is not None and (again := lead_retry(spec, record)) is not None:
            with ctrl_c_deferred():  # its kill did not land: the same plan once more
                pool.submit(again)
            taken[again.index] = again
            return False
        records.append(record)
        results.append_run(record)
        valid = record["verdict"]["valid"]
        progress.advance(run_line(record), failed=valid is False, unknown=valid == "unknown",
                         faults=faults_fired(record["counts"]))
        if valid is True:
            return False
        progress.echo(failure_line(record, results.path), out)
        return True

    stop = False
    try:
        while True:
            raise_noted_ctrl_c()  # one that Python dropped (``noting_ctrl_c``) ends it here
            # A bounded window of runs in flight: specs are made as they are taken.
            while not stop and pool.in_flight() < 2 * pool.capacity():
                spec = next(specs, None)
                if spec is None:
                    break
                with ctrl_c_deferred():  # a run half-submitted is one the abort cannot see
                    pool.submit(spec)
                if cfg.chosen_mode.enumerates:
                    taken[spec.index] = spec
            if not pool.in_flight():
                hold.hold()
                return False
            # Deferred: a Ctrl-C between two finished runs' bookkeeping dropped the second
            # (taken from the pool, recorded nowhere); now it waits at most the 1 s wait.
            with ctrl_c_deferred():
                for record in pool.finished(timeout=1.0):
                    stop = (finished(record) and cfg.stop_on_failure) or stop
    except KeyboardInterrupt:
        stopping()
        progress.echo(f"chaos: interrupted: ending {pool.in_flight()} running run(s) (their "
                      "drivers by pid, their Spaces); no new run starts", sys.stderr)
        pool.abort()
        deadline = time.time() + ABORT_WAIT_S
        while pool.in_flight() and time.time() < deadline:
            for record in pool.finished(timeout=max(0.0, deadline - time.time())):
                finished(record)
        hold.hold()
        return True


class SigintHold:
    """Ctrl-C raises ``KeyboardInterrupt`` (in the main thread) until ``hold()``; from then
    until the block ends it is only noted in ``came``. Holding from inside the code that
    decides the work is over leaves no instant where a Ctrl-C escapes half-way."""

    def __init__(self) -> None:
        self.came: list[int] = []
        self._before: Any = None

    def hold(self) -> None:
        if self._before is None and threading.current_thread() is threading.main_thread():
            self._before = signal.signal(signal.SIGINT,
                                         lambda signum, _frame: self.came.append(signum))

    def __enter__(self) -> SigintHold:
        return self

    def __exit__(self, *exc: object) -> None:
        if self._before is not None:
            signal.signal(signal.SIGINT, self._before)


#: How many times an exhaustive run is tried before its (point, occurrence) counts as not
#: covered: a run takes the reference run's path, unless something outside the plan (the
#: machine's load) moved it.
LEAD_TRIES = 3


def lead_missed(record: dict[str, Any]) -> str | None:
    """Why an exhaustive run's lead fault (the (point, occurrence) it exists for) did not
    land, or None when it did."""
    if 0 in record.get("fired", []):
        return None
    lead = record["plan"]["faults"][0]
    said = [op["value"] for op in record.get("history", [])
            if op.get("process") == "nemesis" and "skipped" in str(op.get("value"))]
    return (said[0] if said else f"the run never reached {lead['point']}#"
            f"{lead['occurrence']} (its driver took another path than the reference run)")


def lead_retry(spec: RunSpec, record: dict[str, Any]) -> RunSpec | None:
    """``spec`` to run again when ``record`` missed its lead fault and has tries left; the
    misses so far ride along in ``spec.lead_misses`` and end in the record that stays."""
    missed = lead_missed(record)
    if missed is None or record["verdict"]["valid"] is not True:
        record["lead_misses"] = list(spec.lead_misses)
        return None
    misses = (*spec.lead_misses, missed)
    if len(misses) >= LEAD_TRIES:
        record["lead_misses"] = list(misses)
        return None
    return replace(spec, lead_misses=misses)


def publish(cfg: CampaignConfig, results: ResultsDir, records: list[dict[str, Any]],
            seconds: float, *, reachable: int | None = None, interrupted: bool = False,
            out: TextIO = sys.stdout) -> int:
    """The campaign's SUMMARY (written, printed), its unreached cells and plots, from its
    run records; returns its exit code. A campaign and ``chaos merge`` both end here."""
    records.sort(key=lambda r: r["index"])
    covered = None
    if cfg.chosen_mode.enumerates:
        fired = {(lead["point"], lead["occurrence"]) for r in records
                 for lead in r["plan"]["faults"][:1] if 0 in r.get("fired", [])}
        covered = len(fired)
        if reachable is not None:
            print(f"exhaustive: {covered} of {reachable} (failpoint, occurrence) pairs "
                  f"covered, {len({p for p, _ in fired})} distinct failpoints", file=out)
        for r in records:
            if r.get("lead_misses"):
                lead = r["plan"]["faults"][0]
                state = "not covered" if lead_missed(r) else "covered on a retry"
                print(f"exhaustive: run {r['index']} ({lead['point']}#{lead['occurrence']}) "
                      f"{state} after {len(r['lead_misses'])} miss(es): "
                      f"{r['lead_misses'][-1]}", file=out)
    summary = summarize(mode=cfg.mode, backend=cfg.backend,
                        seed_base=cfg.seeds[0] if cfg.seeds else cfg.seed_base,
                        records=records, seconds=seconds, covered=covered,
                        durable_mode=cfg.adapter_mode, log_storage=cfg.log_storage,
                        held=cfg.held)
    missed = sorted(campaign_cells(cfg.backend, cfg.adapter_mode) - cells_hit(records))
    if missed:
        print(f"cells not reached ({len(missed)}; mode, decision, tool, cause):", file=out)
        for cell in missed:
            print(f"  {' '.join(cell)}", file=out)
    for line in cfg.chosen_mode.report(records):
        print(line, file=out)
    if interrupted:
        summary["verdict"] = "interrupted"  # of what ran: the finished runs' records
    results.write_json("summary.json", summary)
    line = summary_line(summary)
    (results.path / "SUMMARY").write_text(line + "\n")
    campaign_plots(records, results.path)
    print(line, file=out, flush=True)
    print(f"results: {results.path}", file=out, flush=True)
    return EXIT[summary["verdict"]]
