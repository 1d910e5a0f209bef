"""Process containment: every process a command starts, however it detaches.

A command may leave processes outside its process group and session (``setsid sleep 1000
&``, a double fork into a new session, a daemonizing server) and may drop the
``SPACESD_STATE`` marker from their environment (``env -i``). Killing process groups misses
them, yet the fence promises that every process started under an older epoch is dead before
a restore changes any file, and ``exec_kill`` that a key's whole tree is. A ``Containment``
knows which processes belong to each command (a ``Tree``: its exec record's id and its shim)
and kills them. The daemon picks one mechanism at start (``select``, ``--containment``),
reports it in its ``capabilities`` answer and writes it to ``containment.json`` in its state
directory, where the local provider finds the Space's cgroup even with the daemon dead.

``cgroup``, the strongest, with the adoption of ``subreaper`` besides: the Space has a
cgroup ``<root>/spacesd-<label>-<hash>`` (named after its state directory, of bounded
length) with one child per exec record, named by the record's id. The shim writes its own
pid into its record's ``cgroup.procs`` before it forks the command, and nothing a process
does (fork, setsid, exec, ``env -i``) takes it out of its cgroup, but for a root process
writing its pid into another cgroup's ``cgroup.procs``: so the shims and the daemon are
child subreapers here too, and such an escapee is still found by its shim's descent (or as
the daemon's stray) and killed first. What no mechanism here can find: a root command that
left its cgroup and whose shim and daemon are both dead (init adopted it); docker and
microVM Spaces contain that too (``sandbox``: their PID 1 adopts every orphan, and a
container's commands are not root). Killing: ``cgroup.kill`` (cgroup v2, Linux 5.14+), else
freeze, SIGKILL every member, thaw, until it is empty (a frozen process cannot fork). The
cgroups are made when a command starts; an empty record cgroup is removed once the daemon
sees its tree gone, and the Space's with its last one (the local provider removes them all
on ``restart`` and ``delete``). ``root``: the first writable of the cgroup v2 hierarchy and
the v1 ``freezer`` one (from ``/proc/self/mountinfo``), or ``--cgroup-root`` (e.g. a cgroup
delegated to a user).

``sandbox``: the Space is the whole machine (a container): spacesd is the child of
``spacesd.supervisor`` running as PID 1 of its own PID namespace, so every orphan becomes a
child of PID 1. Trees are tracked as under ``subreaper``, and every descendant of PID 1 that
is not the daemon, not one of its ancestors and not in the tree of a known command (a
*stray*: its command is unknown) is killed at every fence. Processes entered from outside
(``docker exec``) descend from no process of the namespace and are spared.

``subreaper``, the fallback for an unprivileged run: the daemon and every shim are child
subreapers (``prctl(PR_SET_CHILD_SUBREAPER)``), so an orphan is reparented to the nearest
living one instead of init, and a shim, after its command exited, stays until its last
descendant did. A command's tree is its process group, its session, and the descendants of
its living shim and of those. An orphan whose shim died goes to the daemon: a stray, killed
at the next fence (``exec_kill`` of its key misses it). What it cannot guarantee: a process
that detaches (a new session, its parent gone) while its shim and the daemon are both dead,
or that the daemon adopted before it was killed, is reparented to init and escapes every
fence; and the local provider's ``restart`` and ``delete`` miss it too once it has dropped
the ``SPACESD_STATE`` marker.

Standard library only (``ctypes`` for ``prctl``): this module runs in every Space, and the
local provider imports it to find a Space's cgroup.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import hashlib
import json
import os
import re
import signal
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from . import procfs
from .mount_table import Mount, read_mounts
from .shim import SUBREAPER

#: The values of ``--containment``.
MODES = ("auto", "cgroup", "sandbox", "subreaper")
#: The file of the state directory that names the mechanism (and the Space's cgroup).
STATE_FILE = "containment.json"
_PR_SET_CHILD_SUBREAPER = 36
_PR_GET_CHILD_SUBREAPER = 37
#: How long a kill waits between two passes.
_PASS = 0.005


class Unavailable(Exception):
    """The mechanism asked for cannot work here; the message names what is missing."""


@dataclass(frozen=True)
class Tree:
    """One command as the ledger knows it: ``id``, its exec record's id (its cgroup's name);
    ``leader``, ``(pid, start time)`` of its shim once known (that pid is the command's
    process group and session id)."""

    id: str
    leader: tuple[int, int] | None


class Containment(ABC):
    mode: ClassVar[str]

    @abstractmethod
    def shim_arg(self, tree_id: str) -> str:
        """Prepare the place of ``tree_id`` and return the shim's containment argument."""

    @abstractmethod
    def members(self, trees: Sequence[Tree], table: dict[int, procfs.Proc] | None = None
                ) -> dict[str, list[int]]:
        """The live processes of each of ``trees`` that has any, by tree id (``table``: the
        process table to read, a ``procfs.snapshot`` the caller took; else a fresh one)."""

    @abstractmethod
    def kill(self, trees: Sequence[Tree], *, timeout: float = 5.0) -> set[str]:
        """SIGKILL the members of ``trees`` that left their process group (all members,
        for a cgroup) and wait until they are gone; returns the ids of trees that still
        had such members at ``timeout``. The ledger kills the groups themselves afterwards
        (``procfs.kill_groups``), so a shim outlives its escaped descendants and adopts any
        orphan a racing fork leaves."""

    def strays(self, known: Sequence[Tree], *, spare: Collection[int] = (),
               table: dict[int, procfs.Proc] | None = None) -> list[int]:
        """Processes of the Space in none of the ``known`` trees (their command unknown),
        but for ``spare``: the daemon's own helpers (its shim launcher); ``table`` as for
        ``members``."""
        return []

    def kill_strays(self, known: Sequence[Tree], *, spare: Collection[int] = (),
                    timeout: float = 5.0) -> list[int]:
        """SIGKILL ``strays(known, spare=spare)`` until none is left; returns those left at
        ``timeout``."""
        return []

    def release(self, tree_ids: Iterable[str]) -> None:  # noqa: B027 - a no-op by default
        """Forget trees whose processes are all gone."""

    def describe(self) -> dict[str, Any]:
        """What ``STATE_FILE`` records."""
        return {"mode": self.mode}


