"""Scripted agents: a deterministic plan of tool calls drawn from a seed.

A ``Scenario`` is everything a run needs to know about its agent: the initial workspace, the
steps (each a tool call whose effect carries the unique marker ``step-<k>``), and, for every
step, its effect on a workspace model and the result it returns (``steps.py``). The checker
replays those effects over the calls the log committed to get the state the workspace must
be in and the result each call must have returned; the scripted model plays the same steps
through the harness. Both come from the seed alone, so a run can be regenerated
exactly from its seed (``chaos repro``).

Generation is pure: one ``random.Random`` seeded from (seed, preset name), nothing else.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

from durable.models import PlannedCall, ScriptedModel

from .preset import Preset
from .steps import (
    BACKGROUND_SECONDS,
    CGROUP_ESCAPE,
    CHMOD_MODES,
    DATED,
    DETACHED_GRACE_SECONDS,
    DOC_FILE,
    LATE_PRINT_LINES,
    LEAK_FILE,
    LINK_SLOTS,
    LOG_FILE,
    README,
    SPARSE_SIZE,
    WRITE_SLOTS,
    Step,
    simple_step,
    write_path,
)
from .workload import Workload
from .workspace_model import WorkspaceModel

SLOTS = 5


@dataclass(frozen=True)
class Scenario:
    seed: int
    preset: Preset
    initial: WorkspaceModel
    steps: list[Step]
    #: A user's workload (``scenarios.workload``): its steps' effects come from a golden
    #: run, not from a model.
    workload: Workload | None = None
    #: The step after whose result the agent, once its script is done, forks its
    #: conversation and plays the steps after that one again in the fork (which starts from
    #: the state as of that result, in a Space of its own); None: no fork.
    fork_after: int | None = None

    def keep(self, indices: tuple[int, ...] | None, simple: tuple[int, ...] = ()) -> Scenario:
        """A shrunk scenario: only the steps whose index is in ``indices`` (all for None),
        in their order, those in ``simple`` replaced by the simplest step there is
        (``simple_step``: a write of the step's marker to a file of its own). Each step
        keeps its index (its marker and its arguments); an edit's old text follows the
        edits kept before it, so it still finds its slot. The agent takes the steps one
        after the other, and the checks read a call's step by its position in the list."""
        if indices is None and not simple:
            return self
        chosen = set(s.index for s in self.steps) if indices is None else set(indices)
        slots = {j: "init" for j in range(SLOTS)}
        out: list[Step] = []
        for s in self.steps:
            if s.index not in chosen:
                continue
            if s.index in simple:
                out.append(simple_step(s))
                continue
            if s.kind == "edit":  # a scripted edit (a workload's is the user's own)
                s = _edit(s.index, s.params["slot"], slots)
            out.append(s)
        fork_after = self.fork_after if self.fork_after in chosen else None
        return Scenario(self.seed, self.preset, self.initial, out, self.workload, fork_after)

    def model(self) -> ScriptedModel:
        return ScriptedModel(
            [PlannedCall(s.index, s.tool, s.args) for s in self.steps],
            reissue=self.reissue, max_attempts=3)

    def reissue(self, step: int, attempt: int) -> bool:
        """Whether the model issues an interrupted step again (seeded, stateless)."""
        return random.Random(f"reissue:{self.seed}:{step}:{attempt}").random() < self.preset.reissue


def workload_scenario(workload: Workload, seed: int) -> Scenario:
    """A user's workload as a scripted agent (the seed draws only the faults)."""
    return Scenario(seed, workload.preset(), workload.initial_model(), workload.steps(),
                    workload=workload)


def _filler(rng: random.Random, size: int) -> str:
    words = ("alpha", "beta", "gamma", "delta", "omega", "kappa", "sigma", "theta")
    out: list[str] = []
    n = 0
    while n < size:
        w = rng.choice(words)
        out.append(w)
        n += len(w) + 1
    return " ".join(out)[:size]


def initial_workspace(seed: int, preset: Preset, rng: random.Random) -> WorkspaceModel:
    """The workspace a run starts from: text files, an executable, a private file and a
    symlink, so that adopting it (the first image or checkpoint) must keep modes and links,
    and two of the files the write steps use, so that rm, mv, chmod and sums steps find
    something to work on from the first step."""
    ws = WorkspaceModel()
    ws.files[DOC_FILE] = ("".join(f"slot-{j}: init\n" for j in range(SLOTS)).encode(), 0o644)
    ws.files[README] = (f"# scenario {seed}\n".encode(), 0o644)
    for i in range(max(0, preset.initial_files - 2)):
        ws.files[f"src/m{i}.txt"] = (_filler(rng, 200).encode() + b"\n",
                                     0o755 if i == 0 else 0o600 if i == 1 else 0o644)
    for i in range(2):
        ws.files[write_path(i)] = (f"initial w{i}\n".encode(), 0o644)
    ws.links["links/readme"] = f"../{README}"
    for path in [*ws.files, *ws.links]:
        ws.parents(path)
    return ws


def _step(k: int, kind: str, rng: random.Random, preset: Preset,
          slots: dict[int, str]) -> Step:
    """Step ``k`` of ``kind``: its tool call and the parameters of its effect."""
    m = f"step-{k}"
    if kind == "write":
        size = rng.randint(*preset.file_size)
        return Step(k, kind, "write", {"path": write_path(rng.randrange(WRITE_SLOTS)),
                                       "content": f"{m}\n{_filler(rng, size)}\n"})
    if kind == "edit":
        return _edit(k, rng.randrange(SLOTS), slots)
    if kind in ("never_tool", "safe_tool"):
        return Step(k, kind, "record_never" if kind == "never_tool" else "record_safe",
                    {"marker": m})
    command, params = _command(k, kind, rng, preset)
    return Step(k, kind, "bash", {"command": command}, params)


def _edit(k: int, slot: int, slots: dict[int, str]) -> Step:
    """Step ``k``: an edit of ``doc.txt``'s line ``slot`` (its text now ``slots[slot]``)."""
    m = f"step-{k}"
    edit = {"old_text": f"slot-{slot}: {slots[slot]}\n", "new_text": f"slot-{slot}: {m}\n"}
    slots[slot] = m
    return Step(k, "edit", "edit", {"path": DOC_FILE, "edits": [edit]}, {"slot": slot})


def _command(k: int, kind: str, rng: random.Random, preset: Preset
             ) -> tuple[str, dict[str, Any]]:
    m = f"step-{k}"
    append = f"printf '{m}\\n' >> {LOG_FILE}"
    if kind == "append":
        return append, {}
    if kind == "long":
        return f"sleep {preset.long_seconds}; {append}", {}
    if kind == "synced_append":
        # Its append reaches the disk (fsync of the file) while it still runs: a power
        # loss then keeps the line; only a ledger that recorded the start durably first
        # tells the next driver the command ran. What it prints after the fsync tells the
        # campaign the line is durable (``Fault.after_output``).
        return (f"{append} && sync {LOG_FILE} && printf '{m} synced\\n'; "
                f"sleep {preset.long_seconds}"), {}
    if kind == "late_print":
        # It prints only after a sleep, more than a full disk's seeded room (LATE_PRINT_LINES
        # lines, 31 KB), and ends a sleep later: a fault at space.running lands before it
        # prints, and one held for less than both sleeps ends before it exits (a full state
        # disk then loses part of its output, and the output must say so).
        return (f"sleep {preset.long_seconds}; seq -f '{m} printed late %05g' 1 "
                f"{LATE_PRINT_LINES}; sleep {preset.long_seconds}; {append}"), {}
    if kind == "background":
        return f"(sleep {BACKGROUND_SECONDS} >/dev/null 2>&1 &); {append}", {}
    if kind == "detached":
        # A writer in a session of its own (setsid; with ``env -i`` it also drops the
        # Space's marker from its environment) that writes after the command's window; the
        # command ends it itself before then. Only a command killed inside its window (a
        # newer epoch's fence) leaves it behind: the fence must kill it too, or it writes.
        # Where it can (root, a local Space), it also moves itself to the root cgroup of
        # each hierarchy, out of the Space's (``CGROUP_ESCAPE``).
        window = preset.long_seconds
        escape = rng.choice(("setsid", 'env -i PATH="$PATH" setsid'))
        writer = (f"{escape} sh -c '{CGROUP_ESCAPE} sleep {window + DETACHED_GRACE_SECONDS}; "
                  f"printf \"leaked-{m}\\n\" >> {LEAK_FILE}' >/dev/null 2>&1 </dev/null &")
        # setsid made the writer a group leader: ``kill -- -$w`` ends it with its sleep.
        return (f"{writer} w=$!; sleep {window}; kill -- -$w 2>/dev/null; {append}",
                {"escape": escape})
    if kind == "many_files":
        n = preset.many_files
        return (f"mkdir -p bulk{k} && for i in $(seq 1 {n}); do printf '{m}-%d\\n' $i > "
                f"bulk{k}/f$i; done && chmod +x bulk{k}/f1"), {"count": n}
    if kind == "fail":
        code = rng.randint(2, 125)
        return f"printf '{m}: out\\n'; printf '{m}: err\\n' >&2; exit {code}", {"code": code}
    if kind == "write_fail":
        code = rng.randint(2, 125)
        return (f"{append}; printf '{m}: failing after the write\\n' >&2; exit {code}",
                {"code": code})
    if kind == "big_output":
        lines = preset.big_output_lines
        return f"seq -f '{m} line %06g' 1 {lines}; {append}", {"lines": lines}
    if kind == "rm":
        path = write_path(rng.randrange(WRITE_SLOTS))
        return f"rm -f {path}", {"path": path}
    if kind == "mv":
        src_slot, dst_slot = rng.sample(range(WRITE_SLOTS), 2)
        src, dst = write_path(src_slot), write_path(dst_slot)
        return (f"if [ -e {src} ]; then mv -f {src} {dst} && echo moved; "
                f"else echo 'nothing to move'; fi"), {"src": src, "dst": dst}
    if kind == "mkdir":
        path = f"tree/s{k}/a/b/f.txt"
        return f"mkdir -p tree/s{k}/a/b && printf '{m}\\n' > {path}", {"path": path}
    if kind == "symlink":
        link = f"links/l{rng.randrange(LINK_SLOTS)}"
        target = rng.choice((f"../{README}", f"../{DOC_FILE}",
                             f"../{write_path(rng.randrange(WRITE_SLOTS))}", f"../gone-{m}"))
        return f"mkdir -p links && ln -sfn {target} {link}", {"link": link, "target": target}
    if kind == "chmod":
        path, mode = write_path(rng.randrange(WRITE_SLOTS)), rng.choice(CHMOD_MODES)
        return (f"if [ -f {path} ]; then chmod {mode:o} {path} && echo changed; "
                f"else echo 'no file'; fi"), {"path": path, "mode": mode}
    if kind == "binary":
        data = rng.randbytes(rng.randint(64, 512))
        path = f"bin/b{k}.dat"
        escapes = "".join(f"\\{b:03o}" for b in data)
        return f"mkdir -p bin && printf '{escapes}' > {path}", {"path": path, "hex": data.hex()}
    if kind == "large":
        path, size = f"big/b{k}.bin", preset.large_bytes
        return (f"mkdir -p big && yes '{m} payload' | head -c {size} > {path}",
                {"path": path, "size": size})
    if kind == "large_loop":
        # ``large`` written line by line with shell builtins only (a shell with no ``yes``,
        # as a virtual workspace's): a whole number of lines, about ``large_bytes``.
        path, line = f"big/b{k}.bin", f"{m} payload\n"
        lines = max(1, preset.large_bytes // len(line))
        return (f"mkdir -p big && {{ for i in $(seq 1 {lines}); do printf '{m} payload\\n'; "
                f"done; }} > {path}", {"path": path, "size": lines * len(line)})
    if kind == "empty_dir":  # git's refs/heads after gc, a build's empty output directory
        return f"mkdir -p empty/e{k}/deep/er", {"path": f"empty/e{k}/deep/er"}
    if kind == "hardlink":  # cp -al, a clone's objects: one inode, two names, one write
        a, b = f"hl/a{k}", f"hl/b{k}"
        return (f"mkdir -p hl && printf '{m}\\n' > {a} && ln -f {a} {b} && "
                f"printf 'more\\n' >> {b}"), {"a": a, "b": b}
    if kind == "fifo":
        path = f"fifos/f{k}"
        return f"mkdir -p fifos && rm -f {path} && mkfifo -m 640 {path}", {"path": path}
    if kind == "abs_symlink":  # a venv's bin/python3 -> /usr/bin/python3; a dangling one
        link, dangling = f"links/abs{k}", f"links/gone{k}"
        return (f"mkdir -p links && ln -sfn /usr/bin/env {link} && "
                f"ln -sfn /nonexistent/{m} {dangling}"), {"link": link, "dangling": dangling}
    if kind == "odd_name":  # what unzip leaves of a Windows archive, a newline, a dash
        names = (f"odd/new\nline-{k}", f"odd/C:\\temp\\r{k}.txt", f"odd/-dash{k}")
        return (f"mkdir -p odd && printf '{m}\\n' > $'odd/new\\nline-{k}' && "
                f"printf '{m}\\n' > 'odd/C:\\temp\\r{k}.txt' && "
                f"printf '{m}\\n' > ./odd/-dash{k}"), {"paths": names}
    if kind == "sparse":  # truncate -s, a disk image: holes stay holes
        path = f"sparse/s{k}"
        return (f"mkdir -p sparse && rm -f {path} && truncate -s {SPARSE_SIZE} {path} && "
                f"printf '{m}' | dd of={path} conv=notrunc status=none"), {"path": path}
    if kind == "dated":  # touch -d, tar x, git's fixed dates: an mtime a program set
        path = f"dated/d{k}"
        return (f"mkdir -p dated && printf '{m}\\n' > {path} && "
                f"touch -d '{DATED}' {path} dated"), {"path": path}
    if kind == "setid":  # set-id and sticky bits a restore must keep
        path, shared = f"modes/s{k}", f"modes/t{k}"
        return (f"mkdir -p modes/t{k} && printf '{m}\\n' > {path} && chmod 4755 {path} && "
                f"chmod 1777 {shared}"), {"path": path, "shared": shared}
    if kind == "sums":
        path = write_path(rng.randrange(WRITE_SLOTS))
        return (f"{{ sha256sum {DOC_FILE} {README}; cat {path} 2>/dev/null | sha256sum; }} "
                f"| tee sums.txt"), {"path": path}
    raise ValueError(f"unknown step kind {kind!r}")


def generate(seed: int, preset: Preset, *, steps: int | None = None,
             keep: tuple[int, ...] | None = None, simple: tuple[int, ...] = ()) -> Scenario:
    """The scenario of ``seed`` under ``preset`` (``steps`` overrides the preset's count),
    shrunk to ``keep`` with ``simple`` simplified (``Scenario.keep``)."""
    rng = random.Random(f"scenario:{preset.name}:{seed}")
    initial = initial_workspace(seed, preset, rng)
    slots = {j: "init" for j in range(SLOTS)}
    kinds = [k for k, w in preset.mix.items() for _ in range(w)]
    out: list[Step] = []
    for k in range(steps or preset.steps):
        kind = preset.sequence[k % len(preset.sequence)] if preset.sequence else rng.choice(kinds)
        out.append(_step(k, kind, rng, preset, slots))
    return Scenario(seed, preset, initial, out, fork_after=_fork_after(seed, preset, out)
                    ).keep(keep, simple)


def _fork_after(seed: int, preset: Preset, steps: list[Step]) -> int | None:
    """Whether and after which step the agent forks (its own RNG: the steps drawn are the
    same with forks or without); never after the last, so the fork has a step to play."""
    rng = random.Random(f"fork:{preset.name}:{seed}")
    if len(steps) < 2 or rng.random() >= preset.forks:
        return None
    return rng.choice(steps[:-1]).index
