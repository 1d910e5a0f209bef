"""Workload files: a user's own scripted agent, the tool calls of a real session.

A workload is a YAML mapping::

    name: git                      # default: the file's name
    description: what it does
    requires: [git, python3]       # programs the Space must have (else skipped, with why)
    volatile: [repo/.git/index]    # paths whose content differs between any two runs
                                   # (git's index holds inodes): compared by kind only
    max_files: 5000                # transactional mode's limits (presets' fields)
    max_bytes: 67108864
    initial:                       # the workspace a run starts from (default: empty)
      notes.txt: "text\n"
      run.sh: {content: "#!/bin/sh\n", mode: 0o755}
      latest: {symlink: run.sh}
    calls:
      - bash: git init -q repo
      - bash: {command: date, output: nondeterministic}
      - write: {path: repo/a.txt, content: "hello\n"}
      - edit: {path: repo/a.txt, old: hello, new: hi}
      - edit: {path: b.txt, edits: [{old: x, new: y}, {old: z, new: w}]}
      - read: {path: repo/a.txt}
      - record_never: {}           # a host tool that must never run twice
      - record_safe: {}            # a host tool that is safe to run again

No model can say what a real program does to a workspace, so the oracle is a golden run:
the campaign runs the workload once without faults, on a fresh Space of the same backend and
mode, and every faulted run must end in the workspace the golden run ended in, each of its
committed results equal to the golden one (but for calls marked ``output:
nondeterministic``). A call that legitimately ends interrupted (checkpoint mode restores
the Space and tells the model) is judged against a golden run without that call
(``chaos.checks.golden``). A workload's calls are planned in order whatever they return, as a
scripted model's, so one call's effect cannot change which calls come next.

Loading checks every field and says what is wrong where (``WorkloadError``, exit 254).
"""

from __future__ import annotations

import fnmatch
import hashlib
import shutil
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml

from spacesd.protocol import ScanEntry

from .preset import Preset
from .steps import Step
from .workspace_model import WorkspaceModel

#: The tools a workload call may name, with the arguments each takes and requires.
TOOLS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "bash": (("command", "timeout"), ("command",)),
    "write": (("path", "content"), ("path", "content")),
    "edit": (("path", "old", "new", "edits"), ("path",)),
    "read": (("path",), ("path",)),
    "record_never": ((), ()),
    "record_safe": ((), ()),
}
#: Where the bundled workloads live (``--workload NAME`` finds them by name).
WORKLOAD_DIR = Path(__file__).parent / "workloads"
#: The step kind of every workload call (its effect comes from the golden run, not a model).
KIND = "workload"


class WorkloadError(ValueError):
    """A workload file is missing or malformed; the message names the call and the field
    and says what it expects (see the format in ``scenarios.workload``)."""


@dataclass(frozen=True)
class Call:
    tool: str
    args: dict[str, Any]
    #: The call's output may differ between runs (a date, a timing): its result is not
    #: compared with the golden run's.
    nondeterministic: bool = False


@dataclass(frozen=True)
class Workload:
    name: str
    path: str
    calls: tuple[Call, ...]
    description: str = ""
    requires: tuple[str, ...] = ()
    #: Globs of paths compared by kind only (their content is the machine's, not the
    #: workload's: git's index holds inodes and ctimes).
    volatile: tuple[str, ...] = ()
    #: path -> (content, mode) of a file, or the target of a symlink (a str)
    initial: dict[str, tuple[bytes, int] | str] = field(default_factory=dict)
    max_files: int = 1000
    max_bytes: int = 16 * 1024 * 1024
    #: sha256 of the file: which workload a golden run belongs to.
    digest: str = ""

    def preset(self) -> Preset:
        """The preset the campaign's machinery reads (limits; every interrupted call is
        issued again, once, as an agent retrying would)."""
        return Preset(name=f"workload:{self.name}", steps=len(self.calls), mix={"write": 1},
                      initial_files=0, max_files=self.max_files, max_bytes=self.max_bytes,
                      reissue=1.0, long_seconds=1.0)

    def initial_model(self) -> WorkspaceModel:
        """The workspace the workload starts from."""
        initial = WorkspaceModel()
        for path, value in self.initial.items():
            if isinstance(value, str):
                initial.parents(path)
                initial.links[path] = value
            else:
                initial.write(path, *value)
        return initial

    def steps(self) -> list[Step]:
        """The workload's calls as a scripted agent's steps (``plan.workload_scenario``)."""
        return [Step(i, KIND, call.tool, _tool_args(i, call),
                     {"nondeterministic": call.nondeterministic})
                for i, call in enumerate(self.calls)]

    def comparable(self, entries: list[ScanEntry]) -> list[ScanEntry]:
        """``entries`` with what a volatile path's content decides left out."""
        return [replace(e, sha256=None, size=0, mtime_ns=None, extents=None, link=None)
                if any(fnmatch.fnmatchcase(e.path, g) for g in self.volatile) else e
                for e in entries]

    def missing(self) -> list[str]:
        """The required programs this machine lacks (local Spaces run on it)."""
        return [p for p in self.requires if shutil.which(p) is None]


