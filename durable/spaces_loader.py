"""A Spaces provider named on a command line: ``MODULE:FACTORY`` and ``KEY=VALUE``
arguments (``backends.local:LocalSpaces`` with ``base_dir=/var/lib/spaces``). ``durable``
never imports a backend itself; the command lines of the coordinator and of the review
tools name one this way."""

from __future__ import annotations

import importlib
from collections.abc import Sequence

from .spaces import Spaces


class BadProvider(ValueError):
    """The provider named cannot be made; the message says why and what to pass."""


def pairs(items: Sequence[str], what: str) -> dict[str, str]:
    """``KEY=VALUE`` items as a dict (``what`` names the flag in errors)."""
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise BadProvider(f"{what} {item!r}: expected KEY=VALUE")
        out[key] = value
    return out


def load_spaces(target: str, args: dict[str, str]) -> Spaces:
    """The provider ``MODULE:FACTORY`` makes with ``args`` (strings)."""
    module_name, sep, attr = target.partition(":")
    if not sep or not module_name or not attr:
        raise BadProvider(f"--spaces {target!r}: expected MODULE:FACTORY, e.g. "
                          "backends.local:LocalSpaces")
    try:
        factory = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise BadProvider(f"--spaces {target!r}: {type(exc).__name__}: {exc}") from None
    try:
        spaces = factory(**args)
    except TypeError as exc:
        raise BadProvider(f"--spaces {target} does not take {sorted(args)}: {exc}") from None
    if not isinstance(spaces, Spaces):
        raise BadProvider(f"--spaces {target} made a {type(spaces).__name__}, which is not a "
                          "Spaces provider (durable.spaces.Spaces)")
    return spaces
