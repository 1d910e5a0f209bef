"""``python -m durable.review`` on real logs of sessions that ran through the Space adapter
(transactional: the image in the log; checkpoint: the checkpoints in a store): entries, the
diff between two entries (text, binary, modes), the workspace before a decision, and a fork
with a Space built from that state."""

from __future__ import annotations

from pathlib import Path

import pytest

from backends.local import LocalSpaces
from durable.adapter import DirectoryCheckpointStore, WorkspaceSnapshots, durable_spaces
from durable.coding_tools import coding_tools
from durable.harness import Harness
from durable.models import PlannedCall, ScriptedModel
from durable.review.cli import main
from durable.storage_fences import open_fenced_sqlite
from durable.tools import ToolRegistry

PLAN = [
    PlannedCall(0, "write", {"path": "a.txt", "content": "alpha\n"}),
    PlannedCall(1, "edit", {"path": "a.txt", "edits": [{"old_text": "alpha",
                                                        "new_text": "beta"}]}),
    PlannedCall(2, "bash", {"command": "printf '\\x00\\x01' > bin.dat; chmod 700 a.txt"}),
]


def run_session(tmp_path: Path, spaces: LocalSpaces, mode: str) -> Path:
    log_path = tmp_path / "log.sqlite"
    storage, fence = open_fenced_sqlite(log_path, 1)
    store = DirectoryCheckpointStore(tmp_path / "store")
    adapter = durable_spaces(session="s", spaces=spaces, mode=mode, fence=fence, epoch=1,
                             snapshots=WorkspaceSnapshots(spaces, "", store))
    registry = ToolRegistry(coding_tools())
    registry.extend(adapter.extension)
    harness = Harness.open(storage, models=ScriptedModel(PLAN), registry=registry,
                           env=adapter.env)
    assert harness.root("a").submit(content="go", request_id="r").wait().done
    harness.close()
    return log_path


def results(log: Path) -> list[int]:
    from durable.log import Log
    from durable.storage import SqliteStorage

    reader = Log.open(SqliteStorage(log))
    try:
        return [e.id for e in reader.entries(1) if e.kind == "tool_result"]
    finally:
        reader.close()


