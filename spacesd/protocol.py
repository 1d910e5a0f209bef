"""The message shapes of the spacesd protocol, shared by the daemon and the host side.

Standard library only: this file is copied into container images and VM disks, and
``durable`` imports it (the only part of ``spacesd`` it may import).

It also defines the one workspace hash used on both sides of the invariant: the checker
computes it over the state the committed log implies, the Space over what is on disk.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Literal

PROTOCOL_VERSION = 1

#: Capabilities a daemon may announce.
CAP_EXEC_LEDGER = "process.exec_ledger"
CAP_EPOCH = "process.epoch"
#: ``advance_epoch`` takes ``own`` (its owner fences what its own epoch started too).
CAP_EPOCH_OWN = "process.epoch.own"
CAP_FS = "fs"
CAP_SCAN = "workspace.scan"
CAP_CHECKPOINT = "workspace.checkpoint"

#: Size of the output tail the ledger keeps per ended command (``shim.ENDED_KEEP_BYTES``).
OUTPUT_TAIL_BYTES = 64 * 1024

ExecState = Literal["started", "running", "exited", "lost", "unknown"]
EntryKind = Literal["file", "dir", "symlink", "fifo"]

# Error codes carried in error responses ({"error": {"code": ..., "message": ...}}).
ERR_STALE_EPOCH = "stale_epoch"
ERR_UNAUTHORIZED = "unauthorized"
ERR_BAD_REQUEST = "bad_request"
ERR_NOT_FOUND = "not_found"
ERR_OUTSIDE_ROOT = "outside_root"
ERR_TOO_LARGE = "too_large"
ERR_CONFLICT = "conflict"
ERR_EPOCH_TAKEN = "epoch_taken"
#: The daemon's own stored state needed for the request is damaged (a checkpoint's manifest
#: or object): nothing was changed from it; the message names the file.
ERR_DAMAGED = "damaged"
#: The Space's disk is full (``ENOSPC``, ``EDQUOT``) where the daemon keeps its own state:
#: what the request recorded before that stays recorded (an exec key then reads as lost).
ERR_NO_SPACE = "no_space"
ERR_INTERNAL = "internal"


@dataclass(frozen=True)
class ExecInfo:
    """What the exec ledger knows of one key.

    ``state``: ``started`` (this request started it), ``running``, ``exited``, ``lost``
    (no exit recorded and the process is gone: the outcome is unknown), ``unknown`` (the key
    was never seen). ``output`` is the output read by this request (from the requested
    offset) or, for a replay, the recorded tail; ``output_offset`` is the byte offset of
    its first byte in the command's whole output.
    """

    key: str
    state: ExecState
    epoch: int | None = None
    pid: int | None = None
    exit_code: int | None = None
    output: str = ""
    output_offset: int = 0
    output_size: int = 0
    started_ms: int | None = None
    ended_ms: int | None = None
    #: The floor epoch that killed this process (``advance_epoch``), when that is how it ended.
    fenced_by: int | None = None
    #: The signal that ended the process, when one did.
    signal: int | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> ExecInfo:
        return cls(**raw)


@dataclass(frozen=True)
class ScanEntry:
    """One entry of the workspace state (docs/workloads.md says what every path keeps).

    ``path``: the name relative to the root, bytes that are not UTF-8 carried as
    ``os.fsdecode`` does (surrogate escapes), so any name Linux allows but NUL and '/'.
    ``kind``: ``file``, ``dir`` (empty ones included), ``symlink`` (any target, absolute or
    dangling: a link is data) or ``fifo``. ``mode``: every permission bit (set-id and sticky
    included; 0 for symlinks). ``mtime_ns``: the modification time (None in a state that
    does not decide it, such as a model that cannot know when a command wrote). ``link``:
    for the second and later members of a hardlink group (in path order), the first one's
    path. ``extents``: for a sparse file (one with holes), its data extents as
    ``[offset, length]`` pairs; None for a dense one.
    """

    path: str
    kind: EntryKind
    exec: bool = False
    size: int = 0
    sha256: str | None = None  # files
    target: str | None = None  # symlinks
    mode: int = 0
    mtime_ns: int | None = None
    link: str | None = None
    extents: tuple[tuple[int, int], ...] | None = None

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        if self.extents is not None:
            out["extents"] = [list(x) for x in self.extents]
        return out

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> ScanEntry:
        extents = raw.get("extents")
        return cls(**{**raw, "extents": None if extents is None else
                      tuple((int(a), int(b)) for a, b in extents)})

    def ident(self) -> str:
        """What the content is: a file's sha256, a link's target, '' for the rest."""
        if self.kind == "file":
            return self.sha256 or ""
        return self.target or "" if self.kind == "symlink" else ""

    def state(self) -> list[Any]:
        """The fields the workspace hash covers, as a JSON-able list."""
        return [self.path, self.kind, 0 if self.kind == "symlink" else self.mode, self.ident(),
                self.link, None if self.extents is None else [list(x) for x in self.extents],
                self.mtime_ns]


@dataclass(frozen=True)
class ScanResult:
    entries: list[ScanEntry]
    #: Entries the state cannot keep, each with why (a socket, a device), as
    #: ``"<path>: <why>"``.
    refused: list[str] = field(default_factory=list)
    #: True when any process started by the daemon is still running.
    running: bool = False
    #: Keys of the processes still running.
    running_keys: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "entries": [e.to_json() for e in self.entries],
            "refused": list(self.refused),
            "running": self.running,
            "running_keys": list(self.running_keys),
        }

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> ScanResult:
        return cls(
            entries=[ScanEntry.from_json(e) for e in raw["entries"]],
            refused=list(raw.get("refused", [])),
            running=bool(raw.get("running", False)),
            running_keys=list(raw.get("running_keys", [])),
        )


def applied_scan(held: dict[str, ScanEntry] | None, full: bool, entries: Iterable[ScanEntry],
                 removed: Iterable[str]) -> dict[str, ScanEntry]:
    """The workspace state a scan answer (``spacesd.watched_scan``) makes of the state
    ``held`` before it, by path: ``entries`` alone when the answer is ``full``, else the
    difference applied to a copy of ``held``. A difference with no state held is a
    protocol error: send ``since`` only with the state of its answer."""
    if full:
        return {e.path: e for e in entries}
    if held is None:
        raise ValueError("a scan answered a difference, but this client held no state to "
                         "apply it to: it sent 'since' without keeping that answer's state")
    state = dict(held)
    for path in removed:
        state.pop(path, None)
    state.update((e.path, e) for e in entries)
    return state


@dataclass(frozen=True)
class CheckpointInfo:
    id: str
    files: int = 0
    bytes: int = 0
    created_ms: int = 0

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> CheckpointInfo:
        return cls(**raw)


def workspace_hash(entries: Iterable[ScanEntry]) -> str:
    """sha256 over the sorted workspace state: every entry's ``ScanEntry.state()``, one JSON
    line each (a name may hold a newline: JSON escapes it, so no two states share a text).

    This is the one definition used by the Space, the workspace image, the checkpoint
    manifests and the checker: "equal" means names, kinds, every mode bit, contents and
    link targets, hardlink groups, sparse extents and mtimes alike. An entry whose
    ``mtime_ns`` is None hashes without one: compare such a state with ``times_as`` first.
    """
    h = hashlib.sha256()
    for state in sorted((e.state() for e in entries), key=lambda s: s[0]):
        h.update(json.dumps(state, separators=(",", ":")).encode("ascii") + b"\n")
    return h.hexdigest()


def times_as(entries: Iterable[ScanEntry], like: Iterable[ScanEntry]) -> list[ScanEntry]:
    """``entries`` with the mtime dropped wherever ``like`` (the state they are compared
    with) does not decide it: an entry ``like`` lacks, or holds with ``mtime_ns`` None."""
    decided = {e.path for e in like if e.mtime_ns is not None}
    return [e if e.path in decided else replace(e, mtime_ns=None) for e in entries]


# ---------------------------------------------------------------- wire format
#
# JSON over HTTP/1.1. Every operation is ``POST /v1/<op>`` with a JSON object body that
# carries ``epoch`` (int) and the operation's fields; the answer is a JSON object, or on
# error ``{"error": {"code": ..., "message": ...}}`` with the status of ``ERROR_STATUS``.
# Every request needs ``Authorization: Bearer <token>`` except ``GET /v1/health``.
# Two operations are not JSON-in/JSON-out: ``checkpoint_export`` answers with a chunked tar
# stream, and ``checkpoint_import`` takes the tar as its body, with ``id`` and ``epoch`` in
# the query string.

API_PREFIX = "/v1/"
HEALTH_PATH = API_PREFIX + "health"
OP_CHECKPOINT_EXPORT = "checkpoint_export"
OP_CHECKPOINT_IMPORT = "checkpoint_import"

#: HTTP status of each error code.
ERROR_STATUS: dict[str, int] = {
    ERR_BAD_REQUEST: 400,
    ERR_UNAUTHORIZED: 401,
    ERR_OUTSIDE_ROOT: 403,
    ERR_NOT_FOUND: 404,
    ERR_CONFLICT: 409,
    ERR_EPOCH_TAKEN: 409,
    ERR_STALE_EPOCH: 412,
    ERR_TOO_LARGE: 413,
    ERR_DAMAGED: 500,
    ERR_NO_SPACE: 507,
    ERR_INTERNAL: 500,
}

#: Default limit of a JSON request body (file writes travel base64-encoded inside it).
DEFAULT_MAX_BODY = 64 * 1024 * 1024

# ---------------------------------------------------------------- the daemon's resource limits
#
# A JSON body costs the daemon about twice its size while it is parsed and handled (the
# decoded text, then the parsed strings; a file write adds its decoded bytes), so memory is
# bounded by a byte budget across the bodies in flight, not by their number alone.

#: Default byte budget of the JSON bodies held at once: two maximum-size bodies, or many
#: small ones. A request whose body does not fit waits (``BUSY_WAIT_SECONDS``), then 503.
DEFAULT_BODY_BUDGET = 2 * DEFAULT_MAX_BODY
#: Default number of requests handled at once (``exec_wait`` holds one up to 30 s, so this
#: is not small); beyond it a request waits (``BUSY_WAIT_SECONDS``), then gets 503.
DEFAULT_MAX_REQUESTS = 64
#: Default number of open connections (one thread each); beyond it a connection gets 503 at
#: once and is closed.
DEFAULT_MAX_CONNECTIONS = 256
#: Seconds a new connection has to send its request line and headers (an idle keep-alive
#: connection of an authenticated client gets the handler's idle timeout instead).
HEADER_TIMEOUT_SECONDS = 10.0
#: Seconds a request waits for a free slot or room in the body budget before its 503.
BUSY_WAIT_SECONDS = 10.0
#: HTTP status and error code of a request refused because the daemon is at its limits
#: (not in ``ERROR_STATUS``: clients see an ordinary error with this code; retry later).
BUSY_STATUS = 503
ERR_BUSY = "busy"
#: Deepest JSON nesting a request body may have (request fields are flat: strings, numbers,
#: lists of strings, objects of strings).
MAX_JSON_DEPTH = 32
#: Largest integer a request field may hold (a signed 64-bit file offset).
MAX_INT = 2**63 - 1
#: Longest name (path component) and path, in UTF-8 bytes, a request may name (Linux's
#: NAME_MAX and PATH_MAX - 1).
MAX_NAME_BYTES = 255
MAX_PATH_BYTES = 4095
#: Most bytes one ``read_file`` answer carries: the largest ``limit``, and a read without one
#: of a file with more from ``offset`` is refused ``too_large`` (read it in parts). The
#: answer's memory (the bytes, their base64, the JSON) is held in the body budget while it is
#: built and sent.
MAX_READ_LIMIT = 16 * 1024 * 1024
#: What an answer of n read bytes costs the daemon at its peak, in bytes, per byte read.
READ_ANSWER_COST = 5

#: How long the daemon holds one ``exec_wait`` request open waiting for output or an exit.
EXEC_WAIT_SECONDS = 0.2

#: Set in the environment of every command the daemon starts (value: the daemon's state
#: directory), so that a provider can find every process of a Space, even after the daemon
#: that started them is gone (``restart`` as a machine restart would).
ENV_SPACE_STATE = "SPACESD_STATE"


def op_path(op: str) -> str:
    """The URL path of operation ``op``."""
    return API_PREFIX + op


# ---------------------------------------------------------------- the daemon's state files
#
# What the daemon records of its commands and fences, under its state directory. Providers
# copy these files out of a Space (``save_state``) and ``spacesd.audit.read_state`` reads
# the copy, so the names are part of the contract between the daemon and the host side.

#: The exec ledger: fsynced JSON lines ``start`` and ``end`` (``spacesd.exec_ledger``).
STATE_LEDGER = "ledger.jsonl"
#: The fence audit journal: what each advance, restore and start-up sweep found alive.
STATE_FENCES = "fences.jsonl"
#: The epoch floor: ``<epoch> [<owner> [<round>]]`` (``spacesd.epoch_fence``).
STATE_EPOCH = "epoch"
#: The Space's id, made when its daemon first started (``spacesd.space_identity``).
STATE_SPACE_ID = "space_id"
#: Held (``flock``) by the daemon for its whole life, and naming its pid: one daemon per
#: state directory, and how the host finds it whatever its command line (``spacesd.__main__``).
STATE_DAEMON_LOCK = "daemon.lock"
#: The per-command files: ``<id>.claim`` (the shim's pid or ``lost``), ``<id>.exit`` (the
#: exit status), ``<id>.out`` (the output, not needed by an audit).
STATE_EXEC_DIR = "exec"
_AUDIT_EXEC_SUFFIXES = (".claim", ".exit")


def is_audit_file(rel: str) -> bool:
    """Whether ``rel``, a path relative to a state directory, is one an audit reads:
    the ledger, the fence journal, the epoch, the Space's id, and the claim and exit file of
    each command (not their output, not checkpoints, not temp files)."""
    if rel in (STATE_LEDGER, STATE_FENCES, STATE_EPOCH, STATE_SPACE_ID):
        return True
    parent, _, name = rel.partition("/")
    return (parent == STATE_EXEC_DIR and "/" not in name and not name.startswith(".")
            and name.endswith(_AUDIT_EXEC_SUFFIXES))
