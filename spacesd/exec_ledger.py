"""The exec ledger: commands started under idempotency keys, at most once each.

Starting a key appends ``start`` (key, command, cwd, epoch) to the journal and fsyncs it
*before* the process is spawned, so no command ever runs without a durable record; a known
key is never spawned again. The rest of a key's story comes from files the shim writes in
``exec/`` (claim: pid and start time; exit: status) and from ``end`` records the daemon
appends when it kills a group itself (``exec_kill``, ``advance_epoch``), since a SIGKILLed
shim cannot write anything.

A key's state is derived, never cached, in this order: an exit file → ``exited``; an ``end``
record → ``exited`` (by that signal, maybe ``fenced_by``); the claimed process alive (same
pid and start time) → ``running``; otherwise ``lost``. That is what makes a restart of the
daemon harmless: the new daemon reads the same files and gets the same answers (and so
does ``audit``, which reads them with no daemon, through ``replay`` and ``recorded_end``).

Output: the shim relays the command's stdout and stderr into ``exec/<id>.out``, keeping at
most a window of it on disk (``shim.Output``). Readers get bytes from an offset, skipping
what was punched out; once a key has ended, only its last ``OUTPUT_TAIL_BYTES`` are replayed.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from . import exec_files, procfs
from .containment import Containment, Subreaper, Tree
from .errors import Conflict
from .failpoints import Channel
from .journal import DamagedJournal, Journal
from .protocol import OUTPUT_TAIL_BYTES, STATE_EXEC_DIR, STATE_LEDGER, ExecInfo, ExecState
from .shim import SYNC_ENV, failpoints_env
from .shim_launcher import ExitWakeup, ShimLauncher

#: The most output one read returns (a client that fell far behind reads in several steps).
MAX_READ = 1024 * 1024


def _next_data(fd: int, offset: int, size: int) -> int:
    """The first offset at or after ``offset`` that holds data rather than a punched hole."""
    if offset >= size:
        return offset
    try:
        return os.lseek(fd, offset, os.SEEK_DATA)
    except OSError as exc:  # ENXIO: holes up to the end
        return size if exc.errno == errno.ENXIO else offset


def _now_ms() -> int:
    return int(time.time() * 1000)


@dataclass(frozen=True)
class Ended:
    """An end the daemon recorded itself: a kill (the shim died with the group and could
    not write its exit file) or a spawn that failed."""

    exit_code: int | None
    signal: int | None
    ended_ms: int
    fenced_by: int | None = None


@dataclass
class ExecRecord:
    key: str
    id: str
    command: str
    cwd: str
    epoch: int
    started_ms: int
    #: ``procfs.life()`` when it started (None in ledgers written before it was recorded).
    life: str | None = None
    ended: Ended | None = None
    #: (pid, start time) of the shim spawned by *this* daemon instance: covers the moment
    #: between spawn and the shim's claim.
    spawned: tuple[int, int] | None = None
    #: Set once the process group and what left it were seen empty; they never come back
    #: (in memory only).
    group_gone: bool = False

    def file(self, exec_dir: str, suffix: str) -> str:
        """The path of this key's ``.claim``, ``.exit`` or ``.out`` file in ``exec_dir``."""
        return os.path.join(exec_dir, self.id + suffix)


#: The fields of each kind of ledger record, with their types.
_FIELDS: dict[str, dict[str, tuple[type, ...]]] = {
    "start": {"key": (str,), "id": (str,), "command": (str,), "cwd": (str,), "epoch": (int,),
              "ms": (int,)},
    "end": {"key": (str,), "signal": (int, type(None)), "fenced_by": (int, type(None)),
            "ms": (int,)},
}


def _check_record(n: int, raw: dict[str, Any]) -> None:
    fields = _FIELDS.get(raw.get("t", ""))  # no "t" (or "") is no kind of record
    bad = ["t"] if fields is None else [
        name for name, kinds in fields.items()
        if not isinstance(raw.get(name, ...), kinds) or isinstance(raw.get(name), bool)]
    if not isinstance(raw.get("life", ""), str):
        bad.append("life")
    if bad:
        raise DamagedJournal(
            f"exec ledger record {n} lacks or mistypes {', '.join(bad)}: {str(raw)[:120]}; "
            "refusing to guess what it held (a forgotten key could run twice): look at the "
            "ledger, or remove the Space")


