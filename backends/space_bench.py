"""``python -m backends.space_bench``: what a local Space costs. Prints numbers, asserts nothing.

One ``BENCH`` line per measurement, ``key=value`` pairs, medians over several rounds (the
setup line gives the load average: on a shared machine other processes inflate the short
operations most, so read the ratios with it):
- ``exec``: a no-op (``true``) through the exec ledger (start + wait: ledger fsync, the
  shim, the exit file), next to ``subprocess.run(["bash", "-c", "true"])``;
- ``scan``: 100 and 1000 files of 4 KiB, a first scan (every file hashed) and a rescan
  after one file changed (the stat cache spares the rest); the target is
  ``rescan/first <= 0.2`` for 1000 files, and the line says whether it was met;
- ``checkpoint``: 100 files of 4 KiB, a first checkpoint (copies every file), one of the
  unchanged workspace, and a restore after 10 files changed, 10 were removed, 10 added.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

from backends.local import LocalSpaces
from backends.space_client import HttpSpaceClient
from spacesd.workspace_scan import RACY_NS

FILE_SIZE = 4096
SCAN_TARGET = 0.2


def _ms(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return (time.perf_counter() - start) * 1000


def _median(xs: list[float]) -> str:
    return f"{statistics.median(xs):.2f}"


def _write_files(root: Path, count: int, salt: str) -> None:
    root.mkdir(parents=True, exist_ok=True)
    for n in range(count):
        (root / f"f{n:04d}.txt").write_bytes(f"{salt} {n} ".encode().ljust(FILE_SIZE, b"."))


def _settle() -> None:
    """Let new files leave the scanner's racy window (else the rescan rehashes them)."""
    time.sleep(RACY_NS / 1e9 * 2)


def bench_exec(client: HttpSpaceClient, rounds: int) -> tuple[float, float]:
    """Medians (ms) of a no-op through the ledger and of a plain spawn, interleaved."""
    ledger, plain = [], []
    def noop(key: str) -> None:
        client.exec_start(key, "true")
        client.exec_wait(key, timeout=60)

    for n in range(rounds):
        ledger.append(_ms(partial(noop, f"bench:noop:{n}")))
        plain.append(_ms(lambda: subprocess.run(["bash", "-c", "true"], check=True)))
    print(f"BENCH exec noop_ledger_ms={_median(ledger)} noop_subprocess_ms={_median(plain)} "
          f"ratio={statistics.median(ledger) / statistics.median(plain):.1f} rounds={rounds}")
    return statistics.median(ledger), statistics.median(plain)


def bench_scan(client: HttpSpaceClient, work: Path, count: int, rounds: int) -> None:
    first, rescan = [], []
    for r in range(rounds):
        shutil.rmtree(work / "scan", ignore_errors=True)
        _write_files(work / "scan", count, salt=f"round{r}")  # new inodes: the cache is cold
        _settle()
        first.append(_ms(client.scan))
        (work / "scan" / "f0000.txt").write_bytes(b"changed".ljust(FILE_SIZE, b"!"))
        rescan.append(_ms(client.scan))
    ratio = statistics.median(rescan) / statistics.median(first)
    met = ("yes" if ratio <= SCAN_TARGET else "NO") if count >= 1000 else "n/a"
    print(f"BENCH scan files={count} first_ms={_median(first)} rescan_ms={_median(rescan)} "
          f"ratio={ratio:.3f} target={SCAN_TARGET} target_met={met} rounds={rounds}")
    shutil.rmtree(work / "scan")


def bench_checkpoint(client: HttpSpaceClient, work: Path, count: int, rounds: int) -> None:
    create, again, restore = [], [], []
    for r in range(rounds):
        shutil.rmtree(work / "cp", ignore_errors=True)
        _write_files(work / "cp", count, salt=f"cp{r}")
        _settle()
        create.append(_ms(partial(client.checkpoint_create, f"bench{r}")))
        again.append(_ms(partial(client.checkpoint_create, f"bench{r}-again")))
        for n in range(10):
            (work / "cp" / f"f{n:04d}.txt").write_bytes(b"changed".ljust(FILE_SIZE, b"!"))
            (work / "cp" / f"f{n + 10:04d}.txt").unlink()
            (work / "cp" / f"new{n}.txt").write_bytes(b"new".ljust(FILE_SIZE, b"+"))
        restore.append(_ms(partial(client.checkpoint_restore, f"bench{r}")))
    print(f"BENCH checkpoint files={count} create_ms={_median(create)} "
          f"create_unchanged_ms={_median(again)} restore_ms={_median(restore)} rounds={rounds}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m backends.space_bench", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--small", action="store_true", help="few rounds (a smoke run)")
    args = parser.parse_args(argv)
    rounds = 3 if args.small else 15
    scan_rounds = 1 if args.small else 7
    with tempfile.TemporaryDirectory(prefix="spaces-bench-") as base:
        spaces = LocalSpaces(base)
        try:
            spaces.create("bench")
            client = spaces.connect("bench", epoch=1)
            work = spaces.get("bench").work
            print(f"BENCH setup python={sys.version.split()[0]} cpus={os.cpu_count()} "
                  f"load1={os.getloadavg()[0]:.2f} workspace={work}")
            bench_exec(client, rounds)
            for count in (100, 1000):
                bench_scan(client, work, count, scan_rounds)
            bench_checkpoint(client, work, 100, scan_rounds)
        finally:
            spaces.delete_all()
    return 0


if __name__ == "__main__":
    sys.exit(main())
