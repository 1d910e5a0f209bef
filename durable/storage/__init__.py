"""Storages of the durable log: memory (reference), SQLite (embedded default), JSONL."""

from .base import MemoryStorage, Storage, validate_batch
from .records import (
    Batch,
    ConversationRecord,
    DocRecord,
    EntryRecord,
    RequestRecord,
    SlotRecord,
    Snapshot,
)

__all__ = [
    "Batch",
    "ConversationRecord",
    "DocRecord",
    "EntryRecord",
    "MemoryStorage",
    "RequestRecord",
    "SlotRecord",
    "Snapshot",
    "Storage",
    "validate_batch",
]
