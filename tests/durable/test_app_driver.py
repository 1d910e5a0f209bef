"""``python -m durable run MODULE:START``: the session driver for any app's ``start``, run
as a real process on real local Spaces, alone and under the coordinator."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from backends.local import LocalSpaces
from durable.session_driver import EXIT_OK, EXIT_PERMANENT

ROOT = Path(__file__).resolve().parents[2]
APP = "tests.durable.example_app:start"


def run_driver(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "durable", "run", *args],
                          env={**os.environ, "PYTHONPATH": str(ROOT), **env}, cwd=ROOT,
                          capture_output=True, text=True, timeout=300)


def session_env(tmp_path: Path, epoch: int, **extra: str) -> dict[str, str]:
    return {"CUA_SESSION_NAME": "app", "CUA_SESSION_EPOCH": str(epoch),
            "CUA_STATE_DIR": str(tmp_path / "state"), "CUA_SPACE_NAME": "ws-app",
            "CUA_SESSION_HEARTBEAT_SECS": "0.5", "CUA_SESSION_INPUT": "it's a note", **extra}


def test_an_app_runs_with_only_its_start_function(tmp_path: Path,
                                                  local_spaces: LocalSpaces) -> None:
    """The provider from ``CUA_SPACE_PROVIDER`` (as a coordinator writes it), the mode from
    ``CUA_SESSION_MODE``, the input from ``CUA_SESSION_INPUT``: the app's calls ran in the
    named Space, and a second attempt at a newer epoch resumes the finished request (the
    same request id) without running anything again."""
    provider = json.dumps({"spaces": "backends.local:LocalSpaces",
                           "args": {"base_dir": str(local_spaces.base_dir)}})
    for epoch in (1, 2):
        done = run_driver(APP, env=session_env(tmp_path, epoch, CUA_SPACE_PROVIDER=provider,
                                               CUA_SESSION_MODE="checkpoint"))
        assert done.returncode == EXIT_OK, done.stderr
        assert "CUA-EXIT 0 finished" in done.stderr
    work = local_spaces.get("ws-app").dir / "work"
    assert (work / "notes.txt").read_text() == "it's a note\n"  # once: the rerun resumed
    assert (work / "done.txt").read_text() == "done\n"
    assert (tmp_path / "state" / "log.sqlite").is_file()
    assert (tmp_path / "state" / "checkpoints").is_dir()  # the store, as the mode needs


def test_bad_options_are_permanent_and_say_what_to_pass(tmp_path: Path,
                                                        local_spaces: LocalSpaces) -> None:
    env = session_env(tmp_path, 1)
    spaces = ["--spaces", "backends.local:LocalSpaces",
              "--spaces-arg", f"base_dir={local_spaces.base_dir}"]
    checks = [
        (["tests.durable.example_app"], {}, "expected MODULE:START"),
        (["tests.durable.nowhere:start", *spaces], {}, "is the app's package on PYTHONPATH"),
        (["tests.durable.example_app:not_a_function", *spaces], {}, "not a function"),
        ([APP], {}, "pass --spaces MODULE:FACTORY"),
        ([APP], {"CUA_SPACE_PROVIDER": "{]"}, "is not a provider's description"),
        ([APP, *spaces], {"CUA_SESSION_MODE": "fast"}, "expected one of auto"),
        ([APP, *spaces, "--mode", "fast"], {}, "invalid choice: 'fast'"),
        ([APP, "--no-such-flag"], {}, "unrecognized arguments"),
        (["tests.durable.broken_app:start", *spaces], {}, "RuntimeError: the app's module is "
                                                          "broken; fix the app's module"),
    ]
    for args, extra, message in checks:
        got = run_driver(*args, env={**env, **extra})
        assert got.returncode == EXIT_PERMANENT and message in got.stderr, (args, got.stderr)
        assert "Traceback" not in got.stderr
    assert not (tmp_path / "state").exists()  # nothing was opened


def test_a_coordinator_drives_an_app_through_the_entry_point(
        tmp_path: Path, local_spaces: LocalSpaces) -> None:
    store = str(tmp_path / "coord.sqlite")

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "durable.coordinator", "--store", store,
                               *args], capture_output=True, text=True, timeout=300, cwd=ROOT)

    submitted = cli("submit", "s1", "--space", "ws1", "--state-dir", str(tmp_path / "s1"),
                    "--mode", "transactional", "--input", "from the coordinator",
                    "--env", f"PYTHONPATH={ROOT}", "--",
                    sys.executable, "-m", "durable", "run", APP)
    assert submitted.returncode == 0, submitted.stderr
    served = cli("serve", "--spaces", "backends.local:LocalSpaces", "--spaces-arg",
                 f"base_dir={local_spaces.base_dir}", "--poll-secs", "0.05", "--until-idle")
    assert served.returncode == 0, served.stderr
    status = json.loads(cli("status", "s1", "--json").stdout)
    assert status["session"]["state"] == "done", status
    work = local_spaces.get("ws1").dir / "work"
    assert (work / "notes.txt").read_text() == "from the coordinator\n"
    assert not (tmp_path / "s1" / "checkpoints").exists()  # transactional: the log's image
