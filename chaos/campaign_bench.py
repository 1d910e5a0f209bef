"""Campaign throughput: ``python -m chaos.campaign_bench [--runs 250] [--steps 10] [--mode checkpoint]``.

Runs one campaign on the local backend and prints runs per minute and kills per minute
(the seed document's goal: a checkpoint campaign of 250 runs of 10 calls in under 5 minutes
on 2 cores). It prints numbers; it asserts nothing.
"""

from __future__ import annotations

import argparse
import io
import os
import sys
import time
from pathlib import Path

from .campaign import CampaignConfig, run_campaign
from .summary import parse_summary


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m chaos.campaign_bench", description=__doc__)
    p.add_argument("--runs", type=int, default=250)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--mode", default="checkpoint")
    p.add_argument("--jobs", type=int, default=2 * (os.cpu_count() or 1))
    p.add_argument("--results", type=Path, default=Path("results"),
                   help="where the campaign's results go (kept: a failure must be reproducible)")
    args = p.parse_args(argv)
    out = io.StringIO()
    t0 = time.monotonic()
    code = run_campaign(CampaignConfig(mode=args.mode, runs=args.runs, steps=args.steps,
                                       jobs=args.jobs, results_root=args.results), out)
    seconds = time.monotonic() - t0
    for text in out.getvalue().splitlines():  # failures with their repro lines, then results
        if not text.startswith("SUMMARY "):
            print(text)
    line = next(x for x in out.getvalue().splitlines() if x.startswith("SUMMARY "))
    s = parse_summary(line)
    print(line)
    print(f"chaos.campaign_bench: {args.runs} runs x {args.steps} steps, mode={args.mode}, "
          f"jobs={args.jobs}, {os.cpu_count()} cores")
    print(f"  wall time      {seconds:8.1f} s")
    print(f"  runs/minute    {60 * args.runs / seconds:8.1f}")
    print(f"  kills/minute   {60 * int(s['kills']) / seconds:8.1f}")
    print(f"  250-run estimate {250 * seconds / args.runs / 60:6.1f} min (goal: under 5)")
    return code


if __name__ == "__main__":
    sys.exit(main())