# ------------------------------------------------------------------ cgroup


def space_cgroup_name(state_dir: str) -> str:
    """The name of the cgroup of the Space whose state directory is ``state_dir``: its last
    two path components (readable) and a hash of the whole path (unique), at most 65
    characters."""
    real = os.path.realpath(state_dir)
    label = re.sub(r"[^A-Za-z0-9._-]+", "_", "-".join(real.strip("/").split("/")[-2:]))
    return f"spacesd-{label[-40:]}-{hashlib.sha256(real.encode()).hexdigest()[:16]}"


def space_cgroup(state_dir: str) -> str | None:
    """The cgroup of the Space whose state directory is ``state_dir``, if it exists: the one
    ``containment.json`` records (only if it carries this Space's name: the file cannot
    point a provider at another cgroup), else, when the file is missing, damaged or names
    another, found by its name in the mounted hierarchies (``find_cgroup``), so a damaged
    file never hides a Space's processes from the provider that must kill them."""
    name = space_cgroup_name(state_dir)
    try:
        with open(os.path.join(state_dir, STATE_FILE), "rb") as f:
            recorded = json.loads(f.read()).get("cgroup")
    except (OSError, ValueError, AttributeError):
        recorded = None
    if isinstance(recorded, str) and os.path.basename(recorded) == name and \
            os.path.isfile(os.path.join(recorded, "cgroup.procs")):
        return recorded
    return find_cgroup(name)


#: How deep below a hierarchy's root ``find_cgroup`` looks, and how many directories at most.
_FIND_DEPTH = 4
_FIND_MOST = 20000


