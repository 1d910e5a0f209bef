"""Where the virtual shell runs a command: a worker process of its own, so every limit holds.

The interpreter is pure Python: a built-in that loops in Python (``echo {1..3000000}``, an
endless ``awk`` loop) never yields to a timer, and a command that doubles a string forty
times raises ``MemoryError`` in whatever process runs it. So a command runs in a worker
process (``python -m durable.virtual.shell_worker``) whose address space is capped at its
size after start-up plus ``ShellLimits.max_memory_bytes``, and which is SIGKILLed when the
command outruns its time limit by ``GRACE_S`` (a command that yields, such as ``sleep``, is
stopped at the limit itself, inside the worker, with the workspace as it left it). A
stopped or dead worker's command changed nothing: the result says which limit it hit and
the workspace is the one before the call. Workers are kept warm and reused (one per
concurrent call), and each dies with the process that started it.

The pipe carries length-prefixed pickles of our own dataclasses, between a process and the
child it started; nothing else writes to it.
"""

from __future__ import annotations

import atexit
import os
import pickle
import resource
import select
import signal
import struct
import subprocess
import sys
import threading
import time
import traceback
from typing import IO, Any

from ..lifetime import DIE_WITH_ENV, die_with
from .shell import ShellLimits, ShellRun, Tree, run_here

#: Seconds past its time limit after which a command that does not yield is stopped.
GRACE_S = 5.0
_HEADER = struct.Struct(">Q")


def _send(stream: IO[bytes], obj: Any) -> None:
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    stream.write(_HEADER.pack(len(data)) + data)
    stream.flush()


def _receive(stream: IO[bytes]) -> Any:
    header = stream.read(_HEADER.size)
    if len(header) < _HEADER.size:
        raise EOFError("the pipe closed")
    (size,) = _HEADER.unpack(header)
    data = stream.read(size)
    if len(data) < size:
        raise EOFError("the pipe closed mid-message")
    return pickle.loads(data)


def _memory_limit(limits: ShellLimits) -> str:
    return (f"the command used more than {limits.max_memory_bytes} bytes of memory, the "
            "virtual workspace's limit (max_memory_bytes); it changed nothing")


# ---------------------------------------------------------------- the worker's side


def main() -> None:
    die_with(os.environ.get(DIE_WITH_ENV))
    import just_bash  # noqa: F401 - loaded once, before the baseline is measured

    requests, replies = sys.stdin.buffer, sys.stdout.buffer
    sys.stdout = sys.stderr  # nothing else may write into the reply pipe
    baseline = _address_space()
    while True:
        try:
            tree, command, limits, seconds = _receive(requests)
        except EOFError:
            return
        cap = baseline + limits.max_memory_bytes
        resource.setrlimit(resource.RLIMIT_AS, (cap, resource.RLIM_INFINITY))
        try:
            reply: tuple[str, Any] = ("ok", run_here(tree, command, limits, seconds))
        except MemoryError:
            reply = ("memory", None)
        except Exception:  # noqa: BLE001 - the caller raises it, with this traceback
            reply = ("error", traceback.format_exc())
        resource.setrlimit(resource.RLIMIT_AS, (resource.RLIM_INFINITY,
                                                resource.RLIM_INFINITY))
        _send(replies, reply)
        if reply[0] == "memory":
            return  # a process that ran out of memory is not trusted with the next command


def _address_space() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmSize:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmSize in /proc/self/status")


# ---------------------------------------------------------------- the caller's side


class ShellCrashed(RuntimeError):
    """The interpreter itself raised (a bug of its, not a limit of the command)."""


class _Gone(Exception):
    """A warm worker had died before it was given a command."""


class _Worker:
    def __init__(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "durable.virtual.shell_worker"], stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, env={**os.environ, DIE_WITH_ENV: str(os.getpid())})
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.requests, self.replies = self.proc.stdin, self.proc.stdout

    def run(self, tree: Tree, command: str, limits: ShellLimits, seconds: float
            ) -> ShellRun | None:
        """The command's result; None when the worker had to be stopped (past its time
        limit) or died (``end`` was called on it either way). ``_Gone``: it was dead before
        it got the command."""
        try:
            _send(self.requests, (tree, command, limits, seconds))
        except OSError:
            self.end()
            raise _Gone() from None
        ready, _, _ = select.select([self.replies], [], [], seconds + GRACE_S)
        if not ready:
            self.end()
            return None
        try:
            kind, value = _receive(self.replies)
        except (EOFError, pickle.UnpicklingError):
            self.end()
            return None
        if kind == "memory":
            self.end()
            return ShellRun(126, "", False, _memory_limit(limits), tree)
        if kind == "error":
            raise ShellCrashed(f"the virtual shell failed on {command[:80]!r}:\n{value}")
        run: ShellRun = value
        return run

    def end(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()
        self.requests.close()
        self.replies.close()


class WorkerPool:
    """Warm workers, one per concurrent call; each ended by its pid when it misbehaves, and
    all with this process (they ask the kernel for SIGKILL when it dies; ``close`` ends and
    reaps the idle ones first, so none is left to the collector at exit)."""

    def __init__(self) -> None:
        self._idle: list[_Worker] = []
        self._lock = threading.Lock()

    def close(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, []
        for worker in idle:
            worker.end()

    def run(self, tree: Tree, command: str, limits: ShellLimits, seconds: float) -> ShellRun:
        while True:
            with self._lock:
                warm = self._idle.pop() if self._idle else None
            worker = warm or _Worker()
            started = time.monotonic()
            try:
                run = worker.run(tree, command, limits, seconds)
            except _Gone:
                if warm is None:
                    raise ShellCrashed("the virtual shell's worker process died as it "
                                       "started; its stderr (above) says why") from None
                continue  # a warm worker had died meanwhile: the next one, or a fresh one
            except ShellCrashed:
                with self._lock:
                    self._idle.append(worker)  # it is well: the interpreter raised, not it
                raise
            break
        if run is None:
            if time.monotonic() - started >= seconds:
                return ShellRun(None, "", True, f"the command ran past its time limit of "
                                f"{seconds:g} s without yielding and was stopped; it changed "
                                "nothing", tree)
            # Killed from outside (the kernel's OOM killer) or crashed in C.
            return ShellRun(126, "", False, "the command's worker process died (out of "
                            "memory?); it changed nothing", tree)
        if worker.proc.poll() is None:
            with self._lock:
                self._idle.append(worker)
        return run


def run_shell(tree: Tree, command: str, limits: ShellLimits, *,
              timeout: float | None = None) -> ShellRun:
    """Run ``command`` on a copy of ``tree`` (``shell.run_here``), in a worker process where
    its time and memory limits hold."""
    global _pool
    seconds = limits.timeout_s if timeout is None else min(timeout, limits.timeout_s)
    with _pool_lock:
        if _pool is None:
            _pool = WorkerPool()
            atexit.register(_pool.close)  # its warm workers end with this process
    return _pool.run(tree, command, limits, seconds)


_pool: WorkerPool | None = None
_pool_lock = threading.Lock()


if __name__ == "__main__":
    main()
