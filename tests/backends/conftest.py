"""Fixtures for the backend tests: a local provider whose Spaces are all deleted (daemons
and commands killed by pid) when the test ends."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from backends.local import LocalSpaces


@pytest.fixture
def spaces(tmp_path) -> Iterator[LocalSpaces]:
    provider = LocalSpaces(tmp_path / "spaces")
    yield provider
    provider.delete_all()
