"""``chaos`` / ``python -m chaos``: run a campaign, reproduce a run, re-check records, clean up.

    chaos run --mode M --backend B --runs N --steps K --seed-base S [--jobs J]
    chaos repro RESULTS --run N          (or: chaos repro --seed S --mode M [--backend B])
    chaos analyze RESULTS
    chaos ci [--slice NAME ...] [--results DIR] [--stop-on-failure]
    chaos clean [--results DIR]
    chaos image build [--image NAME] [--base IMAGE]

Flags of ``run`` mirror the environment variables ``CRASH_MODE``, ``CRASH_BACKEND``,
``CRASH_RUNS``, ``CRASH_STEPS``, ``CRASH_SEED_BASE`` and ``CRASH_DURABLE_MODE``, which work
alone too. Exit codes: 0 valid, 1 invalid, 2 unknown, 130 interrupted (Ctrl-C: the
finished runs' records and a SUMMARY of them are kept, ``verdict=interrupted``), 254 bad
arguments or configuration, 255 the harness itself crashed.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import re
import sys
import traceback
from pathlib import Path
from typing import NoReturn

from scenarios import PresetError, generate, load

from . import live
from .backends import BACKENDS, BackendUnavailable
from .campaign import EXIT, MODES, CampaignConfig, run_campaign
from .checker import Observation, Valid, check, merge
from .ci_subset import BY_NAME, run_slices
from .faults import ALL_POINTS, FaultPlan
from .records import BadResults, ResultsDir
from .runner import Run, RunSpec
from .stale import KINDS

EXIT_INTERRUPTED = 130
EXIT_BAD_ARGS = 254
EXIT_CRASHED = 255


class BadArguments(Exception):
    """Raised for a configuration the campaign cannot run; the CLI prints it and exits 254."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        print(f"chaos: error: {message}", file=sys.stderr)
        sys.exit(EXIT_BAD_ARGS)


#: The most runs one campaign takes (more is a typo, or a job for ``--shard``/a cluster).
MAX_RUNS = 1_000_000
DURABLE_MODES = ("auto", "transactional", "checkpoint")


def _env_int(name: str) -> int | None:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return None
    if not re.fullmatch(r"-?[0-9]+", raw.strip()):
        raise BadArguments(f"Expected an integer in {name} but got {name}={raw!r}")
    return int(raw)


def _env_choice(flag: str, value: str | None, env: str, choices: tuple[str, ...]) -> None:
    """argparse checks the choices of a flag given, not of a default taken from ``env``."""
    if value is not None and value not in choices:
        raise BadArguments(f"{env}={value!r} (the default of {flag}) is not one of "
                           f"{', '.join(choices)}")


def _check_driver(driver: str) -> None:
    if driver.endswith(".py"):
        if not Path(driver).is_file():
            raise BadArguments(f"--driver {driver}: no such file; pass a driver program's "
                               ".py path or a module name (default chaos.driver)")
        return
    try:
        found = importlib.util.find_spec(driver)
    except (ImportError, ValueError):
        found = None
    if found is None:
        raise BadArguments(f"--driver {driver}: no such module; pass a module name (run with "
                           "-m, default chaos.driver) or a driver program's .py path")


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="chaos", description="Crash campaigns against durable agent Spaces.")
    sub = p.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run a campaign and print its SUMMARY")
    run.add_argument("--mode", choices=MODES, default=os.environ.get("CRASH_MODE"))
    run.add_argument("--backend", choices=BACKENDS,
                     default=os.environ.get("CRASH_BACKEND", "local"))
    run.add_argument("--runs", type=int, default=None)
    run.add_argument("--steps", type=int, default=None)
    run.add_argument("--seed-base", type=int, default=None)
    run.add_argument("--jobs", type=int, default=os.cpu_count() or 2)
    run.add_argument("--preset", default=None, help="scenario preset name or YAML path")
    run.add_argument("--durable-mode", choices=DURABLE_MODES,
                     default=os.environ.get("CRASH_DURABLE_MODE") or None)
    run.add_argument("--results", type=Path, default=Path("results"))
    run.add_argument("--keep", action="store_true", help="keep every run's directory")
    run.add_argument("--driver", default="chaos.driver",
                     help="driver program: a module (run with -m) or a .py file")
    run.add_argument("--points", default="",
                     help="exhaustive only: comma-separated failpoints to cover (default all)")
    run.add_argument("--pairs", action="store_true",
                     help="exhaustive only: every kind of recovery fault after every first "
                     "fault (default: the kinds in turn)")
    run.add_argument("--stale-kind", choices=KINDS,
                     default=os.environ.get("CRASH_STALE_KIND", "race"),
                     help="stale mode: an older driver of the session (race), the same race "
                          "while a command that left a detached writer runs (detached), or "
                          "a second session on the same Spaces provider (foreign)")
    run.add_argument("--stop-on-failure", action="store_true",
                     help="start no more runs once one failed")
    ci = sub.add_parser("ci", help="run the fast fixed-seed crash subset that gates CI")
    ci.add_argument("--slice", action="append", default=[], dest="slices",
                    help=f"only this slice (repeatable); one of: {', '.join(BY_NAME)}")
    ci.add_argument("--results", type=Path, default=Path("results") / "ci")
    ci.add_argument("--jobs", type=int, default=2)
    ci.add_argument("--stop-on-failure", action="store_true",
                    help="stop at the first failing run")
    rep = sub.add_parser("repro", help="replay one run's fault plan and print its verdict")
    rep.add_argument("results", type=Path, nargs="?")
    rep.add_argument("--run", type=int)
    rep.add_argument("--seed", type=int)
    rep.add_argument("--mode", choices=MODES)
    rep.add_argument("--backend", choices=BACKENDS, default="local")
    rep.add_argument("--preset")
    rep.add_argument("--steps", type=int)
    rep.add_argument("--durable-mode", choices=("auto", "transactional", "checkpoint"))
    rep.add_argument("--stale-kind", choices=KINDS, default="race")
    ana = sub.add_parser("analyze", help="re-run the checker on stored run records")
    ana.add_argument("results", type=Path)
    cln = sub.add_parser("clean", help="remove Spaces left behind by crashed campaigns")
    cln.add_argument("--results", type=Path, default=Path("results"))
    cln.add_argument("--backend", choices=("all", "local", "docker"), default="all",
                     help="which Spaces to remove (docker: every campaign's, running or not)")
    img = sub.add_parser("image", help="build the Docker Space image (as ci/build-images.sh)")
    img_sub = img.add_subparsers(dest="image_command", required=True)
    imb = img_sub.add_parser("build", help="build durable-space (a debootstrap'd base when "
                             "debian:bookworm-slim cannot be pulled); fast when cached")
    imb.add_argument("--image", default="durable-space")
    imb.add_argument("--base", default=None, help="use this base image as is")
    return p