def _tool_args(index: int, call: Call) -> dict[str, Any]:
    """The harness's arguments of call ``index`` (edit: the coding tool's ``edits`` list;
    a host tool: the step's marker, which the checker counts its runs by)."""
    if call.tool == "edit":
        edits = call.args.get("edits") or [{"old": call.args["old"], "new": call.args["new"]}]
        return {"path": call.args["path"],
                "edits": [{"old_text": e["old"], "new_text": e["new"]} for e in edits]}
    if call.tool in ("record_never", "record_safe"):
        return {"marker": f"step-{index}"}
    return dict(call.args)


def find(name_or_path: str) -> Path:
    """A workload file: a path, or the name of a bundled one (``git``)."""
    path = Path(name_or_path)
    if path.suffix in (".yaml", ".yml") or path.exists():
        return path
    bundled = WORKLOAD_DIR / f"{name_or_path}.yaml"
    if bundled.exists():
        return bundled
    known = sorted(p.stem for p in WORKLOAD_DIR.glob("*.yaml"))
    raise WorkloadError(f"no workload file {name_or_path!r}: give a path to a YAML file or "
                        f"the name of a bundled one ({', '.join(known)})")


def load(name_or_path: str) -> Workload:
    path = find(name_or_path)
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise WorkloadError(f"cannot read workload {path}: {exc.strerror or exc}") from None
    try:
        raw = yaml.safe_load(data.decode("utf-8"))
    except UnicodeDecodeError:
        raise WorkloadError(f"{path}: the file is not UTF-8") from None
    except yaml.YAMLError as exc:
        raise WorkloadError(f"{path}: not valid YAML ({exc})") from None
    return parse(raw, str(path), hashlib.sha256(data).hexdigest())


def parse(raw: Any, where: str, digest: str = "") -> Workload:
    if not isinstance(raw, dict):
        raise WorkloadError(f"{where}: a workload is a YAML mapping with 'calls', got "
                            f"{type(raw).__name__}")
    known = {"name", "description", "requires", "initial", "calls", "max_files", "max_bytes",
             "volatile"}
    unknown = sorted(set(raw) - known)
    if unknown:
        raise WorkloadError(f"{where}: unknown field(s) {unknown}; known: {sorted(known)}")
    calls = raw.get("calls")
    if not isinstance(calls, list) or not calls:
        raise WorkloadError(f"{where}: 'calls' must be a non-empty list of tool calls, e.g. "
                            "[{bash: 'git init -q repo'}]")
    requires = raw.get("requires", [])
    if not isinstance(requires, list) or not all(isinstance(r, str) for r in requires):
        raise WorkloadError(f"{where}: 'requires' is a list of program names, got {requires!r}")
    volatile = raw.get("volatile", [])
    if not isinstance(volatile, list) or not all(isinstance(v, str) for v in volatile):
        raise WorkloadError(f"{where}: 'volatile' is a list of paths (globs), got {volatile!r}")
    initial = raw.get("initial", {})
    if not isinstance(initial, dict):
        raise WorkloadError(f"{where}: 'initial' maps paths to their text, got {initial!r}")
    limits = {}
    for key in ("max_files", "max_bytes"):
        if key in raw:
            value = raw[key]
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise WorkloadError(f"{where}: {key} is a positive integer, got {value!r}")
            limits[key] = value
    return Workload(
        name=str(raw.get("name", Path(where).stem)), path=where,
        calls=tuple(_call(c, f"{where}: call {i}") for i, c in enumerate(calls)),
        description=str(raw.get("description", "")), requires=tuple(requires),
        volatile=tuple(volatile),
        initial={k: _initial(k, v, f"{where}: initial {k!r}") for k, v in initial.items()},
        digest=digest, **limits)


