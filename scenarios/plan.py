"""Scripted agents: a deterministic plan of tool calls drawn from a seed.

A ``Scenario`` is everything a run needs to know about its agent: the initial workspace, the
steps (each a tool call whose effect carries the unique marker ``step-<k>``), and, for every
step, its effect on a workspace model. The checker replays those effects over the calls the
log committed to get the state the workspace must be in; the scripted model plays the same
steps through the harness. Both come from the seed alone, so a run can be regenerated
exactly from its seed (``chaos repro``).

Generation is pure: one ``random.Random`` seeded from (seed, preset name), nothing else.
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass, field
from typing import Any

from durable.models import PlannedCall, ScriptedModel
from spacesd.protocol import workspace_hash

from .preset import Preset

DOC_FILE = "doc.txt"
LOG_FILE = "log.txt"
SLOTS = 5
BACKGROUND_SECONDS = 120


@dataclass
class WorkspaceModel:
    """Files of a workspace: path → (content, permission bits). Directories are implied."""

    files: dict[str, tuple[bytes, int]] = field(default_factory=dict)

    def copy(self) -> WorkspaceModel:
        return WorkspaceModel(dict(self.files))

    def rows(self) -> list[tuple[str, str, bool, str]]:
        return [(p, "file", mode, hashlib.sha256(data).hexdigest())
                for p, (data, mode) in sorted(self.files.items())]

    def hash(self) -> str:
        return workspace_hash(self.rows())


@dataclass(frozen=True)
class Step:
    index: int
    kind: str
    tool: str
    args: dict[str, Any]
    #: For many_files steps: how many files the command creates.
    count: int = 0

    @property
    def marker(self) -> str:
        return f"step-{self.index}"

    def touches_workspace(self) -> bool:
        return self.tool in ("write", "edit", "bash")

    def apply(self, ws: WorkspaceModel) -> None:
        """This step's effect on ``ws`` (what a committed, non-interrupted call did)."""
        if self.tool == "write":
            old_mode = ws.files.get(self.args["path"], (b"", 0o644))[1]
            ws.files[self.args["path"]] = (self.args["content"].encode(), old_mode)
        elif self.tool == "edit":
            path = self.args["path"]
            text = ws.files[path][0].decode()
            for e in self.args["edits"]:
                if text.count(e["old_text"]) != 1:
                    raise ValueError(f"{self.marker}: edit text not found once in the model")
                text = text.replace(e["old_text"], e["new_text"])
            ws.files[path] = (text.encode(), ws.files[path][1])
        elif self.kind in ("append", "long", "background"):
            old = ws.files.get(LOG_FILE, (b"", 0o644))
            ws.files[LOG_FILE] = (old[0] + f"{self.marker}\n".encode(), old[1])
        elif self.kind == "many_files":
            for i in range(1, self.count + 1):
                ws.files[f"bulk{self.index}/f{i}"] = (f"{self.marker}-{i}\n".encode(),
                                                      0o755 if i == 1 else 0o644)


@dataclass(frozen=True)
class Scenario:
    seed: int
    preset: Preset
    initial: WorkspaceModel
    steps: list[Step]

    def model(self) -> ScriptedModel:
        return ScriptedModel(
            [PlannedCall(s.index, s.tool, s.args) for s in self.steps],
            reissue=self.reissue, max_attempts=3)

    def reissue(self, step: int, attempt: int) -> bool:
        """Whether the model issues an interrupted step again (seeded, stateless)."""
        return random.Random(f"reissue:{self.seed}:{step}:{attempt}").random() < self.preset.reissue


def _filler(rng: random.Random, size: int) -> str:
    words = ("alpha", "beta", "gamma", "delta", "omega", "kappa", "sigma", "theta")
    out: list[str] = []
    n = 0
    while n < size:
        w = rng.choice(words)
        out.append(w)
        n += len(w) + 1
    return " ".join(out)[:size]


def generate(seed: int, preset: Preset, *, steps: int | None = None) -> Scenario:
    """The scenario of ``seed`` under ``preset`` (``steps`` overrides the preset's count)."""
    rng = random.Random(f"scenario:{preset.name}:{seed}")
    initial = WorkspaceModel()
    slots = {j: "init" for j in range(SLOTS)}
    initial.files[DOC_FILE] = ("".join(f"slot-{j}: init\n" for j in range(SLOTS)).encode(), 0o644)
    initial.files["README.md"] = (f"# scenario {seed}\n".encode(), 0o644)
    for i in range(max(0, preset.initial_files - 2)):
        initial.files[f"src/m{i}.txt"] = (_filler(rng, 200).encode() + b"\n", 0o755 if i == 0 else 0o644)
    kinds = [k for k, w in preset.mix.items() for _ in range(w)]
    out: list[Step] = []
    for k in range(steps or preset.steps):
        kind = preset.sequence[k % len(preset.sequence)] if preset.sequence else rng.choice(kinds)
        marker = f"step-{k}"
        if kind == "write":
            size = rng.randint(*preset.file_size)
            path = f"files/w{rng.randrange(4)}.txt"
            out.append(Step(k, kind, "write",
                            {"path": path, "content": f"{marker}\n{_filler(rng, size)}\n"}))
        elif kind == "edit":
            j = rng.randrange(SLOTS)
            edit = {"old_text": f"slot-{j}: {slots[j]}\n", "new_text": f"slot-{j}: {marker}\n"}
            slots[j] = marker
            out.append(Step(k, kind, "edit", {"path": DOC_FILE, "edits": [edit]}))
        elif kind == "append":
            out.append(Step(k, kind, "bash", {"command": f"printf '{marker}\\n' >> {LOG_FILE}"}))
        elif kind == "long":
            out.append(Step(k, kind, "bash", {
                "command": f"sleep {preset.long_seconds}; printf '{marker}\\n' >> {LOG_FILE}"}))
        elif kind == "background":
            out.append(Step(k, kind, "bash", {
                "command": f"(sleep {BACKGROUND_SECONDS} >/dev/null 2>&1 &); "
                           f"printf '{marker}\\n' >> {LOG_FILE}"}))
        elif kind == "many_files":
            n = preset.many_files
            out.append(Step(k, kind, "bash", {
                "command": f"mkdir -p bulk{k} && for i in $(seq 1 {n}); do "
                           f"printf '{marker}-%d\\n' $i > bulk{k}/f$i; done && "
                           f"chmod +x bulk{k}/f1"}, count=n))
        elif kind == "never_tool":
            out.append(Step(k, kind, "record_never", {"marker": marker}))
        else:
            out.append(Step(k, kind, "record_safe", {"marker": marker}))
    return Scenario(seed, preset, initial, out)
