"""Step kinds of the scripted agents: the tool call each makes, its effect on the workspace
model, and the result one uninterrupted run returns.

Every step is built so that a wrong recovery shows: each effect carries the step's unique
marker (``step-<k>``) or a seeded content, appending steps make a duplicate visible, and
each step's *result* is predicted exactly from the workspace it runs on (exit status and
output of a command, the text of a file tool), so an outcome replayed from the wrong key,
cut to the wrong tail or adopted from another call differs from the prediction. Commands
are written to give a predictable result whatever state earlier (possibly interrupted)
steps left, e.g. ``mv`` only when its source exists.

Paths by role, so that steps never step on each other in ways the model cannot follow:
``files/w<i>.txt`` (write tool; also rm, mv, chmod and sums), ``doc.txt`` (edit only),
``log.txt`` (appends), ``README.md`` (never changed), ``links/l<j>`` (symlinks only),
``tree/``, ``bin/``, ``big/``, ``bulk<k>/``, ``sums.txt``, ``simple/s<k>.txt`` (a step a shrink
simplified), ``leak.txt`` (written only by a detached process that escaped a fence: never in
a correct run).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from durable.coding_tools import bash_result

from .workspace_model import WorkspaceModel

DOC_FILE = "doc.txt"
LOG_FILE = "log.txt"
README = "README.md"
WRITE_SLOTS = 4
LINK_SLOTS = 3
CHMOD_MODES = (0o600, 0o640, 0o700, 0o750, 0o755, 0o604)
BACKGROUND_SECONDS = 120
#: Size of a ``sparse`` step's file, and the fs block its one data extent fills.
SPARSE_SIZE = 1 << 20
BLOCK = 4096
#: The mtime a ``dated`` step sets (UTC, as touch -d reads the trailing Z), in ns.
DATED = "2001-02-03T04:05:06Z"
DATED_NS = 981173106 * 10**9
#: Where a ``detached`` step's writer writes if it outlives its command.
LEAK_FILE = "leak.txt"
#: How long after its command's fence window a ``detached`` step's writer writes.
DETACHED_GRACE_SECONDS = 0.5
#: Lines a ``late_print`` command prints (26 bytes each, 31 KB: more than the 4 pages of room
#: a disk fill leaves at most, ``chaos.faults.kinds._FillDisk.LEAVE_PAGES``).
LATE_PRINT_LINES = 1200
#: What a ``detached`` step's writer runs first: it moves itself to the root cgroup of each
#: hierarchy, out of the Space's (only root can, and only where the hierarchy is writable: a
#: local Space run as root; elsewhere each write fails, silently). Escapes the cgroup alone.
CGROUP_ESCAPE = ("for c in /sys/fs/cgroup/unified /sys/fs/cgroup/freezer /sys/fs/cgroup; "
                 "do echo $$ > $c/cgroup.procs; done 2>/dev/null;")


def write_path(i: int) -> str:
    return f"files/w{i}.txt"


@dataclass(frozen=True)
class Expected:
    """The result one uninterrupted run of a step returns, as the harness commits it."""

    content: str
    is_error: bool = False
    #: A command's exit status (None for the other tools).
    exit_code: int | None = None
    #: sha256 of the whole content, when ``content`` is only its head (a golden run's
    #: result as the observation keeps it); None: the content's own.
    sha256: str | None = None
    #: A command's whole output (None for the other tools and a golden run's results).
    output: str | None = None


@dataclass(frozen=True)
class Step:
    index: int
    kind: str
    tool: str
    args: dict[str, Any]
    #: What the effect needs beyond the call's arguments (paths, modes, sizes, an exit code).
    params: dict[str, Any] = field(default_factory=dict)

    @property
    def marker(self) -> str:
        return f"step-{self.index}"

    def touches_workspace(self) -> bool:
        return self.tool in ("write", "edit", "bash")

    @property
    def appends(self) -> bool:
        """Whether the effect appends the marker line to ``log.txt``."""
        return self.kind in APPENDING

    def apply(self, ws: WorkspaceModel) -> Expected:
        """Apply this step's effect to ``ws`` (what a committed, non-interrupted call did)
        and return the result that run gives."""
        if self.tool == "write":
            data = self.args["content"].encode()
            ws.write(self.args["path"], data, renamed=True)
            return Expected(f"Wrote {len(data)} bytes to {self.args['path']}")
        if self.tool == "edit":
            path = self.args["path"]
            text = (ws.content(path) or b"").decode()
            for e in self.args["edits"]:
                if text.count(e["old_text"]) != 1:
                    raise ValueError(f"{self.marker}: edit text not found once in the model")
                text = text.replace(e["old_text"], e["new_text"])
            ws.write(path, text.encode(), renamed=True)
            return Expected(f"Applied {len(self.args['edits'])} edit(s) to {path}")
        if self.kind == "workload":
            raise ValueError(f"{self.marker}: a workload call's effect comes from its golden "
                             "run (chaos.checks.golden), not from a model")
        if self.tool == "bash":
            code, output = EFFECTS[self.kind](self, ws)
            result = bash_result(code, output)
            return Expected(result.content, result.is_error, code, output=output)
        return Expected(f"recorded {self.marker}")  # host tools: record_never, record_safe


#: The kind of the simplest step there is: what a shrink puts in place of a step.
SIMPLE_KIND = "write"


def simple_step(step: Step) -> Step:
    """The simplest step in place of ``step``: a write of its marker to a file no other step
    touches (``simple/s<k>.txt``), with the same index. ``params`` names what it replaced."""
    return Step(step.index, SIMPLE_KIND, "write",
                {"path": f"simple/s{step.index}.txt", "content": f"{step.marker}\n"},
                {"simplified_from": step.kind})


Effect = Callable[[Step, WorkspaceModel], tuple[int, str]]


def _append_marker(step: Step, ws: WorkspaceModel) -> None:
    ws.append(LOG_FILE, f"{step.marker}\n".encode())


def _append(step: Step, ws: WorkspaceModel) -> tuple[int, str]:
    _append_marker(step, ws)
    return 0, ""


def _synced_append(step: Step, ws: WorkspaceModel) -> tuple[int, str]:
    _append_marker(step, ws)
    return 0, f"{step.marker} synced\n"


def _late_print(step: Step, ws: WorkspaceModel) -> tuple[int, str]:
    _append_marker(step, ws)
    return 0, "".join(f"{step.marker} printed late {i:05d}\n"
                      for i in range(1, LATE_PRINT_LINES + 1))


def _many_files(step: Step, ws: WorkspaceModel) -> tuple[int, str]:
    for i in range(1, step.params["count"] + 1):
        ws.write(f"bulk{step.index}/f{i}", f"{step.marker}-{i}\n".encode(),
                 0o755 if i == 1 else None)
    return 0, ""


def _fail(step: Step, ws: WorkspaceModel) -> tuple[int, str]:
    return step.params["code"], f"{step.marker}: out\n{step.marker}: err\n"


def _write_fail(step: Step, ws: WorkspaceModel) -> tuple[int, str]:
    _append_marker(step, ws)
    return step.params["code"], f"{step.marker}: failing after the write\n"


def big_output_text(marker: str, lines: int) -> str:
    return "".join(f"{marker} line {i:06d}\n" for i in range(1, lines + 1))


def _big_output(step: Step, ws: WorkspaceModel) -> tuple[int, str]:
    _append_marker(step, ws)
    return 0, big_output_text(step.marker, step.params["lines"])


def _rm(step: Step, ws: WorkspaceModel) -> tuple[int, str]:
    ws.remove(step.params["path"])
    return 0, ""


def _mv(step: Step, ws: WorkspaceModel) -> tuple[int, str]:
    src, dst = step.params["src"], step.params["dst"]
    if not ws.has_file(src):
        return 0, "nothing to move\n"
    data, mode = ws.files[src]
    when = ws.times.get(src)  # mv keeps the inode: its mode and mtime
    ws.remove(src)
    ws.remove(dst)
    ws.touched_dir_of(dst)
    ws.files[dst] = (data, mode)
    if when is not None:
        ws.times[dst] = when
    return 0, "moved\n"


def _mkdir(step: Step, ws: WorkspaceModel) -> tuple[int, str]:
    ws.write(step.params["path"], f"{step.marker}\n".encode())
    return 0, ""


def _symlink(step: Step, ws: WorkspaceModel) -> tuple[int, str]:
    link = step.params["link"]
    ws.remove(link)
    ws.parents(link)
    ws.links[link] = step.params["target"]
    return 0, ""


def _chmod(step: Step, ws: WorkspaceModel) -> tuple[int, str]:
    path = step.params["path"]
    if not ws.has_file(path):
        return 0, "no file\n"
    for member in ws.group(path):  # the mode is the inode's
        ws.files[member] = (ws.files[member][0], step.params["mode"])
    return 0, "changed\n"


def _binary(step: Step, ws: WorkspaceModel) -> tuple[int, str]:
    ws.write(step.params["path"], bytes.fromhex(step.params["hex"]))
    return 0, ""


def large_content(marker: str, size: int) -> bytes:
    line = f"{marker} payload\n".encode()
    return (line * (size // len(line) + 1))[:size]


def _large(step: Step, ws: WorkspaceModel) -> tuple[int, str]:
    ws.write(step.params["path"], large_content(step.marker, step.params["size"]))
    return 0, ""


def _sums(step: Step, ws: WorkspaceModel) -> tuple[int, str]:
    def sha(data: bytes | None) -> str:
        return hashlib.sha256(data or b"").hexdigest()

    out = (f"{sha(ws.content(DOC_FILE))}  {DOC_FILE}\n{sha(ws.content(README))}  {README}\n"
           f"{sha(ws.content(step.params['path']))}  -\n")
    ws.write("sums.txt", out.encode())
    return 0, out


def _empty_dir(step: Step, ws: WorkspaceModel) -> tuple[int, str]:
    ws.parents(step.params["path"] + "/x")
    return 0, ""


def _hardlink(step: Step, ws: WorkspaceModel) -> tuple[int, str]:
    a, b = step.params["a"], step.params["b"]
    ws.write(a, f"{step.marker}\nmore\n".encode())
    ws.remove(b)
    ws.files[b] = ws.files[a]
    ws.hardlinks[max(a, b)] = min(a, b)
    return 0, ""


def _fifo(step: Step, ws: WorkspaceModel) -> tuple[int, str]:
    path = step.params["path"]
    ws.remove(path)
    ws.parents(path)
    ws.fifos[path] = 0o640
    return 0, ""


def _abs_symlink(step: Step, ws: WorkspaceModel) -> tuple[int, str]:
    for link, target in ((step.params["link"], "/usr/bin/env"),
                         (step.params["dangling"], f"/nonexistent/{step.marker}")):
        ws.remove(link)
        ws.parents(link)
        ws.links[link] = target
    return 0, ""


def _odd_name(step: Step, ws: WorkspaceModel) -> tuple[int, str]:
    for path in step.params["paths"]:
        ws.write(path, f"{step.marker}\n".encode())
    return 0, ""


def _sparse(step: Step, ws: WorkspaceModel) -> tuple[int, str]:
    path = step.params["path"]
    data = step.marker.encode()
    ws.remove(path)
    ws.write(path, data + bytes(SPARSE_SIZE - len(data)))
    ws.extents[path] = ((0, BLOCK),)
    return 0, ""


def _dated(step: Step, ws: WorkspaceModel) -> tuple[int, str]:
    path = step.params["path"]
    ws.write(path, f"{step.marker}\n".encode())
    ws.times[path] = ws.times["dated"] = DATED_NS
    return 0, ""


def _setid(step: Step, ws: WorkspaceModel) -> tuple[int, str]:
    ws.write(step.params["path"], f"{step.marker}\n".encode(), 0o4755)
    ws.parents(step.params["shared"] + "/x")
    ws.dirs[step.params["shared"]] = 0o1777
    return 0, ""


#: The effect (and the exit status and output it gives) of each shell step kind.
EFFECTS: dict[str, Effect] = {
    "append": _append, "long": _append, "background": _append, "detached": _append,
    "synced_append": _synced_append, "late_print": _late_print,
    "many_files": _many_files,
    "fail": _fail, "write_fail": _write_fail, "big_output": _big_output, "rm": _rm, "mv": _mv,
    "mkdir": _mkdir, "symlink": _symlink, "chmod": _chmod, "binary": _binary,
    "large": _large, "large_loop": _large, "sums": _sums,
    "empty_dir": _empty_dir, "hardlink": _hardlink, "fifo": _fifo, "abs_symlink": _abs_symlink,
    "odd_name": _odd_name, "sparse": _sparse, "dated": _dated, "setid": _setid,
}
APPENDING = frozenset({"append", "long", "background", "detached", "write_fail",
                       "big_output", "synced_append", "late_print"})
