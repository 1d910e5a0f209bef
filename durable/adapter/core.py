"""The Space adapter: bash, write and edit run in a Space that stays consistent with the log.

Modes (per conversation, recorded in ``cua.space``):

- ``transactional``: the log holds an image of the workspace (``image.py``). Before a call
  the workspace is scanned and any change made outside the calls is committed with the call's
  start mark; after the call its diff is committed in the same transaction as its result.
  After a crash whose outcome is unknown the workspace is *reverted* to the image (the state
  before the call) and the call runs again, whatever the tool: no call ends interrupted.
  Effects outside the workspace (a network call, a host tool) may therefore repeat.
- ``checkpoint``: after a call's effects its outcome is recorded, the Space is checkpointed
  and the checkpoint recorded with the result. After a crash whose outcome is unknown the
  Space is restored to the newest checkpoint; write and edit (and tools declared
  ``replay="safe"``) run again, a shell command that started is never started a second time:
  the call ends interrupted, telling the model the sandbox was restored.
- ``auto``: transactional while it can be, then checkpoint, permanently, with the reason.

Recovery of an interrupted call (its intent committed, no result), in order:

1. outcome recorded (checkpoint mode): adopt it; take the checkpoint if the crash prevented it;
2. shell command running (same Space generation): reattach to it;
3. exited by itself: replay its recorded outcome; it does not run again;
4. never reached the Space (no start mark, or a key the ledger never saw): run it;
5. anything else is unknown (lost with the daemon or the Space, cut off by a newer epoch,
   a file tool cut off mid-write): revert (transactional) or restore (checkpoint) as above.

The rules are a pure table in ``decide.py`` (``decide`` for an interrupted call,
``decide_rebuild`` for a Space that is not ready); ``_recover`` and ``_rebuild`` gather its
facts and carry the decision out. Every decision is recorded as ``RecoveryEvent``s with its
cause and this driver's epoch, committed to the log with the call's result.

Space generations: before the adapter creates a conversation's Space it commits a new
generation to ``cua.space``; every start mark carries the generation it ran in. A command
whose generation is not the current one ran in a Space that no longer exists: unknown, even
if the new Space's ledger has never heard of its key.
"""

from __future__ import annotations

import os
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from spacesd.protocol import CAP_EPOCH, CAP_EXEC_LEDGER, CAP_SCAN, ExecInfo, ScanResult

from ..coding_tools import apply_edits, bash_result
from ..errors import (
    HaltError,
    PermanentFailure,
    SpaceError,
    SpaceUnavailable,
    StaleEpochError,
    ToolError,
)
from ..failpoints import failpoint
from ..fence import Fence
from ..log import Log, Transaction
from ..spaces import SpaceClient, Spaces
from ..tools import CallContext, Tool, ToolResult, interrupted_result
from . import image as img
from .decide import (
    Action,
    Cause,
    Decision,
    Facts,
    ModeCause,
    RebuildFacts,
    decide,
    decide_rebuild,
    ledger_state,
    needs_ledger,
)
from .snapshots import CheckpointRef, SnapshotProvider
from .space_env import SpaceEnv, tool_error
from .space_names import check_prefix, exec_key, session_token, space_name
from .state import (
    CALL_DOC,
    IMAGE_DOC,
    SPACE_DOC,
    EventKind,
    Mode,
    RecoveryEvent,
    call_record,
)

#: How often live output streaming checks the log's fence.
FENCE_CHECK_INTERVAL_S = 0.2
WRAPPED = ("bash", "write", "edit")


@dataclass(frozen=True)
class TransactionalLimits:
    """When the workspace is too big (or has untrackable names) to keep as an image."""

    max_files: int = 1000
    max_bytes: int = 16 * 1024 * 1024
    exclude: list[str] = field(default_factory=list)

    def limits(self) -> img.Limits:
        return img.Limits(self.max_files, self.max_bytes, tuple(self.exclude))


@dataclass
class _Space:
    """This process's view of one conversation's Space."""

    name: str
    client: SpaceClient
    image: img.Image = field(default_factory=img.Image)


