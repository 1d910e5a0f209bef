"""Storages of the durable log: memory (reference), SQLite (embedded default), JSONL."""

from .base import MemoryStorage, Storage, validate_batch
from .jsonl import JsonlStorage
from .records import (
    Batch,
    ConversationRecord,
    DocRecord,
    EntryRecord,
    RequestRecord,
    SlotRecord,
    Snapshot,
)
from .sqlite import SqliteStorage

__all__ = [
    "Batch",
    "ConversationRecord",
    "DocRecord",
    "EntryRecord",
    "JsonlStorage",
    "MemoryStorage",
    "RequestRecord",
    "SlotRecord",
    "Snapshot",
    "SqliteStorage",
    "Storage",
    "validate_batch",
]
