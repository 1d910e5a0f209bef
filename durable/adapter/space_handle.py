"""What a driver holds of one conversation's Space once it fenced it (``SpaceKeeper``
makes it; the modes, the runner and recovery use it)."""

from __future__ import annotations

from dataclasses import dataclass

from ..spaces import SpaceClient


@dataclass(frozen=True)
class SpaceHandle:
    """This process's connection to one conversation's Space, fenced at its epoch."""

    name: str
    client: SpaceClient
    #: The daemon's capabilities, read when it was fenced.
    caps: frozenset[str]
    #: Which Space it is (``SpaceClient.describe``); None for a daemon without ids.
    space_id: str | None = None
