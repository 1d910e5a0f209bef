"""``python -m reports``: what a user publishes after a campaign or a benchmark.

    python -m reports cost [--backend local [docker ...]] [--repeat 20] [--sizes 10 100 1000]
                           [--modes ...] [--out DIR]
    python -m reports perf [--rounds 100] [--repeat 60] [--campaign-runs 250] [--results DIR]
                           [--quiet | --verbose]
    python -m reports latency RESULTS... [--out DIR]
    python -m reports html RESULTS... [--out FILE] [--cost DIR] [--sample K]

RESULTS are campaign results directories (``results/latest``, ``results/<campaign>``);
several merge into one report. Exit codes as the chaos CLI's: 0 written, 254 bad arguments
or input (the message says what was expected), 255 the reports themselves crashed.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import NoReturn

from chaos.campaign import progress
from chaos.errors import BackendUnavailable
from chaos.exits import EXIT_BAD_ARGS, exit_with, guarded
from chaos.space_providers import BACKENDS

from . import cost, cost_bench, html, latency, perf
from .errors import ReportsError
from .results import load_all


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        print(f"reports: error: {message}", file=sys.stderr)
        sys.exit(EXIT_BAD_ARGS)


def _positive(raw: str) -> int:
    if not raw.isdigit() or int(raw) < 1:
        raise argparse.ArgumentTypeError(f"Expected a positive integer but got {raw!r}")
    return int(raw)


def _backends(raw: str) -> list[str]:
    names = [n for n in raw.split(",") if n]
    bad = [n for n in names if n not in BACKENDS]
    if bad or not names:
        raise argparse.ArgumentTypeError(f"unknown backend {raw!r}; use one or more of "
                                         f"{', '.join(BACKENDS)} (space or comma separated)")
    return names


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="python -m reports", description="Cost, latency and campaign reports.")
    sub = p.add_subparsers(dest="command", required=True)
    c = sub.add_parser("cost", help="benchmark the per-call cost of each adapter mode")
    c.add_argument("--backend", type=_backends, nargs="+", default=[["local"]],
                   help="backends to measure (local, docker, microvm); one that cannot be "
                   "had is skipped with its reason")
    c.add_argument("--repeat", type=_positive, default=20, help="timed calls per cell and kind")
    c.add_argument("--sizes", type=_positive, nargs="+", default=list(cost_bench.SIZES),
                   help="workspace sizes in files of 4 KiB (default 10 100 1000)")
    c.add_argument("--modes", nargs="+", choices=cost_bench.MODES, default=list(cost_bench.MODES))
    c.add_argument("--out", type=Path, default=None,
                   help="output directory (default results/cost-<timestamp>)")
    pf = sub.add_parser("perf", help="the performance table: each metric beside its floor")
    pf.add_argument("--rounds", type=_positive, default=100,
                    help="no-op commands through the ledger (and plain spawns)")
    pf.add_argument("--repeat", type=_positive, default=60,
                    help="timed calls per cell: each row reads their median")
    pf.add_argument("--campaign-runs", type=int, default=250,
                    help="runs of the campaign measured (0: skip it; it takes minutes)")
    pf.add_argument("--results", type=Path, default=Path("results") / "perf",
                    help="where the measured campaign's results go")
    progress.add_flags(pf, lines="a line per finished run of the measured campaign",
                       kept="the table")
    lat = sub.add_parser("latency", help="recovery latency tables and plots from campaigns")
    lat.add_argument("results", type=Path, nargs="+")
    lat.add_argument("--out", type=Path, default=None,
                     help="output directory (default: RESULTS/latency of the first one)")
    h = sub.add_parser("html", help="one self-contained HTML report of campaigns")
    h.add_argument("results", type=Path, nargs="+")
    h.add_argument("--out", type=Path, default=None,
                   help="the HTML file (default: RESULTS/report.html of the first one)")
    h.add_argument("--cost", type=Path, default=None,
                   help="also show the cost report in this `reports cost` output directory")
    h.add_argument("--sample", type=int, default=3,
                   help="timelines of this many passing runs besides every failing one")
    return p


def _run(args: argparse.Namespace) -> int:
    if args.command == "cost":
        backends = list(dict.fromkeys(b for group in args.backend for b in group))
        out = args.out or Path("results") / f"cost-{time.strftime('%Y%m%dT%H%M%S')}"
        print(cost.run(backends, args.repeat, tuple(sorted(set(args.sizes))),
                       tuple(m for m in cost_bench.MODES if m in args.modes), out))
        print(f"cost report: {out}")
        return 0
    if args.command == "perf":
        if args.campaign_runs < 0:
            raise ReportsError(f"--campaign-runs must be 0 or more, got {args.campaign_runs}")
        with progress.shown(args.display):
            print(perf.report(rounds=args.rounds, repeat=args.repeat,
                              campaign_runs=args.campaign_runs, results=args.results))
        return 0
    campaigns = load_all(args.results)
    if args.command == "latency":
        out = args.out or campaigns[0].path / "latency"
        print(latency.write(campaigns, out))
        print(f"latency report: {out}")
        return 0
    if args.sample < 0:
        raise ReportsError(f"--sample must be 0 or more, got {args.sample}")
    out = html.write(campaigns, args.out or campaigns[0].path / "report.html",
                     cost_dir=args.cost, sample=args.sample)
    print(f"html report: {out}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return guarded("reports", "the reports themselves", lambda: _run(args),
                   (ReportsError, BackendUnavailable))


if __name__ == "__main__":
    exit_with(main())