def find_cgroup(name: str) -> str | None:
    """A cgroup directory called ``name`` in a usable hierarchy (breadth first, at most
    ``_FIND_DEPTH`` levels down), or None. Names made by ``space_cgroup_name`` hold a hash
    of the state directory's path, so another Space's cgroup never matches."""
    try:
        mounts = read_mounts()
    except OSError:
        return None
    level = [m.point for m in mounts if _cgroup_version(m) is not None]
    seen = 0
    for _ in range(_FIND_DEPTH + 1):
        below: list[str] = []
        for directory in level:
            candidate = os.path.join(directory, name)
            if os.path.isfile(os.path.join(candidate, "cgroup.procs")):
                return candidate
            try:
                with os.scandir(directory) as entries:
                    below += [e.path for e in entries
                              if e.is_dir(follow_symlinks=False) and e.name != name]
            except OSError:
                continue
            seen += 1
            if seen >= _FIND_MOST:
                return None
        level = below
    return None


#: What the kernel answers for a cgroup removed before (ENOENT) or while (ENODEV) it is used.
_REMOVED = (errno.ENOENT, errno.ENODEV)


def cgroup_pids(path: str) -> list[int]:
    """The processes in the cgroup ``path`` and below it (none if it does not exist). A
    cgroup removed while it is read (the kernel then answers ENODEV) holds none."""
    pids: list[int] = []
    for directory, _, _ in os.walk(path):
        try:
            with open(os.path.join(directory, "cgroup.procs")) as f:
                pids.extend(int(line) for line in f if line.strip())
        except OSError as exc:
            if exc.errno not in _REMOVED:
                raise
    return pids


def kill_cgroup(path: str, *, timeout: float = 5.0) -> list[int]:
    """SIGKILL every process in the cgroup ``path`` and below and wait until none runs;
    returns those left at ``timeout`` (stuck in the kernel).

    An empty cgroup is not yet a dead one: a killed process leaves ``cgroup.procs`` while
    it exits (the kernel's ``cgroup_exit`` comes before it is a zombie), so each process
    seen is also waited for until it is gone. Without that, a caller that returned "killed"
    could still see its process run for a moment on a loaded machine (found as a flake of
    ``test_the_cgroup_finds_an_escapee_whose_every_ancestor_died``)."""
    deadline = time.monotonic() + timeout
    seen: dict[int, int] = {}
    while pids := cgroup_pids(path):
        for pid in pids:
            started = procfs.start_time(pid)
            if started is not None:
                seen.setdefault(pid, started)
        try:
            if os.path.exists(os.path.join(path, "cgroup.kill")):
                _write(os.path.join(path, "cgroup.kill"), "1")
            else:
                _kill_frozen(path, deadline)
        except OSError as exc:  # removed meanwhile: empty, the next pass sees it
            if exc.errno not in _REMOVED:
                raise
        time.sleep(_PASS)
        if time.monotonic() > deadline:
            return cgroup_pids(path)
    while exiting := [pid for pid, started in seen.items() if procfs.is_alive(pid, started)]:
        if time.monotonic() > deadline:
            return exiting
        time.sleep(_PASS)
    return []


def remove_cgroup(path: str, *, timeout: float = 10.0) -> None:
    """Remove the cgroup ``path`` and every cgroup below it, deepest first (they must be
    empty; a missing one is fine). A cgroup whose last process was just killed can still
    be busy while the kernel releases it (``EBUSY``, though it lists no process): that one
    is tried again until ``timeout``."""
    deadline = time.monotonic() + timeout
    for directory, _, _ in os.walk(path, topdown=False):
        while True:
            try:
                os.rmdir(directory)
                break
            except FileNotFoundError:
                break
            except OSError as exc:
                if exc.errno != errno.EBUSY or time.monotonic() > deadline:
                    raise
                time.sleep(_PASS)


def _write(path: str, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)


def _kill_frozen(path: str, deadline: float) -> None:
    """Freeze the cgroup (v2 ``cgroup.freeze`` or v1 ``freezer.state``), SIGKILL its members,
    thaw it: frozen processes cannot fork, so no child is born unseen. Without a freezer (a
    v2 kernel before 5.2) only the SIGKILL."""
    if os.path.exists(os.path.join(path, "cgroup.freeze")):
        control, frozen, thawed = "cgroup.freeze", "1", "0"
    elif os.path.exists(os.path.join(path, "freezer.state")):
        control, frozen, thawed = "freezer.state", "FROZEN", "THAWED"
    else:
        _sigkill(cgroup_pids(path))
        return
    _write(os.path.join(path, control), frozen)
    try:
        # A process stuck in the kernel may keep the cgroup from freezing: kill anyway.
        while not _is_frozen(path) and time.monotonic() < deadline:
            time.sleep(_PASS)
        _sigkill(cgroup_pids(path))
    finally:
        _write(os.path.join(path, control), thawed)


