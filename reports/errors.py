"""Errors of the reports. The CLI prints them and exits 254 (bad arguments or input)."""

from __future__ import annotations


class ReportsError(Exception):
    """Root of the reports' errors."""


class BadResults(ReportsError):
    """A path given as campaign results is not one: no ``campaign.json`` or no
    ``runs.jsonl``. Fix: pass ``results/<campaign>`` or ``results/latest`` of a campaign made
    with ``python -m chaos run ...``."""


class NoBackend(ReportsError):
    """None of the backends asked for could be had on this machine; each one's reason was
    printed. Fix: pass ``--backend local``, or install what the printed reasons name."""
