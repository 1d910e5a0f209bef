"""Every error the durable runtime raises, under one root.

Each class says when it is raised and what to do about it. Callers that add context use
``exc.add_note(...)`` rather than wrapping, so the original type and traceback survive.
"""

from __future__ import annotations


class DurableError(Exception):
    """Root of every error raised by ``durable``."""


# ---------------------------------------------------------------- storage and log


class StorageError(DurableError):
    """The storage refused a commit and nothing was written.

    Raised for a commit that definitely did not land (a constraint, a closed storage, a file
    that is not a log). The log stays usable unless the message says otherwise.
    """


class StorageUncertain(StorageError):
    """A commit failed in a way that leaves its outcome unknown (an I/O error at fsync, a
    lost connection). The log closes itself: reopen it to see what landed."""


class StorageClosed(StorageError):
    """The storage (or the log on top of it) was closed; open it again to continue."""


class NotALog(StorageError):
    """The file or directory given is not a durable log (wrong schema, foreign SQLite file,
    garbage JSONL). Point the storage at a log created by ``durable``, or at a new path."""


class CorruptLog(StorageError):
    """A log is damaged: a record that fails its checksum or cannot be decoded anywhere but
    in a torn final write, fewer commits than its commit mark says (a lost SQLite ``-wal``,
    a cut JSONL file), or an existing empty file where a log should be.

    A torn *final* write of a JSONL log is expected after a crash and removed on reopen;
    anything else means the file was edited, copied without its companions or the disk is
    failing. Restore it from a copy (the message says which file); nothing was changed."""


class LogConflict(StorageError):
    """Another writer committed to the same log since this one opened it. Only one writer
    per epoch may use a log: reopen it (and use a fenced storage to keep older writers out)."""


class DuplicateRequest(StorageError):
    """A request id was already admitted in this conversation. The earlier admission stands;
    this is how a retried submission is kept from being admitted twice."""


class StaleEpochError(DurableError):
    """A newer epoch exists: this writer (driver, client) was fenced off.

    Raised by fenced storages and by Spaces when a request carries an epoch below the floor.
    It is never turned into a tool result. Stop this process: a newer driver owns the session.
    """

    def __init__(self, message: str, *, epoch: int | None = None, floor: int | None = None):
        super().__init__(message)
        self.epoch = epoch
        self.floor = floor


class EpochTaken(DurableError):
    """A Space's floor already is this driver's epoch and another owner raised it (a second
    driver launched with the same epoch, or a new log on a Space an earlier driver raised to
    exactly this epoch). One epoch has one owner: run above ``floor`` (the session driver
    does, by itself), which fences the other owner's processes."""

    def __init__(self, message: str, *, epoch: int, floor: int):
        super().__init__(message)
        self.epoch = epoch
        self.floor = floor


class UnknownEntryKind(DurableError):
    """An entry kind that this version of ``durable`` does not know. Use one of
    ``durable.log.ENTRY_KINDS``, or upgrade the code that reads this log."""


# ---------------------------------------------------------------- documents


class DocError(DurableError):
    """Root of document errors."""


class DocTooLarge(DocError):
    """A document value encodes to more than 64 KiB of JSON. Keep large data in files or
    entries and store a reference in the document."""


class DocVersionError(DocError):
    """The stored document was written by a newer version of its definition than the code
    reading it. Upgrade the code (raise ``version`` and add a ``migrate``) before reading."""


class DocConflict(DocError):
    """``expect_revision`` did not match: another edit landed first. Read the document again
    and decide, or use ``update_doc`` without ``expect_revision`` to retry automatically."""


class UnknownDoc(DocError):
    """A document kind that was never defined with ``define_doc``. Define it (at import time
    of the module that owns it) before reading or writing it."""


# ---------------------------------------------------------------- harness and tools


class ToolError(DurableError):
    """A tool failed in an expected way; the model receives the message as an error result."""


class ToolInputError(ToolError):
    """A tool call's arguments do not match the tool's input schema. The model receives the
    message as an error result and may call again with corrected arguments."""


class UnknownTool(ToolError):
    """The model called a tool that is not in the registry."""


class PermanentFailure(DurableError):
    """The session cannot go on by retrying (bad configuration, a missing capability, a lost
    Space with no way to rebuild it). The driver exits 78; fix the cause, then start again."""


class HaltError(DurableError):
    """A Space could not be brought under the session's fence (its epoch could not be
    advanced). ``permanent`` tells whether retrying can help: a missing capability cannot."""

    def __init__(self, message: str, *, permanent: bool):
        super().__init__(message)
        self.permanent = permanent


class SpaceError(DurableError):
    """A Space operation failed (the daemon answered with an error, or could not be reached).
    ``code`` is the protocol's error code when the daemon answered."""

    def __init__(self, message: str, *, code: str | None = None, status: int | None = None):
        super().__init__(message)
        self.code = code
        self.status = status


class SpaceUnavailable(SpaceError):
    """The Space's daemon could not be reached (not running, restarting, or the Space is
    gone). Recovery treats commands in flight as unknown."""


class SpaceFull(SpaceError):
    """The Space's disk had no room for what the daemon must record (its answer 507
    ``no_space``): nothing is lost, and a driver that meets it halts (a later one goes on
    once there is room)."""


class SpaceNotFound(SpaceError):
    """No Space with that name exists in this provider. Create it, or check the name."""
