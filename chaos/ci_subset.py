"""The fast fixed-seed crash subset that gates CI: named slices of campaigns.

Each slice is a small campaign with fixed seeds (or an exhaustive slice of failpoints),
chosen so that together they reach every reachable cell of the adapter's recovery table
in each mode (``cells=N/N``), exercise every named check (G1-G5) on real faults, and stay
within a few minutes on two cores. ``chaos ci`` runs them (all, or ``--slice NAME``) and
prints one SUMMARY line per slice; the pytest marker ``crash_ci`` runs the same slices,
and the mutation gate (``tests/mutants``) runs, for each planted bug, the cheapest slice
that must catch it.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, TextIO

from .campaign import CampaignConfig, run_campaign


@dataclass(frozen=True)
class Slice:
    name: str
    #: What this slice is for, in one sentence.
    why: str
    #: ``CampaignConfig`` fields (mode, runs, steps, seed_base, preset, durable_mode, points).
    config: dict[str, Any] = field(default_factory=dict)
    #: Whether every reachable cell of its adapter mode must be reached.
    full_cells: bool = False

    def campaign(self, results_root: Path, jobs: int, **overrides: Any) -> CampaignConfig:
        return replace(CampaignConfig(results_root=results_root, jobs=jobs, **self.config),
                       **overrides)


SLICES: tuple[Slice, ...] = (
    Slice("transactional", "transactional recovery under every fault kind, combined ones too",
          {"mode": "transactional", "runs": 10, "steps": 8, "seed_base": 101}, full_cells=True),
    Slice("checkpoint", "checkpoint recovery under every fault kind, combined ones too",
          {"mode": "checkpoint", "runs": 10, "steps": 8, "seed_base": 101}, full_cells=True),
    Slice("auto", "auto mode's switch, with faults before and after it",
          {"mode": "auto", "runs": 8, "steps": 8, "seed_base": 101}),
    Slice("stale", "an older driver parked mid-call is fenced and changes nothing",
          {"mode": "stale", "runs": 4, "steps": 5, "seed_base": 7}),
    Slice("exhaustive-daemon", "a fault at every point inside the daemon, then one during "
          "recovery", {"mode": "exhaustive", "durable_mode": "checkpoint",
                       "points": ("spacesd.exec.recorded", "spacesd.exec.spawned",
                                  "spacesd.exec.exit_writing")}),
    Slice("exhaustive-transactional", "a kill at every occurrence of the command and file "
          "points, then one during recovery", {"mode": "exhaustive",
                                              "durable_mode": "transactional",
                                              "points": ("space.running", "space.exited",
                                                         "space.file_op")}),
)
BY_NAME = {s.name: s for s in SLICES}


def run_slices(names: list[str], *, results_root: Path, jobs: int, stop_on_failure: bool,
               out: TextIO = sys.stdout) -> int:
    """Run the named slices (all when empty; names checked by the caller); the exit code is
    the worst of theirs."""
    codes: list[int] = []
    for s in [BY_NAME[n] for n in names] or list(SLICES):
        print(f"slice {s.name}: {s.why}", file=out, flush=True)
        codes.append(run_campaign(s.campaign(results_root / s.name, jobs,
                                             stop_on_failure=stop_on_failure), out))
        if codes[-1] and stop_on_failure:
            break
    return 1 if 1 in codes else max(codes)  # invalid beats unknown beats valid
