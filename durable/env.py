"""The execution environment the coding tools run against, and its local implementation.

``ExecutionEnv`` is what ``read``, ``write``, ``edit`` and ``bash`` need: run a shell command
with streamed output, and file operations on paths relative to a working directory. The
local implementation confines every path to a root directory; the Space adapter provides a
remote one backed by a Space's daemon.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, runtime_checkable

from .errors import ToolError

OutputCallback = Callable[[str], None]


@dataclass(frozen=True)
class ExecResult:
    exit_code: int | None
    output: str
    timed_out: bool = False
    #: True when ``output`` is a tail (the beginning was dropped).
    truncated: bool = False


@dataclass(frozen=True)
class FileStat:
    path: str
    kind: str  # "file" | "dir" | "symlink"
    size: int
    mode: int
    target: str | None = None


@runtime_checkable
class ExecutionEnv(Protocol):
    cwd: str

    def exec(
        self, command: str, *, timeout: float | None = None, on_output: OutputCallback | None = None
    ) -> ExecResult: ...

    def read_file(self, path: str) -> bytes: ...

    def write_file(self, path: str, data: bytes) -> None: ...

    def stat(self, path: str) -> FileStat | None:
        """``None`` when the path does not exist."""
        ...

    def list_dir(self, path: str) -> list[str]: ...

    def remove(self, path: str) -> None: ...


class LocalEnv:
    """An ``ExecutionEnv`` on this machine, confined to ``root``.

    Paths are resolved against ``root`` (relative ones) and must stay inside it after
    symlinks are resolved; anything else raises ``ToolError``. Commands run with ``bash -c``
    in their own process group, which is killed whole on timeout.
    """

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root).resolve()
        self.root.mkdir(parents=True, exist_ok=True)
        self.cwd = str(self.root)

    def resolve(self, path: str) -> Path:
        if "\x00" in path:
            raise ToolError(f"path {path!r} contains a NUL byte; use a plain relative path")
        p = Path(path)
        full = p if p.is_absolute() else self.root / p
        real = Path(os.path.realpath(full))
        if real != self.root and self.root not in real.parents:
            raise ToolError(
                f"path {path!r} leads outside the workspace {self.root}; use a path inside it"
            )
        return real

    def exec(
        self, command: str, *, timeout: float | None = None, on_output: OutputCallback | None = None
    ) -> ExecResult:
        proc = subprocess.Popen(
            ["bash", "-c", command],
            cwd=self.root,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        assert proc.stdout is not None
        chunks: list[str] = []
        deadline = None if timeout is None else time.monotonic() + timeout
        timed_out = False
        os.set_blocking(proc.stdout.fileno(), False)
        try:
            while True:
                data = proc.stdout.read()
                if data:
                    text = data.decode("utf-8", "replace")
                    chunks.append(text)
                    if on_output:
                        on_output(text)
                if proc.poll() is not None:
                    rest = proc.stdout.read()
                    if rest:
                        text = rest.decode("utf-8", "replace")
                        chunks.append(text)
                        if on_output:
                            on_output(text)
                    break
                if deadline is not None and time.monotonic() > deadline:
                    timed_out = True
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()
                    break
                time.sleep(0.01)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            proc.stdout.close()
        return ExecResult(exit_code=proc.returncode, output="".join(chunks), timed_out=timed_out)

    def read_file(self, path: str) -> bytes:
        p = self.resolve(path)
        try:
            return p.read_bytes()
        except FileNotFoundError:
            raise ToolError(f"file not found: {path}") from None
        except IsADirectoryError:
            raise ToolError(f"{path} is a directory, not a file") from None

    def write_file(self, path: str, data: bytes) -> None:
        p = self.resolve(path)
        p.parent.mkdir(parents=True, exist_ok=True)
        tmp = p.with_name(f".{p.name}.tmp-{os.getpid()}")
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, p)

    def stat(self, path: str) -> FileStat | None:
        p = self.resolve(path)
        try:
            st = os.lstat(p)
        except FileNotFoundError:
            return None
        if os.path.islink(p):
            return FileStat(path, "symlink", st.st_size, st.st_mode, os.readlink(p))
        kind = "dir" if p.is_dir() else "file"
        return FileStat(path, kind, st.st_size, st.st_mode)

    def list_dir(self, path: str) -> list[str]:
        return sorted(os.listdir(self.resolve(path)))

    def remove(self, path: str) -> None:
        p = self.resolve(path)
        if p.is_dir() and not p.is_symlink():
            raise ToolError(f"{path} is a directory; remove its files first")
        p.unlink(missing_ok=True)
