"""The Space adapter: keeps a conversation's Space consistent with the log across crashes
(``facade`` says how the parts fit)."""

from .checkpoint_store import CheckpointStore, DirectoryCheckpointStore
from .facade import WRAPPED, DurableSpaces, SpacesExtension, durable_spaces
from .image import TransactionalLimits
from .snapshots import CheckpointRef, SnapshotProvider, WorkspaceSnapshots
from .state import CALL_DOC, IMAGE_DOC, SPACE_DOC, RecoveryEvent

__all__ = [
    "CALL_DOC",
    "IMAGE_DOC",
    "SPACE_DOC",
    "WRAPPED",
    "CheckpointRef",
    "CheckpointStore",
    "DirectoryCheckpointStore",
    "DurableSpaces",
    "RecoveryEvent",
    "SnapshotProvider",
    "SpacesExtension",
    "TransactionalLimits",
    "WorkspaceSnapshots",
    "durable_spaces",
]
