"""``VirtualEnv``: the ``ExecutionEnv`` the coding tools run against on a virtual workspace,
over the files of one call (a ``shell.Tree``) that the call changes in place.

Paths are relative to ``/workspace`` or absolute inside it; ``..`` may not leave it, and a
symlink is followed only while it stays inside (as ``LocalEnv`` confines a root). Commands
run in ``shell_worker.run_shell``: a fresh in-memory shell per command, nothing of the host.
"""

from __future__ import annotations

import posixpath

from ..env import ExecResult, FileStat, OutputCallback
from ..errors import ToolError
from .shell import ROOT, Node, ShellLimits, Tree
from .shell_worker import run_shell

#: Symlinks followed at most, as the kernel's limit.
MAX_LINKS = 40


class VirtualEnv:
    def __init__(self, tree: Tree, limits: ShellLimits) -> None:
        self.tree = tree
        self.limits = limits
        self.cwd = ROOT
        #: The limit the last command hit, in words (the tool reports it).
        self.limit: str | None = None

    # -- paths -------------------------------------------------------------------

    def relative(self, path: str) -> str:
        """``path`` as a workspace-relative path ("" for the workspace itself)."""
        if "\x00" in path:
            raise ToolError(f"path {path!r} contains a NUL byte; use a plain relative path")
        full = posixpath.normpath(posixpath.join(ROOT, path))
        if full == ROOT:
            return ""
        if not full.startswith(ROOT + "/"):
            raise ToolError(f"path {path!r} leads outside the workspace {ROOT}; use a path "
                            "inside it")
        return full[len(ROOT) + 1:]

    def resolve(self, path: str) -> str:
        """The workspace path ``path`` names once its symlinks are followed."""
        rel = self.relative(path)
        for _ in range(MAX_LINKS):
            parts = rel.split("/") if rel else []
            for i in range(len(parts)):
                prefix = "/".join(parts[:i + 1])
                node = self.tree.get(prefix)
                if node is not None and node.kind == "symlink":
                    target = node.data.decode("utf-8", "surrogateescape")
                    base = posixpath.dirname(prefix)
                    joined = target if target.startswith("/") else posixpath.join(
                        ROOT, base, target)
                    rest = "/".join(parts[i + 1:])
                    rel = self.relative(posixpath.join(joined, rest) if rest else joined)
                    break
            else:
                return rel
        raise ToolError(f"too many levels of symbolic links in {path!r}")

    def _is_dir(self, rel: str) -> bool:
        return rel == "" or any(p.startswith(rel + "/") for p in self.tree)

    # -- ExecutionEnv ------------------------------------------------------------

    def exec(self, command: str, *, timeout: float | None = None,
             on_output: OutputCallback | None = None) -> ExecResult:
        run = run_shell(self.tree, command, self.limits, timeout=timeout)
        self.tree.clear()
        self.tree.update(run.tree)
        self.limit = run.limit
        if on_output and run.output:
            on_output(run.output)
        return ExecResult(run.exit_code, run.output, timed_out=run.timed_out)

    def read_file(self, path: str) -> bytes:
        rel = self.resolve(path)
        node = self.tree.get(rel)
        if node is None:
            if self._is_dir(rel):
                raise ToolError(f"{path} is a directory, not a file")
            raise ToolError(f"file not found: {path}")
        return node.data

    def write_file(self, path: str, data: bytes) -> None:
        rel = self.resolve(path)
        if rel == "" or self._is_dir(rel):
            raise ToolError(f"{path} is a directory, not a file")
        parts = rel.split("/")
        for i in range(1, len(parts)):
            if "/".join(parts[:i]) in self.tree:
                raise ToolError(f"{'/'.join(parts[:i])} is a file, not a directory; "
                                f"{path} cannot be written under it")
        old = self.tree.get(rel)
        self.tree[rel] = Node("file", old.mode if old is not None else 0o644, data)

    def stat(self, path: str) -> FileStat | None:
        rel = self.relative(path)
        node = self.tree.get(rel)
        if node is None:
            return FileStat(path, "dir", 0, 0o40755) if self._is_dir(rel) else None
        if node.kind == "symlink":
            return FileStat(path, "symlink", len(node.data), 0o120777,
                            node.data.decode("utf-8", "surrogateescape"))
        return FileStat(path, "file", len(node.data), 0o100000 | node.mode)

    def list_dir(self, path: str) -> list[str]:
        rel = self.resolve(path)
        if not self._is_dir(rel):
            raise ToolError(f"{path} is not a directory")
        prefix = rel + "/" if rel else ""
        return sorted({p[len(prefix):].split("/", 1)[0] for p in self.tree
                       if p.startswith(prefix)})

    def remove(self, path: str) -> None:
        rel = self.relative(path)
        if rel in self.tree:
            del self.tree[rel]
        elif self._is_dir(rel):
            raise ToolError(f"{path} is a directory; remove its files first")