def test_review_a_transactional_session(tmp_path: Path, local_spaces: LocalSpaces,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    log = run_session(tmp_path, local_spaces, "transactional")
    wrote, edited, ran = results(log)
    assert main(["entries", str(log), "1"]) == 0
    listed = capsys.readouterr().out
    assert "calls edit(edits, path)" in listed and "write: Wrote 6 bytes to a.txt" in listed
    assert main(["diff", str(log), "1", str(wrote), str(edited)]) == 0
    out = capsys.readouterr().out
    assert "-alpha\n+beta\n" in out and "the image in the log" in out
    assert main(["diff", str(log), "1", str(edited), str(ran)]) == 0
    out = capsys.readouterr().out
    assert "Binary files entry-" in out and "bin.dat differ" in out
    assert "mode a.txt: 644 -> 700" in out
    shown = tmp_path / "shown"
    assert main(["show", str(log), "1", str(edited), "--to", str(shown)]) == 0
    assert (shown / "a.txt").read_text() == "alpha\n"  # before the edit's result committed
    assert main(["show", str(log), "1", str(edited), "--to", str(shown)]) == 1
    assert "is not empty" in capsys.readouterr().err
    forks = LocalSpaces(tmp_path / "forks")
    try:
        assert main(["fork", str(log), "1", str(wrote), "--spaces",
                     "backends.local:LocalSpaces", "--spaces-arg",
                     f"base_dir={tmp_path / 'forks'}"]) == 0
        out = capsys.readouterr().out
        (name,) = forks.names()
        assert f"open a shell in it: cd {forks.get(name).work}" in out
        assert (forks.get(name).work / "a.txt").read_text() == "alpha\n"
    finally:
        for n in forks.names():
            forks.delete(n)


def test_review_a_checkpoint_session_reads_its_store(tmp_path: Path,
                                                     local_spaces: LocalSpaces,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    log = run_session(tmp_path, local_spaces, "checkpoint")
    wrote, edited, _ran = results(log)
    assert main(["diff", str(log), "1", str(wrote), str(edited)]) == 1
    assert "pass --store DIR" in capsys.readouterr().err
    assert main(["diff", str(log), "1", str(wrote), str(edited), "--store",
                 str(tmp_path / "store")]) == 0
    out = capsys.readouterr().out
    assert "-alpha\n+beta\n" in out and "checkpoint " in out


def test_bad_input_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["diff", str(tmp_path / "nope.sqlite"), "1", "2", "3"]) == 1
    assert "no log at" in capsys.readouterr().err
    assert main(["diff"]) == 254


def test_a_hostile_state_is_refused_and_never_leaves_a_setuid_file(tmp_path: Path) -> None:
    """What a review reads is input: a path '.', '', '..' or both a file and a directory is
    refused with the reason, set-id bits are not written, and a blob name that is not a
    sha256 (a log naming /dev/zero read until MemoryError) is refused."""
    from durable.review.workspace_state import FileState, NoWorkspaceState, extract
    from durable.virtual.blob_store import BlobStore, DamagedBlob

    for i, (state, says) in enumerate([
            ({".": FileState("file", 0o644, b"x")}, "is not a relative path"),
            ({"": FileState("file", 0o644, b"x")}, "is not a relative path"),
            ({"a/../../x": FileState("file", 0o644, b"x")}, "is not a relative path"),
            ({"a": FileState("file", 0o644, b"x"), "a/b": FileState("file", 0o644, b"y")},
             "both a file and a directory")]):
        with pytest.raises(NoWorkspaceState, match=says):
            extract(state, tmp_path / f"out{i}")
    extract({"run": FileState("file", 0o6755, b"#!/bin/sh\n")}, tmp_path / "ok")
    assert (tmp_path / "ok" / "run").stat().st_mode & 0o7777 == 0o755
    with pytest.raises(DamagedBlob, match="not a sha256"):
        BlobStore(tmp_path / "blobs").get("/dev/zero")


def _conversations(log: Path) -> list[int]:
    from durable.log import Log
    from durable.storage import SqliteStorage

    reader = Log.open(SqliteStorage(log))
    try:
        return [c.id for c in reader.conversations()]
    finally:
        reader.close()


def test_a_fork_that_fails_leaves_no_space_and_forks_nothing_it_cannot_build(
        tmp_path: Path, local_spaces: LocalSpaces, capsys: pytest.CaptureFixture[str]) -> None:
    """Checked before the fork: the workspace to start from (a checkpoint session without
    its store forks nothing). After it: a Space that cannot be built is removed, daemon and
    all, and the message says which conversation stays in the log."""
    log = run_session(tmp_path, local_spaces, "checkpoint")
    wrote, _edited, _ran = results(log)
    before = _conversations(log)
    forks = tmp_path / "forks"
    assert main(["fork", str(log), "1", str(wrote), "--spaces", "backends.local:LocalSpaces",
                 "--spaces-arg", f"base_dir={forks}"]) == 1
    assert "pass --store DIR" in capsys.readouterr().err
    assert _conversations(log) == before and LocalSpaces(forks).names() == []
    assert main(["fork", str(log), "1", str(wrote), "--store", str(tmp_path / "store"),
                 "--spaces", "tests.durable.failing_spaces:UnservedSpaces",
                 "--spaces-arg", f"base_dir={forks}"]) == 1
    err = capsys.readouterr().err
    forked = _conversations(log)[-1]
    assert f"conversation {forked} was forked in the log, but its Space" in err
    assert "does not serve" in err
    assert LocalSpaces(forks).names() == [], "the Space (and its daemon) were left"


def test_forks_of_two_logs_get_spaces_of_their_own(tmp_path: Path) -> None:
    """The default fork session is one per log: forks of conversation 1 of two logs once
    shared the name ``cua-review-c<N>``."""
    forks = LocalSpaces(tmp_path / "forks")
    logs, sessions = [], []
    for name in ("one", "two"):
        sessions.append(LocalSpaces(tmp_path / name / "spaces"))
        logs.append(run_session(tmp_path / name, sessions[-1], "transactional"))
    try:
        for log in logs:
            wrote = results(log)[0]
            assert main(["fork", str(log), "1", str(wrote), "--spaces",
                         "backends.local:LocalSpaces", "--spaces-arg",
                         f"base_dir={forks.base_dir}"]) == 0
        assert len(forks.names()) == 2, forks.names()
    finally:
        for provider in (forks, *sessions):
            provider.delete_all()