def replay(records: Iterable[dict[str, Any]]) -> dict[str, ExecRecord]:
    """The ledger's keys from its journal records (``start``, then any ``end``); a record
    without its fields raises ``DamagedJournal``."""
    recs: dict[str, ExecRecord] = {}
    for n, raw in enumerate(records, 1):
        _check_record(n, raw)
        if raw.get("t") == "start":
            recs[raw["key"]] = ExecRecord(
                raw["key"], raw["id"], raw["command"], raw["cwd"], raw["epoch"], raw["ms"],
                raw.get("life"))
        elif raw.get("t") == "end" and raw.get("key") in recs:
            recs[raw["key"]].ended = Ended(
                raw.get("exit_code"), raw["signal"], raw["ms"], raw["fenced_by"]
            )
    return recs


def recorded_end(rec: ExecRecord,
                 exec_dir: str) -> tuple[exec_files.ExitStatus, int | None] | None:
    """How ``rec`` ended, if that is recorded, with the epoch that fenced it: its shim's
    exit file first, else an ``end`` record of the daemon's; None if neither exists."""
    status = exec_files.read_exit(rec.file(exec_dir, ".exit"))
    if status is not None:
        return status, None
    if rec.ended is not None:
        e = rec.ended
        return exec_files.ExitStatus(e.exit_code, e.signal, e.ended_ms), e.fenced_by
    return None


@dataclass(frozen=True)
class _State:
    state: ExecState
    pid: int | None = None
    exit: exec_files.ExitStatus | None = None
    fenced_by: int | None = None