class DurableSpaces:
    """Build with ``durable_spaces(...)``. ``.env`` and ``.extension`` plug into a Harness.

    ``session`` names the session: its Spaces are ``<space_prefix>-<session>-c<conversation>``
    and its exec keys start with it (``space_names``), so sessions never share a Space or a
    recorded result. ``on_stale`` is called once for each refusal by a newer epoch this
    adapter meets (the Space's floor, or the log's fence while a command streams), before
    the ``StaleEpochError`` propagates; the driver stops then.
    """

    def __init__(
        self,
        *,
        session: str,
        spaces: Spaces,
        snapshots: SnapshotProvider,
        cwd: str = ".",
        mode: str = "auto",
        fence: Fence | None = None,
        on_stale: Callable[[StaleEpochError], None] | None = None,
        on_halt: Callable[[HaltError], None] | None = None,
        epoch: int | None = None,
        transactional: TransactionalLimits | None = None,
        space_prefix: str = "cua",
    ) -> None:
        if mode not in ("auto", "transactional", "checkpoint"):
            raise ValueError(f"mode must be 'auto', 'transactional' or 'checkpoint', got {mode!r}")
        if epoch is None:
            raw = os.environ.get("CUA_SESSION_EPOCH")
            if raw is None or not raw.isdigit():
                raise PermanentFailure(
                    f"no session epoch: pass epoch= or set CUA_SESSION_EPOCH to an integer "
                    f"(got {raw!r})")
            epoch = int(raw)
        self.session = session_token(session)
        #: This adapter's ``advance_epoch`` owner: one epoch of a Space has one owner.
        self.owner = uuid.uuid4().hex
        self.spaces = spaces
        self.snapshots = snapshots
        self.cwd = cwd
        self.mode = mode
        self.fence = fence
        self.on_stale = on_stale
        self.on_halt = on_halt
        self.epoch = epoch
        self.limits = (transactional or TransactionalLimits()).limits()
        self.space_prefix = check_prefix(space_prefix)
        #: Every recovery event this process decided, in order (also committed to the log).
        self.events: list[RecoveryEvent] = []
        self._spaces: dict[int, _Space] = {}
        self._lock = threading.RLock()
        self.extension = _Extension(self)

    # ------------------------------------------------------------------ public API

    def space_name(self, conversation: int) -> str:
        return space_name(self.space_prefix, self.session, conversation)

    def env(self, log: Log, conversation: int) -> SpaceEnv:
        """The harness's env factory: the conversation's Space as an ``ExecutionEnv``."""
        return SpaceEnv(lambda: self.ensure(log, conversation).client, self.cwd)

    def ensure_space(self, harness: Any, conversation: int) -> SpaceClient:
        """Make sure the conversation's Space exists, is fenced at this epoch and holds the
        log's state (rebuilding a lost one); returns its client."""
        with self._lock:
            if not self.spaces.exists(self.space_name(conversation)):
                self._spaces.pop(conversation, None)  # lost since we last used it
            return self.ensure(harness.log, conversation).client

    def raise_epoch(self, name: str) -> dict[str, Any]:
        """Advance the named Space to this session's epoch (kills older commands)."""
        return self._advance(self.spaces.connect(name, epoch=self.epoch))

    # ------------------------------------------------------------------ the Space

    def _advance(self, client: SpaceClient) -> dict[str, Any]:
        try:
            caps = client.capabilities()
        except StaleEpochError:
            raise
        except SpaceError as exc:
            raise self._halt(HaltError(f"Space {client.name} cannot be probed: {exc}",
                                       permanent=False)) from exc
        missing = {CAP_EPOCH, CAP_EXEC_LEDGER} - caps
        if missing:
            raise self._halt(HaltError(
                f"Space {client.name} lacks {sorted(missing)}; it cannot be fenced. Use a "
                "Space image whose daemon supports epochs", permanent=True))
        try:
            return client.advance_epoch(self.epoch, owner=self.owner)
        except StaleEpochError as exc:
            self._stale(exc)
            raise
        except SpaceError as exc:
            raise self._halt(HaltError(f"Space {client.name} refused advance_epoch({self.epoch}):"
                                       f" {exc}", permanent=False)) from exc

    def _halt(self, exc: HaltError) -> HaltError:
        if self.on_halt is not None:
            self.on_halt(exc)
        return exc

    def _stale(self, exc: StaleEpochError) -> None:
        """Tell ``on_stale`` of ``exc``, once: a refusal met deep down (an advance) passes
        through the entry points that report too."""
        if self.on_stale is not None and not getattr(exc, "reported_stale", False):
            exc.reported_stale = True  # type: ignore[attr-defined]
            self.on_stale(exc)

    def ensure(self, log: Log, conversation: int) -> _Space:
        with self._lock:
            st = self._spaces.get(conversation)
            name = self.space_name(conversation)
            doc = log.read_doc(conversation, SPACE_DOC).value
            if st is not None and doc["space"] == name and doc["ready"]:
                return st
            exists = self.spaces.exists(name)
            if doc["space"] == name and doc["ready"] and exists:
                st = _Space(name, self._connect(name))
            elif doc["space"] is None and exists:
                # A Space made for this conversation before its first call (seeded): adopt
                # it, and record its state at once (image or checkpoint) so that losing it
                # from now on loses nothing the log does not hold.
                st = _Space(name, self._connect(name))
                self._fold(log, conversation, st)
                try:
                    _mode, baseline = self._prepare(log, conversation, st, None, "space")
                except ToolError:  # over the limits: the first call reports it
                    baseline = None
                self._commit_space(log, conversation, lambda d: {**d, "space": name,
                                                                 "generation": 1, "ready": True},
                                   extra=baseline)
            else:
                st = self._rebuild(log, conversation, name, doc, exists)
            self._spaces[conversation] = st
            self._fold(log, conversation, st)
            return st

    def _connect(self, name: str) -> SpaceClient:
        client = self.spaces.connect(name, epoch=self.epoch)
        try:
            client.health()
        except SpaceUnavailable:
            # Its daemon is not up: a crash during the Space's creation, a stopped machine.
            # ``create`` is idempotent and brings an existing Space up.
            self.spaces.create(name)
            client = self.spaces.connect(name, epoch=self.epoch)
        self._advance(client)
        return client

    def _commit_space(self, log: Log, conversation: int,
                      fn: Callable[[dict[str, Any]], dict[str, Any]],
                      extra: Callable[[Transaction], None] | None = None) -> None:
        with log.transaction() as tx:
            tx.write_doc(conversation, SPACE_DOC, fn(log.read_doc(conversation, SPACE_DOC).value))
            if extra is not None:
                extra(tx)

    def _rebuild(self, log: Log, conversation: int, name: str, doc: dict[str, Any],
                 exists: bool) -> _Space:
        """Create (or finish creating) the Space and bring it to the log's state, as
        ``decide_rebuild`` says."""
        checkpoint = doc["checkpoint"]
        decision = decide_rebuild(RebuildFacts(
            mode=doc["mode"],
            recorded=("this" if doc["space"] == name else
                      "none" if doc["space"] is None else "other"),
            exists=exists,
            checkpoint=checkpoint is not None,
            checkpoint_inside=(checkpoint is not None and not self.snapshots.durable
                               and CheckpointRef.from_json(checkpoint).space == name)))
        if decision.new_generation:
            # A new generation is committed before the Space is created (see module doc).
            self._commit_space(log, conversation, lambda d: {
                **d, "space": name, "generation": d["generation"] + 1, "ready": False})
        self.spaces.create(name)  # idempotent: also finishes a creation a crash cut short
        st = _Space(name, self._connect(name))
        self._fold(log, conversation, st)
        doc = log.read_doc(conversation, SPACE_DOC).value
        if decision.action == "fail":
            raise PermanentFailure(
                f"the Space {name} of conversation {conversation} was lost in checkpoint "
                "mode and its checkpoints were inside it. Keep copies outside the Space "
                "with WorkspaceSnapshots(store=DirectoryCheckpointStore(path)), or use "
                "transactional mode, whose image is in the log")
        if decision.action == "restore":
            ref = CheckpointRef.from_json(doc["checkpoint"])
            failpoint("recovery.restore", space=name, checkpoint=ref.id)
            self.snapshots.restore(st.client, ref)
        else:
            self._reimage(log, conversation, st)
        (kind,) = decision.events
        event = self._event(kind, doc["mode"], conversation, None, "space", decision.cause,
                            f"Space {name} rebuilt (generation {doc['generation']})")
        self._commit_space(log, conversation, lambda d: {**d, "ready": True},
                           extra=lambda tx: self._record_event(tx, conversation, event))
        return st

    def _event(self, kind: EventKind, mode: str | None, conversation: int,
               call_id: str | None, tool: str, cause: Cause | ModeCause,
               detail: str) -> RecoveryEvent:
        """A recovery event decided by this driver (it carries its epoch)."""
        return RecoveryEvent(kind, mode, call_id, detail, conversation, tool, cause, self.epoch)

    def _note(self, ctx: CallContext, tool: str, kind: EventKind, cause: Cause,
              detail: str, mode: str | None) -> None:
        """Record a recovery event of this call with its result."""
        event = self._event(kind, mode, ctx.conversation, ctx.call_id, tool, cause, detail)
        ctx.on_result(lambda tx, _entry: self._record_event(tx, ctx.conversation, event))

    def _record_now(self, ctx: CallContext, event: RecoveryEvent) -> None:
        """Commit a recovery event of this call at once (not with its result)."""
        def record(tx: Transaction) -> None:
            self._record_event(tx, ctx.conversation, event)

        ctx.commit_now(record)

    def _record_event(self, tx: Transaction, conversation: int, event: RecoveryEvent) -> None:
        tx.append(conversation, "system", event.to_entry())
        self.events.append(event)

    # ------------------------------------------------------------------ the image

    def _fold(self, log: Log, conversation: int, st: _Space) -> None:
        for e in log.entries(conversation):
            if e.id > st.image.upto and e.kind == "system" and img.IMAGE_KEY in e.data:
                st.image.fold(e.id, e.data[img.IMAGE_KEY])

    def _scan(self, st: _Space) -> ScanResult:
        return st.client.scan(exclude=list(self.limits.exclude))

    def _reimage(self, log: Log, conversation: int, st: _Space) -> None:
        """Make the workspace equal to the image: write back what is missing or differs,
        delete what the image lacks."""
        failpoint("recovery.reimage", space=st.name)
        stale = log.read_doc(conversation, IMAGE_DOC).value["stale"]
        if stale:
            raise PermanentFailure(
                f"the workspace image of conversation {conversation} is stale ({stale}), so "
                "the Space cannot be rebuilt from the log; use checkpoint mode with a "
                "CheckpointStore for workspaces this large")
        scan = self._scan(st)
        have = {e.path: e for e in scan.entries}
        rows = img.tracked_rows(scan)
        for path in sorted((p for p in have if p not in st.image.table
                            and not any(q.startswith(p + "/") for q in st.image.table)),
                           reverse=True):
            if have[path].kind == "dir" or rows.get(path) is not None:
                st.client.remove(path, recursive=True)
        for path, row in sorted(st.image.table.items()):
            if rows.get(path) == row:
                continue
            kind, mode, ident = row
            if path in have and have[path].kind == "dir":
                st.client.remove(path, recursive=True)
            elif path in have and (have[path].kind == "symlink" or kind == "symlink"):
                st.client.remove(path)
            if kind == "symlink":
                st.client.symlink(path, ident)
            else:
                entry = log.entry(st.image.blobs[ident])
                st.client.write_file(path, img.blob_from(entry.data, ident), mode=mode)

    def _image_diff(self, st: _Space, scan: ScanResult, call_id: str | None
                    ) -> tuple[img.Diff, dict[str, Any]]:
        """The diff from the image to ``scan`` and the entry data that records it (with the
        bytes of contents the log does not hold yet, read from the Space)."""
        d = img.diff(st.image, img.tracked_rows(scan))
        blobs: dict[str, bytes] = {}
        for sha in d.new_blobs(st.image):
            path = next(p for p, (k, _m, ident) in d.set.items() if k == "file" and ident == sha)
            blobs[sha] = st.client.read_file(path)
        return d, img.payload(d, blobs, call_id=call_id)

    def _stage_image(self, tx: Transaction, conversation: int, st: _Space, scan: ScanResult,
                     call_id: str | None) -> None:
        d, data = self._image_diff(st, scan, call_id)
        if not d:
            return
        entry = tx.append(conversation, "system", data)
        files = [e for e in scan.entries if e.kind in ("file", "symlink")]
        tx.write_doc(conversation, IMAGE_DOC, {
            "stale": None, "files": len(files),
            "bytes": sum(e.size for e in files if e.kind == "file")})
        st.image.fold(entry, data[img.IMAGE_KEY])

    # ------------------------------------------------------------------ modes

    def _mode(self, log: Log, conversation: int, st: _Space) -> tuple[Mode, str | None]:
        """The conversation's mode, and the reason when it must be decided now."""
        doc = log.read_doc(conversation, SPACE_DOC).value
        if doc["mode"] is not None:
            return doc["mode"], None
        if self.mode != "auto":
            return self.mode, f"mode={self.mode} requested"  # type: ignore[return-value]
        if self.snapshots.kind != "workspace":
            return "checkpoint", f"the snapshot provider takes {self.snapshots.kind} snapshots"
        if CAP_SCAN not in st.client.capabilities():
            return "checkpoint", "the Space cannot scan its workspace"
        return "transactional", "auto: a new conversation starts transactional"

    def _set_mode(self, tx: Transaction, conversation: int, mode: Mode, reason: str) -> None:
        doc = tx.read_doc(conversation, SPACE_DOC)
        tx.write_doc(conversation, SPACE_DOC, {**doc, "mode": mode, "mode_reason": reason})

    def _switch(self, tx: Transaction, conversation: int, call_id: str | None,
                tool: str, cause: ModeCause, reason: str) -> None:
        """auto: switch to checkpoint mode, for good, and record why."""
        self._set_mode(tx, conversation, "checkpoint", reason)
        self._record_event(tx, conversation, self._event(
            "mode", "checkpoint", conversation, call_id, tool, cause, reason))

    def _checkpoint(self, ctx: CallContext, st: _Space, mode: Mode) -> None:
        """Checkpoint the Space and record it with the call's result."""
        cid = f"{st.name}.{ctx.call_id}.e{self.epoch}".replace("/", "_")
        failpoint("checkpoint.before", call=ctx.call_id, checkpoint=cid)
        ref = self.snapshots.take(st.client, cid)
        failpoint("checkpoint.after", call=ctx.call_id, checkpoint=cid)
        ctx.update_doc(SPACE_DOC, lambda d: {**d, "checkpoint": {
            **ref.to_json(), "call_id": ctx.call_id, "entry": None}})

        def record_entry(_tx: Transaction, result_entry: int) -> None:
            ctx.update_doc(SPACE_DOC, lambda d: {
                **d, "checkpoint": {**d["checkpoint"], "entry": result_entry}})

        ctx.on_result(record_entry)

    # ------------------------------------------------------------------ a wrapped call

    def run_call(self, tool: str, args: dict[str, Any], ctx: CallContext, replay: str
                 ) -> ToolResult:
        try:
            try:
                return self._run_call(tool, args, ctx)
            except SpaceUnavailable:
                # The Space's daemon went away mid-call (killed, restarted, or the Space was
                # deleted). Wait for it, then recover this call in-process exactly as a new
                # driver would: a command that survived the daemon is reattached.
                self._wait_for_space(ctx.conversation)
                return self._recover(tool, args, ctx, replay)
        except StaleEpochError as exc:
            self._stale(exc)
            raise

    def _wait_for_space(self, conversation: int, timeout: float = 30.0) -> None:
        """Block until the conversation's Space answers again or is known to be gone."""
        name = self.space_name(conversation)
        with self._lock:
            self._spaces.pop(conversation, None)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.spaces.exists(name):
                return  # lost: ensure() rebuilds it
            try:
                self.spaces.connect(name, epoch=self.epoch).health()
                return
            except SpaceError:
                time.sleep(0.2)
        raise SpaceUnavailable(f"Space {name} did not come back within {timeout:.0f} s")

    def recover_call(self, tool: str, args: dict[str, Any], ctx: CallContext,
                     replay: str) -> ToolResult:
        try:
            return self._recover(tool, args, ctx, replay)
        except StaleEpochError as exc:
            self._stale(exc)
            raise

    def _prepare(self, log: Log, conv: int, st: _Space, call_id: str | None,
                 tool: str) -> tuple[Mode, Callable[[Transaction], None]]:
        """Decide the mode before a call (or at adoption: ``tool="space"``) and what must be
        committed first: the mode and its reason, a baseline checkpoint, changes made
        outside the calls."""
        mode, reason = self._mode(log, conv, st)
        switch: tuple[ModeCause, str] | None = None
        scan: ScanResult | None = None
        if mode == "transactional":
            scan = self._scan(st)
            stale = log.read_doc(conv, IMAGE_DOC).value["stale"]
            over = img.over_limits(scan, self.limits)
            problem = over or stale
            if problem and self.mode == "transactional":
                raise ToolError(
                    f"the workspace cannot be kept transactionally: {problem}. Use "
                    "mode='checkpoint' (or 'auto') for this workspace")
            if problem:
                switch = ("over_limits" if over else "image_stale", problem)
                mode, scan = "checkpoint", None
        ref: CheckpointRef | None = None
        if mode == "checkpoint" and log.read_doc(conv, SPACE_DOC).value["checkpoint"] is None:
            # The state before this call must be restorable: checkpoint it first.
            ref = self.snapshots.take(st.client, f"{st.name}.base-{call_id or 'adopt'}"
                                                 f".e{self.epoch}")

        def stage(tx: Transaction) -> None:
            if switch is not None:
                self._switch(tx, conv, call_id, tool, *switch)
            elif reason is not None:
                self._set_mode(tx, conv, mode, reason)
            if ref is not None:
                tx.write_doc(conv, SPACE_DOC, {**tx.read_doc(conv, SPACE_DOC), "checkpoint": {
                    **ref.to_json(), "call_id": None, "entry": None}})
            if scan is not None:
                self._stage_image(tx, conv, st, scan, None)
        return mode, stage

    def _run_call(self, tool: str, args: dict[str, Any], ctx: CallContext, *,
                  n: int = 1) -> ToolResult:
        log, conv = ctx.log, ctx.conversation
        st = self.ensure(log, conv)
        mode, prepare = self._prepare(log, conv, st, ctx.call_id, tool)
        gen = log.read_doc(conv, SPACE_DOC).value["generation"]
        record = call_record(ctx.call_id, tool, gen)
        key = exec_key(self.session, conv, ctx.call_id, n, self.epoch)
        if tool == "bash":
            record["commands"].append({"key": key, "epoch": self.epoch, "n": n})

        def start_mark(tx: Transaction) -> None:
            prepare(tx)
            tx.write_doc(conv, CALL_DOC, record)

        ctx.commit_now(start_mark)
        failpoint("space.start_mark", call=ctx.call_id, tool=tool)
        if tool == "bash":
            boot = st.client.health().get("started_ms")
            failpoint("space.before_spawn", call=ctx.call_id, key=key)
            info = st.client.exec_start(key, args["command"], cwd=self.cwd)
            result = self._await(ctx, st, key, info, args.get("timeout"), boot)
        else:
            failpoint("space.file_op", call=ctx.call_id, tool=tool)
            result = self._file_op(st.client, tool, args)
        return self._finish(ctx, st, mode, tool, result)

    def _await(self, ctx: CallContext, st: _Space, key: str, info: ExecInfo,
               timeout: float | None, boot: int | None = None) -> ToolResult:
        """Stream a started (or reattached) command to its end; its output from byte 0.

        ``boot`` is the daemon's start time read before the command was started: a different
        one at the end means the daemon died and came back while the command ran on, and
        the ledger reattached to it (the client retried through the restart)."""
        failpoint("space.running", call=ctx.call_id, key=key)
        chunks: list[str] = []
        last_check = [time.monotonic()]

        def on_output(text: str) -> None:
            now = time.monotonic()
            if self.fence is not None and now - last_check[0] >= FENCE_CHECK_INTERVAL_S:
                last_check[0] = now
                self.fence.check()
            chunks.append(text)
            ctx.progress(text)

        timed_out = False
        if info.state in ("started", "running"):
            ctx.reset_progress()
            info = st.client.exec_wait(key, offset=0, on_output=on_output, timeout=timeout)
            if (boot is not None and info.state == "exited"
                    and st.client.health().get("started_ms") != boot):
                # In-process: the client retried through the restart and the ledger
                # answered for the command, which kept running (the cell of a recovery
                # that found it running).
                self._note(ctx, "bash", "reattached", "running",
                           f"command {key} outlived a daemon restart",
                           ctx.log.read_doc(ctx.conversation, SPACE_DOC).value["mode"])
            if info.state == "running":  # the tool's own timeout: kill it and say so
                info = st.client.exec_kill(key)
                timed_out = True
        else:
            info = st.client.exec_wait(key, offset=0)
            chunks = [info.output]
        failpoint("space.exited", call=ctx.call_id, key=key)
        if info.state == "lost":
            raise SpaceUnavailable(f"command {key} was lost with the Space's daemon; "
                                   "its outcome is unknown")
        return bash_result(info.exit_code, "".join(chunks), timed_out)

    @staticmethod
    def _file_op(client: SpaceClient, tool: str, args: dict[str, Any]) -> ToolResult:
        path = args["path"]
        try:
            if tool == "write":
                data = args["content"].encode("utf-8")
                client.write_file(path, data)
                return ToolResult(f"Wrote {len(data)} bytes to {path}")
            text = client.read_file(path).decode("utf-8")
            client.write_file(path, apply_edits(text, args["edits"], path).encode("utf-8"))
            return ToolResult(f"Applied {len(args['edits'])} edit(s) to {path}")
        except SpaceError as exc:
            raise tool_error(exc) from None

    def _finish(self, ctx: CallContext, st: _Space, mode: Mode, tool: str,
                result: ToolResult) -> ToolResult:
        """Record the outcome (and image diff, or the switch) and checkpoint as the mode says."""
        log, conv = ctx.log, ctx.conversation
        if mode == "transactional":
            scan = self._scan(st)
            problem = img.over_limits(scan, self.limits)
            cause: ModeCause = "over_limits"
            if problem is None and self.mode == "auto" and scan.running:
                cause, problem = "process_running", (
                    f"a command left a process running in the Space "
                    f"({', '.join(scan.running_keys) or 'unknown key'})")
            if problem is None:
                def stage(tx: Transaction, _entry: int) -> None:
                    self._stage_image(tx, conv, st, scan, ctx.call_id)
                ctx.on_result(stage)
                return result
            if self.mode == "transactional":
                def mark_stale(tx: Transaction, _entry: int) -> None:
                    tx.write_doc(conv, IMAGE_DOC, {**log.read_doc(conv, IMAGE_DOC).value,
                                                   "stale": problem})
                ctx.on_result(mark_stale)
                return result
            # auto: the outcome and the switch land together, then the checkpoint follows
            record = {**log.read_doc(conv, CALL_DOC).value, "outcome": result.to_json()}

            def switch(tx: Transaction) -> None:
                tx.write_doc(conv, CALL_DOC, record)
                self._switch(tx, conv, ctx.call_id, tool, cause, problem)
            ctx.commit_now(switch)
        else:
            record = {**log.read_doc(conv, CALL_DOC).value, "outcome": result.to_json()}
            ctx.commit_now(lambda tx: tx.write_doc(conv, CALL_DOC, record))
        failpoint("space.outcome", call=ctx.call_id, tool=tool)
        self._checkpoint(ctx, st, "checkpoint")
        return result

    # ------------------------------------------------------------------ recovery

    def _recover(self, tool: str, args: dict[str, Any], ctx: CallContext,
                 replay: str) -> ToolResult:
        """Recover an interrupted call: gather its facts, ``decide``, carry the decision out."""
        failpoint("recovery.begin", call=ctx.call_id, tool=tool)
        call = self._interrupted(tool, args, ctx, replay)
        decision = decide(call.facts)
        return self._EXECUTORS[decision.action](self, call, decision)

    def _interrupted(self, tool: str, args: dict[str, Any], ctx: CallContext,
                     replay: str) -> _Interrupted:
        """What the log, and the ledger when ``decide`` needs it, say about the call."""
        log, conv = ctx.log, ctx.conversation
        st = self.ensure(log, conv)
        space = log.read_doc(conv, SPACE_DOC).value
        mode: Mode = space["mode"] or self._mode(log, conv, st)[0]
        rec = log.read_doc(conv, CALL_DOC).value
        mine = rec if rec is not None and rec["call_id"] == ctx.call_id else None
        checkpoint = space["checkpoint"]
        facts = Facts(
            mode=mode, tool="bash" if tool == "bash" else "file",
            replay="safe" if replay == "safe" else "never",
            start_mark=mine is not None,
            outcome=mine is not None and mine["outcome"] is not None,
            same_generation=mine is not None and mine["generation"] == space["generation"],
            key=mine is not None and bool(mine["commands"]),
            ledger=None,
            checkpoint=("none" if checkpoint is None else
                        "this_call" if checkpoint["call_id"] == ctx.call_id else "earlier"))
        call = _Interrupted(tool, args, ctx, st, facts, mine, checkpoint)
        if not needs_ledger(facts):
            return call
        info = st.client.exec_status(call.last["key"])
        return replace(call, facts=replace(facts, ledger=ledger_state(info)), info=info)

    def _decided(self, call: _Interrupted, decision: Decision) -> None:
        """Record the decision's events and reach ``recovery.decided``.

        A decision that runs the call again after a revert or a restore is committed at
        once, before the rerun: a command may then start a second time, and that must only
        ever follow a durable record of why (a rerun cut short by another crash would
        otherwise leave a second start with no revert in the log). Other decisions are
        recorded with the call's result."""
        rerun = decision.action in ("revert", "restore_rerun")
        for kind in decision.events:
            detail = call.found(decision.cause) + _DONE.get(kind, "")
            if rerun:
                self._record_now(call.ctx, self._event(
                    kind, call.facts.mode, call.ctx.conversation, call.ctx.call_id, call.tool,
                    decision.cause, detail))
            else:
                self._note(call.ctx, call.tool, kind, decision.cause, detail,
                           call.facts.mode)
        failpoint("recovery.decided", call=call.ctx.call_id, decision=decision.events[-1])

    # One executor per action: its effects, in order.

    def _adopt(self, call: _Interrupted, decision: Decision) -> ToolResult:
        assert call.record is not None
        result = ToolResult(**call.record["outcome"])
        self._decided(call, decision)
        if decision.take_checkpoint:
            self._checkpoint(call.ctx, call.st, call.facts.mode)
        return result

    def _reattach(self, call: _Interrupted, decision: Decision) -> ToolResult:
        assert call.info is not None
        self._decided(call, decision)
        result = self._await(call.ctx, call.st, call.last["key"], call.info,
                             call.args.get("timeout"))
        return self._finish(call.ctx, call.st, call.facts.mode, call.tool, result)

    def _replay(self, call: _Interrupted, decision: Decision) -> ToolResult:
        assert call.info is not None
        self._decided(call, decision)
        result = self._await(call.ctx, call.st, call.last["key"], call.info, None)
        return self._finish(call.ctx, call.st, call.facts.mode, call.tool, result)

    def _run(self, call: _Interrupted, decision: Decision) -> ToolResult:
        self._decided(call, decision)
        return self._run_call(call.tool, call.args, call.ctx, n=call.next_n)

    def _revert(self, call: _Interrupted, decision: Decision) -> ToolResult:
        self._reimage(call.ctx.log, call.ctx.conversation, call.st)
        return self._run(call, decision)

    def _restore(self, call: _Interrupted, decision: Decision) -> ToolResult:
        if decision.restore_from == "checkpoint":
            assert call.checkpoint is not None
            ref = CheckpointRef.from_json(call.checkpoint)
            failpoint("recovery.restore", call=call.ctx.call_id, checkpoint=ref.id)
            self.snapshots.restore(call.st.client, ref)
        else:
            self._reimage(call.ctx.log, call.ctx.conversation, call.st)
        if decision.action == "restore_rerun":
            return self._run(call, decision)
        self._decided(call, decision)
        return interrupted_result(
            call.tool, call.ctx.slot.progress,
            "The sandbox was restored to its state before this call; run it again if needed.")

    _EXECUTORS: dict[Action, Callable[[DurableSpaces, _Interrupted, Decision], ToolResult]] = {
        "adopt": _adopt, "reattach": _reattach, "replay": _replay, "run": _run,
        "revert": _revert, "restore_rerun": _restore, "restore_interrupt": _restore,
    }


