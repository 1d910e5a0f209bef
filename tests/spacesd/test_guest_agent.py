"""The guest agent's answers (``spacesd.guest_agent``), on this machine: the microVM tests
run it inside real guests."""

from __future__ import annotations

import base64
import io
import subprocess
import sys
import tarfile
from pathlib import Path

from spacesd.guest_agent import Agent


def test_the_agent_answers_each_request_by_its_id(tmp_path: Path) -> None:
    state = tmp_path / "state"
    (state / "exec").mkdir(parents=True)
    for rel in ("ledger.jsonl", "fences.jsonl", "epoch", "exec/k.claim", "exec/k.exit",
                "exec/k.out", "token"):
        (state / rel).write_text(rel)
    agent = Agent(str(state), str(state / "daemon.pid"))
    assert agent.answer("a1 ping") == "a1 ok"
    assert agent.answer("a2 sync") == "a2 ok"
    rid, ok, data = agent.answer("a3 state").split(" ")
    assert (rid, ok) == ("a3", "ok")
    with tarfile.open(fileobj=io.BytesIO(base64.b64decode(data))) as tar:
        names = sorted(tar.getnames())
    assert names == ["epoch", "exec/k.claim", "exec/k.exit", "fences.jsonl", "ledger.jsonl"]
    assert agent.answer("a4 dance").startswith("a4 error ValueError: unknown command 'dance'")
    assert agent.answer("a5 kill-daemon").startswith("a5 error RuntimeError: kill-daemon")
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        assert agent.answer(f"a6 kill {sleeper.pid}") == "a6 ok"
        assert sleeper.wait(timeout=120) == -9
    finally:
        sleeper.kill()
        sleeper.wait()
