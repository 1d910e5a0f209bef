"""``chaos clean``: end what campaigns left behind.

First every dead campaign's note (``live.clean_dead``: its drivers, Spaces, daemons,
commands and temp directories, even after its results directory was deleted), then the
local and microVM Spaces found under a results directory, then, unless only local ones are
asked for, every campaign's docker Spaces (by their labels).
"""

from __future__ import annotations

import argparse

from chaos.campaign import live
from chaos.space_providers import BACKEND_DESCRIPTORS


def clean(args: argparse.Namespace) -> int:
    campaigns, killed = live.clean_dead()
    if campaigns:
        print(f"clean: ended {campaigns} dead campaign(s): {killed} process(es) killed, their "
              "Spaces and temp directories removed")
    # --backend local: every backend's Spaces under results (local, microVM), as local ones
    # live; docker: those in engines; all: both.
    chosen = BACKEND_DESCRIPTORS.get(args.backend)
    removed = sum(b.clean(args.results) for b in BACKEND_DESCRIPTORS.values()
                  if b.clean is not None and (
                      chosen is None or b.spaces_in_run_dir == chosen.spaces_in_run_dir))
    print(f"clean: removed {removed} Space(s)")
    return 0
