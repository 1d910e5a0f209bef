"""The Space adapter's façade: bash, write and edit run in a Space that stays consistent with
the log. ``DurableSpaces`` builds the parts and plugs them into a harness (``.env`` and
``.extension``); each part has one job:

- ``space_keeper``: the conversation's Space and its epoch (fencing, adoption, rebuilds);
- ``image_keeper``: the workspace image in the log (transactional mode);
- ``checkpoint_keeper``: checkpoints of the Space (checkpoint mode);
- ``modes`` carries out the mode ``policy`` decides; ``events`` records recovery events;
- ``runner`` runs a call; ``recovery`` recovers an interrupted one as ``decide`` says.

Modes (per conversation, recorded in ``cua.space``):

- ``transactional``: the log holds an image of the workspace (``image.py``). Before a call
  the workspace is scanned and any change made outside the calls is committed with the call's
  start mark; after the call its diff is committed in the same transaction as its result.
  After a crash whose outcome is unknown the workspace is reverted to the image and the call
  runs again, whatever the tool: no call ends interrupted. Effects outside the workspace (a
  network call, a host tool) may therefore repeat.
- ``checkpoint``: after a call's effects its outcome is recorded, the Space is checkpointed
  and the checkpoint recorded with the result. After a crash whose outcome is unknown the
  Space is restored to the newest checkpoint (``recovery`` has the rules).
- ``auto``: transactional while it can be, then checkpoint, permanently, with the reason.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..errors import HaltError, SpaceNotFound, SpaceUnavailable, StaleEpochError
from ..fence_contract import Fence
from ..log import ROOT_CONVERSATION, Log
from ..spaces import SpaceClient, Spaces
from ..tools import CallContext, Tool, ToolResult
from .checkpoint_keeper import CheckpointKeeper
from .events import EventRecorder
from .image import TransactionalLimits
from .image_keeper import ImageKeeper
from .modes import ModeKeeper
from .policy import requested_mode
from .recovery import Recovery
from .runner import CallRunner
from .snapshots import SnapshotProvider
from .space_env import SpaceEnv
from .space_keeper import SpaceKeeper
from .space_names import check_prefix, session_token
from .state import RecoveryEvent

if TYPE_CHECKING:
    from ..harness import Harness

#: The tools the adapter wraps: they run in the Space (the campaign's checker reads this
#: too).
WRAPPED = ("bash", "write", "edit")


class DurableSpaces:
    """``.env`` and ``.extension`` plug into a Harness.

    ``session`` names the session: its Spaces are ``<space_prefix>-<session>-c<conversation>``
    and its exec keys start with it (``space_names``), so sessions never share a Space or a
    recorded result. ``root_space``: the Space of the first conversation instead, when a
    coordinator placed one and leased it to the session (sessions take turns on it, each
    with its own keys and epochs above the last). ``epoch`` is this driver's (the session
    driver reads it from its environment); every Space is fenced at it. ``on_stale`` is
    called once for each refusal by a newer epoch this adapter meets (the Space's floor, or
    the log's fence while a command streams), before the ``StaleEpochError`` propagates; the
    driver stops then.
    ``on_halt`` is called with a ``HaltError`` (a Space that cannot be fenced) before it is
    raised.
    """

    def __init__(self, *, session: str, spaces: Spaces, snapshots: SnapshotProvider,
                 epoch: int, cwd: str = ".", mode: str = "auto",
                 fence: Fence | None = None,
                 on_stale: Callable[[StaleEpochError], None] | None = None,
                 on_halt: Callable[[HaltError], None] | None = None,
                 transactional: TransactionalLimits | None = None,
                 space_prefix: str = "cua", root_space: str | None = None) -> None:
        requested = requested_mode(mode)
        if not isinstance(epoch, int) or isinstance(epoch, bool):
            raise TypeError(f"Expected an int epoch but got epoch={epoch!r} "
                            f"(type={type(epoch).__name__}); pass the driver's epoch")
        token = session_token(session)
        self.cwd = cwd
        self.recorder = EventRecorder(epoch)
        self.image = ImageKeeper(transactional or TransactionalLimits())
        self.checkpoints = CheckpointKeeper(snapshots, epoch)
        self.modes = ModeKeeper(requested, snapshots.kind, self.image, self.checkpoints,
                                self.recorder)
        self.space = SpaceKeeper(spaces=spaces, session=token, prefix=check_prefix(space_prefix),
                                 root_space=root_space, epoch=epoch, on_stale=on_stale,
                                 on_halt=on_halt, modes=self.modes, image=self.image,
                                 checkpoints=self.checkpoints, recorder=self.recorder)
        self.checkpoints.refence = self.space.refence
        self.runner = CallRunner(session=token, epoch=epoch, cwd=cwd, fence=fence,
                                 space=self.space, modes=self.modes, image=self.image,
                                 checkpoints=self.checkpoints, recorder=self.recorder)
        self.recovery = Recovery(space=self.space, modes=self.modes, image=self.image,
                                 checkpoints=self.checkpoints, runner=self.runner,
                                 recorder=self.recorder)
        self.extension = SpacesExtension(self)

    @property
    def events(self) -> list[RecoveryEvent]:
        """Every recovery event this process decided, in order (also committed to the log)."""
        return self.recorder.events

    def space_name(self, conversation: int) -> str:
        return self.space.name(conversation)

    def env(self, log: Log, conversation: int) -> SpaceEnv:
        """The harness's env factory: the conversation's Space as an ``ExecutionEnv``."""
        return SpaceEnv(lambda: self.space.ensure(log, conversation).client, self.cwd)

    def raise_epoch(self, name: str) -> dict[str, Any]:
        """Raise the Space ``name`` to this driver's epoch before its first use: every
        process an older epoch started there is killed first, and older epochs are refused
        from then on. Returns spacesd's answer (``{"floor": int, "killed": [keys]}``);
        raises ``StaleEpochError`` (after telling ``on_stale``) when a newer epoch holds the
        Space, ``SpaceNotFound`` when there is none of that name."""
        try:
            return self.space.raise_epoch(name)
        except StaleEpochError as exc:
            self.space.stale(exc)
            raise

    def raise_epochs(self) -> None:
        """Raise the session's first Space to this epoch if it exists yet: what the session
        driver does before ``start`` resumes anything, so that no command of an older
        driver runs on while this one reads the log. (The Space of a later conversation is
        raised when the log first leads to it, before any of its calls runs.)"""
        name = self.space.name(ROOT_CONVERSATION)
        if self.space.spaces.exists(name):
            self.raise_epoch(name)

    def ensure_space(self, harness: Harness, conversation: int) -> SpaceClient:
        """Make sure the conversation's Space exists, is fenced at this epoch and holds the
        log's state (rebuilding a lost one); returns its client."""
        return self.space.ensure(harness.log, conversation, check_exists=True).client

    def run_call(self, tool: str, args: dict[str, Any], ctx: CallContext, replay: str
                 ) -> ToolResult:
        try:
            try:
                return self.runner.run(tool, args, ctx)
            except (SpaceUnavailable, SpaceNotFound):
                # The Space's daemon went away mid-call (killed, restarted, or the Space was
                # deleted). A daemon that comes back: recover this call in-process exactly
                # as a new driver would (a command that survived the daemon is reattached).
                # A Space that is gone: halt, never a tool error. Placing Spaces is the
                # coordinator's: the next drive resumes on the one it places.
                if not self.space.wait_for(ctx.conversation):
                    raise HaltError(f"the Space {self.space.name(ctx.conversation)} is gone "
                                    f"(during call {ctx.call_id}); the next drive resumes on "
                                    "a new one", permanent=False) from None
                return self.recovery.recover(tool, args, ctx, replay)
        except StaleEpochError as exc:
            self.space.stale(exc)
            raise

    def recover_call(self, tool: str, args: dict[str, Any], ctx: CallContext, replay: str
                     ) -> ToolResult:
        try:
            return self.recovery.recover(tool, args, ctx, replay)
        except StaleEpochError as exc:
            self.space.stale(exc)
            raise


#: The builder docs/architecture.md and existing callers name: the class itself.
durable_spaces = DurableSpaces


class SpacesExtension:
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
