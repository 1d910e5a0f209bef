"""Virtual workspaces (``durable.virtual``): the coding tools with no sandbox, their files in
the session's log. Real SQLite logs, a real second process, real host files, processes,
environment variables and a real loopback server the shell must not reach."""

from __future__ import annotations

import io
import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from chaos.campaign.campaign import CampaignConfig, run_campaign
from chaos.campaign.summary import parse_summary
from chaos.cli import main as chaos_main
from durable.adapter.image import IMAGE_KEY
from durable.coding_tools import coding_tools
from durable.harness import Harness
from durable.log import Log
from durable.models import (
    AssistantMessage,
    ModelRequest,
    PlannedCall,
    ScriptedModel,
    ToolCallRequest,
)
from durable.review.workspace_state import state_at, unified_diff
from durable.session_log import open_log_at
from durable.storage.base import MemoryStorage
from durable.storage.jsonl import JsonlStorage
from durable.storage.sqlite import SqliteStorage
from durable.tools import ToolRegistry
from durable.virtual import (
    DamagedBlob,
    Node,
    ShellLimits,
    VirtualLimits,
    virtual,
    workspace_instructions,
    workspace_tools,
)
from durable.virtual.tools import SCRATCH_NOTE, Virtual
from scenarios.preset import STEP_KINDS, VIRTUAL_SHELL_LACKS


def play(log_path: Path | None, v: Virtual, calls: list[tuple[str, dict[str, Any]]], *,
         registry: ToolRegistry | None = None, inputs: int = 1) -> tuple[Harness, list[dict]]:
    """Run ``calls`` (one per model turn) through a harness with ``v`` (its tools, or those
    of ``registry``, e.g. ``workspace_tools(v)``); the results."""
    plan = [PlannedCall(i, name, args) for i, (name, args) in enumerate(calls)]
    storage = MemoryStorage() if log_path is None else (
        SqliteStorage(log_path) if log_path.suffix == ".sqlite" else JsonlStorage(log_path))
    h = Harness.open(storage, models=ScriptedModel(plan),
                     extensions=[v] if registry is None else [],
                     registry=registry if registry is not None else ToolRegistry())
    conv = h.root("scripted")
    v.ensure_space(h, conv.id)
    for n in range(inputs):
        assert conv.submit(content=f"go {n}", request_id=f"r{n}").wait().done
    return h, [e.data for e in conv.entries() if e.kind == "tool_result"]


def test_each_tool_changes_the_files_the_log_keeps(tmp_path: Path) -> None:
    v = virtual(initial={"README.md": Node("file", 0o644, b"# hi\n"),
                         "link": Node("symlink", 0, b"README.md")})
    h, results = play(tmp_path / "log.sqlite", v, [
        ("write", {"path": "src/a.txt", "content": "one\ntwo\n"}),
        ("edit", {"path": "/workspace/src/a.txt",
                  "edits": [{"old_text": "two", "new_text": "three"}]}),
        ("bash", {"command": "cat link src/a.txt; chmod 700 src/a.txt; printf x >> log.txt; "
                             "rm README.md; mkdir -p d/e && echo q > d/e/f; exit 3"}),
        ("read", {"path": "src/a.txt", "offset": 2}),
        ("read", {"path": "../../etc/passwd"}),
    ])
    assert [r["is_error"] for r in results] == [False, False, True, False, True]
    assert results[2]["content"] == "# hi\none\nthree\n\nCommand exited with code 3"
    assert results[3]["content"] == "three\n"
    assert "leads outside the workspace" in results[4]["content"]
    want = {"src/a.txt": ("file", 0o700, b"one\nthree\n"), "log.txt": ("file", 0o644, b"x"),
            "d/e/f": ("file", 0o644, b"q\n"), "link": ("symlink", 0, b"README.md")}
    got = {p: (n.kind, n.mode, n.data) for p, n in v.snapshot(h.log, 1).items()}
    assert got == want
    # the change of each call is a hidden entry the model never sees
    assert all("space_image" not in str(m) for m in h.root("scripted").messages())
    h.close()
    # another process (a new log object over the file) reads the same files
    reopened = Log.open(SqliteStorage(tmp_path / "log.sqlite"))
    got2 = {p: (n.kind, n.mode, n.data) for p, n in virtual().snapshot(reopened, 1).items()}
    assert got2 == want
    reopened.close()


