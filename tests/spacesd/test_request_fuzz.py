"""A fuzzer over the request schema of every operation, against a real ``python -m spacesd``.

Valid request shapes are drawn per operation, then mutated: wrong types, lone surrogates,
NUL bytes, names over 255 bytes, huge integers, NaN and infinities, deep nesting, unknown
and missing fields, non-object bodies, and raw bodies that are not JSON at all. Whatever
arrives, the daemon must answer: a 2xx for what happens to be valid, else a 4xx with an
error code and message; never a 500, never a dropped connection.
"""

from __future__ import annotations

import http.client
import json
import subprocess
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlencode

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.direct_spacesd import direct_spacesd

TOKEN = "fuzz-token"
#: Every request's epoch: high, so that a fuzzed ``advance_epoch`` below it is refused and
#: the floor never climbs over the other operations' epoch.
EPOCH = 1_000_000


class Daemon:
    def __init__(self, port: int, proc: subprocess.Popen) -> None:
        self.port = port
        self.proc = proc

    def send(self, path: str, body: bytes) -> tuple[int, bytes]:
        """POST ``body``; a dropped connection raises (and fails the test)."""
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
        try:
            conn.request("POST", path, body=body, headers={
                "Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"})
            resp = conn.getresponse()
            return resp.status, resp.read()
        finally:
            conn.close()


@pytest.fixture(scope="module")
def daemon(tmp_path_factory) -> Iterator[Daemon]:
    tmp = tmp_path_factory.mktemp("fuzz")
    work = tmp / "work"
    work.mkdir()
    (work / "f.txt").write_text("hello world\n")
    (work / "d").mkdir()
    with open(tmp / "daemon.log", "wb") as log, \
            direct_spacesd(tmp, TOKEN, "--max-body", "1000000", stderr=log) as (port, proc, _):
        yield Daemon(port, proc)


# ---------------------------------------------------------------- the schema

# Kinds of field: what a valid value looks like.
PATH, TEXT, KEY, INT, NUM, BOOL, STRS, ENV, CID, B64, CMD = (
    "path", "text", "key", "int", "num", "bool", "strs", "env", "cid", "b64", "cmd")

SCHEMA: dict[str, dict[str, str]] = {
    "capabilities": {},
    "advance_epoch": {"owner": TEXT, "own": BOOL},
    "exec_start": {"key": KEY, "command": CMD, "cwd": PATH, "env": ENV},
    "exec_status": {"key": KEY},
    "exec_wait": {"key": KEY, "offset": INT, "wait": NUM},
    "exec_kill": {"key": KEY},
    "read_file": {"path": PATH, "offset": INT, "limit": INT},
    "write_file": {"path": PATH, "data": B64, "mode": INT},
    "edit_file": {"path": PATH, "old": TEXT, "new": TEXT},
    "stat": {"path": PATH},
    "list_dir": {"path": PATH},
    "remove": {"path": PATH, "recursive": BOOL},
    "mkdir": {"path": PATH},
    "symlink": {"path": PATH, "target": PATH},
    "scan": {"exclude": STRS, "since": TEXT},
    "checkpoint_create": {"id": CID},
    "checkpoint_restore": {"id": CID},
    "checkpoint_list": {},
    "checkpoint_delete": {"id": CID},
    "checkpoint_export": {"id": CID},
}

names = st.sampled_from(["f.txt", "d", "new", "d/x", "link", "", "."])
VALID: dict[str, st.SearchStrategy[Any]] = {
    PATH: names,
    TEXT: st.text(max_size=20),
    KEY: st.sampled_from(["k1", "k2"]),
    INT: st.integers(0, 4096),
    NUM: st.sampled_from([0, 0.01, 0.05]),
    BOOL: st.booleans(),
    STRS: st.lists(st.sampled_from(["*.pyc", "d"]), max_size=2),
    ENV: st.dictionaries(st.sampled_from(["A", "B"]), st.text(max_size=5), max_size=2),
    CID: st.sampled_from(["c1", "c2"]),
    B64: st.sampled_from(["", "aGk=", "AAAA"]),
    CMD: st.sampled_from(["true", "echo hi"]),  # never arbitrary shell text
}

surrogates = st.sampled_from(["\ud800", "a\udfffb", "x/\udc80", "\udcff"])
long_names = st.sampled_from(["n" * 256, "d/" + "é" * 128, "a/" * 3000, "x" * 5000])
odd_strings = st.one_of(
    surrogates, long_names,
    st.sampled_from(["a\x00b", "\x00", "/etc/passwd", "../up", "a\\b", "a\nb", "", "k" * 2000]),
    st.text(max_size=30),
)
huge_ints = st.sampled_from([-1, 2**63 - 1, 2**63, 2**64, -(2**63), 10**30, 10**4000])
odd_numbers = st.sampled_from([float("nan"), float("inf"), float("-inf"), 1e308, -0.0, 1e-300])


def nested(depth: int) -> Any:
    v: Any = 0
    for i in range(depth):
        v = [v] if i % 2 else {"a": v}
    return v


