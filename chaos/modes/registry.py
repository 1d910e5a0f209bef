"""The campaign's modes by name: ``MODES``, the one table the runner, the campaign, the CLI
and the SUMMARY look a mode up in."""

from __future__ import annotations

from chaos.modes.mode import CampaignMode
from chaos.modes.redrive_mode import Redrive
from chaos.modes.stale_mode import Stale
from chaos.modes.standard import Exhaustive, Machine, Standard

MODES: dict[str, CampaignMode] = {m.name: m for m in (
    Standard("transactional", virtual=True),
    Standard("checkpoint"),
    Standard("auto", preset="auto"),
    Stale(),
    Exhaustive(),
    Redrive(),
    Machine(),
)}

