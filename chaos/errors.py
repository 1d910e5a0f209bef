"""Every exception the campaign raises on purpose, each saying when and what to do.

The CLI turns ``BadArguments``, ``BadResults`` and ``BackendUnavailable`` into exit 254 with
their one-line message. ``RunAborted`` and ``NemesisContractError`` never leave a run: they
make its verdict ``unknown`` (a run that may not have had its faults proves nothing).
"""

from __future__ import annotations


class ChaosError(Exception):
    """The root of the campaign's own exceptions."""


class BadArguments(ChaosError):
    """A configuration the campaign cannot run (a flag, a ``CRASH_*`` variable, a driver
    program that does not exist), found before anything runs. The message says what to
    pass instead."""


class BadResults(ChaosError, ValueError):
    """A results directory whose files cannot be read back (a corrupt line in the middle of
    ``runs.jsonl``, a record without its fields, two records of one run). Re-run the
    campaign; results are for people and ``repro``, never needed for correctness."""


class BackendUnavailable(ChaosError, RuntimeError):
    """The backend cannot be used on this machine (no engine, no image, no KVM). The message
    says what is missing and how to get it."""


class RunAborted(ChaosError):
    """The campaign was interrupted (Ctrl-C) while this run was going: its drivers were
    killed and no new one is launched. The run ends ``unknown`` and is recorded nowhere."""


class NemesisContractError(ChaosError):
    """A nemesis broke its contract (``chaos.faults.nemesis``): an operation ended in no history
    entry or in a second one, or a planned fault ended neither fired nor skipped. Recorded
    as the nemesis's error, so the run is ``unknown``; fix the nemesis or schedule the
    message names."""
