"""The workspace model and the predicted results are what a real Space does and returns.

Every step kind runs in a real local Space (spacesd, the exec ledger, real bash and
coreutils); after each step the Space's workspace hash must equal the model's, and the
result must equal the predicted one, both streamed (a live run) and replayed from the
ledger's tail (a recovery). If this test fails, the checker would call correct runs broken.
"""

from __future__ import annotations

import os

import pytest

from backends.local import LocalSpaces
from chaos.checks.implied import NO_SPACE, apply_step
from chaos.checks.model import Implied
from chaos.checks.state import state_difference
from chaos.run.spaces import seed_space
from durable.coding_tools import apply_edits, bash_result
from durable.errors import SpaceError, ToolError
from durable.tools import error_result
from scenarios import generate, load
from scenarios.preset import STEP_KINDS, parse
from scenarios.steps import Step
from spacesd.protocol import times_as, workspace_hash


def _run(client, step: Step) -> tuple[str, bool, str | None]:
    """(content, is_error, replayed content) of one real run of ``step``."""
    if step.tool == "write":
        data = step.args["content"].encode()
        client.write_file(step.args["path"], data)
        return f"Wrote {len(data)} bytes to {step.args['path']}", False, None
    if step.tool == "edit":  # as the edit tool does: the text it does not find is its error
        text = client.read_file(step.args["path"]).decode()
        try:
            edited = apply_edits(text, step.args["edits"], step.args["path"])
        except ToolError as exc:  # a write an earlier full disk cut short left no text
            return error_result(exc).content, True, None
        client.write_file(step.args["path"], edited.encode())
        return f"Applied {len(step.args['edits'])} edit(s) to {step.args['path']}", False, None
    key = f"1:{step.index}.0:1@1"
    client.exec_start(key, step.args["command"])
    chunks: list[str] = []
    info = client.exec_wait(key, on_output=chunks.append)
    live = bash_result(info.exit_code, "".join(chunks))
    replay = client.exec_wait(key)  # an ended key: the ledger's recorded tail
    return live.content, live.is_error, bash_result(replay.exit_code, replay.output).content


#: Every step kind, three times over, in order: each kind also meets what others left.
EVERY_KIND = parse({"name": "every", "sequence": list(STEP_KINDS) * 3, "many_files": 5,
                    "long_seconds": 0.1}, "every-kind.yaml")


def _differs(client, ws) -> str | None:
    """What differs between the Space and the model (None: nothing): the whole state, the
    mtimes where the model decides them."""
    want = ws.entries()
    got = times_as(client.scan().entries, want)
    if workspace_hash(got) == workspace_hash(want):
        return None
    return state_difference(got, want, "Space", "model")


@pytest.mark.parametrize("preset", ["every", "default", "auto"])
def test_model_matches_a_real_space(local_spaces: LocalSpaces, preset: str) -> None:
    chosen = EVERY_KIND if preset == "every" else load(preset)
    scenario = generate(11, chosen, steps=60)
    local_spaces.create("model")
    seed_space(local_spaces, "model", scenario)
    client = local_spaces.connect("model", epoch=1)
    ws = scenario.initial.copy()
    assert _differs(client, ws) is None, _differs(client, ws)
    for step in scenario.steps:
        if not step.touches_workspace():
            continue
        expected = step.apply(ws)
        content, is_error, replayed = _run(client, step)
        assert (content, is_error) == (expected.content, expected.is_error), step
        if replayed is not None:
            assert replayed == expected.content, f"replayed tail differs for {step}"
        assert _differs(client, ws) is None, f"{step.kind} {step.args}: {_differs(client, ws)}"


def test_the_model_of_a_call_a_full_disk_cut_short_holds_for_real_bash(tmp_path) -> None:
    """Every step kind, three times over, in a real Space whose workspace is on a disk of
    its own, every other step run with that disk full (``LocalSpaces.fill_disk``): what bash
    and the tools really do there is the reference. A call that met ENOSPC must say so in
    its result; the checker's model of it (``chaos.checks.implied.apply_step``: an atomic
    tool took no effect, a command's changed paths are unsure) must then equal the Space on
    every path it is sure of, and a call that needed no room must be exactly predicted."""
    if os.geteuid() != 0:
        pytest.skip("a workspace disk of its own is a tmpfs mount, which needs root")
    spaces = LocalSpaces(tmp_path / "spaces", work_disk=16 * 1024 * 1024)
    scenario = generate(11, EVERY_KIND, steps=3 * len(STEP_KINDS))
    try:
        spaces.create("full")
        seed_space(spaces, "full", scenario)
        client = spaces.connect("full", epoch=1)
        out = Implied(scenario.initial.copy())
        cut_kinds = set()
        for step in scenario.steps:
            if not step.touches_workspace():
                continue
            full = step.index % 2 == 0
            if full:
                spaces.fill_disk("full", "work")
            try:
                content, is_error, _ = _run(client, step)
            except SpaceError as exc:
                assert step.tool != "bash", exc
                content, is_error = str(exc), True
            finally:
                if full:
                    spaces.free_disk("full", "work")
            cut = is_error and NO_SPACE in content
            assert full or not cut, f"{step.kind} met a full disk that was not full: {content}"
            expected = apply_step(step, out, cut, f"{step.index}.0")
            if cut:
                cut_kinds.add(step.kind)
            elif expected is not None:
                assert (content, is_error) == (expected.content, expected.is_error), \
                    f"{step.kind} on a full disk: {content!r}"
            ws = out.workspace
            want = [e for e in ws.entries() if e.path not in ws.unsure]
            got = [e for e in times_as(client.scan().entries, want) if e.path not in ws.unsure]
            assert workspace_hash(got) == workspace_hash(want), \
                f"{step.kind} {step.args}: {state_difference(got, want, 'Space', 'model')}"
        # the disk was really full: the kinds that write content met it
        assert {"write", "binary", "append", "sums"} <= cut_kinds, cut_kinds
    finally:
        spaces.delete_all()
