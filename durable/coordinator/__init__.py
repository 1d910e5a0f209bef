"""The coordinator: (re)launches each durable session's driver until the session ends,
holds each session's lease on its Space, and keeps its state in a store that survives its
own crash (SQLite, or PostgreSQL for coordinators on several machines)."""

from .coordinator import Backoff, Coordinator, CoordinatorConfig
from .records import (
    ClaimLost,
    CoordinatorError,
    Event,
    Lease,
    LeaseHeld,
    LeaseSuperseded,
    SessionConflict,
    SessionRecord,
    SessionSpec,
    StoreUnavailable,
    UnknownSession,
)
from .store import CoordinatorStore, PostgresStore, SqliteStore, open_store

__all__ = [
    "Backoff", "ClaimLost", "Coordinator", "CoordinatorConfig", "CoordinatorError",
    "CoordinatorStore", "Event", "Lease", "LeaseHeld", "LeaseSuperseded", "PostgresStore",
    "SessionConflict", "SessionRecord", "SessionSpec", "SqliteStore", "StoreUnavailable",
    "UnknownSession", "open_store",
]
