"""The Space adapter: keeps a conversation's Space consistent with the log across crashes."""

from .core import DurableSpaces, TransactionalLimits, durable_spaces
from .snapshots import (
    CheckpointRef,
    CheckpointStore,
    DirectoryCheckpointStore,
    SnapshotProvider,
    WorkspaceSnapshots,
)
from .state import CALL_DOC, IMAGE_DOC, SPACE_DOC, RecoveryEvent

__all__ = [
    "CALL_DOC",
    "IMAGE_DOC",
    "SPACE_DOC",
    "CheckpointRef",
    "CheckpointStore",
    "DirectoryCheckpointStore",
    "DurableSpaces",
    "RecoveryEvent",
    "SnapshotProvider",
    "TransactionalLimits",
    "WorkspaceSnapshots",
    "durable_spaces",
]
