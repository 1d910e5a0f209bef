"""A coordinator store on each database: SQLite in the test's directory, PostgreSQL on a
throwaway server (``tests.postgres_server``) or ``CUA_TEST_POSTGRES``; without either the
PostgreSQL cases skip with the reason."""

from __future__ import annotations

import itertools
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from durable.coordinator import CoordinatorStore, open_store
from tests.postgres_server import URL_ENV, NoPostgres, PostgresServer

_schemas = itertools.count(1)


@pytest.fixture(scope="session")
def postgres_url() -> Iterator[str]:
    """The URL of a PostgreSQL server for this test session (one per xdist worker)."""
    if os.environ.get(URL_ENV):
        yield os.environ[URL_ENV]
        return
    try:
        server = PostgresServer().start()
    except NoPostgres as exc:
        pytest.skip(f"no PostgreSQL server: {exc}")
    try:
        yield server.url
    finally:
        server.stop()


def store_url(kind: str, tmp_path: Path, request: pytest.FixtureRequest) -> str:
    """A fresh store of ``kind``: a new SQLite file, or a new schema on the server."""
    if kind == "sqlite":
        return str(tmp_path / "coordinator.sqlite")
    base = request.getfixturevalue("postgres_url")
    worker = os.environ.get("PYTEST_XDIST_WORKER", "w")
    return f"{base}?schema=t_{worker}_{os.getpid()}_{next(_schemas)}"


@pytest.fixture(params=["sqlite", "postgresql"])
def store_kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def url(store_kind: str, tmp_path: Path, request: pytest.FixtureRequest) -> str:
    return store_url(store_kind, tmp_path, request)


@pytest.fixture
def store(url: str) -> Iterator[CoordinatorStore]:
    s = open_store(url)
    yield s
    s.close()


@pytest.fixture
def stores() -> Iterator[Callable[..., CoordinatorStore]]:
    """``open_store`` for a test, every store it opened closed when it ends, passed or
    failed: a connection a failed test left open was collected in a later test, which
    then failed too (its ``ResourceWarning`` is an error)."""
    opened: list[CoordinatorStore] = []

    def opener(url: str, **kwargs: Any) -> CoordinatorStore:
        opened.append(open_store(url, **kwargs))
        return opened[-1]

    yield opener
    for s in opened:
        s.close()
