"""``python -m durable.coordinator``: submit, status, sessions, cancel and serve from the
command line, and the one-line refusals of bad input."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from backends.local import LocalSpaces

FAKE = Path(__file__).with_name("fake_driver.py")


def cli(store: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "durable.coordinator", "--store", str(store),
                           *args], capture_output=True, text=True, timeout=120)


def test_a_session_submitted_served_and_shown(tmp_path: Path,
                                              local_spaces: LocalSpaces) -> None:
    store = tmp_path / "coord.sqlite"
    submit = ["submit", "s1", "--space", "ws1", "--state-dir", str(tmp_path / "s1"),
              "--mode", "transactional", "--env", 'CUA_FAKE_SCRIPT=[{"exit": 1}, {"exit": 0}]',
              "--", sys.executable, str(FAKE)]
    first = cli(store, *submit)
    assert (first.returncode, first.stdout) == (0, "s1 pending\n"), first.stderr
    assert cli(store, *submit).returncode == 0  # the same spec again: idempotent
    served = cli(store, "serve", "--spaces", "backends.local:LocalSpaces", "--spaces-arg",
                 f"base_dir={local_spaces.base_dir}", "--backoff", "0", "--poll-secs", "0.05",
                 "--until-idle")
    assert served.returncode == 0, served.stderr
    status = cli(store, "status")
    header, row = status.stdout.splitlines()
    assert header.split()[:4] == ["SESSION", "STATE", "ATTEMPTS", "EPOCH"]
    assert row.split()[:5] == ["s1", "done", "2", "2", "0"], row
    one = json.loads(cli(store, "status", "s1", "--json").stdout)
    kinds = [e["kind"] for e in one["events"]]
    assert kinds[:3] == ["submitted", "lease_acquired", "claimed"] and "backoff" in kinds
    assert cli(store, "sessions").stdout == "s1 done\n"
    assert cli(store, "cancel", "s1").stdout.startswith("s1 done")  # ended: unchanged


def test_bad_input_is_one_line_and_a_code(tmp_path: Path) -> None:
    store = tmp_path / "coord.sqlite"
    checks = [
        (["submit", "s", "--space", "a/b", "--state-dir", "x", "--", "d"], 254, "Space's name"),
        (["submit", "s", "--space", "ws", "--state-dir", "x"], 254, "driver's command"),
        (["status", "nope"], 1, "no session 'nope'"),
        (["serve", "--spaces", "nomodule"], 254, "MODULE:FACTORY"),
        (["serve", "--spaces", "backends.local:Nope"], 254, "AttributeError"),
        (["serve", "--spaces", "backends.local:LocalSpaces", "--stall-secs", "nan"], 254,
         "stall_secs"),
    ]
    for args, code, message in checks:
        got = cli(store, *args)
        assert got.returncode == code and message in got.stderr, (args, got.stderr)
        assert "Traceback" not in got.stderr
    (tmp_path / "dir").mkdir()
    got = cli(tmp_path / "dir", "sessions")
    assert got.returncode == 254 and "not a file" in got.stderr
    (tmp_path / "junk").write_bytes(b"not sqlite at all" * 100)
    got = cli(tmp_path / "junk", "sessions")
    assert got.returncode == 254 and "not a coordinator store" in got.stderr, got.stderr
