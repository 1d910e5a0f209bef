"""``chaos`` / ``python -m chaos``: run a campaign, reproduce a run, re-check records, clean up.

    chaos run --mode M --backend B --runs N --steps K --seed-base S [--jobs J]
              [--shard I/N] [--cluster tcp://HOST:8786 | local:N] [--quiet | --verbose]
    chaos merge SHARD_RESULTS... [--results DIR]
    chaos worker tcp://HOST:8786 [--dir DIR] [--nworkers N] [dask worker flags]
    chaos repro RESULTS --run N          (or: --seed S --mode M [--backend B], or --plan F)
    chaos shrink RESULTS --run N [--jobs J] [--quiet | --verbose]
                                         (or: --seed S --mode M ...)
    chaos analyze RESULTS
    chaos ci [--slice NAME ...] [--results DIR] [--stop-on-failure]
    chaos clean [--results DIR]
    chaos image build [--image NAME] [--base IMAGE]

Flags of ``run`` mirror the environment variables ``CRASH_MODE``, ``CRASH_BACKEND``,
``CRASH_RUNS``, ``CRASH_STEPS``, ``CRASH_SEED_BASE`` and ``CRASH_DURABLE_MODE``, which work
alone too. ``run`` and ``shrink`` show their progress on stderr: a live bar on a terminal,
a line per run otherwise (``--quiet``: neither; ``--verbose``: the lines on a terminal too;
``chaos.campaign.progress``). Exit codes: 0 valid, 1 invalid, 2 unknown, 130 interrupted
(Ctrl-C: the finished runs' records and a SUMMARY of them are kept,
``verdict=interrupted``), 254 bad arguments or configuration, 255 the harness itself
crashed.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import NoReturn

from chaos.campaign import progress
from chaos.campaign.campaign import run_campaign
from chaos.campaign.ci_subset import BY_NAME, run_slices
from chaos.campaign.run_args import DURABLE_MODES, campaign_config
from chaos.clean import clean
from chaos.cluster.merge import merge
from chaos.errors import BackendUnavailable, BadArguments, BadResults
from chaos.exits import EXIT_BAD_ARGS, guarded
from chaos.faults.plans import HELD_KINDS
from chaos.modes.redrive import KINDS as REDRIVE_KINDS
from chaos.modes.registry import MODES
from chaos.modes.stale_kinds import KINDS
from chaos.repro.replay import analyze, repro, shrink
from chaos.space_providers import BACKEND_DESCRIPTORS, BACKENDS
from durable.session_log import DEFAULT_LOG_STORAGE, LOG_NAMES
from scenarios import PresetError, WorkloadError


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        print(f"chaos: error: {message}", file=sys.stderr)
        sys.exit(EXIT_BAD_ARGS)


def _one_run(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """The flags that name one run: ``RESULTS --run N``, or a seed and its campaign."""
    p.add_argument("results", type=Path, nargs="?")
    p.add_argument("--run", type=int)
    p.add_argument("--seed", type=int)
    p.add_argument("--mode", choices=tuple(MODES))
    p.add_argument("--backend", choices=BACKENDS, default="local")
    p.add_argument("--preset")
    p.add_argument("--steps", type=int)
    p.add_argument("--durable-mode", choices=DURABLE_MODES)
    p.add_argument("--stale-kind", choices=KINDS, default="race")
    p.add_argument("--redrive-kind", choices=REDRIVE_KINDS, default=None)
    p.add_argument("--store", default=None, metavar="URL",
                   help="redrive: a PostgreSQL server for the coordinator store")
    p.add_argument("--log", choices=tuple(LOG_NAMES), dest="log_storage",
                   default=DEFAULT_LOG_STORAGE, help="with --seed: the drivers' log storage")
    for kind in HELD_KINDS.values():
        p.add_argument(kind.flag, action="store_true",
                       help=f"with --seed: the campaign ran with chaos run {kind.flag}")
    p.add_argument("--any-code", action="store_true",
                   help="replay a run made by other code than this checkout's (refused "
                   "otherwise: it would drive a different system)")
    return p


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="chaos", description="Crash campaigns against durable agent Spaces.")
    sub = p.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run a campaign and print its SUMMARY")
    run.add_argument("--mode", choices=tuple(MODES), default=os.environ.get("CRASH_MODE"))
    run.add_argument("--backend", choices=BACKENDS,
                     default=os.environ.get("CRASH_BACKEND", "local"))
    run.add_argument("--runs", type=int, default=None)
    run.add_argument("--steps", type=int, default=None)
    run.add_argument("--seed-base", type=int, default=None)
    run.add_argument("--jobs", type=int, default=os.cpu_count() or 2)
    run.add_argument("--preset", default=None,
                     help="scenario preset name or YAML path; 'real' draws a bundled workload "
                          "per run")
    run.add_argument("--workload", default=None,
                     help="a workload file (a user's own tool calls, checked against a "
                          "golden run), or the name of a bundled one (scenarios/workloads)")
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
    run.add_argument("--snapshots", choices=("auto", "workspace", "machine"),
                     default=os.environ.get("CRASH_SNAPSHOTS", "auto"),
                     help="checkpoints as workspace snapshots or whole-machine ones "
                          "(microvm); auto: machine on microvm, else workspace")
    run.add_argument("--redrive-kind", choices=REDRIVE_KINDS,
                     default=os.environ.get("CRASH_REDRIVE_KIND") or None,
                     help="redrive mode: only this kind of run (default: each run's kind by "
                          "its seed)")
    run.add_argument("--store", default=os.environ.get("CRASH_STORE") or None,
                     metavar="URL", help="redrive mode: a PostgreSQL server for the runs' "
                     "coordinator stores (postgresql://user:password@host:port/db; a schema "
                     "per run); default: SQLite in each run's directory")
    run.add_argument("--coordinators", type=int, default=None,
                     help="redrive mode: coordinators sharing each run's store (default: 2 "
                          "with --store, else 1)")
    run.add_argument("--log", choices=tuple(LOG_NAMES), dest="log_storage",
                     default=os.environ.get("CRASH_LOG") or DEFAULT_LOG_STORAGE,
                     help="the drivers' log: SQLite with its exact fence (default), or JSONL "
                          "with the file fence")
    for kind in HELD_KINDS.values():  # --pause-spaces, or CRASH_PAUSE_SPACES=1, ...
        run.add_argument(kind.flag, action="store_true",
                         default=os.environ.get(f"CRASH_{kind.field.upper()}", "") == "1",
                         help=kind.help)
    run.add_argument("--stop-on-failure", action="store_true",
                     help="start no more runs once one failed")
    run.add_argument("--shard", default=os.environ.get("CRASH_SHARD") or None,
                     metavar="I/N", help="run only shard I of N (every N-th run, from run "
                     "I - 1), for CI matrices; `chaos merge` joins the shards' results")
    run.add_argument("--cluster", default=os.environ.get("CRASH_CLUSTER") or None,
                     metavar="ADDRESS", help="run on a Dask cluster: a scheduler's address "
                     "(tcp://HOST:8786, tls://...) or local:N (N worker processes here); "
                     "needs the cluster extra")
    progress.add_flags(run, lines="a line per finished run (run N seed=S ok kills=K ...)",
                       kept="the failure lines, the cells not reached and the SUMMARY")
    wrk = sub.add_parser("worker", help="start a Dask worker for --cluster campaigns (one "
                         "thread per worker process); other flags go to `dask worker`")
    wrk.add_argument("scheduler", help="the scheduler's address, e.g. tcp://10.0.0.5:8786")
    wrk.add_argument("--dir", type=Path, default=Path("chaos-worker"),
                     help="the worker's directory: runs in progress and Dask's own files")
    wrk.add_argument("--nworkers", type=int, default=os.cpu_count() or 1,
                     help="worker processes, one run each at a time (default: the cores)")
    wrk.add_argument("--no-nanny", action="store_true",
                     help="no nanny process: this process is the worker (one worker only)")
    wrk.add_argument("--backend", choices=BACKENDS, default="local",
                     help="check that this backend works here before joining")
    mrg = sub.add_parser("merge", help="join the results of a campaign's shards into one")
    mrg.add_argument("shards", type=Path, nargs="+", help="each shard's results directory")
    mrg.add_argument("--results", type=Path, default=Path("results"))
    ci = sub.add_parser("ci", help="run the fast fixed-seed crash subset that gates CI")
    ci.add_argument("--slice", action="append", default=[], dest="slices",
                    help=f"only this slice (repeatable); one of: {', '.join(BY_NAME)}")
    ci.add_argument("--results", type=Path, default=Path("results") / "ci")
    ci.add_argument("--jobs", type=int, default=2)
    ci.add_argument("--stop-on-failure", action="store_true",
                    help="stop at the first failing run")
    rep = _one_run(sub.add_parser("repro", help="replay one run's fault plan and print its "
                                  "verdict"))
    rep.add_argument("--plan", type=Path, help="a shrunk.json written by chaos shrink")
    shr = _one_run(sub.add_parser("shrink", help="cut a failing run down to the smallest plan "
                                  "that still fails the same check, and tell its story"))
    shr.add_argument("--jobs", type=int, default=os.cpu_count() or 2,
                     help="candidate runs at once")
    shr.add_argument("--tries", type=int, default=3, help="runs of a candidate with a "
                     "time-triggered fault; it counts only if it fails every one")
    shr.add_argument("--confirm", type=int, default=5,
                     help="replays of the shrunk plan at the end")
    progress.add_flags(shr, lines="a line per candidate run (candidate N faults=F steps=S "
                       "... fails CHECK ...)", kept="the passes that made progress, the story "
                       "and the SHRUNK line")
    ana = sub.add_parser("analyze", help="re-run the checker on stored run records")
    ana.add_argument("results", type=Path)
    cln = sub.add_parser("clean", help="remove Spaces left behind by crashed campaigns")
    cln.add_argument("--results", type=Path, default=Path("results"))
    cln.add_argument("--backend", default="all",
                     choices=("all", *(n for n, b in BACKEND_DESCRIPTORS.items() if b.clean)),
                     help="which Spaces to remove (those of every backend whose Spaces live "
                     "in run directories, as the named one's do, or in an engine: docker: "
                     "every campaign's, running or not)")
    wl = sub.add_parser("workload", help="workloads: a session's tool calls to crash-test")
    wl_sub = wl.add_subparsers(dest="workload_command", required=True)
    wfl = wl_sub.add_parser("from-log", help="write the workload of the tool calls a durable "
                            "log committed (a session's SQLite log)")
    wfl.add_argument("log", type=Path, help="the log: a driver's state/log.sqlite (or the "
                     "directory state/log of a JSONL log)")
    wfl.add_argument("--out", type=Path, default=None, help="where to write it (default: stdout)")
    wfl.add_argument("--name", default=None, help="the workload's name (default: the log's)")
    wfl.add_argument("--no-probe", action="store_true",
                     help="do not run the workload twice without faults (local Spaces) to "
                     "declare the paths and outputs that differ between runs")
    img = sub.add_parser("image", help="build the Docker Space image (as ci/build-images.sh)")
    img_sub = img.add_subparsers(dest="image_command", required=True)
    imb = img_sub.add_parser("build", help="build durable-space (a debootstrap'd base when "
                             "debian:bookworm-slim cannot be pulled); fast when cached")
    imb.add_argument("--image", default="durable-space")
    imb.add_argument("--base", default=None, help="use this base image as is")
    return p


def _ci(args: argparse.Namespace) -> int:
    unknown = sorted(set(args.slices) - set(BY_NAME))
    if unknown:
        raise BadArguments(f"no CI slice {unknown}; known: {', '.join(BY_NAME)}")
    if args.jobs < 1:
        raise BadArguments(f"--jobs must be at least 1, got {args.jobs}")
    return run_slices(args.slices, results_root=args.results, jobs=args.jobs,
                      stop_on_failure=args.stop_on_failure)


def _image(args: argparse.Namespace) -> int:
    from backends.docker.image import build

    code, seconds = build(image=args.image, base=args.base)
    print(f"image: build of {args.image} {'ok' if code == 0 else f'failed (exit {code})'} "
          f"in {seconds:.1f}s")
    return 0 if code == 0 else EXIT_BAD_ARGS


def _worker(args: argparse.Namespace, extra: list[str]) -> int:
    try:
        from chaos.cluster.worker import worker_main
    except ImportError as exc:
        from chaos.cluster.dask_pool import EXTRA_HINT

        raise BackendUnavailable(f"chaos worker needs Dask's distributed ({exc}); "
                                 f"{EXTRA_HINT}") from None
    if args.nworkers < 1 or (args.no_nanny and args.nworkers != 1):
        raise BadArguments(f"--nworkers {args.nworkers}: pass at least 1 (exactly 1 with "
                           "--no-nanny)")
    worker_main(args.scheduler, args.dir, args.nworkers, not args.no_nanny, args.backend,
                extra)


def _workload(args: argparse.Namespace) -> int:
    from scenarios.workload_from_log import from_log

    text = from_log(args.log, name=args.name)
    if not args.no_probe:
        text = _probed(args, text)
    if args.out is None:
        sys.stdout.write(text)
    else:
        args.out.write_text(text)
        print(f"chaos: wrote {args.out}; run it with: python -m chaos run --mode checkpoint "
              f"--workload {args.out}", file=sys.stderr)
    return 0


def _probed(args: argparse.Namespace, text: str) -> str:
    """``text`` (a workload from ``args.log``) with what differs between two clean runs of
    it declared: volatile paths, nondeterministic outputs."""
    import tempfile

    from chaos.checks.golden import GoldenFailed, probe
    from chaos.run.runner import execute
    from scenarios.workload_from_log import from_log

    with tempfile.TemporaryDirectory(prefix="chaos-probe-") as tmp:
        draft = Path(tmp) / "workload.yaml"
        draft.write_text(text)
        print("chaos: running the workload twice without faults (local Spaces) to find what "
              "differs between runs (--no-probe skips this)", file=sys.stderr)
        try:
            paths, steps = probe(str(draft), execute, work_dir=Path(tmp))
        except GoldenFailed as exc:
            print(f"chaos: warning: {exc}; the workload is written as the log has it, with "
                  "nothing declared volatile: run it without faults (chaos run --workload W "
                  "--runs 1) to see why", file=sys.stderr)
            return text
    if paths or steps:
        print(f"chaos: declared volatile: {paths or 'none'}; nondeterministic output: calls "
              f"{steps or 'none'}", file=sys.stderr)
    return from_log(args.log, name=args.name, volatile=paths, nondeterministic=steps)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra and args.command != "worker":
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    return guarded("chaos", "the harness itself", lambda: _command(args, extra),
                   (BadArguments, PresetError, WorkloadError, BackendUnavailable, BadResults,
                    FileNotFoundError, NotADirectoryError))


def _command(args: argparse.Namespace, extra: list[str]) -> int:
    if args.command == "worker":
        _worker(args, extra)
    if args.command == "run":
        with progress.shown(args.display):
            return run_campaign(campaign_config(args))
    if args.command == "repro":
        return repro(args)
    if args.command == "shrink":
        with progress.shown(args.display):
            return shrink(args)
    if args.command == "analyze":
        return analyze(args)
    if args.command == "ci":
        return _ci(args)
    if args.command == "image":
        return _image(args)
    if args.command == "merge":
        return merge(args.shards, args.results)
    if args.command == "workload":
        return _workload(args)
    return clean(args)


__all__ = ["main"]