def test_the_tools_are_the_coding_tools_names_schemas_and_descriptions() -> None:
    plain = {t.name: t for t in coding_tools()}
    for v, note in ((virtual(), ""), (virtual(durable=False), SCRATCH_NOTE)):
        tools = {t.name: t for t in v.tools()}
        assert set(tools) == set(plain)
        for name, t in tools.items():
            assert t.schema == plain[name].schema
            assert t.description == plain[name].description + note
            assert t.replay == "safe"  # effects only in the log: rerunning is harmless
    # a registry that has the coding tools gets them replaced, not doubled
    registry = ToolRegistry(coding_tools())
    registry.extend(virtual())
    assert sorted(registry.names()) == sorted(plain)
    assert all(registry.get(n).replay == "safe" for n in plain)


def test_bash_reaches_no_host_file_process_variable_or_network(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    secret = tmp_path / "secret.txt"
    secret.write_text("host-secret-4711\n")
    (tmp_path / "sibling-4713.txt").write_text("")  # what a listing of the host would show
    monkeypatch.setenv("CUA_VIRTUAL_SECRET", "env-secret-4712")
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(4)
    server.settimeout(0.5)
    port = server.getsockname()[1]
    try:
        command = (f"cat {secret}; ls {tmp_path}; cat /etc/passwd; ls /etc /proc /dev; "
                   "cat /proc/self/environ; env; printenv; echo \"[$CUA_VIRTUAL_SECRET]\"; "
                   f"kill -9 {sleeper.pid}; kill -9 {os.getpid()}; ps; "
                   "python3 -c 'print(1)'; /usr/bin/id; "
                   f"curl -s http://127.0.0.1:{port}/; wget -q -O- http://127.0.0.1:{port}/; "
                   f"nc 127.0.0.1 {port} </dev/null; echo x > /dev/tcp/127.0.0.1/{port}; "
                   "echo done")
        _h, results = play(None, virtual(), [("bash", {"command": command})])
        out = results[0]["content"]
        assert out.rstrip().endswith("Command exited with code 1") or "done" in out
        assert "host-secret-4711" not in out
        assert "sibling-4713" not in out
        assert "root:x:0:0" not in out
        assert "env-secret-4712" not in out and "[]" in out
        assert sleeper.poll() is None  # the host process is alive
        with pytest.raises(TimeoutError):
            server.accept()  # nobody connected
    finally:
        server.close()
        sleeper.kill()
        sleeper.wait()


class TurnModel:
    """Plays ``turns[k]``'s calls, one per model turn, for the k-th input."""

    def __init__(self, turns: list[list[tuple[str, dict[str, Any]]]]) -> None:
        self.turns = turns

    def complete(self, request: ModelRequest) -> AssistantMessage:
        msgs = request.messages
        last_input = max(i for i, m in enumerate(msgs) if m["role"] == "user")
        made = sum(1 for m in msgs[last_input:] if m["role"] == "assistant")
        calls = self.turns[sum(1 for m in msgs if m["role"] == "user") - 1]
        if made < len(calls):
            return AssistantMessage("", [ToolCallRequest(*calls[made])])
        return AssistantMessage("done")


def test_scratch_files_last_one_turn_and_never_reach_the_log() -> None:
    v = virtual(durable=False)
    h = Harness.open(MemoryStorage(), extensions=[v], models=TurnModel([
        [("write", {"path": "a.txt", "content": "hello\n"}), ("bash", {"command": "cat a.txt"})],
        [("read", {"path": "a.txt"})],  # the next turn: cleared
    ]))
    conv = h.root("agent")
    for n in range(2):
        assert conv.submit(content=f"go {n}", request_id=f"r{n}").wait().done
    results = [e.data for e in conv.entries() if e.kind == "tool_result"]
    assert results[1]["content"] == "hello\n"
    assert results[2]["is_error"] and "file not found" in results[2]["content"]
    entries = h.log.entries(1)
    assert not any(e.kind == "system" and IMAGE_KEY in e.data for e in entries)
    with pytest.raises(ValueError, match="scratch"):
        v.snapshot(h.log, 1)
    assert "cleared at the end of every turn" in workspace_instructions(v)


def test_more_than_500_files_is_refused_and_the_files_stay_as_they_were() -> None:
    v = virtual()
    h, results = play(None, v, [
        ("bash", {"command": "for i in $(seq 1 500); do echo $i > f$i; done"}),
        ("bash", {"command": "echo one-too-many > g"}),
        ("bash", {"command": "rm f1 && echo new > g"}),
    ])
    assert not results[0]["is_error"]
    assert results[1]["is_error"]
    assert "at most 500 files (max_files)" in results[1]["content"]
    assert "would leave 501" in results[1]["content"]
    assert not results[2]["is_error"]
    files = v.snapshot(h.log, 1)
    assert len(files) == 500 and "g" in files and "f1" not in files


@pytest.mark.parametrize("name", ["log.sqlite", "log"], ids=["sqlite", "jsonl"])
def test_larger_files_are_blobs_beside_the_log_and_a_damaged_one_is_detected(
        tmp_path: Path, name: str) -> None:
    """Blobs live beside the log: a SQLite log's file, a JSONL log's directory (inside it,
    found by the --log jsonl campaign, they made every reopen refuse the log: NotALog)."""
    big = "".join(f"line {i:05d}\n" for i in range(4000))  # 44 KB: over the inline size
    v = virtual()
    h, _ = play(tmp_path / name, v, [("write", {"path": "big.txt", "content": big}),
                                     ("write", {"path": "small.txt", "content": "s"})])
    h.close()
    blobs = [p for p in (tmp_path / f"{name}.blobs").rglob("*") if p.is_file()]
    assert len(blobs) == 1
    log = Log.open(open_log_at(tmp_path / name))
    image_entries = [e for e in log.entries(1) if e.kind == "system" and IMAGE_KEY in e.data]
    assert big[:100] not in str([e.data for e in image_entries])  # not in the log itself
    assert virtual().snapshot(log, 1)["big.txt"].data == big.encode()
    data = bytearray(blobs[0].read_bytes())
    data[10] ^= 0x01
    blobs[0].chmod(0o600)
    blobs[0].write_bytes(bytes(data))
    with pytest.raises(DamagedBlob, match="does not match its hash"):
        virtual().snapshot(log, 1)  # a fresh reader: no cached content
    blobs[0].unlink()
    with pytest.raises(DamagedBlob, match="missing"):
        virtual().snapshot(log, 1)
    log.close()


def test_each_limit_ends_the_call_with_an_error_naming_it() -> None:
    """Every limit holds and is named, the host process never sees the command's trouble:
    before, a string doubled 31 times raised MemoryError out of the call (the host died), a
    CPU-bound built-in ran 88 s past a 2 s limit, and seq stopped at 100000 numbers
    silently."""
    # The limits but time, under a timeout only a hang reaches (a busy machine makes any
    # command slow), then the timeout alone.
    counted = VirtualLimits(shell=ShellLimits(max_commands=500, max_output_bytes=2000,
                                              timeout_s=300, max_memory_bytes=256 << 20))
    _h, results = play(None, virtual(limits=counted), [
        ("bash", {"command": "while true; do :; done"}),
        ("bash", {"command": "for i in $(seq 1 400); do echo line-$i; done"}),
        ("bash", {"command": "x=a; for i in $(seq 1 40); do x=$x$x; done; echo ${#x}"}),
        ("bash", {"command": "seq 1 3000000 | wc -l"}),
        ("bash", {"command": "echo fine"}),
    ])
    assert results[0]["is_error"] and "max_commands=500" in results[0]["content"]
    assert results[1]["is_error"] and "max_output_bytes" in results[1]["content"]
    assert results[2]["is_error"] and "max_memory_bytes" in results[2]["content"]
    assert results[3]["is_error"] and "more than 100000 numbers" in results[3]["content"]
    assert results[4] == {**results[4], "is_error": False, "content": "fine\n"}
    timed = VirtualLimits(shell=ShellLimits(timeout_s=0.5, max_memory_bytes=256 << 20))
    _h, results = play(None, virtual(limits=timed), [
        ("bash", {"command": "sleep 5"}),
        ("bash", {"command": "echo {1..3000000} | wc -c"}),
        ("bash", {"command": "echo fine"}),
    ])
    assert results[0]["is_error"] and "timed out" in results[0]["content"]
    assert results[1]["is_error"] and "without yielding and was stopped" in \
        results[1]["content"]
    assert results[2] == {**results[2], "is_error": False, "content": "fine\n"}


#: awk loops just-bash 0.2 got wrong with exit 0: an unbraced body did nothing, ``break``,
#: ``continue`` and ``do`` were ignored, and every loop stopped at 10000 iterations.
AWK_LOOPS = [
    "BEGIN { while (i < 5) i++; print i }",
    "BEGIN { for (i = 0; i < 5; i++) n += i; print n }",
    "BEGIN { for (;;) { n++; if (n > 3) break }; print n }",
    "BEGIN { while (1) { n++; if (n > 7) break; if (n % 2) continue; e++ }; print n, e }",
    "BEGIN { do { n++ } while (n < 3); print n }",
    "BEGIN { do { n++ } while (0); print n }",
    "BEGIN { for (i = 0; i < 3; i++) for (j = 0; j < 2; j++) n++; print n }",
    "{ for (i = 1; i <= NF; i++) n++ } END { print n, NR }",
]


def test_awk_loops_run_as_awk_runs_them_and_an_endless_one_ends_at_the_named_limit() -> None:
    """Each loop prints what the host's awk prints; a loop past ``max_loop_iterations``
    (an endless ``while``, a ``for`` of 20000) ends the call with the limit named, where
    just-bash stopped it silently at 10000 and exited 0."""
    v = virtual(limits=VirtualLimits(shell=ShellLimits(max_loop_iterations=10_000)),
                initial={"in.txt": Node("file", 0o644, b"a b c\nd e\n")})
    _h, results = play(None, v, [
        *[("bash", {"command": f"awk '{program}' in.txt"}) for program in AWK_LOOPS],
        ("bash", {"command": "awk 'BEGIN { while (1) i++; print i }'"}),
        ("bash", {"command": "awk 'BEGIN { for (i = 0; i < 20000; i++) n++; print n }'"}),
        ("bash", {"command": "awk 'BEGIN { break }'"}),
    ])
    for program, result in zip(AWK_LOOPS, results, strict=False):
        real = subprocess.run(["awk", program], input="a b c\nd e\n", capture_output=True,
                              text=True, check=True).stdout
        assert result == {**result, "is_error": False, "content": real}, program
    for endless in results[len(AWK_LOOPS):len(AWK_LOOPS) + 2]:
        assert endless["is_error"], endless
        assert "a loop ran 10000 iterations" in endless["content"], endless
        assert "max_loop_iterations=10000" in endless["content"], endless
    assert results[-1]["is_error"] and "outside a loop" in results[-1]["content"]


def test_workspace_tools_for_a_loop_of_your_own() -> None:
    v = virtual()
    tools = workspace_tools(v)
    assert [t.name for t in tools] == ["bash", "read_file", "write_file", "edit_file",
                                      "list_files"]
    registry = ToolRegistry(tools)
    _h, results = play(None, v, [
        ("write_file", {"path": "a/b.txt", "content": "x\n"}),
        ("edit_file", {"path": "a/b.txt", "edits": [{"old_text": "x", "new_text": "y"}]}),
        ("bash", {"command": "ln -s b.txt a/l"}),
        ("list_files", {}),
        ("read_file", {"path": "a/l"}),
    ], registry=registry)
    assert results[3]["content"] == "a/b.txt (2 bytes, mode 644)\na/l -> b.txt"
    assert results[4]["content"] == "y\n"
    text = workspace_instructions(v)
    assert "at most 500 files" in text and "last for the whole session" in text


def test_review_shows_a_virtual_workspaces_changes(tmp_path: Path) -> None:
    big = "".join(f"row {i}\n" for i in range(5000))
    h, _ = play(tmp_path / "log.sqlite", virtual(), [
        ("write", {"path": "big.txt", "content": big}),
        ("bash", {"command": "echo more >> big.txt"}),
    ])
    results = [e.id for e in h.log.entries(1) if e.kind == "tool_result"]
    h.close()
    log = Log.open(SqliteStorage(tmp_path / "log.sqlite"))
    a, _ = state_at(log, 1, results[0])
    b, _ = state_at(log, 1, results[1])
    log.close()
    assert a["big.txt"].data == big.encode()
    assert unified_diff(a, b).endswith("+more\n")


def test_a_virtual_campaign_only_runs_in_the_log_modes(capsys: pytest.CaptureFixture) -> None:
    assert chaos_main(["run", "--backend", "virtual", "--mode", "checkpoint"]) == 254
    assert "--backend virtual keeps the workspace in the log" in capsys.readouterr().err


def test_a_virtual_campaign_refuses_a_preset_its_shell_cannot_run(
        capsys: pytest.CaptureFixture) -> None:
    assert chaos_main(["run", "--backend", "virtual", "--mode", "transactional",
                       "--preset", "default"]) == 254
    err = capsys.readouterr().err
    assert "binary: printf escapes above" in err and "--preset virtual" in err, err


#: The step kinds that run a command, but ``background``: each of its calls runs into the
#: shell's 60 s limit (its job runs 120 s in the foreground).
_COMMAND_KINDS = sorted(set(STEP_KINDS) - {"write", "edit", "never_tool", "safe_tool",
                                           "background"})


@pytest.mark.slow
@pytest.mark.parametrize("kind", _COMMAND_KINDS)
def test_the_virtual_shell_lacks_exactly_what_its_table_says(tmp_path: Path,
                                                             kind: str) -> None:
    """Each command step kind, alone, through a virtual workspace's campaign (one run, its
    faults included): valid exactly when ``VIRTUAL_SHELL_LACKS`` does not name it, so the
    table that makes ``chaos run`` refuse a preset is neither too strict nor too lax."""
    preset = tmp_path / f"only-{kind}.yaml"
    preset.write_text(textwrap.dedent(f"""\
        name: only-{kind}
        steps: 3
        mix: {{write: 1, {kind}: 3}}
        long_seconds: 0.3
        large_bytes: 40000
        many_files: 5
        initial_files: 2
        """), encoding="utf-8")
    out = io.StringIO()
    run_campaign(CampaignConfig(mode="transactional", backend="virtual", preset=str(preset),
                                runs=1, results_root=tmp_path / "results"), out)
    summary = parse_summary(next(x for x in out.getvalue().splitlines()
                                 if x.startswith("SUMMARY ")))
    assert summary["unknown"] == "0", out.getvalue()
    assert (summary["verdict"] == "valid") == (kind not in VIRTUAL_SHELL_LACKS), out.getvalue()


@pytest.mark.slow
def test_a_kill_at_every_failpoint_of_a_virtual_workspace(tmp_path: Path) -> None:
    """The exhaustive campaign on a virtual workspace: a real SIGKILL of a real driver at
    every (failpoint, occurrence) of an agent with a blob, each run then finished by a clean
    driver and checked: the files the log holds equal what its committed results imply."""
    out = io.StringIO()
    code = run_campaign(CampaignConfig(mode="exhaustive", backend="virtual",
                                       preset="virtual-small",
                                       results_root=tmp_path / "results", jobs=2), out)
    text = out.getvalue()
    summary = parse_summary(next(x for x in text.splitlines() if x.startswith("SUMMARY ")))
    assert code == 0 and summary["failed"] == "0" and summary["unknown"] == "0", text
    assert "7 distinct failpoints" in text, text  # call.*, virtual.*, session.end
    assert int(summary["kills"]) >= int(summary["runs"]) >= 20


def test_a_second_process_sees_the_files(tmp_path: Path) -> None:
    h, _ = play(tmp_path / "log.sqlite", virtual(), [("write", {"path": "a", "content": "z"})])
    h.close()
    script = textwrap.dedent(f"""
        from durable.log import Log
        from durable.storage.sqlite import SqliteStorage
        from durable.virtual import virtual
        log = Log.open(SqliteStorage({str(tmp_path / 'log.sqlite')!r}))
        print(virtual().snapshot(log, 1)["a"].data.decode())
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         check=True, cwd=Path(__file__).parents[2])
    assert out.stdout == "z\n"


def test_the_shells_warm_workers_end_with_the_process_that_started_them() -> None:
    """A process that ran a virtual command leaves no worker running and no pipe open to
    the collector when it exits (found by the test command: a pytest worker warned
    ``subprocess ... is still running`` and ``unclosed file`` at its exit)."""
    code = textwrap.dedent("""
        from durable.virtual.shell import ShellLimits
        from durable.virtual.shell_worker import run_shell
        print(run_shell({}, "echo hi", ShellLimits()).output, end="")
    """)
    out = subprocess.run([sys.executable, "-X", "dev", "-W", "error::ResourceWarning", "-c",
                          code], capture_output=True, text=True, timeout=300,
                         env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[2])})
    assert out.returncode == 0, out.stderr
    assert out.stdout == "hi\n"
    assert "ResourceWarning" not in out.stderr and "still running" not in out.stderr, out.stderr