junk = st.one_of(
    st.none(), st.booleans(), st.integers(), huge_ints, st.floats(), odd_numbers,
    odd_strings, st.lists(st.one_of(st.integers(), odd_strings, st.none()), max_size=3),
    st.dictionaries(odd_strings, st.one_of(st.integers(), odd_strings), max_size=3),
    st.sampled_from([nested(40), nested(900)]),
)


@st.composite
def request(draw) -> tuple[str, bytes]:
    op = draw(st.sampled_from(sorted(SCHEMA)))
    fields = SCHEMA[op]
    body: dict[str, Any] = {"epoch": EPOCH if op != "advance_epoch" else draw(st.integers(0, 10))}
    for name, kind in fields.items():
        if draw(st.booleans()):
            body[name] = draw(VALID[kind])
    for _ in range(draw(st.integers(0, 3))):
        what = draw(st.sampled_from(["junk", "drop", "unknown", "odd_string", "int"]))
        name = draw(st.sampled_from(sorted(fields) + ["epoch"]))
        if what == "drop":
            body.pop(name, None)
        elif what == "unknown":
            body[draw(odd_strings)] = draw(junk)
        elif what == "odd_string":
            body[name] = draw(odd_strings)
        elif what == "int":
            body[name] = draw(huge_ints)
        elif name != "epoch" or op != "advance_epoch":
            body[name] = draw(junk)
    shape = draw(st.sampled_from(["object"] * 8 + ["non-object", "raw"]))
    if shape == "non-object":
        obj = draw(st.one_of(st.lists(st.integers(), max_size=2), st.text(max_size=5),
                             st.integers(), st.none(), st.floats()))
        return op, json.dumps(obj).encode()
    if shape == "raw":
        return op, draw(st.sampled_from([
            b"{", b"[" * 100_000, b"{\"a\":" * 50_000, b"\xff\xfe\x00", b"\xc3\x28",
            b"{\"epoch\": 1, \"path\": \"\xed\xa0\x80\"}", b"nul\x00l", b"1e999999",
            b"{\"epoch\": " + b"9" * 5000 + b"}", b"  ", b"\"\\ud800\"",
        ]))
    return op, json.dumps(body).encode()


def check_answer(op: str, status: int, data: bytes) -> None:
    assert status < 500, f"{op}: HTTP {status}: {data[:500]!r}"
    if status >= 400:
        err = json.loads(data)["error"]
        assert err["code"] and err["message"], data


@settings(max_examples=300, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture,
                                 HealthCheck.data_too_large])
@given(req=request())
def test_fuzzed_requests_get_an_answer_never_a_500(daemon: Daemon, req) -> None:
    op, body = req
    status, data = daemon.send(f"/v1/{op}", body)
    check_answer(op, status, data)
    assert daemon.proc.poll() is None


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(query=st.dictionaries(st.sampled_from(["id", "epoch", "x"]),
                             st.one_of(odd_strings, st.sampled_from(["c1", "0", str(EPOCH)]),
                                       huge_ints.map(str)), max_size=3),
       body=st.sampled_from([b"", b"not a tar", b"\x00" * 1024]))
def test_fuzzed_imports_get_an_answer_never_a_500(daemon: Daemon, query, body) -> None:
    q = urlencode({k: v.encode("utf-8", "surrogatepass") for k, v in query.items()})
    status, data = daemon.send(f"/v1/checkpoint_import?{q}", body)
    check_answer("checkpoint_import", status, data)


@pytest.mark.parametrize("path", ["/v1/", "/v1/%00", "/v1/" + "x" * 5000, "/nope",
                                  "/v1/stat/../stat", "/v1/%ff", "/v1/%ED%A0%80",
                                  "/v1/checkpoint_import?id=%ff&epoch=%00"])
def test_odd_paths_get_an_answer(daemon: Daemon, path: str) -> None:
    status, data = daemon.send(path, json.dumps({"epoch": EPOCH}).encode())
    check_answer(path, status, data)


@pytest.mark.parametrize("body", [
    b'{"epoch": 1000000, "path": "\xed\xa0\x80"}',  # a surrogate in raw bytes
    b'{"epoch": 1000000, "path": "\\ud800"}',
    b'{"epoch": 1000000, "path": "' + b"n" * 300 + b'"}',
    b'{"epoch": 1000000, "path": "f.txt", "offset": -1}',
    b'{"epoch": 1000000, "path": "f.txt", "limit": 99999999999999999999999}',
])
def test_a_read_the_daemon_refuses_is_refused_before_its_cost_is_counted(
        daemon: Daemon, body: bytes) -> None:
    """Found by the fuzzer in CI (a path of raw surrogate bytes made a 500): the server
    counts a read's answer against its memory budget before the call runs, and that count
    looked at the path before the call's own checks did. Now it makes the same checks."""
    status, data = daemon.send("/v1/read_file", body)
    assert status == 400, data
    assert json.loads(data)["error"]["code"]
