"""The workspace model and the predicted results are what a real Space does and returns.

Every step kind runs in a real local Space (spacesd, the exec ledger, real bash and
coreutils); after each step the Space's workspace hash must equal the model's, and the
result must equal the predicted one, both streamed (a live run) and replayed from the
ledger's tail (a recovery). If this test fails, the checker would call correct runs broken.
"""

from __future__ import annotations

import pytest

from backends.local import LocalSpaces
from chaos.checks.state import state_difference
from chaos.run_spaces import seed_space
from durable.coding_tools import apply_edits, bash_result
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
    if step.tool == "edit":
        text = client.read_file(step.args["path"]).decode()
        client.write_file(step.args["path"],
                          apply_edits(text, step.args["edits"], step.args["path"]).encode())
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
