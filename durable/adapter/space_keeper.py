"""The conversation's Space and its epoch: connecting to it under this driver's epoch
(fencing every older one), adopting a Space made for the conversation before its first
call, and rebuilding a lost or half-made one to the log's state.

Space generations: before a Space is created, a new generation is committed to
``cua.space``; every start mark carries the generation it ran in. A command whose generation
is not the current one ran in a Space that no longer exists: unknown, even if the new
Space's ledger has never heard of its key. How a Space is rebuilt (restore its checkpoint,
reimage it from the log, or fail) is ``rebuild.decide_rebuild``'s; this keeper gathers its
facts and carries it out.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from spacesd.protocol import CAP_EPOCH, CAP_EPOCH_OWN, CAP_EXEC_LEDGER

from ..errors import (
    HaltError,
    PermanentFailure,
    SpaceError,
    SpaceUnavailable,
    StaleEpochError,
    ToolError,
)
from ..failpoints import failpoint
from ..log import ROOT_CONVERSATION, Log, Transaction
from ..spaces import SpaceClient, Spaces
from .checkpoint_keeper import CheckpointKeeper
from .events import EventRecorder
from .image_keeper import ImageKeeper
from .modes import ModeKeeper
from .rebuild import RebuildFacts, decide_rebuild
from .space_handle import SpaceHandle
from .space_names import space_name
from .state import SPACE, SpaceState


class SpaceKeeper:
    """``on_stale`` is called once for each refusal by a newer epoch (see ``stale``);
    ``on_halt`` with every ``HaltError`` before it is raised."""

    def __init__(self, *, spaces: Spaces, session: str, prefix: str, epoch: int,
                 root_space: str | None = None,
                 on_stale: Callable[[StaleEpochError], None] | None,
                 on_halt: Callable[[HaltError], None] | None, modes: ModeKeeper,
                 image: ImageKeeper, checkpoints: CheckpointKeeper,
                 recorder: EventRecorder) -> None:
        self.spaces = spaces
        self.session = session
        self.prefix = prefix
        self.root_space = root_space
        self.epoch = epoch
        #: This process's ``advance_epoch`` owner: one epoch of a Space has one owner.
        self.owner = uuid.uuid4().hex
        self.on_stale = on_stale
        self.on_halt = on_halt
        self.modes = modes
        self.image = image
        self.checkpoints = checkpoints
        self.recorder = recorder
        self._handles: dict[int, SpaceHandle] = {}
        self._lock = threading.RLock()

    def name(self, conversation: int) -> str:
        if conversation == ROOT_CONVERSATION and self.root_space is not None:
            return self.root_space
        return space_name(self.prefix, self.session, conversation)

    def ensure(self, log: Log, conversation: int, *, check_exists: bool = False) -> SpaceHandle:
        """The conversation's Space, fenced at this epoch and holding the log's state
        (adopted, created or rebuilt first when needed). ``check_exists``: ask the provider
        whether a Space already connected to still exists."""
        with self._lock:
            name = self.name(conversation)
            if check_exists and not self.spaces.exists(name):
                self._handles.pop(conversation, None)  # lost since we last used it
            handle = self._handles.get(conversation)
            state = SPACE.read(log, conversation)
            if handle is not None and state.space == name and state.ready:
                return handle
            exists = self.spaces.exists(name)
            if state.space == name and state.ready and exists:
                handle = self._connect(name)
                if state.space_id is not None and handle.space_id != state.space_id:
                    # Not the Space the log describes: it was made again under its name
                    # (removed and placed anew). Its files are not the log's: as lost.
                    handle = self._rebuild(log, conversation, name, state, exists=False)
            elif state.space is None and exists:
                handle = self._adopt(log, conversation, name)
            else:
                handle = self._rebuild(log, conversation, name, state, exists)
            self._handles[conversation] = handle
            self.image.catch_up(log, conversation)
            return handle

    def wait_for(self, conversation: int, timeout: float = 30.0) -> bool:
        """Block until the conversation's Space answers again (True) or is known to be gone
        (False); the next ``ensure`` reconnects to it."""
        name = self.name(conversation)
        with self._lock:
            self._handles.pop(conversation, None)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.spaces.exists(name):
                return False
            try:
                self.spaces.connect(name, epoch=self.epoch).health()
                return True
            except SpaceError:
                time.sleep(0.2)
        raise SpaceUnavailable(f"Space {name} did not come back within {timeout:.0f} s")

    def stale(self, exc: StaleEpochError) -> None:
        """Tell ``on_stale`` of ``exc``, once: a refusal met deep down (an advance) passes
        through the entry points that report too."""
        if self.on_stale is not None and not getattr(exc, "reported_stale", False):
            exc.reported_stale = True  # type: ignore[attr-defined]  # a mark, for once only
            self.on_stale(exc)

    # ------------------------------------------------------------------ connecting

    def _connect(self, name: str) -> SpaceHandle:
        client = self._up(name)
        caps, _answer = self._advance(client)
        return SpaceHandle(name, client, caps, _space_id(client))

    def _up(self, name: str) -> SpaceClient:
        """A client of the existing Space ``name`` whose daemon answers."""
        client = self.spaces.connect(name, epoch=self.epoch)
        try:
            client.health()
        except SpaceUnavailable:
            # Its daemon is not up: a crash during the Space's creation, a stopped machine.
            # ``create`` is idempotent and brings an existing Space up.
            self.spaces.create(name)
            client = self.spaces.connect(name, epoch=self.epoch)
        return client

    def raise_epoch(self, name: str) -> dict[str, Any]:
        """Fence the Space ``name`` at this epoch before anything uses it: every process an
        older epoch started there dies, and it refuses older epochs from now on. spacesd's
        answer (``{"floor", "killed"}``); ``StaleEpochError`` when a newer epoch holds it,
        ``SpaceNotFound`` when there is no such Space."""
        return self._advance(self._up(name))[1]

    def refence(self, client: SpaceClient, *, own: bool = False) -> None:
        """Fence the Space behind ``client`` at this epoch again: after a machine restore
        brought back an older floor and older processes; with ``own``, this driver's own
        earlier processes too, before it restores or reverts the workspace in the middle of
        its run (the design restores under a new epoch: nothing started before the restore
        may outlive it, or write after it)."""
        self._advance(client, own=own)

    def _advance(self, client: SpaceClient, *, own: bool = False
                 ) -> tuple[frozenset[str], dict[str, Any]]:
        """Fence the Space at this epoch (kills older commands; ``own``: this epoch's
        too); its capabilities and spacesd's answer."""
        try:
            caps = client.capabilities()
        except StaleEpochError:
            raise
        except SpaceError as exc:
            raise self._halt(HaltError(f"Space {client.name} cannot be probed: {exc}",
                                       permanent=False)) from exc
        missing = {CAP_EPOCH, CAP_EXEC_LEDGER, *((CAP_EPOCH_OWN,) if own else ())} - caps
        if missing:
            raise self._halt(HaltError(
                f"Space {client.name} lacks {sorted(missing)}; it cannot be fenced. Use a "
                "Space image whose daemon supports them (rebuild it from this checkout's "
                "spacesd)", permanent=True))
        try:
            answer = client.advance_epoch(self.epoch, owner=self.owner, own=own)
        except StaleEpochError as exc:
            self.stale(exc)
            raise
        except SpaceError as exc:
            raise self._halt(HaltError(f"Space {client.name} refused advance_epoch({self.epoch}):"
                                       f" {exc}", permanent=False)) from exc
        return frozenset(caps), answer

    def _halt(self, exc: HaltError) -> HaltError:
        if self.on_halt is not None:
            self.on_halt(exc)
        return exc

    # ------------------------------------------------------------------ adopting, rebuilding

    def _commit(self, log: Log, conversation: int, change: Callable[[SpaceState], SpaceState],
                extra: Callable[[Transaction], None] | None = None) -> None:
        with log.transaction() as tx:
            SPACE.write(tx, conversation, change(SPACE.read(log, conversation)))
            if extra is not None:
                extra(tx)

    def _adopt(self, log: Log, conversation: int, name: str) -> SpaceHandle:
        """A Space made for this conversation before its first call (seeded): adopt it, and
        record its state at once (image or checkpoint) so that losing it from now on loses
        nothing the log does not hold."""
        handle = self._connect(name)
        self.image.catch_up(log, conversation)
        try:
            _mode, baseline = self.modes.prepare(log, conversation, handle, None, "space")
        except ToolError:  # over the limits: the first call reports it
            baseline = None
        self._commit(log, conversation,
                     lambda s: replace(s, space=name, generation=1, ready=True,
                                       space_id=handle.space_id), extra=baseline)
        return handle

    def _rebuild(self, log: Log, conversation: int, name: str, state: SpaceState,
                 exists: bool) -> SpaceHandle:
        """Create (or finish creating) the Space and bring it to the log's state, as
        ``decide_rebuild`` says."""
        mark = state.checkpoint
        decision = decide_rebuild(RebuildFacts(
            mode=state.mode,
            recorded=("this" if state.space == name else
                      "none" if state.space is None else "other"),
            exists=exists,
            checkpoint=mark is not None,
            checkpoint_inside=mark is not None and self.checkpoints.only_inside(mark, name)))
        if decision.new_generation:
            # A new generation is committed before the Space is created (see module doc).
            self._commit(log, conversation, lambda s: replace(
                s, space=name, generation=s.generation + 1, ready=False))
        self.spaces.create(name)  # idempotent: also finishes a creation a crash cut short
        handle = self._connect(name)
        self.image.catch_up(log, conversation)
        state = SPACE.read(log, conversation)
        if decision.action == "fail":
            raise PermanentFailure(
                f"the Space {name} of conversation {conversation} was lost in checkpoint "
                "mode and its checkpoints were inside it. Keep copies outside the Space "
                "with WorkspaceSnapshots(store=DirectoryCheckpointStore(path)), or use "
                "transactional mode, whose image is in the log")
        if decision.action == "restore":
            assert state.checkpoint is not None
            failpoint("recovery.restore", space=name, checkpoint=state.checkpoint.id)
            self.checkpoints.restore(handle.client, state.checkpoint)
            # A whole-machine checkpoint brings back its daemon, with the id of the Space it
            # was taken in: record that one, or the next driver takes it for a stranger.
            handle = replace(handle, space_id=_space_id(handle.client))
        else:
            self.image.reimage(log, conversation, handle.client)
        (kind,) = decision.events
        event = self.recorder.event(kind, state.mode, conversation, None, "space",
                                    decision.cause,
                                    f"Space {name} rebuilt (generation {state.generation})")
        self._commit(log, conversation, lambda s: replace(s, ready=True, space_id=handle.space_id),
                     extra=lambda tx: self.recorder.record(tx, conversation, event))
        return handle


def _space_id(client: SpaceClient) -> str | None:
    """The Space's id, or None when its daemon has none (older than ids)."""
    try:
        space_id = client.describe().get("space_id")
    except SpaceError as exc:
        if exc.code == "not_found":  # "unknown operation": a daemon older than ids
            return None
        raise
    return space_id if isinstance(space_id, str) else None
