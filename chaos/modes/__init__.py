"""The campaign's modes, one object each, by name in ``MODES``: which plans a mode draws,
how it drives a run, what a run always ends with, which SUMMARY groups it adds and which
options it takes. The runner, the campaign, the CLI and the SUMMARY ask the mode; none
compares a mode's name. A new mode is a class here and a line in ``MODES``."""

from __future__ import annotations

from .mode import CampaignMode, Group
from .redrive_mode import Redrive
from .stale_mode import Stale
from .standard import Exhaustive, Machine, Standard

MODES: dict[str, CampaignMode] = {m.name: m for m in (
    Standard("transactional", virtual=True),
    Standard("checkpoint"),
    Standard("auto", preset="auto"),
    Stale(),
    Exhaustive(),
    Redrive(),
    Machine(),
)}


__all__ = ["MODES", "CampaignMode", "Group"]