class ExecLedger:
    def __init__(self, state_dir: str, *, python: str, base_env: dict[str, str],
                 failpoints: Channel, containment: Containment | None = None,
                 sync_exits: bool = False) -> None:
        self._dir = os.path.join(state_dir, STATE_EXEC_DIR)
        os.makedirs(self._dir, exist_ok=True)
        self._base_env = base_env
        self._bash = exec_files.find_bash(base_env)
        self._failpoints = failpoints
        #: What finds a command's processes that left its group (default: see Subreaper).
        self._containment = containment or Subreaper()
        #: Whether shims flush the filesystems before recording an exit (``shim.SYNC_ENV``).
        self._sync_env = {SYNC_ENV: "1"} if sync_exits else {}
        self._lock = threading.Lock()
        self._journal = Journal(os.path.join(state_dir, STATE_LEDGER))
        self._records = replay(self._journal.records)
        self._life = procfs.life()
        self._wakeup = ExitWakeup()
        self._launcher = ShimLauncher(python, base_env, self._wakeup)

    def close(self) -> None:
        self._journal.close()
        self._launcher.close()
        self._wakeup.close()

    def _shim_failpoints(self, key: str) -> dict[str, str]:
        """The environment through which a shim of ``key`` reports its points: none once
        the channel is off."""
        fp = self._failpoints
        return failpoints_env(fp.address if fp.enabled else None, {**fp.context, "key": key})

    def _path(self, rec: ExecRecord, suffix: str) -> str:
        return rec.file(self._dir, suffix)

    # ---------------------------------------------------------------- state

    def _state(self, rec: ExecRecord) -> _State:
        end = recorded_end(rec, self._dir)
        if end is not None:
            return _State("exited", self._pgid(rec), *end)
        claim = exec_files.read_claim(self._path(rec, ".claim"))
        if claim is None and rec.spawned is not None and procfs.is_alive(*rec.spawned):
            return _State("running", rec.spawned[0])  # the shim is still starting up
        if claim is None:
            claim = exec_files.claim_lost(self._path(rec, ".claim"))
        if isinstance(claim, exec_files.Claim) and not self._of_earlier_life(rec) and \
                procfs.is_alive(claim.pid, claim.started):
            return _State("running", claim.pid)
        # Gone without a status, unless it wrote one just after the first look.
        end = recorded_end(rec, self._dir)
        if end is not None:
            return _State("exited", self._pgid(rec), *end)
        return _State("lost", self._pgid(rec))

    def _of_earlier_life(self, rec: ExecRecord) -> bool:
        """Whether ``rec`` started in an earlier life of the Space (``procfs.life``): its
        processes are all gone, and its pid and group now name others."""
        return rec.life is not None and rec.life != self._life

    def _pgid(self, rec: ExecRecord) -> int | None:
        """The process group of ``rec``'s command, None when it can have no live member."""
        if self._of_earlier_life(rec):
            return None
        claim = exec_files.read_claim(self._path(rec, ".claim"))
        if isinstance(claim, exec_files.Claim):
            return claim.pid
        return rec.spawned[0] if rec.spawned else None

    def _info(self, rec: ExecRecord, st: _State, *, output: str = "", offset: int = 0,
              size: int = 0) -> ExecInfo:
        ex = st.exit
        return ExecInfo(
            key=rec.key,
            state=st.state,
            epoch=rec.epoch,
            pid=st.pid,
            exit_code=ex.exit_code if ex else None,
            output=output,
            output_offset=offset,
            output_size=size,
            started_ms=rec.started_ms,
            ended_ms=ex.ended_ms if ex else None,
            fenced_by=st.fenced_by,
            signal=ex.signal if ex else None,
        )

    def _read_output(self, rec: ExecRecord, offset: int, *,
                     ended: bool) -> tuple[str, int, int, int]:
        """(text, its byte offset, the offset after it, output size) from ``offset``.

        A running command's read stops before a split UTF-8 character (the rest comes with
        the next read); an ended command's read starts at most ``OUTPUT_TAIL_BYTES`` before
        the end, and any read after the part the shim punched out (``shim.Output``), on a
        character boundary.
        """
        try:
            with open(self._path(rec, ".out"), "rb") as f:
                size = os.fstat(f.fileno()).st_size
                start = min(offset, size)
                tail_start = max(0, size - OUTPUT_TAIL_BYTES)
                moved = ended and start < tail_start
                if moved:
                    start = tail_start
                held = _next_data(f.fileno(), start, size)
                if held > start:  # the shim punched out output older than its window
                    moved, start = True, held
                f.seek(start)
                data = f.read(MAX_READ)
        except FileNotFoundError:
            return "", 0, 0, 0
        if moved:
            skip = 0
            while skip < min(3, len(data)) and 0x80 <= data[skip] < 0xC0:
                skip += 1
            data, start = data[skip:], start + skip
        if not ended:
            data = data[: _complete_utf8(data)]
        return data.decode("utf-8", "replace"), start, start + len(data), size

    # ---------------------------------------------------------------- operations

    def start(self, key: str, command: str, cwd: str, env: dict[str, str], epoch: int) -> ExecInfo:
        """Start ``command`` under ``key`` or, for a known key, report what it did."""
        with self._lock:
            rec = self._records.get(key)
            if rec is not None:
                if (rec.command, rec.cwd) != (command, cwd):
                    raise Conflict(
                        f"exec key {key!r} was started with command {rec.command!r} in "
                        f"{rec.cwd!r}; it cannot now stand for {command!r} in {cwd!r}. A key "
                        "is a promise about one command: use a new key for a new command",
                        key=key)
                return self.status(key)
            rec = ExecRecord(key, hashlib.sha256(key.encode()).hexdigest()[:32], command, cwd,
                             epoch, _now_ms(), self._life)
            self._journal.append({"t": "start", "key": key, "id": rec.id, "command": command,
                                  "cwd": cwd, "epoch": epoch, "ms": rec.started_ms,
                                  "life": self._life})
            self._failpoints.report("spacesd.exec.recorded", {"key": key, "epoch": epoch})
            # Published in _records only once spawned: a status() racing this start must not
            # find it unclaimed and declare it lost before its shim could claim it.
            for suffix in (".claim", ".exit", ".out"):  # leftovers of a torn, dropped start
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(self._path(rec, suffix))
            try:
                pid = self._launcher.spawn(
                    [self._bash, self._path(rec, ".claim"), self._path(rec, ".exit"), cwd,
                     command, self._containment.shim_arg(rec.id)],
                    {**self._base_env, **env, **self._sync_env,
                     **self._shim_failpoints(key)},
                    self._path(rec, ".out"))
            except OSError as exc:
                with open(self._path(rec, ".out"), "ab") as f:
                    f.write(f"spacesd: cannot start the command: {exc}\n".encode())
                self._record_end(rec, signal=None, fenced_by=None, exit_code=127)
                self._records[key] = rec
                return self.status(key)
            started = procfs.start_time(pid)
            if started is not None:
                rec.spawned = (pid, started)
            self._records[key] = rec
            self._failpoints.report("spacesd.exec.spawned",
                                    {"key": key, "epoch": epoch, "shim_pid": pid})
            return ExecInfo(key=key, state="started", epoch=epoch, pid=pid,
                            started_ms=rec.started_ms)

    def status(self, key: str) -> ExecInfo:
        """What the ledger knows of ``key``; an ended key comes with its output tail."""
        rec = self._records.get(key)
        if rec is None:
            return ExecInfo(key=key, state="unknown")
        st = self._state(rec)
        if st.state == "running":
            size = self._output_size(rec)
            return self._info(rec, st, offset=size, size=size)
        text, at, _, size = self._read_output(rec, 0, ended=True)
        return self._info(rec, st, output=text, offset=at, size=size)

    def read(self, key: str, offset: int, wait: float) -> tuple[ExecInfo, int]:
        """Output of ``key`` from ``offset``, waiting up to ``wait`` seconds for some to
        appear or for the command to end; returns the info and the offset to ask next."""
        rec = self._records.get(key)
        if rec is None:
            return ExecInfo(key=key, state="unknown"), offset
        deadline = time.monotonic() + wait
        pause = 0.002
        while True:
            generation = self._wakeup.generation
            st = self._state(rec)
            ended = st.state != "running"
            text, at, nxt, size = self._read_output(rec, offset, ended=ended)
            left = deadline - time.monotonic()
            if text or ended or left <= 0:
                return self._info(rec, st, output=text, offset=at, size=size), nxt
            # Woken at once by an exit; output, and the shims of an earlier daemon, by looking.
            self._wakeup.wait(generation, min(pause, left))
            pause = min(pause * 2, 0.01)

    def kill(self, key: str) -> ExecInfo:
        """SIGKILL the key's whole tree: its process group and whatever left it."""
        with self._lock:
            rec = self._records.get(key)
            if rec is not None:
                self._kill([rec], fenced_by=None)
        return self.status(key)

    def fence(self, epoch: int, *, own: bool = False) -> list[str]:
        """Kill the tree of every key started under an epoch below ``epoch`` (``own``: at
        or below it, a restore's fence), and every stray (a process of the Space whose
        command is unknown); returns the keys."""
        top = epoch + 1 if own else epoch
        with self._lock:
            killed = self._kill([r for r in self._records.values() if r.epoch < top],
                                fenced_by=epoch)
            self._containment.kill_strays(self._trees(self._records.values()),
                                          spare=self._helpers())
            return killed

    def _kill(self, recs: list[ExecRecord], *, fenced_by: int | None) -> list[str]:
        groups = self._live_groups(recs)
        if not groups:
            return []
        running = [rec for rec in groups.values() if self._state(rec).state == "running"]
        # The escaped first, while the shims live to adopt what a racing fork leaves; then
        # the groups. A tree alive after the kill (a process stuck in the kernel) has not
        # ended: no end record, and it stays live, so the fence journal and the next fence
        # see it.
        stuck = self._containment.kill(self._trees(groups.values()))
        survivors = procfs.kill_groups(groups)
        dead = {pgid: rec for pgid, rec in groups.items()
                if pgid not in survivors and rec.id not in stuck}
        for rec in running:
            if rec in dead.values():
                self._record_end(rec, signal=9, fenced_by=fenced_by)
        for rec in dead.values():
            rec.group_gone = True
        self._containment.release(rec.id for rec in dead.values())
        return sorted(rec.key for rec in dead.values())

    def _record_end(self, rec: ExecRecord, *, signal: int | None, fenced_by: int | None,
                    exit_code: int | None = None) -> None:
        ended = Ended(exit_code, signal, _now_ms(), fenced_by)
        self._journal.append({"t": "end", "key": rec.key, "signal": signal,
                              "fenced_by": fenced_by, "exit_code": exit_code,
                              "ms": ended.ended_ms})
        rec.ended = ended

    def _helpers(self) -> set[int]:
        """The daemon's own processes, never strays: its shim launcher."""
        return set() if self._launcher.pid is None else {self._launcher.pid}

    def _tree(self, rec: ExecRecord) -> Tree:
        if self._of_earlier_life(rec):
            return Tree(rec.id, None)
        claim = exec_files.read_claim(self._path(rec, ".claim"))
        return Tree(rec.id, (claim.pid, claim.started) if isinstance(claim, exec_files.Claim)
                    else rec.spawned)

    def _trees(self, recs: Iterable[ExecRecord]) -> list[Tree]:
        return [self._tree(rec) for rec in recs]

    def _live_groups(self, recs: list[ExecRecord]) -> dict[int, ExecRecord]:
        """The records of ``recs`` whose tree (process group, or what left it) still has a
        live member, by process group id."""
        return {pgid: rec for pgid, (rec, _pids) in self._live_members(recs).items()}

    def _live_members(self, recs: list[ExecRecord]) -> dict[int, tuple[ExecRecord, set[int]]]:
        """``_live_groups`` with the live pids of each tree (its group and what left it)."""
        by_pgid: dict[int, ExecRecord] = {}
        for rec in recs:
            if rec.group_gone:
                continue
            pgid = self._pgid(rec)
            if pgid is None:
                # Unclaimed after a restart: settle the claim race first (see exec_files).
                self._state(rec)
                pgid = self._pgid(rec)
            if pgid is None:
                rec.group_gone = True
            else:
                by_pgid[pgid] = rec
        table = procfs.snapshot() if by_pgid else {}  # one instant for both questions
        live = procfs.group_members(by_pgid, table)
        escaped = self._containment.members(self._trees(by_pgid.values()), table) \
            if by_pgid else {}
        members = {pgid: (rec, {*live.get(pgid, ()), *escaped.get(rec.id, ())})
                   for pgid, rec in by_pgid.items()}
        gone = [rec for rec, pids in members.values() if not pids]
        for rec in gone:
            rec.group_gone = True
        self._containment.release(rec.id for rec in gone)
        return {pgid: (rec, pids) for pgid, (rec, pids) in members.items() if pids}

    def alive_below(self, epoch: int) -> list[str]:
        """Keys started under an epoch below ``epoch`` whose tree has a live member, then
        ``"pid <n> (no key)"`` for each stray, looked up afresh in /proc (not from what this
        daemon remembers of the trees): what a fence audit records. Under the lock: a shim
        being spawned is not yet a known tree and would count as a stray."""
        with self._lock:
            recs = list(self._records.values())
            by_pgid = {pgid: rec for rec in recs
                       if rec.epoch < epoch and (pgid := self._pgid(rec)) is not None}
            table = procfs.snapshot()  # one instant for the three questions
            live = procfs.group_members(by_pgid, table)
            older = [rec for rec in recs if rec.epoch < epoch]
            escaped = self._containment.members(self._trees(older), table)
            strays = self._containment.strays(self._trees(recs), spare=self._helpers(),
                                              table=table)
        keys = {rec.key for pgid, rec in by_pgid.items() if pgid in live}
        keys.update(rec.key for rec in older if rec.id in escaped)
        return sorted(keys) + [f"pid {pid} (no key)" for pid in strays]

    def running_keys(self) -> list[str]:
        """Keys whose tree still has a live member: a command that left ``sleep 100 &`` (or
        ``setsid sleep 100 &``) behind counts even after its shell exited. A shim whose
        command's exit is recorded is not one: it only drains the output and exits (a
        window that load stretches to milliseconds), or waits for the orphans it adopted,
        which count themselves."""
        keys = []
        for pgid, (rec, pids) in self._live_members(list(self._records.values())).items():
            if recorded_end(rec, self._dir) is not None:
                pids = pids - {pgid}  # the shim leads its group: its pid is the group's id
            if pids:
                keys.append(rec.key)
        return sorted(keys)

    def _output_size(self, rec: ExecRecord) -> int:
        try:
            return os.stat(self._path(rec, ".out")).st_size
        except FileNotFoundError:
            return 0


def _complete_utf8(data: bytes) -> int:
    """Length of the longest prefix of ``data`` that does not end inside a UTF-8 char."""
    n = len(data)
    for back in range(1, min(4, n) + 1):
        b = data[n - back]
        if b < 0x80:
            return n
        if b >= 0xC0:  # a lead byte: is its sequence complete?
            need = 2 if b < 0xE0 else 3 if b < 0xF0 else 4
            return n if back >= need else n - back
    return n
