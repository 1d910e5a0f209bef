"""G4 stale writers: no entry committed by a driver after a newer epoch took the log over,
and a stale driver's refusal is never recorded as a tool result.

From the log's epoch history (``SqliteStorage.epoch_history``): each raise of the floor to
epoch E governs every entry from its recorded first id on, and each of those must come from
a writer of epoch E or newer. In stale mode, the runner also requires the parked older
driver to exit fenced (75)."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from chaos.checks.model import Undecided

if TYPE_CHECKING:
    from chaos.checks.model import CheckInput

REFUSAL = re.compile(r"below (this Space's|the log's) floor|was halted|stale_epoch")


def check(inp: CheckInput) -> list[str]:
    obs = inp.obs
    errors: list[str] = []
    if obs.stale_error:
        errors.append(obs.stale_error)
    if not obs.epoch_raises:
        raise Undecided("the run recorded no epoch history of its log")
    epochs = dict(obs.entry_epochs)
    for epoch, first, _ms in sorted(obs.epoch_raises):
        late = [(i, e) for i, e in epochs.items() if i >= first and (e is None or e < epoch)]
        for entry, writer in late[:3]:
            errors.append(f"entry {entry} was committed by epoch {writer} after epoch {epoch} "
                          f"took the log over (from entry {first})")
    for c in obs.calls:
        if c.result is not None and REFUSAL.search(c.content):
            errors.append(f"call {c.call_id} (step {c.step}) recorded a fence refusal as its "
                          f"result: {c.content[:160]!r}")
    return errors