def _is_frozen(path: str) -> bool:
    """Whether the cgroup ``path`` (v2 or v1) has finished freezing."""
    if os.path.exists(os.path.join(path, "cgroup.events")):
        with open(os.path.join(path, "cgroup.events")) as f:
            return "frozen 1" in f.read().splitlines()
    with open(os.path.join(path, "freezer.state")) as f:
        return f.read().strip() == "FROZEN"


def _sigkill(pids: Iterable[int]) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def _cgroup_version(m: Mount) -> int | None:
    """2, 1 (a v1 hierarchy with the freezer) or None (no usable cgroup hierarchy)."""
    if m.fstype == "cgroup2":
        return 2
    return 1 if m.fstype == "cgroup" and "freezer" in m.options else None


def _mount_of(path: str, mounts: list[Mount]) -> Mount:
    """The mount ``path`` is on: the one with the longest mount point above it."""
    under = [m for m in mounts if path == m.point or path.startswith(m.point.rstrip("/") + "/")]
    return max(under, key=lambda m: len(m.point))


# ------------------------------------------------------------------ sandbox, subreaper


def _children(table: dict[int, procfs.Proc]) -> dict[int, list[int]]:
    kids: dict[int, list[int]] = {}
    for p in table.values():
        kids.setdefault(p.ppid, []).append(p.pid)
    return kids


def _closure(kids: dict[int, list[int]], seeds: Iterable[int]) -> set[int]:
    """``seeds`` and all their descendants."""
    found: set[int] = set()
    todo = list(seeds)
    while todo:
        pid = todo.pop()
        if pid not in found:
            found.add(pid)
            todo.extend(kids.get(pid, ()))
    return found


def _tree_members(table: dict[int, procfs.Proc], trees: Sequence[Tree]) -> dict[str, set[int]]:
    """Each tree's group and session members, its living shim, and their descendants."""
    kids = _children(table)
    by_group: dict[int, list[int]] = {}
    for p in table.values():
        by_group.setdefault(p.pgid, []).append(p.pid)
        if p.sid != p.pgid:
            by_group.setdefault(p.sid, []).append(p.pid)
    found: dict[str, set[int]] = {}
    for t in trees:
        if t.leader is None:
            continue
        pid, started = t.leader
        now = table.get(pid)
        if now is not None and now.started != started:
            continue  # the pid was reused: the kernel frees it only once its group is gone
        if members := _closure(kids, by_group.get(pid, []) + ([pid] if now else [])):
            found[t.id] = members
    return found


def _kill_until_gone(targets: Callable[[dict[int, procfs.Proc]], set[int]],
                     timeout: float) -> set[int]:
    """SIGKILL ``targets(snapshot)`` pass after pass until it is empty; what is left at
    ``timeout``."""
    deadline = time.monotonic() + timeout
    while pids := targets(table := procfs.snapshot()):
        for pid in pids:
            procfs.kill_exact(pid, table[pid].started)
        time.sleep(_PASS)
        if time.monotonic() > deadline:
            return targets(procfs.snapshot())
    return set()


