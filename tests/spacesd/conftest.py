"""Fixtures for the daemon's tests: real spacesd processes, through the local backend.

Every Space a test creates is deleted in the finalizer, which kills its daemon and its
commands by pid (never by name)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from backends.local import LocalSpace, LocalSpaces
from backends.space_client import SpaceClient


@pytest.fixture
def spaces(tmp_path) -> Iterator[LocalSpaces]:
    provider = LocalSpaces(tmp_path / "spaces")
    yield provider
    provider.delete_all()


@pytest.fixture
def space(spaces: LocalSpaces) -> LocalSpace:
    spaces.create("s1")
    return spaces.get("s1")


@pytest.fixture
def client(spaces: LocalSpaces, space: LocalSpace) -> SpaceClient:
    return spaces.connect(space.name, epoch=1)
