"""The daemon's operations: one table of ops, their fields, and how each meets the fence.

``Daemon`` wires the parts (fence, exec ledger, workspace, scanner, checkpoints) and
``call(op, body)`` runs one JSON operation: it validates the epoch and the fields, then runs
the handler under the fence. Operations with effects run inside ``fence.admit`` (a stale
epoch is refused and no advance can slip between the check and the effect); read-only ones
only check the epoch; ``advance_epoch`` holds the fence exclusively. The HTTP layer
(``server``) knows nothing of the ops beyond this table.

Every fence the daemon raises or relies on is written to the fence journal
(``fence_journal``): the start-up sweep, each ``advance_epoch`` and each
``checkpoint_restore``, with what was alive of an older epoch.
"""

from __future__ import annotations

import base64
import binascii
import json
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from . import protocol
from .checkpoints import Checkpoints, Readable, check_id
from .containment import STATE_FILE as CONTAINMENT_FILE
from .containment import Containment, Subreaper
from .epoch_fence import EpochFence, check_owner
from .errors import BadRequest, Conflict, NotFound
from .exec_ledger import ExecLedger
from .failpoints import ENV_VAR, POINTS, Channel
from .fence_journal import Advance, FenceJournal, Restore, Sweep
from .file_ops import Workspace
from .fsio import AtomicWriter
from .manifest import Manifest
from .params import BOOL, INT, NUM, STR, STR_LIST, STR_MAP, Field, check
from .shim import SHIM_ENV_VAR, SYNC_ENV
from .space_identity import load_space_id
from .watched_scan import WatchedScan
from .workspace_scan import Scanner

CAPABILITIES = (protocol.CAP_EXEC_LEDGER, protocol.CAP_EPOCH, protocol.CAP_EPOCH_OWN,
                protocol.CAP_FS, protocol.CAP_SCAN, protocol.CAP_CHECKPOINT)
_MAX_KEY = 1024
_MAX_WAIT = 30.0
#: Variables the daemon sets or keeps for itself: never taken from a request, never given
#: to a command as they are (``SPACESD_STATE`` is set to the state directory).
_RESERVED_ENV = frozenset({protocol.ENV_SPACE_STATE, ENV_VAR, SHIM_ENV_VAR, SYNC_ENV})

FenceUse = Literal["admit", "check", "advance", "none"]


class Encoded(bytes):
    """A result already encoded as JSON (the scan reuses the encoding of unchanged files)."""



@dataclass(frozen=True)
class Op:
    handler: Callable[..., dict[str, Any] | Encoded]
    fields: dict[str, Field]
    #: ``admit``: has effects; ``check``: read-only; ``advance``: raises the floor;
    #: ``none``: reads only what the fence itself is (any epoch may ask).
    fence: FenceUse
    #: Whether the handler takes the request's epoch as ``epoch=``.
    with_epoch: bool = False