class _Adopting(Containment):
    """Trees by ancestry: each shim is a subreaper and outlives its command's descendants."""

    def shim_arg(self, tree_id: str) -> str:
        return SUBREAPER

    def members(self, trees: Sequence[Tree], table: dict[int, procfs.Proc] | None = None
                ) -> dict[str, list[int]]:
        return {tid: sorted(pids) for tid, pids in _tree_members(
            procfs.snapshot() if table is None else table, trees).items()}

    def kill(self, trees: Sequence[Tree], *, timeout: float = 5.0) -> set[str]:
        leaders = {t.id: t.leader[0] for t in trees if t.leader}

        def escaped(table: dict[int, procfs.Proc]) -> dict[str, set[int]]:
            return {tid: {p for p in pids if table[p].pgid != leaders[tid]}
                    for tid, pids in _tree_members(table, trees).items()}

        left = _kill_until_gone(lambda table: set().union(*escaped(table).values()), timeout)
        if not left:
            return set()
        return {tid for tid, pids in escaped(procfs.snapshot()).items() if pids & left}

    def strays(self, known: Sequence[Tree], *, spare: Collection[int] = (),
               table: dict[int, procfs.Proc] | None = None) -> list[int]:
        return sorted(self._strays(procfs.snapshot() if table is None else table, known,
                                   spare))

    def kill_strays(self, known: Sequence[Tree], *, spare: Collection[int] = (),
                    timeout: float = 5.0) -> list[int]:
        return sorted(_kill_until_gone(lambda table: self._strays(table, known, spare),
                                       timeout))

    def _strays(self, table: dict[int, procfs.Proc], known: Sequence[Tree],
                spare: Collection[int]) -> set[int]:
        candidates = self._candidates(table).difference(spare)
        if not candidates:
            return candidates
        return candidates.difference(*_tree_members(table, known).values())

    @abstractmethod
    def _candidates(self, table: dict[int, procfs.Proc]) -> set[int]:
        """The processes of the Space that are not the daemon or its ancestors."""


class Sandbox(_Adopting):
    mode = "sandbox"

    @classmethod
    def open(cls) -> Sandbox:
        """Raises ``Unavailable`` unless PID 1 of this PID namespace is our supervisor."""
        if os.getppid() != 1:
            why = f"its parent is pid {os.getppid()}, not PID 1"
        else:
            try:
                with open("/proc/1/cmdline", "rb") as f:
                    if b"spacesd.supervisor" in f.read().split(b"\0"):
                        return cls()
                why = "PID 1 is not spacesd.supervisor"
            except OSError as exc:
                why = f"/proc/1/cmdline is unreadable ({exc.strerror})"
        raise Unavailable(
            "--containment sandbox needs spacesd to be the child of spacesd.supervisor "
            f"running as PID 1 of its own PID namespace, as in the Space image ({why}); run "
            "it in a container of that image, or choose --containment subreaper")

    def _candidates(self, table: dict[int, procfs.Proc]) -> set[int]:
        ours = set()
        pid: int | None = os.getpid()
        while pid is not None and pid not in ours:  # the daemon and its ancestors
            ours.add(pid)
            pid = table[pid].ppid if pid in table else None
        return _closure(_children(table), [1]) - ours


class _AdoptingHere(_Adopting):
    """``adopting``: whether this process is a child subreaper: only then are the orphans
    among its children strays. A ``Daemon`` embedded in another process (tests) is made
    without making its host one."""

    def __init__(self) -> None:
        flag = ctypes.c_int(0)
        _prctl(_PR_GET_CHILD_SUBREAPER, ctypes.byref(flag))
        self.adopting = bool(flag.value)

    def _candidates(self, table: dict[int, procfs.Proc]) -> set[int]:
        if not self.adopting:
            return set()
        return _closure(_children(table), [os.getpid()]) - {os.getpid()}


class Subreaper(_AdoptingHere):
    mode = "subreaper"

    @classmethod
    def open(cls) -> Subreaper:
        """Make this process a child subreaper; raises ``Unavailable`` if it cannot be."""
        _prctl(_PR_SET_CHILD_SUBREAPER, 1)
        return cls()