def _initial(path: str, raw: Any, where: str) -> tuple[bytes, int] | str:
    """One initial entry: text, ``{content, mode}``, or ``{symlink: target}``."""
    if isinstance(raw, str):
        return raw.encode(), 0o644
    if isinstance(raw, dict) and set(raw) == {"symlink"} and isinstance(raw["symlink"], str):
        return raw["symlink"]
    if isinstance(raw, dict) and "content" in raw and set(raw) <= {"content", "mode"} and \
            isinstance(raw["content"], str):
        mode = raw.get("mode", 0o644)
        if isinstance(mode, bool) or not isinstance(mode, int) or not 0 <= mode <= 0o7777:
            raise WorkloadError(f"{where}: mode is a number like 0o644, got {mode!r}")
        return raw["content"].encode(), mode
    raise WorkloadError(f"{where}: an initial entry is its text, {{content: ..., mode: ...}} "
                        f"or {{symlink: target}}; got {raw!r}")


def _call(raw: Any, where: str) -> Call:
    if not isinstance(raw, dict) or len(raw) != 1:
        raise WorkloadError(f"{where}: a call is a mapping of one tool name to its arguments, "
                            f"e.g. {{bash: 'ls'}} or {{write: {{path: a, content: b}}}}; "
                            f"got {raw!r}")
    ((tool, args),) = raw.items()
    if tool not in TOOLS:
        raise WorkloadError(f"{where}: unknown tool {tool!r}; known: {sorted(TOOLS)}")
    if tool == "bash" and isinstance(args, str):
        args = {"command": args}
    if args is None:
        args = {}
    if not isinstance(args, dict):
        raise WorkloadError(f"{where}: the arguments of {tool} are a mapping, got {args!r}")
    args = dict(args)
    output = args.pop("output", "deterministic")
    if output not in ("deterministic", "nondeterministic"):
        raise WorkloadError(f"{where}: output is 'deterministic' (the default) or "
                            f"'nondeterministic', got {output!r}")
    allowed, required = TOOLS[tool]
    bad = sorted(set(args) - set(allowed))
    if bad:
        raise WorkloadError(f"{where}: {tool} takes {list(allowed) or 'no arguments'} (and "
                            f"output), not {bad}")
    missing = [a for a in required if a not in args]
    if missing:
        raise WorkloadError(f"{where}: {tool} needs {missing}")
    if tool == "edit" and ("edits" in args) == ("old" in args or "new" in args):
        raise WorkloadError(f"{where}: edit takes old and new, or edits (a list of "
                            f"{{old, new}}), not both and not neither")
    if tool == "edit" and "edits" not in args and not {"old", "new"} <= set(args):
        raise WorkloadError(f"{where}: edit needs both old and new")
    edits = args.pop("edits", None)
    for key, value in args.items():
        expected = (int, float) if key == "timeout" else str
        if isinstance(value, bool) or not isinstance(value, expected):
            raise WorkloadError(f"{where}: {tool}'s {key} is a "
                                f"{'number' if key == 'timeout' else 'string'}, got {value!r}")
    if edits is not None:
        if not isinstance(edits, list) or not edits or not all(
                isinstance(e, dict) and set(e) == {"old", "new"} and
                all(isinstance(v, str) for v in e.values()) for e in edits):
            raise WorkloadError(f"{where}: edits is a non-empty list of {{old, new}} (two "
                                f"strings each), got {edits!r}")
        args["edits"] = edits
    return Call(tool, args, output == "nondeterministic")


#: The preset name of a workload: ``workload:<path>`` (``--workload`` makes it).
PREFIX = "workload:"
#: The preset that draws one of the bundled workloads per run, by its seed.
REAL = "real"


def bundled() -> list[Path]:
    return sorted(WORKLOAD_DIR.glob("*.yaml"))


def named(preset: str, seed: int) -> Workload | None:
    """The workload ``preset`` names for the run of ``seed``: ``workload:<path>``, or
    ``real`` (a bundled one drawn by the seed among those whose programs are on this
    machine) or ``real:<name>,<name>`` (among those: the campaign names the ones its
    backend's Spaces can run). None for a preset of the scripted agents."""
    if preset.startswith(PREFIX):
        return load(preset[len(PREFIX):])
    if preset == REAL:
        usable = [w.name for w in map(lambda p: load(str(p)), bundled()) if not w.missing()]
    elif preset.startswith(REAL + ":"):
        usable = [n for n in preset[len(REAL) + 1:].split(",") if n]
    else:
        return None
    if not usable:
        raise WorkloadError("the real preset has no bundled workload whose programs the Spaces "
                            "have (git, python3, tar, cc, make): install them")
    return load(sorted(usable)[seed % len(usable)])
