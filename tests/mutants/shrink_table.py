"""``python -m tests.mutants.shrink_table [MUTANT ...]``: for each mutant of the gate, its CI
slice's first failing run shrunk with ``chaos shrink``, as a table (mutant, check, original
faults/steps, shrunk faults/steps, replays failed, shrink time). It prints numbers; the gate
itself is ``pytest -m mutants``.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tests.mutants.test_mutants import BY_ID, MUTANTS, Mutant, _apply, _copy_project

SHRUNK = re.compile(r"SHRUNK check=(\S+) faults=(\d+)->(\d+) steps=(\d+)->(\d+) "
                    r"simplified=(\d+) runs=(\d+) flaky_rejected=(\d+) "
                    r"replays_failed=(\d+)/(\d+)")


def shrink_one(mutant: Mutant, work: Path) -> str:
    tree = work / "tree"
    _copy_project(tree)
    _apply(mutant, tree)
    env = {**os.environ, "PYTHONPATH": str(tree)}
    env.pop("CUA_FAILPOINTS", None)
    ci = subprocess.run([sys.executable, "-m", "chaos", "ci", "--slice", mutant.slice,
                         "--results", str(work / "results"), "--stop-on-failure", "--jobs", "2"],
                        cwd=tree, env=env, capture_output=True, text=True, timeout=900)
    repro = re.search(r"reproduce: python -m chaos repro (\S+) --run (\d+)", ci.stdout)
    if repro is None:
        return f"| {mutant.id} | {mutant.slice} | not caught (exit {ci.returncode}) | | | | |"
    t0 = time.time()
    shrink = subprocess.run([sys.executable, "-m", "chaos", "shrink", repro[1], "--run",
                             repro[2], "--jobs", "2", "--confirm", "5"],
                            cwd=tree, env=env, capture_output=True, text=True, timeout=1800)
    seconds = time.time() - t0
    found = SHRUNK.search(shrink.stdout)
    if found is None:
        last = (shrink.stdout + shrink.stderr).strip().splitlines()[-1:]
        return f"| {mutant.id} | {mutant.slice} | shrink gave no result: {last} | | | | |"
    check, f0, f1, s0, s1, simple, runs, flaky, failed, of = found.groups()
    return (f"| {mutant.id} | {check} | {f0} / {s0} | {f1} / {s1} ({simple} simplified) | "
            f"{failed}/{of} | {runs} ({flaky} flaky) | {seconds:.0f} s |")


def main(argv: list[str]) -> int:
    chosen = [BY_ID[m] for m in argv] if argv else list(MUTANTS)
    print("| mutant | check | original faults / steps | shrunk faults / steps | replays "
          "failed | candidate runs | shrink time |")
    print("|---|---|---|---|---|---|---|")
    for mutant in chosen:
        with tempfile.TemporaryDirectory(prefix=f"shrink-{mutant.id}-") as work:
            print(shrink_one(mutant, Path(work)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
