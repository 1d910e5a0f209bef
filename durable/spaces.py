"""What the adapter needs from a backend: a ``Spaces`` provider and the client of one Space.

Backends (``backends.local``, ``backends.docker``, ``backends.microvm``) implement these;
``durable`` only ever sees these protocols, so it never imports a backend. The message
shapes travelling to the daemon are ``spacesd.protocol``'s.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterator
from typing import IO, Any, Protocol, runtime_checkable

from spacesd.protocol import CheckpointInfo, ExecInfo, ScanResult


@runtime_checkable
class SpaceClient(Protocol):
    """A connection to one Space's daemon, bound to an epoch that every request carries.

    Errors: ``StaleEpochError`` when the Space's floor is above ``epoch``; ``SpaceUnavailable``
    when the daemon cannot be reached; ``SpaceError`` for anything the daemon refused.
    """

    name: str
    epoch: int

    def with_epoch(self, epoch: int) -> SpaceClient: ...

    def health(self) -> dict[str, Any]: ...

    def capabilities(self) -> set[str]: ...

    def describe(self) -> dict[str, Any]:
        """Which Space this is and its fence, at any epoch: ``{"space_id": str, "floor":
        int, "protocol": int}``. The id is made when the Space's daemon first starts and
        kept for the Space's life (restarts included); a Space deleted and made again under
        its name has another."""
        ...

    def advance_epoch(self, epoch: int, *, owner: str | None = None,
                      own: bool = False) -> dict[str, Any]:
        """Raise the Space's floor to ``epoch``; kill every process started under an older
        epoch (``own``: under ``epoch`` too: what a driver does before it restores or
        reverts the workspace in the middle of its run). Returns ``{"floor": int, "killed":
        [keys]}``. ``owner`` is an opaque token of the caller (default: one per process):
        advancing to the floor itself is idempotent for its owner and refused to anyone
        else with ``EpochTaken``."""
        ...

    # ---------------------------------------------------------------- exec ledger
    def exec_start(
        self,
        key: str,
        command: str,
        *,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
    ) -> ExecInfo:
        """Start ``command`` (``bash -c``) under the idempotency ``key``, or return what the
        ledger knows of it (a known key never runs twice)."""
        ...

    def exec_status(self, key: str) -> ExecInfo:
        """State of ``key``: ``running``, ``exited``, ``lost``, or ``unknown`` (never seen)."""
        ...

    def exec_wait(
        self,
        key: str,
        *,
        offset: int = 0,
        on_output: Callable[[str], None] | None = None,
        timeout: float | None = None,
    ) -> ExecInfo:
        """Stream output of ``key`` from byte ``offset`` until it ends (or ``timeout``) and
        return its final ``ExecInfo``."""
        ...

    def exec_kill(self, key: str) -> ExecInfo: ...

    # ---------------------------------------------------------------- files
    def read_file(self, path: str, *, offset: int = 0, limit: int | None = None) -> bytes: ...

    def write_file(self, path: str, data: bytes, *, mode: int | None = None) -> None: ...

    def edit_file(self, path: str, old: str, new: str) -> None: ...

    def stat(self, path: str) -> dict[str, Any] | None: ...

    def list_dir(self, path: str) -> list[dict[str, Any]]: ...

    def remove(self, path: str, *, recursive: bool = False) -> None: ...

    def mkdir(self, path: str) -> None: ...

    def symlink(self, path: str, target: str) -> None: ...

    # ---------------------------------------------------------------- workspace
    def scan(self, *, exclude: list[str] | None = None) -> ScanResult: ...

    def checkpoint_create(self, checkpoint_id: str) -> CheckpointInfo: ...

    def checkpoint_restore(self, checkpoint_id: str, *,
                           exclude: list[str] | None = None) -> CheckpointInfo:
        """Make the workspace equal to the checkpoint, leaving the paths matched by
        ``exclude`` (scan globs) as they are."""
        ...

    def checkpoint_list(self) -> list[CheckpointInfo]: ...

    def checkpoint_delete(self, checkpoint_id: str) -> None: ...

    def checkpoint_export(self, checkpoint_id: str, *,
                          have: Collection[str] = ()) -> Iterator[bytes]:
        """The checkpoint as a tar stream, in chunks: its manifest and its objects, but for
        those named in ``have`` (the receiver holds them already)."""
        ...

    def checkpoint_import(self, checkpoint_id: str, tar: IO[bytes]) -> CheckpointInfo: ...


@runtime_checkable
class Spaces(Protocol):
    """A provider of Spaces: finds them by name, from any process (no in-memory state)."""

    kind: str  # "local" | "docker" | "microvm"

    def create(self, name: str) -> None:
        """Create a Space (idempotent: an existing one is kept) and wait until it is healthy."""
        ...

    def exists(self, name: str) -> bool: ...

    def delete(self, name: str) -> None:
        """Remove the Space, its processes and its disk. No error if it does not exist."""
        ...

    def connect(self, name: str, *, epoch: int) -> SpaceClient:
        """A client of the Space bound to ``epoch``. Raises ``SpaceNotFound``."""
        ...


@runtime_checkable
class ShellReachable(Protocol):
    """A provider whose Spaces a person can open a shell in (``durable.review`` says how)."""

    def shell_hint(self, name: str) -> str:
        """The command that opens a shell in the Space ``name``."""
        ...
