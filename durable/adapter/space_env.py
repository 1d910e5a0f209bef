"""An ``ExecutionEnv`` over a Space's daemon, for the tools the adapter does not wrap
(``read``, host tools that look at files). Wrapped tools talk to the Space directly."""

from __future__ import annotations

import uuid
from collections.abc import Callable

from ..env import ExecResult, FileStat, OutputCallback
from ..errors import SpaceError, SpaceNotFound, SpaceUnavailable, ToolError
from ..spaces import SpaceClient


def tool_error(exc: SpaceError) -> Exception:
    """A refusal about the request (not found, outside the root) is the model's error; an
    unreachable Space is not (recovery handles it)."""
    if isinstance(exc, (SpaceUnavailable, SpaceNotFound)):
        return exc
    if exc.code in ("not_found", "outside_root", "bad_request", "conflict"):
        return ToolError(str(exc))
    return exc


class SpaceEnv:
    def __init__(self, client: Callable[[], SpaceClient], cwd: str = ".") -> None:
        self._client = client
        self.cwd = cwd

    def exec(self, command: str, *, timeout: float | None = None,
             on_output: OutputCallback | None = None) -> ExecResult:
        """Run a command through the ledger under a one-off key (not a durable call)."""
        client = self._client()
        key = f"env:{uuid.uuid4().hex}@{client.epoch}"
        client.exec_start(key, command, cwd=self.cwd)
        info = client.exec_wait(key, on_output=on_output, timeout=timeout)
        timed_out = info.state == "running"
        if timed_out:
            info = client.exec_kill(key)
        return ExecResult(info.exit_code, info.output, timed_out=timed_out)

    def read_file(self, path: str) -> bytes:
        try:
            return self._client().read_file(path)
        except SpaceError as exc:
            raise tool_error(exc) from None

    def write_file(self, path: str, data: bytes) -> None:
        try:
            self._client().write_file(path, data)
        except SpaceError as exc:
            raise tool_error(exc) from None

    def stat(self, path: str) -> FileStat | None:
        try:
            st = self._client().stat(path)
        except SpaceError as exc:
            raise tool_error(exc) from None
        if st is None:
            return None
        return FileStat(path, st["kind"], st.get("size", 0), st.get("mode", 0), st.get("target"))

    def list_dir(self, path: str) -> list[str]:
        try:
            return sorted(e["name"] for e in self._client().list_dir(path))
        except SpaceError as exc:
            raise tool_error(exc) from None

    def remove(self, path: str) -> None:
        try:
            self._client().remove(path)
        except SpaceError as exc:
            raise tool_error(exc) from None
