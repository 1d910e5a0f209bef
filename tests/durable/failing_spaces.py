"""A local Spaces provider whose Spaces are made but never answer a client (a broken image,
a daemon that cannot serve): for ``durable.review fork``'s clean-up on a failed build."""

from __future__ import annotations

from backends.local import LocalSpaces
from backends.space_client import HttpSpaceClient
from durable.errors import SpaceUnavailable


class UnservedSpaces(LocalSpaces):
    def connect(self, name: str, *, epoch: int) -> HttpSpaceClient:
        self.get(name)
        raise SpaceUnavailable(f"Space {name!r} does not serve (a test's broken provider)")