def _campaign_config(args: argparse.Namespace) -> CampaignConfig:
    if args.mode is None:
        raise BadArguments("no campaign mode: pass --mode or set CRASH_MODE "
                           f"(one of {', '.join(MODES)})")
    if args.mode not in MODES:
        raise BadArguments(f"CRASH_MODE={args.mode!r} is not a mode; use one of {MODES}")
    _env_choice("--backend", args.backend, "CRASH_BACKEND", BACKENDS)
    _env_choice("--durable-mode", args.durable_mode, "CRASH_DURABLE_MODE", DURABLE_MODES)
    _env_choice("--stale-kind", args.stale_kind, "CRASH_STALE_KIND", KINDS)
    _check_driver(args.driver)
    if args.results.exists() and not args.results.is_dir():
        raise BadArguments(f"--results {args.results} is a file, not a directory; pass the "
                           "directory campaigns are written under")
    runs = args.runs if args.runs is not None else _env_int("CRASH_RUNS")
    steps = args.steps if args.steps is not None else _env_int("CRASH_STEPS")
    seed = args.seed_base if args.seed_base is not None else _env_int("CRASH_SEED_BASE")
    if runs is not None and not 1 <= runs <= MAX_RUNS:
        raise BadArguments(f"--runs must be from 1 to {MAX_RUNS}, got {runs}")
    if steps is not None and steps < 1:
        raise BadArguments(f"--steps must be at least 1, got {steps}")
    if args.jobs < 1:
        raise BadArguments(f"--jobs must be at least 1, got {args.jobs}")
    cfg = CampaignConfig(mode=args.mode, backend=args.backend, runs=runs, steps=steps,
                         seed_base=1 if seed is None else seed, jobs=args.jobs,
                         preset=args.preset, durable_mode=args.durable_mode,
                         results_root=args.results, keep=args.keep, driver=args.driver,
                         points=tuple(p for p in args.points.split(",") if p),
                         pairs=args.pairs, stop_on_failure=args.stop_on_failure,
                         stale_kind=args.stale_kind)
    unknown = sorted(set(cfg.points) - set(ALL_POINTS))
    if unknown:
        raise BadArguments(f"unknown failpoint(s) {unknown}; known: {sorted(ALL_POINTS)}")
    load(cfg.preset_name)  # a bad preset is a bad argument, before anything runs
    return cfg


def _brief(fault: dict) -> str:
    return f"{fault['action']}@{fault['point'] or fault['delay']}"


