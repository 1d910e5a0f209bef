"""``chaos repro`` and ``chaos analyze``: one run replayed, or stored runs re-checked.

``repro`` replays a stored run's own plan (``RESULTS --run N``), a plan drawn from a seed
(``--seed S --mode M``) or a shrunk plan (``--plan shrunk.json``) and prints its verdict;
``shrink`` cuts a failing run down (``chaos.repro.shrink``); ``analyze`` re-runs the checker on the
observations stored in ``runs.jsonl`` without running anything (Jepsen's ``analyze``).
Both exit as a campaign does: 0 valid, 1 invalid, 2 unknown.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from pathlib import Path

from chaos.campaign import code_identity
from chaos.campaign.campaign import EXIT, CampaignConfig
from chaos.campaign.records import ResultsDir
from chaos.checks.checker import check
from chaos.checks.model import VERDICT_NAMES, Observation, Valid, merge
from chaos.errors import BadArguments
from chaos.faults.plans import Fault, FaultPlan, held_of
from chaos.modes.registry import MODES
from chaos.repro.shrink import SHRUNK_NAME, run_shrink, spec_of_shrunk
from chaos.run.runner import execute
from chaos.run.spec import RunSpec
from durable.session_log import DEFAULT_LOG_STORAGE
from scenarios import scenario_of


def _brief(fault: Fault) -> str:
    return f"{fault.action}@{fault.point or fault.delay}"


def stored_spec(results_dir: Path, index: int | None, store_url: str | None = None, *,
                any_code: bool = False) -> RunSpec:
    """Run ``index`` of the campaign in ``results_dir``, refused when the campaign ran other
    code (unless ``any_code``: ``code_identity.check_same``)."""
    if index is None:
        raise BadArguments("repro RESULTS needs --run N (the run index from the failure line)")
    results = ResultsDir.open(results_dir)
    campaign = results.read_json("campaign.json")
    warning = code_identity.check_same(campaign.get("code"), f"the campaign {results.path}",
                                       any_code=any_code)
    if warning:
        print(warning, file=sys.stderr)
    # The campaign's PostgreSQL server is not in campaign.json with its password: a repro
    # takes it from --store again, else the run keeps a SQLite store of its own.
    store = store_url
    record = next((r for r in results.runs() if r["index"] == index), None)
    if record is None:
        raise BadArguments(f"{results_dir} has no run {index}")
    return RunSpec(index=record["index"], seed=record["seed"],
                   campaign_mode=record["campaign_mode"], durable_mode=record["durable_mode"],
                   backend=record["backend"], preset=record["preset"], steps=record["steps"],
                   work_dir=results.path / "repro", plan=FaultPlan.from_json(record["plan"]),
                   keep=True,
                   driver=campaign.get("driver", "chaos.driver"),
                   stale_kind=record.get("stale_kind") or "race",
                   redrive_kind=campaign.get("redrive_kind"), redrive_store=store,
                   coordinators=campaign.get("coordinators") or 1 if store else 1,
                   log_storage=campaign.get("log_storage") or DEFAULT_LOG_STORAGE,
                   held=held_of(campaign))


def drawn_spec(args: argparse.Namespace) -> RunSpec:
    if args.seed is None or args.mode is None:
        raise BadArguments("repro needs RESULTS --run N, or --seed S --mode M")
    if MODES[args.mode].enumerates:
        raise BadArguments(f"{args.mode} plans are not drawn from a seed; use RESULTS --run N")
    cfg = CampaignConfig(mode=args.mode, backend=args.backend, preset=args.preset,
                         durable_mode=args.durable_mode, stale_kind=args.stale_kind,
                         store=args.store)
    return RunSpec(index=0, seed=args.seed, campaign_mode=args.mode,
                   durable_mode=cfg.adapter_mode, backend=args.backend,
                   preset=cfg.preset_name, steps=args.steps,
                   work_dir=Path("results") / "repro", keep=True, stale_kind=args.stale_kind,
                   redrive_kind=args.redrive_kind, redrive_store=args.store,
                   coordinators=cfg.coordinator_count, log_storage=args.log_storage,
                   held=held_of(vars(args)))


def repro(args: argparse.Namespace) -> int:
    if args.plan is not None:
        spec = spec_of_shrunk(args.plan, args.plan.parent / "repro", any_code=args.any_code)
    elif args.results is not None:
        spec = stored_spec(args.results, args.run, args.store, any_code=args.any_code)
    else:
        spec = drawn_spec(args)
    record = execute(spec)
    v = record.verdict
    print(f"repro run={spec.index} seed={spec.seed} mode={spec.campaign_mode} "
          f"backend={spec.backend} plan={[_brief(f) for f in record.plan.faults]}")
    for e in v.errors:
        print(f"  {e.splitlines()[0] if e else e}")
    print(f"VERDICT valid={v.valid} kills={record.counts['kills']} run_dir={record.run_dir}")
    return EXIT[VERDICT_NAMES[v.valid]]


def shrink(args: argparse.Namespace) -> int:
    """``chaos shrink``: the failing run of ``RESULTS --run N``, or of ``--seed S --mode M``
    (run once first), shrunk; ``shrunk.json`` next to the run."""
    if args.jobs < 1 or args.tries < 1 or args.confirm < 1:
        raise BadArguments("--jobs, --tries and --confirm must be at least 1")
    if args.results is not None:
        spec = stored_spec(args.results, args.run, args.store, any_code=args.any_code)
        results = ResultsDir.open(args.results)
        record = next(r for r in results.runs() if r["index"] == args.run)
        kept = Path(record["run_dir"]) if record.get("run_dir") else None
        dest = (kept if kept is not None and kept.is_dir()
                else results.path / f"run-{args.run:04d}") / SHRUNK_NAME
    else:
        spec = drawn_spec(args)
        print(f"shrink: running seed {spec.seed} once to see it fail", flush=True)
        ran = execute(spec)
        record = ran.to_json()
        spec = replace(spec, plan=ran.plan)
        dest = Path(ran.run_dir or spec.work_dir) / SHRUNK_NAME
    dest.parent.mkdir(parents=True, exist_ok=True)
    return run_shrink(spec, record, dest, jobs=args.jobs, tries=args.tries,
                      confirm=args.confirm)


def analyze(args: argparse.Namespace) -> int:
    results = ResultsDir.open(args.results)
    verdicts: list[Valid] = []
    for r in results.runs():
        if r["observation"] is None:
            verdicts.append("unknown")
            print(f"run {r['index']}: no observation recorded: unknown")
            continue
        scenario = scenario_of(r["preset"], r["seed"], steps=r["steps"])
        v = check(scenario, Observation.from_json(r["observation"]),
                  campaign_mode=r["campaign_mode"])
        verdicts.append(v.valid)
        if v.valid != r["verdict"]["valid"]:
            print(f"run {r['index']}: stored verdict {r['verdict']['valid']}, now {v.valid}")
        if v.valid is not True:
            print(f"run {r['index']} seed={r['seed']}: {v.errors[0] if v.errors else ''}")
    print(f"ANALYZE runs={len(verdicts)} ok={sum(v is True for v in verdicts)} "
          f"failed={sum(v is False for v in verdicts)} "
          f"unknown={sum(v == 'unknown' for v in verdicts)}")
    return EXIT[VERDICT_NAMES[merge(verdicts)]]
