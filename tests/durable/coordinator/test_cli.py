"""``python -m durable.coordinator``: submit, status, sessions, cancel and serve from the
command line, and the one-line refusals of bad input."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

from backends.local import LocalSpaces
from durable.coordinator import SessionSpec, open_store

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


def test_a_store_is_made_only_where_no_file_is(tmp_path: Path) -> None:
    """An empty, damaged or foreign file at --store is refused and left as it was (before, an
    empty store opened as a new one and its pending sessions were forgotten); reading a
    store that does not exist makes nothing; a new store is 0600 (it keeps --env values)."""
    got = cli(tmp_path / "missing" / "coord.sqlite", "sessions")
    assert got.returncode == 254 and "no coordinator store at" in got.stderr, got.stderr
    assert not (tmp_path / "missing").exists()
    store = tmp_path / "coord.sqlite"
    opened = open_store(str(store))
    for i in range(40):
        opened.submit(SessionSpec(f"s{i}", f"ws{i}", ("driver",), str(tmp_path / f"s{i}"),
                                  "", "auto", True, {"NOTE": "x" * 400}), time.time())
    opened.close()
    assert store.stat().st_mode & 0o777 == 0o600
    whole = store.read_bytes()
    damaged = {"empty": b"", "zeroed last page": whole[:-4096] + bytes(4096),
               "cut at a page": whole[:-4096]}
    for name, data in damaged.items():
        store.write_bytes(data)
        for wal in (tmp_path / "coord.sqlite-wal", tmp_path / "coord.sqlite-shm"):
            wal.unlink(missing_ok=True)
        for args in (["sessions"], ["submit", "new", "--space", "wsn", "--state-dir",
                                    str(tmp_path / "n"), "--", "driver"]):
            got = cli(store, *args)
            assert got.returncode == 254, (name, args, got.stdout)
            assert ("is empty" if name == "empty" else "is damaged") in got.stderr, got.stderr
            assert "Traceback" not in got.stderr
            assert store.read_bytes() == data, name
    foreign = tmp_path / "other.sqlite"
    with sqlite3.connect(foreign) as conn:
        conn.execute("CREATE TABLE t (x)")
    conn.close()
    before = foreign.read_bytes()
    got = cli(foreign, "submit", "s", "--space", "ws", "--state-dir", "x", "--", "d")
    assert got.returncode == 254 and "without its tables" in got.stderr, got.stderr
    assert foreign.read_bytes() == before


def test_a_postgresql_schema_postgresql_would_cut_or_owns_is_refused() -> None:
    """Refused before connecting: names longer than 63 bytes (PostgreSQL cuts them, so two
    stores would share tables under different locks) and the server's own schemas."""
    from durable.coordinator import CoordinatorError

    base = "postgresql://u:p@127.0.0.1:1/db?schema="
    for schema, says in (("s" * 64, "at most 63 characters"),
                         ("information_schema", "PostgreSQL's own"),
                         ("pg_catalog", "PostgreSQL's own"), ("sché", "letters, digits")):
        try:
            open_store(base + schema)
        except CoordinatorError as exc:
            assert says in str(exc), (schema, exc)
        else:
            raise AssertionError(f"schema {schema!r} was accepted")


def test_end_orphan_kills_a_live_orphan_and_tells_one_that_is_gone() -> None:
    """What a coordinator that takes a session over records as the end of the dead
    coordinator's drive: its driver killed (True), found gone (False: its host rebooted),
    or a reused pid left alone (False: that process is someone else). A zombie is gone."""
    import psutil

    from durable.coordinator.drive import end_orphan

    orphan = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"],
                              start_new_session=True)
    try:
        started = psutil.Process(orphan.pid).create_time()
        assert end_orphan(orphan.pid, started + 5.0) is False  # another process: left alone
        assert orphan.poll() is None
        assert end_orphan(orphan.pid, started) is True  # (it reaped our child itself)
        assert not psutil.pid_exists(orphan.pid)
        assert end_orphan(orphan.pid, started) is False  # gone
    finally:
        if orphan.poll() is None:
            orphan.kill()
        orphan.wait()
    zombie = subprocess.Popen([sys.executable, "-c", "pass"])
    try:
        started = psutil.Process(zombie.pid).create_time()
        while psutil.Process(zombie.pid).status() != psutil.STATUS_ZOMBIE:
            time.sleep(0.01)  # it exits at once; unreaped, it is a zombie
        assert end_orphan(zombie.pid, started) is False  # dead, though its pid is there
    finally:
        zombie.wait()
