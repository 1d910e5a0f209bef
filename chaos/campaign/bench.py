"""Campaign throughput: ``python -m chaos.campaign.bench [--runs 250] [--steps 10] [--mode M]``.

Runs one campaign on the local backend and prints runs per minute and kills per minute
(the seed document's goal: a checkpoint campaign of 250 runs of 10 calls in under 5 minutes
on 2 cores). With ``--cluster ADDRESS`` (e.g. ``local:2``) it runs the same seeds both ways,
``--jobs`` threads here and on the cluster, alternately ``--repeat`` times, and prints each
one's median runs per minute and the cluster's cost in throughput. It prints numbers; it
asserts nothing. Each campaign shows its progress as ``chaos run`` does (``--quiet``,
``--verbose``).
"""

from __future__ import annotations

import argparse
import io
import os
import statistics
import sys
import time
from pathlib import Path

from chaos.campaign import progress
from chaos.campaign.campaign import CampaignConfig, run_campaign
from chaos.campaign.summary import parse_summary


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m chaos.campaign.bench", description=__doc__)
    p.add_argument("--runs", type=int, default=250)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--mode", default="checkpoint")
    p.add_argument("--jobs", type=int, default=2 * (os.cpu_count() or 1))
    p.add_argument("--results", type=Path, default=Path("results"),
                   help="where the campaign's results go (kept: a failure must be reproducible)")
    p.add_argument("--cluster", default=None,
                   help="also run the same seeds on this cluster and compare (e.g. local:2 "
                   "with --jobs 2: as many runs at once both ways)")
    p.add_argument("--repeat", type=int, default=1,
                   help="with --cluster: campaigns of each kind, alternately")
    progress.add_flags(p, lines="a line per finished run",
                       kept="the failures, the SUMMARY lines and the numbers")
    args = p.parse_args(argv)
    with progress.shown(args.display):
        return _measure(args)


def _measure(args: argparse.Namespace) -> int:
    if args.cluster is None:
        code, seconds, line, failures = _campaign(args, None)
        print(failures + line)
        s = parse_summary(line)
        print(f"chaos.campaign.bench: {args.runs} runs x {args.steps} steps, mode={args.mode}, "
              f"jobs={args.jobs}, {os.cpu_count()} cores")
        print(f"  wall time      {seconds:8.1f} s")
        print(f"  runs/minute    {60 * args.runs / seconds:8.1f}")
        print(f"  kills/minute   {60 * int(s['kills']) / seconds:8.1f}")
        print(f"  250-run estimate {250 * seconds / args.runs / 60:6.1f} min (goal: under 5)")
        return code
    times: dict[str, list[float]] = {"local": [], "cluster": []}
    worst = 0
    for _ in range(max(1, args.repeat)):
        for kind, cluster in (("local", None), ("cluster", args.cluster)):
            code, seconds, line, failures = _campaign(args, cluster)
            print(failures + line)
            times[kind].append(seconds)
            worst = max(worst, code)
    local, there = (statistics.median(times[k]) for k in ("local", "cluster"))
    print(f"chaos.campaign.bench: {args.runs} runs x {args.steps} steps, mode={args.mode}, "
          f"same seeds, {args.repeat} campaign(s) each, {os.cpu_count()} cores")
    print(f"  --jobs {args.jobs:<3}         {60 * args.runs / local:8.1f} runs/minute "
          f"(median wall {local:.1f} s)")
    print(f"  --cluster {args.cluster:<8} {60 * args.runs / there:8.1f} runs/minute "
          f"(median wall {there:.1f} s, start-up included)")
    print(f"  cluster cost   {100 * (there / local - 1):+8.1f} % of wall time (aim: under 10)")
    return worst


def _campaign(args: argparse.Namespace, cluster: str | None) -> tuple[int, float, str, str]:
    """One campaign: exit code, wall seconds, SUMMARY line, and the other lines (failures
    with their repro lines, unreached cells, results)."""
    out = io.StringIO()
    t0 = time.monotonic()
    code = run_campaign(CampaignConfig(mode=args.mode, runs=args.runs, steps=args.steps,
                                       jobs=args.jobs, results_root=args.results,
                                       cluster=cluster), out)
    seconds = time.monotonic() - t0
    lines = out.getvalue().splitlines()
    failures = "".join(x + "\n" for x in lines if not x.startswith("SUMMARY "))
    return code, seconds, next(x for x in lines if x.startswith("SUMMARY ")), failures


if __name__ == "__main__":
    sys.exit(main())