class Daemon:
    """``base_env``: the environment of the commands (default: this process's), without
    the reserved variables. ``failpoints``: the failpoint channel, or None (off).
    ``containment``: how commands' processes are tracked and killed (``spacesd.containment``;
    ``python -m spacesd`` selects one; default: ``Subreaper()``, which does not make the
    process that embeds the daemon a subreaper)."""

    def __init__(self, root: str, state_dir: str, *, python: str = sys.executable,
                 base_env: dict[str, str] | None = None, failpoints: str | None = None,
                 containment: Containment | None = None, sync_exits: bool = False) -> None:
        if not os.path.isdir(root):
            raise SystemExit(f"spacesd: workspace root {root!r} is not a directory")
        os.makedirs(state_dir, exist_ok=True)
        self.state_dir = os.path.realpath(state_dir)
        self.failpoints = Channel(failpoints, POINTS, registry="spacesd.failpoints.POINTS",
                                  context={"process": "spacesd", "space_state": self.state_dir})
        self.writer = AtomicWriter(os.path.join(self.state_dir, "tmp"))
        self.containment = containment or Subreaper()
        self.writer.write(os.path.join(self.state_dir, CONTAINMENT_FILE),
                          [json.dumps(self.containment.describe()).encode() + b"\n"],
                          mode=0o644)
        self.fence = EpochFence(os.path.join(self.state_dir, protocol.STATE_EPOCH))
        self.space_id = load_space_id(os.path.join(self.state_dir, protocol.STATE_SPACE_ID),
                                      self.writer)
        self.fences = FenceJournal(os.path.join(self.state_dir, protocol.STATE_FENCES))
        env = {k: v for k, v in (os.environ if base_env is None else base_env).items()
               if k not in _RESERVED_ENV}
        env[protocol.ENV_SPACE_STATE] = self.state_dir
        self.ledger = ExecLedger(self.state_dir, python=python, base_env=env,
                                 failpoints=self.failpoints, containment=self.containment,
                                 sync_exits=sync_exits)
        self.workspace = Workspace(root, self.writer)
        self.scanner = Scanner(root)
        self.watched = WatchedScan(self.scanner)
        self.checkpoints = Checkpoints(self.state_dir, self.workspace, self.watched,
                                       failpoints=self.failpoints)
        # A daemon that crashed inside advance_epoch persisted the floor but may not have
        # killed every older process: finish that before serving anyone.
        floor = self.fence.floor
        killed = self.ledger.fence(floor)
        self.fences.append(Sweep(floor, killed, self.ledger.alive_below(floor)))
        path, opt_int = STR.with_default(""), INT.optional()
        cid = {"id": STR}
        self.ops: dict[str, Op] = {
            "capabilities": Op(self._capabilities, {}, "check"),
            "describe": Op(self._describe, {}, "none"),
            "advance_epoch": Op(self._advance_epoch, {"owner": STR.with_default(""),
                                                      "own": BOOL.with_default(False)},
                                "advance", with_epoch=True),
            "exec_start": Op(self._exec_start, {"key": STR, "command": STR,
                                                "cwd": STR.optional(), "env": STR_MAP.optional()},
                             "admit", with_epoch=True),
            "exec_status": Op(self._exec_status, {"key": STR}, "check"),
            "exec_wait": Op(self._exec_wait, {"key": STR, "offset": INT.with_default(0),
                                              "wait": NUM.with_default(protocol.EXEC_WAIT_SECONDS)},
                            "check"),
            "exec_kill": Op(self._exec_kill, {"key": STR}, "admit"),
            "read_file": Op(self._read_file, {"path": STR, "offset": INT.with_default(0),
                                              "limit": opt_int}, "check"),
            "write_file": Op(self._write_file, {"path": STR, "data": STR, "mode": opt_int},
                             "admit"),
            "edit_file": Op(self._edit_file, {"path": STR, "old": STR, "new": STR}, "admit"),
            "stat": Op(self._stat, {"path": path}, "check"),
            "list_dir": Op(self._list_dir, {"path": path}, "check"),
            "remove": Op(self._remove, {"path": STR, "recursive": BOOL.with_default(False)},
                         "admit"),
            "mkdir": Op(self._mkdir, {"path": STR}, "admit"),
            "symlink": Op(self._symlink, {"path": STR, "target": STR}, "admit"),
            "scan": Op(self._scan, {"exclude": STR_LIST.optional(), "since": STR.optional()},
                       "check"),
            "checkpoint_create": Op(self._checkpoint_create, cid, "admit"),
            "checkpoint_restore": Op(self._checkpoint_restore,
                                     {**cid, "exclude": STR_LIST.optional()}, "admit",
                                     with_epoch=True),
            "checkpoint_list": Op(self._checkpoint_list, {}, "check"),
            "checkpoint_delete": Op(self._checkpoint_delete, cid, "admit"),
        }

    def close(self) -> None:
        self.watched.close()
        self.ledger.close()
        self.fences.close()

    # ---------------------------------------------------------------- dispatch

    @staticmethod
    def epoch_of(op: str, body: dict[str, Any]) -> int:
        """Take the request's ``epoch`` out of ``body``."""
        if "epoch" not in body:
            raise BadRequest(f"{op}: missing field 'epoch' (an integer >= 0); every request "
                             "carries the epoch of its sender")
        epoch: int = check(op, {"epoch": body.pop("epoch")}, {"epoch": INT})["epoch"]
        return epoch

    @staticmethod
    def round_of(op: str, body: dict[str, Any]) -> int | None:
        """Take the request's ``round`` (``epoch_fence``) out of ``body``: None when it
        carries none."""
        if "round" not in body:
            return None
        sent_round: int = check(op, {"round": body.pop("round")}, {"round": INT})["round"]
        return sent_round

    def call(self, op: str, body: Any) -> dict[str, Any] | Encoded:
        spec = self.ops.get(op)
        if spec is None:
            raise NotFound(f"unknown operation {op!r}; known: "
                           f"{', '.join(sorted(self.ops))}, checkpoint_export, "
                           "checkpoint_import, health")
        if not isinstance(body, dict):
            raise BadRequest(f"{op}: the request body must be a JSON object, "
                             f"got {type(body).__name__}")
        epoch = self.epoch_of(op, body)
        sent_round = self.round_of(op, body)
        args = check(op, body, spec.fields)
        if spec.with_epoch:
            args["epoch"] = epoch
        if spec.fence == "advance":  # the round it was sent in tells a late copy
            return spec.handler(**args, sent_round=sent_round)
        if spec.fence == "none":
            return spec.handler(**args)
        if spec.fence == "check":
            self.fence.check(epoch)
            return spec.handler(**args)
        with self.fence.admit(epoch, sent_round):
            return spec.handler(**args)

    def export_manifest(self, body: Any) -> tuple[Manifest, bytes, frozenset[str]]:
        """The checkpoint a ``checkpoint_export`` request names (epoch checked), its
        manifest's JSON, and the objects the receiver has (``have``: left out of the tar)."""
        if not isinstance(body, dict):
            raise BadRequest("checkpoint_export: the request body must be a JSON object")
        self.fence.check(self.epoch_of(protocol.OP_CHECKPOINT_EXPORT, body))
        args = check(protocol.OP_CHECKPOINT_EXPORT, body,
                     {"id": STR, "have": STR_LIST.with_default([])})
        return (*self.checkpoints.load_with_json(args["id"]), frozenset(args["have"]))

    def import_checkpoint(self, query: dict[str, str], stream: Readable) -> dict[str, Any]:
        op = protocol.OP_CHECKPOINT_IMPORT
        # Its epoch and round come in the query (the body is the tar): as integers, they
        # are judged as a JSON body's are.
        fenced: dict[str, Any] = {}
        for name in ("epoch", "round"):
            try:
                fenced.update({name: int(query[name])} if name in query else {})
            except ValueError:
                raise BadRequest(f"{op}: query parameter {name!r} must be an integer") \
                    from None
        epoch, sent_round = self.epoch_of(op, fenced), self.round_of(op, fenced)
        checkpoint_id = check_id(query.get("id", ""))
        with self.fence.admit(epoch, sent_round):
            return self.checkpoints.import_(checkpoint_id, stream).to_json()

    # ---------------------------------------------------------------- handlers

    def _capabilities(self) -> dict[str, Any]:
        return {"capabilities": list(CAPABILITIES), "protocol": protocol.PROTOCOL_VERSION,
                "containment": self.containment.mode}

    def _describe(self) -> dict[str, Any]:
        """Which Space this is and how high its fence stands: what a coordinator reads
        before it chooses an epoch, and a host before it trusts the Space's files."""
        return {"space_id": self.space_id, "floor": self.fence.floor,
                "protocol": protocol.PROTOCOL_VERSION}

    def _advance_epoch(self, epoch: int, owner: str, own: bool, sent_round: int | None
                       ) -> dict[str, Any]:
        """``own``: also kill what ``epoch`` itself started (its owner's own fence, taken
        before it restores or reverts the workspace in the middle of its run), unless it
        is a late copy of one already taken (``EpochFence.advancing``)."""
        with self.fence.advancing(epoch, check_owner(owner), own=own,
                                  sent_round=sent_round) as done:
            if epoch > done.floor_before:
                self.failpoints.report("spacesd.advance.persisted",
                                       {"epoch": epoch, "floor_before": done.floor_before})
            killed = self.ledger.fence(epoch, own=done.own)
            self.fences.append(Advance(epoch, done.floor_before, epoch > done.floor_before,
                                       killed, self.ledger.alive_below(
                                           epoch + 1 if done.own else epoch), done.own))
        return {"floor": done.floor, "round": done.round, "killed": killed}

    @staticmethod
    def _check_key(key: str) -> None:
        if not key or len(key) > _MAX_KEY:
            raise BadRequest(f"exec: field 'key' must be 1-{_MAX_KEY} characters")

    def _exec_start(self, key: str, command: str, cwd: str | None, env: dict[str, str] | None,
                    epoch: int) -> dict[str, Any]:
        self._check_key(key)
        if "\x00" in command:
            raise BadRequest("exec_start: the command contains a NUL byte")
        for name, value in (env or {}).items():
            if not name or "=" in name or "\x00" in name + value:
                raise BadRequest(f"exec_start: bad environment variable {name!r}: names must "
                                 "be non-empty without '=', and no NUL anywhere")
        real_cwd = self.workspace.resolve(cwd or "", follow=True)
        if not os.path.isdir(real_cwd):
            raise Conflict(f"exec_start: cwd {cwd!r} is not a directory of the workspace")
        env = {k: v for k, v in (env or {}).items() if k not in _RESERVED_ENV}
        return self.ledger.start(key, command, real_cwd, env, epoch).to_json()

    def _exec_status(self, key: str) -> dict[str, Any]:
        return self.ledger.status(key).to_json()

    def _exec_wait(self, key: str, offset: int, wait: float) -> dict[str, Any]:
        info, next_offset = self.ledger.read(key, offset, min(wait, _MAX_WAIT))
        return {"info": info.to_json(), "next_offset": next_offset}

    def _exec_kill(self, key: str) -> dict[str, Any]:
        return self.ledger.kill(key).to_json()

    def answer_bytes(self, op: str, body: Any) -> int:
        """What the answer to this request will cost in memory at its peak, if it can be
        large (``read_file``); the server holds that much of its body budget meanwhile. A
        request ``call`` will refuse costs 0."""
        if op != "read_file" or not isinstance(body, dict):
            return 0
        try:  # the same checks ``call`` makes: a path it refuses is never looked at here
            args = check(op, {k: v for k, v in body.items() if k != "epoch"},
                         self.ops[op].fields)
        except BadRequest:
            return 0
        size = self.workspace.read_size(args["path"], args["offset"], args["limit"])
        return size * protocol.READ_ANSWER_COST

    def _read_file(self, path: str, offset: int, limit: int | None) -> dict[str, Any]:
        data = self.workspace.read(path, offset, limit)
        return {"data": base64.b64encode(data).decode("ascii")}

    def _write_file(self, path: str, data: str, mode: int | None) -> dict[str, Any]:
        if mode is not None and mode > 0o7777:
            raise BadRequest(f"write_file: mode {mode:#o} is not a permission mode (<= 0o7777)")
        try:
            raw = base64.b64decode(data, validate=True)
        except (binascii.Error, ValueError):
            raise BadRequest("write_file: field 'data' must be base64") from None
        self.workspace.write(path, raw, mode)
        return {}

    def _edit_file(self, path: str, old: str, new: str) -> dict[str, Any]:
        self.workspace.edit(path, old, new)
        return {}

    def _stat(self, path: str) -> dict[str, Any]:
        return {"stat": self.workspace.stat(path)}

    def _list_dir(self, path: str) -> dict[str, Any]:
        return {"entries": self.workspace.list(path)}

    def _remove(self, path: str, recursive: bool) -> dict[str, Any]:
        return {"removed": self.workspace.remove(path, recursive)}

    def _mkdir(self, path: str) -> dict[str, Any]:
        self.workspace.mkdir(path)
        return {}

    def _symlink(self, path: str, target: str) -> dict[str, Any]:
        self.workspace.symlink(path, target)
        return {}

    def _scan(self, exclude: list[str] | None, since: str | None) -> Encoded:
        """The workspace state, or its difference since the state ``since`` names (a
        token of an earlier answer: see ``watched_scan``)."""
        answer = self.watched.scan(exclude, since)
        running = self.ledger.running_keys()
        rest = json.dumps({"token": answer.token, "full": answer.full,
                           "removed": answer.removed, "refused": answer.refused,
                           "running": bool(running), "running_keys": running},
                          separators=(",", ":")).encode()
        return Encoded(b'{"entries":' + self.scanner.encode(answer.entries) + b","
                       + rest[1:])

    def _checkpoint_create(self, id: str) -> dict[str, Any]:  # noqa: A002 - protocol name
        return self.checkpoints.create(id).to_json()

    def _checkpoint_restore(self, id: str, epoch: int,  # noqa: A002 - protocol name
                            exclude: list[str] | None) -> dict[str, Any]:
        floor = self.fence.floor
        self.fences.append(Restore(id, epoch, floor, self.ledger.alive_below(epoch + 1)))
        return self.checkpoints.restore(id, exclude=exclude).to_json()

    def _checkpoint_list(self) -> dict[str, Any]:
        return {"checkpoints": [c.to_json() for c in self.checkpoints.list()]}

    def _checkpoint_delete(self, id: str) -> dict[str, Any]:  # noqa: A002 - protocol name
        return {"deleted": self.checkpoints.delete(id)}