#: What an unknown outcome's event adds to what recovery found.
_DONE: dict[EventKind, str] = {
    "reverted": "; the workspace was reverted to the image",
    "restored": "; the Space was restored to the state before the call",
}


@dataclass(frozen=True)
class _Interrupted:
    """An interrupted call as recovery found it: its facts, and what acting on them needs."""

    tool: str
    args: dict[str, Any]
    ctx: CallContext
    st: _Space
    facts: Facts
    #: This call's ``cua.call`` record (None without its start mark).
    record: dict[str, Any] | None
    #: The checkpoint ``cua.space`` records.
    checkpoint: dict[str, Any] | None
    #: The ledger's answer for the last command key, when ``needs_ledger``.
    info: ExecInfo | None = None

    @property
    def last(self) -> dict[str, Any]:
        """The last command started (key, epoch, n); only for a start mark with a key."""
        assert self.record is not None and self.record["commands"]
        return self.record["commands"][-1]

    @property
    def next_n(self) -> int:
        """The number of the next command key: after the last one, else the first."""
        return self.last["n"] + 1 if self.facts.key else 1

    def found(self, cause: Cause) -> str:
        """What recovery found, for people."""
        match cause:
            case "outcome_recorded":
                return "the outcome was recorded before the crash"
            case "no_start_mark" | "no_key":
                return f"the {self.tool} call never reached the Space"
            case "key_unknown":
                return f"command {self.last['key']} never reached the Space"
            case "running":
                return f"command {self.last['key']} is still running"
            case "exited":
                assert self.info is not None
                return f"command {self.last['key']} exited with {self.info.exit_code}"
            case "fenced":
                assert self.info is not None
                return f"command {self.last['key']} was cut off by epoch {self.info.fenced_by}"
            case "daemon_lost":
                return f"command {self.last['key']} was lost"
            case "space_lost":
                return f"the Space that ran the {self.tool} call was lost"
            case "file_cut":
                return f"the {self.tool} call was cut off; it may have partly changed the workspace"
        raise ValueError(f"no recovery of a call is caused by {cause!r}: it is a rebuilt "
                         "Space's cause; see decide.decide_rebuild")


class _Extension:
    """Wraps bash, write and edit so that they run in the conversation's Space."""

    def __init__(self, adapter: DurableSpaces) -> None:
        self.adapter = adapter

    def tools(self) -> list[Tool]:
        return []

    def wrap(self, tool: Tool) -> Tool | None:
        if tool.name not in WRAPPED:
            return None
        adapter = self.adapter
        name = tool.name

        def run(args: dict[str, Any], ctx: CallContext) -> ToolResult:
            return adapter.run_call(name, args, ctx, tool.replay)

        def recover(args: dict[str, Any], ctx: CallContext) -> ToolResult:
            return adapter.recover_call(name, args, ctx, tool.replay)

        return Tool(tool.name, tool.description, tool.schema, run, tool.replay, recover)


def durable_spaces(**kwargs: Any) -> DurableSpaces:
    """Build the adapter; see ``DurableSpaces`` for the arguments."""
    return DurableSpaces(**kwargs)