def _repro(args: argparse.Namespace) -> int:
    if args.results is not None:
        if args.run is None:
            raise BadArguments("repro RESULTS needs --run N (the run index from the failure line)")
        results = ResultsDir.open(args.results)
        record = next((r for r in results.runs() if r["index"] == args.run), None)
        if record is None:
            raise BadArguments(f"{args.results} has no run {args.run}")
        spec = RunSpec(index=record["index"], seed=record["seed"],
                       campaign_mode=record["campaign_mode"], durable_mode=record["durable_mode"],
                       backend=record["backend"], preset=record["preset"],
                       steps=record["steps"], work_dir=results.path / "repro",
                       plan=FaultPlan.from_json(record["plan"]), keep=True,
                       driver=results.read_json("campaign.json").get("driver", "chaos.driver"),
                       stale_kind=record.get("stale_kind") or "race")
    else:
        if args.seed is None or args.mode is None:
            raise BadArguments("repro needs RESULTS --run N, or --seed S --mode M")
        cfg = CampaignConfig(mode=args.mode, backend=args.backend, preset=args.preset,
                             durable_mode=args.durable_mode, stale_kind=args.stale_kind)
        if args.mode == "exhaustive":
            raise BadArguments("exhaustive plans are not drawn from a seed; use RESULTS --run N")
        spec = RunSpec(index=0, seed=args.seed, campaign_mode=args.mode,
                       durable_mode=cfg.adapter_mode, backend=args.backend,
                       preset=cfg.preset_name, steps=args.steps,
                       work_dir=Path("results") / "repro", keep=True, stale_kind=args.stale_kind)
    record = Run(spec).execute()
    v = record["verdict"]
    print(f"repro run={spec.index} seed={spec.seed} mode={spec.campaign_mode} "
          f"backend={spec.backend} plan={[_brief(f) for f in record['plan']['faults']]}")
    for e in v["errors"]:
        print(f"  {e.splitlines()[0] if e else e}")
    print(f"VERDICT valid={v['valid']} kills={record['counts']['kills']} "
          f"run_dir={record['run_dir']}")
    return EXIT[{True: "valid", False: "invalid"}.get(v["valid"], "unknown")]


def _analyze(args: argparse.Namespace) -> int:
    results = ResultsDir.open(args.results)
    verdicts: list[Valid] = []
    for r in results.runs():
        if r["observation"] is None:
            verdicts.append("unknown")
            print(f"run {r['index']}: no observation recorded: unknown")
            continue
        scenario = generate(r["seed"], load(r["preset"]), steps=r["steps"])
        v = check(scenario, Observation.from_json(r["observation"]),
                  campaign_mode=r["campaign_mode"])
        verdicts.append(v.valid)
        if v.valid != r["verdict"]["valid"]:
            print(f"run {r['index']}: stored verdict {r['verdict']['valid']}, now {v.valid}")
        if v.valid is not True:
            print(f"run {r['index']} seed={r['seed']}: {v.errors[0] if v.errors else ''}")
    overall = merge(verdicts)
    print(f"ANALYZE runs={len(verdicts)} ok={sum(v is True for v in verdicts)} "
          f"failed={sum(v is False for v in verdicts)} "
          f"unknown={sum(v == 'unknown' for v in verdicts)}")
    return EXIT[{True: "valid", False: "invalid"}.get(overall, "unknown")]  # type: ignore[arg-type]


def _ci(args: argparse.Namespace) -> int:
    unknown = sorted(set(args.slices) - set(BY_NAME))
    if unknown:
        raise BadArguments(f"no CI slice {unknown}; known: {', '.join(BY_NAME)}")
    if args.jobs < 1:
        raise BadArguments(f"--jobs must be at least 1, got {args.jobs}")
    return run_slices(args.slices, results_root=args.results, jobs=args.jobs,
                      stop_on_failure=args.stop_on_failure)


def _clean(args: argparse.Namespace) -> int:
    from backends.local import LocalSpaces

    campaigns, killed = live.clean_dead()
    if campaigns:
        print(f"clean: ended {campaigns} dead campaign(s): {killed} process(es) killed, their "
              "Spaces and temp directories removed")
    removed = 0
    for spaces_dir in sorted(args.results.glob("**/spaces")) if args.backend != "docker" else []:
        provider = LocalSpaces(spaces_dir)
        for name in provider.names():
            provider.delete(name)
            removed += 1
    if args.backend == "local":
        print(f"clean: removed {removed} Space(s)")
        return 0
    try:
        from backends.docker import DockerSpaces, DockerUnavailable
    except ImportError:  # no docker SDK here: no docker Spaces either
        pass
    else:
        try:
            removed += DockerSpaces.clean_all()
        except DockerUnavailable as exc:
            print(f"clean: docker Spaces not cleaned: {exc}", file=sys.stderr)
    print(f"clean: removed {removed} Space(s)")
    return 0


def _image(args: argparse.Namespace) -> int:
    from backends.docker.image import build

    code, seconds = build(image=args.image, base=args.base)
    print(f"image: build of {args.image} {'ok' if code == 0 else f'failed (exit {code})'} "
          f"in {seconds:.1f}s")
    return 0 if code == 0 else EXIT_BAD_ARGS


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.command == "run":
            return run_campaign(_campaign_config(args))
        if args.command == "repro":
            return _repro(args)
        if args.command == "analyze":
            return _analyze(args)
        if args.command == "ci":
            return _ci(args)
        if args.command == "image":
            return _image(args)
        return _clean(args)
    except (BadArguments, PresetError, BackendUnavailable, BadResults, FileNotFoundError,
            NotADirectoryError) as exc:
        print(f"chaos: {exc}", file=sys.stderr)
        return EXIT_BAD_ARGS
    except KeyboardInterrupt:
        print("chaos: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except Exception:
        traceback.print_exc()
        print("chaos: the harness itself crashed (exit 255); the traceback above says where",
              file=sys.stderr)
        return EXIT_CRASHED


__all__ = ["main"]
