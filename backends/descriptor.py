"""What a campaign must know of a backend, said by the backend itself: how to make a run's
Spaces provider, and the abilities the campaign's plans and checks depend on. Each
``backends/<name>/`` exports one ``BACKEND`` (in its ``descriptor`` module, importable
without the backend's own dependencies); ``chaos.space_providers`` maps them by name, and no
module outside ``backends/`` compares a backend's name.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol

from backends.space_client import REQUEST_TIMEOUT_S, Via


class BackendUnavailable(RuntimeError):
    """The backend cannot be used on this machine (no engine, no image, no QEMU); the
    message says what is missing and how to get it."""


class _Deletes(Protocol):
    def names(self) -> list[str]: ...

    def delete(self, name: str) -> None: ...


def delete_spaces_under(results: Path, provider: Callable[[Path], _Deletes]) -> int:
    """Delete the Spaces ``provider`` finds in each run's ``spaces`` directory under
    ``results``; how many (the ``clean`` of backends whose Spaces live in run
    directories)."""
    removed = 0
    for spaces_dir in sorted(results.glob("**/spaces")):
        spaces = provider(spaces_dir)
        for name in spaces.names():
            spaces.delete(name)
            removed += 1
    return removed


#: The directories of a Space a backend may give a disk of its own (``ProviderOptions``):
#: its daemon's state, its workspace.
DiskName = Literal["state", "work"]


@dataclass(frozen=True)
class ProviderOptions:
    """How a run's provider is made. ``failpoints``: the channel the Spaces' daemons report
    their failpoints to (a unix socket); ``request_timeout``: how long its clients wait for
    a daemon's answer; ``via``: where their endpoints are routed (the run's link proxies);
    ``disks``: which directories of each Space get a disk of their own (``"state"``,
    ``"work"``), and their size in bytes; ``fork_daemons``: start the Spaces' daemons, from
    any process, by a server this process owns that imported them once, where the backend
    can (local: ``backends.local.daemon_start``)."""

    failpoints: str | None = None
    request_timeout: float = REQUEST_TIMEOUT_S
    via: Via | None = None
    disks: Mapping[DiskName, int] = field(default_factory=dict)
    fork_daemons: bool = False


@dataclass(frozen=True)
class BackendDescriptor:
    name: str
    #: The run's provider, its Spaces kept under (or scoped by) the run's directory; raises
    #: ``BackendUnavailable`` with what to do when the backend cannot run here.
    make: Callable[[Path, ProviderOptions], Any]
    #: ``BackendUnavailable`` unless it can run here (``directory``: a scratch place for a
    #: throwaway provider); by default, making one is the probe.
    probe: Callable[[Path], None] | None = None
    #: Whether it has Spaces at all (the virtual backend keeps its workspace in the log).
    spaces: bool = True
    #: Its Spaces live in the run's directory (``chaos clean`` finds them there) rather than
    #: in an engine of their own.
    spaces_in_run_dir: bool = True
    #: Its daemons reach the run's failpoint channel through a mount shared with another
    #: user (a container's): the channel is made reachable to them.
    shared_failpoints: bool = False
    #: Its Spaces are whole machines: whole-machine snapshots, a daemon's kill taken as the
    #: machine's fault, held faults at the points a guest reports, power to cut.
    machines: bool = False
    #: The directories of its Spaces on a disk it can fill: one of their own
    #: (``ProviderOptions.disks``), or a machine's one disk.
    own_disks: frozenset[DiskName] = frozenset()
    #: Remove every Space of this backend that campaigns left behind (under ``results``
    #: where they live in run directories, else in its engine); how many. ``chaos clean``.
    clean: Callable[[Path], int] | None = None

    def check(self, directory: Path) -> None:
        """``BackendUnavailable`` (with what to do) unless this backend can run here."""
        if self.probe is not None:
            self.probe(directory)
        else:
            self.make(directory, ProviderOptions())