class Cgroup(_AdoptingHere):
    """The Space's cgroup, and the adoption of ``subreaper`` besides: a command run as root
    can write its own pid into another cgroup (``echo $$ > /sys/fs/cgroup/cgroup.procs``)
    and so leave its record's cgroup, but not its shim's descent, since every shim and the
    daemon are child subreapers here too. A tree is its cgroup and its shim's descendants;
    a kill takes the adopted escapees first (while their shim lives), then the cgroup."""

    mode = "cgroup"

    def __init__(self, space_dir: str) -> None:
        super().__init__()
        #: The Space's cgroup; each record's is ``<space_dir>/<record id>``.
        self.space_dir = space_dir
        #: Between making a record's cgroup and removing an empty Space cgroup.
        self._lock = threading.Lock()

    @classmethod
    def open(cls, state_dir: str, root: str | None) -> Cgroup:
        """The Space's cgroup under ``root`` (default: the first writable hierarchy), this
        process a child subreaper if it can be one; raises ``Unavailable``."""
        mounts = read_mounts()
        roots = [os.path.realpath(root)] if root else \
            [m.point for m in mounts if _cgroup_version(m) == 2] + \
            [m.point for m in mounts if _cgroup_version(m) == 1]
        problems = [] if roots else ["no cgroup v2 or v1 freezer hierarchy is mounted"]
        for candidate in roots:
            if _cgroup_version(_mount_of(candidate, mounts)) is None:
                problems.append(f"{candidate} is not in a cgroup v2 or v1 freezer hierarchy")
                continue
            if not os.path.isdir(candidate):
                problems.append(f"{candidate} does not exist")
            elif not os.access(candidate, os.W_OK | os.X_OK):
                problems.append(f"{candidate} is not writable by uid {os.geteuid()}")
            else:
                with contextlib.suppress(Unavailable):  # else the cgroup alone (Linux < 3.4)
                    _prctl(_PR_SET_CHILD_SUBREAPER, 1)
                return cls(os.path.join(candidate, space_cgroup_name(state_dir)))
        raise Unavailable(
            "--containment cgroup needs a writable cgroup hierarchy (cgroup v2, or v1 with "
            f"the freezer controller): {'; '.join(problems)}. Run as root or delegate a "
            "cgroup to this user and pass it with --cgroup-root; or choose --containment "
            "subreaper")

    def _dir(self, tree_id: str) -> str:
        return os.path.join(self.space_dir, tree_id)

    def shim_arg(self, tree_id: str) -> str:
        path = self._dir(tree_id)
        with self._lock:
            os.makedirs(path, exist_ok=True)
        return path

    def members(self, trees: Sequence[Tree], table: dict[int, procfs.Proc] | None = None
                ) -> dict[str, list[int]]:
        adopted = super().members(trees, table)
        found = {}
        for t in trees:
            if pids := sorted(set(cgroup_pids(self._dir(t.id))).union(adopted.get(t.id, ()))):
                found[t.id] = pids
        return found

    def kill(self, trees: Sequence[Tree], *, timeout: float = 5.0) -> set[str]:
        deadline = time.monotonic() + timeout
        stuck = super().kill(trees, timeout=timeout)
        return stuck | {t.id for t in trees
                        if kill_cgroup(self._dir(t.id),
                                       timeout=max(0.0, deadline - time.monotonic()))}

    def release(self, tree_ids: Iterable[str]) -> None:
        with self._lock:
            # A busy one (not empty yet) is left to a later release or to the provider; the
            # Space's goes only once it has no record cgroup left (rmdir refuses otherwise).
            for path in [*(self._dir(tree_id) for tree_id in tree_ids), self.space_dir]:
                with contextlib.suppress(OSError):
                    os.rmdir(path)

    def describe(self) -> dict[str, Any]:
        return {"mode": self.mode, "cgroup": self.space_dir}


def _prctl(option: int, arg: Any) -> None:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(option, arg, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))
    except (OSError, AttributeError) as exc:
        raise Unavailable(f"--containment subreaper needs prctl(PR_SET_CHILD_SUBREAPER) "
                          f"(Linux 3.4+, through ctypes): {exc}") from None


# ------------------------------------------------------------------ choosing


def select(mode: str, state_dir: str, *, cgroup_root: str | None = None) -> Containment:
    """The mechanism ``mode`` names; ``auto``: cgroup if a hierarchy is writable, else
    sandbox if we are in one, else subreaper. Raises ``Unavailable`` (one line: what is
    missing, what to do) for an explicit choice that cannot work here."""
    openers: dict[str, Callable[[], Containment]] = {
        "cgroup": lambda: Cgroup.open(state_dir, cgroup_root),
        "sandbox": Sandbox.open,
        "subreaper": Subreaper.open,
    }
    if mode != "auto":
        return openers[mode]()
    for name in ("cgroup", "sandbox"):
        with contextlib.suppress(Unavailable):
            return openers[name]()
    return openers["subreaper"]()
