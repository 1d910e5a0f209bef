"""Backends by name: the campaign's one place that knows which ``Spaces`` providers exist.

Each provider is a peer behind the ``durable.spaces.Spaces`` protocol; a run keeps its
Spaces under its own directory (local) or label/prefix (docker, microvm) so parallel runs
never share one.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Protocol, runtime_checkable

from backends.descriptor import BackendDescriptor, DiskName, ProviderOptions
from backends.descriptor import BackendUnavailable as BackendUnavailableHere
from backends.docker import descriptor as docker
from backends.local import descriptor as local
from backends.microvm import descriptor as microvm
from backends.space_client import REQUEST_TIMEOUT_S, Resolver, Via
from chaos.errors import BackendUnavailable
from durable.spaces import Spaces

#: The backend with no Space: the workspace lives in the session's log (``durable.virtual``).
VIRTUAL = "virtual"


class CampaignSpaces(Spaces, Protocol):
    """What the campaign needs of a provider beyond ``durable.spaces.Spaces``, which a
    backend implements structurally (without importing ``chaos``): the faults (a machine
    restart, a daemon kill, a kill of one process by the pid a failpoint reported), reading
    a Space's state back for the audits (its ledger and fence journal, even while the daemon
    is down), and listing its Spaces for clean-up. A backend need not have these to be a
    backend; it needs them to be attacked."""

    def restart(self, name: str) -> None:
        """As a machine restart: the daemon and every process it started are gone, the disk
        is kept, and the daemon comes back (healthy) before this returns."""
        ...

    def kill_daemon(self, name: str) -> None:
        """SIGKILL only the daemon; processes it started keep running. The daemon is started
        again before this returns (as a supervisor would)."""
        ...

    def kill_process(self, name: str, pid: int) -> None: ...

    def lose(self, name: str, keep: Path) -> None:
        """The Space is lost at one instant: nothing in it changes after that instant (no
        request is answered, no ``create`` revives it), its audit files as that instant
        left them are saved under ``keep`` (as ``save_state``), and it is gone. Raises
        ``SpaceNotFound`` when there was no Space to lose."""
        ...

    def save_state(self, name: str, dest: Path) -> None: ...

    def endpoint(self, name: str) -> Resolver:
        """How to find the daemon of ``name`` as it is when asked (its port and token may
        change with a restart): what a link proxy forwards to."""
        ...

    def names(self) -> list[str]:
        """Every Space this provider can find."""
        ...


@runtime_checkable
class Pausable(Protocol):
    """A provider that can freeze a Space where it stands, every process alive and holding
    what it holds, and thaw it (the nemesis's ``pause_space``)."""

    def pause(self, name: str) -> None: ...

    def resume(self, name: str) -> None: ...


@runtime_checkable
class PowerSwitched(Protocol):
    """A provider whose Spaces have power to cut: their unsynced writes are lost and the
    machine is booted again (the nemesis's ``power_loss``)."""

    def power_loss(self, name: str) -> None: ...


@runtime_checkable
class Restorable(Protocol):
    """A provider whose restores take a Space's audit files back in time (a microVM's
    machine checkpoints), and that keeps what they said before each one."""

    def audit_history(self, name: str) -> list[Path]: ...


@runtime_checkable
class DaemonPausable(Protocol):
    """A provider that can freeze a Space's daemon alone, its commands running on, and thaw
    it (the nemesis's ``pause_daemon``)."""

    def pause_daemon(self, name: str) -> None: ...

    def resume_daemon(self, name: str) -> None: ...


@runtime_checkable
class Clocked(Protocol):
    """A provider whose Spaces keep a clock of their own (a microVM's), which it can set:
    to the host's, or ``offset`` seconds from it (the nemesis's ``jump_clock``)."""

    def set_clock(self, name: str, offset: float = 0.0) -> None: ...


@runtime_checkable
class CommandPausable(Protocol):
    """A provider that can freeze every process of a Space's commands, its daemon
    answering, and thaw them (the nemesis's ``pause_commands``)."""

    def pause_commands(self, name: str) -> list[str]:
        """Freeze them; returns the keys whose shim (the process that claimed the key) it
        froze: those commands are alive, held, until ``resume_commands``."""
        ...

    def resume_commands(self, name: str) -> None: ...


@runtime_checkable
class DiskFillable(Protocol):
    """A provider whose Spaces keep a directory on a disk of their own (``disk``: their
    daemon's ``"state"``, their ``"work"``space), which it can fill and free (the nemesis's
    ``fill_state_disk``, ``fill_work_disk``)."""

    def fill_disk(self, name: str, disk: DiskName, leave: int = 0) -> None:
        """Fill it but ``leave`` bytes, until ``free_disk``."""
        ...

    def free_disk(self, name: str, disk: DiskName) -> None: ...


def _no_spaces(run_dir: Path, options: ProviderOptions) -> CampaignSpaces:
    raise BackendUnavailable("the virtual backend has no Spaces: its workspace is in the "
                             "session's log (durable.virtual)")


def _probe_virtual(directory: Path) -> None:
    try:
        import durable.virtual.shell  # noqa: F401 - its shell is the one requirement
    except ImportError as exc:
        raise BackendUnavailable(f"the virtual backend needs just-bash ({exc}); install "
                                 "the project again (pip install -e .)") from None


#: Every backend a campaign can run on, by name: each ``backends/<name>/`` says what it is
#: (``backends.descriptor``); the virtual one has no Space.
BACKEND_DESCRIPTORS: dict[str, BackendDescriptor] = {b.name: b for b in (
    local.BACKEND, docker.BACKEND, microvm.BACKEND,
    BackendDescriptor(VIRTUAL, _no_spaces, probe=_probe_virtual, spaces=False,
                      spaces_in_run_dir=False))}
BACKENDS = tuple(BACKEND_DESCRIPTORS)


def backend(name: str) -> BackendDescriptor:
    """The backend called ``name``; ``BackendUnavailable`` naming the known ones if none."""
    try:
        return BACKEND_DESCRIPTORS[name]
    except KeyError:
        raise BackendUnavailable(f"unknown backend {name!r}; use one of {BACKENDS}") from None


def make_spaces(name: str, run_dir: Path, *, failpoints: str | None = None,
                request_timeout: float = REQUEST_TIMEOUT_S,
                via: Via | None = None, disks: Mapping[DiskName, int] | None = None,
                fork_daemons: bool = False) -> CampaignSpaces:
    """The run's Spaces provider of the backend ``name`` (``ProviderOptions`` says what the
    options are; disks of their own, and daemons forked by this process's server, are for
    backends that have them, and every process of the run then makes Spaces with them)."""
    chosen = backend(name)
    lacking = sorted(set(disks or ()) - chosen.own_disks)
    if lacking:
        able = [b.name for b in BACKEND_DESCRIPTORS.values() if set(disks or ()) <= b.own_disks]
        raise BackendUnavailable(f"the {name} backend cannot give its Spaces' {lacking} a "
                                 f"disk of their own; use a backend that can ({able})")
    try:
        spaces: CampaignSpaces = chosen.make(run_dir, ProviderOptions(
            failpoints, request_timeout, via, dict(disks or {}), fork_daemons))
    except BackendUnavailableHere as exc:
        raise BackendUnavailable(str(exc)) from None
    return spaces


def probe_backend(name: str, directory: Path) -> None:
    """``BackendUnavailable`` (with what to do) unless ``name`` can run here."""
    try:
        backend(name).check(directory)
    except BackendUnavailableHere as exc:
        raise BackendUnavailable(str(exc)) from None


def programs_in_space(backend: str, directory: Path, programs: list[str]) -> set[str]:
    """Which of ``programs`` a Space of ``backend`` has on its PATH (a throwaway Space,
    asked with ``command -v``, deleted after)."""
    spaces = make_spaces(backend, directory)
    name = "probe-programs"
    spaces.create(name)
    try:
        client = spaces.connect(name, epoch=1)
        client.exec_start("probe@1", "for p in " + " ".join(programs) +
                          "; do command -v \"$p\" >/dev/null && echo \"$p\"; done; true")
        return set(client.exec_wait("probe@1", timeout=120).output.split())
    finally:
        spaces.delete(name)


def snapshot_kind(name: str, chosen: str) -> str:
    """The snapshots a run's checkpoints are: ``chosen``, or for ``auto`` whole-machine
    ones where the Spaces are machines and workspace ones elsewhere."""
    machines = backend(name).machines
    if chosen != "auto":
        if chosen == "machine" and not machines:
            raise BackendUnavailable(f"machine snapshots need Spaces that are whole machines "
                                     f"(--backend microvm), not {name}")
        return chosen
    return "machine" if machines else "workspace"


def coordinator_spaces(backend: str, run_dir: str, failpoints: str = "") -> CampaignSpaces:
    """The provider a redrive run's coordinator places Spaces with (``python -m
    durable.coordinator serve --spaces chaos.space_providers:coordinator_spaces``): the
    run's, its daemons reporting to the run's failpoint channel."""
    return make_spaces(backend, Path(run_dir), failpoints=failpoints or None)
