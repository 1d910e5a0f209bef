"""The campaign's modes, one object each, by name in ``registry.MODES``: which plans a mode
draws, how it drives a run, what a run always ends with, which SUMMARY groups it adds and
which options it takes. The runner, the campaign, the CLI and the SUMMARY ask the mode; none
compares a mode's name. A new mode is a class here and a line in ``MODES``. Beside the mode
objects live the modes' own machinery: stale mode's kinds (``stale_kinds``) and parked
drivers (``holds``), redrive's coordinator run (``redrive``, ``second_session``,
``redrive_stats``) and machine mode's check (``machine_check``). This package's ``__init__``
imports nothing."""
