"""The HTTP layer and the CLI: auth, bad input, body limits. The daemon keeps serving."""

from __future__ import annotations

import http.client
import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from backends.space_client import Endpoint, HttpSpaceClient
from tests.direct_spacesd import direct_spacesd

TOKEN = "test-token"
MAX_BODY = 100_000


@dataclass
class Daemon:
    port: int
    work: Path

    def request(self, method: str, path: str, body: bytes | None = None,
                token: str | None = TOKEN) -> tuple[int, dict]:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        try:
            headers = {"Authorization": f"Bearer {token}"} if token else {}
            conn.request(method, path, body=body, headers=headers)
            resp = conn.getresponse()
            return resp.status, json.loads(resp.read())
        finally:
            conn.close()

    def op(self, op: str, body: bytes | dict, **kwargs) -> tuple[int, dict]:
        raw = body if isinstance(body, bytes) else json.dumps(body).encode()
        return self.request("POST", f"/v1/{op}", raw, **kwargs)

    def error(self, op: str, body: bytes | dict, **kwargs) -> tuple[int, str, str]:
        status, res = self.op(op, body, **kwargs)
        return status, res["error"]["code"], res["error"]["message"]

    def serving(self) -> bool:
        return self.op("capabilities", {"epoch": 0})[0] == 200


@pytest.fixture
def daemon(tmp_path) -> Iterator[Daemon]:
    """``python -m spacesd`` run directly: token from the environment, a small body limit."""
    with direct_spacesd(tmp_path, TOKEN, "--max-body", str(MAX_BODY)) as (port, _, work):
        yield Daemon(port, work)


def test_health_needs_no_token_everything_else_does(daemon: Daemon) -> None:
    status, res = daemon.request("GET", "/v1/health", token=None)
    assert status == 200 and res["ok"] is True
    assert daemon.error("capabilities", {"epoch": 0}, token=None)[:2] == (401, "unauthorized")
    assert daemon.error("write_file", {"epoch": 0, "path": "x", "data": ""},
                        token="wrong")[:2] == (401, "unauthorized")
    assert not (daemon.work / "x").exists()
    assert daemon.serving()


def test_the_token_from_the_environment_is_not_passed_to_commands(daemon: Daemon) -> None:
    client = HttpSpaceClient("d", 0, lambda: Endpoint("127.0.0.1", daemon.port, TOKEN))
    client.exec_start("k", "echo \"[$SPACESD_TEST_TOKEN]\"")
    assert client.exec_wait("k", timeout=60).output == "[]\n"


@pytest.mark.parametrize("op, body, status, code, words", [
    ("stat", b"{not json", 400, "bad_request", "not valid JSON"),
    ("stat", b"[1, 2]", 400, "bad_request", "must be a JSON object"),
    ("nope", {"epoch": 0}, 404, "not_found", "unknown operation 'nope'"),
    ("stat", {"path": "x"}, 400, "bad_request", "missing field 'epoch'"),
    ("stat", {"epoch": "1", "path": "x"}, 400, "bad_request",
     "field 'epoch' must be an integer >= 0, got str"),
    ("read_file", {"epoch": 0, "path": "x", "offset": "10"}, 400, "bad_request",
     "field 'offset' must be an integer >= 0, got str ('10')"),
    ("exec_start", {"epoch": 0, "key": "k", "command": ["ls"]}, 400, "bad_request",
     "field 'command' must be a string, got list"),
    ("exec_start", {"epoch": 0, "key": "k"}, 400, "bad_request", "missing field 'command'"),
    ("remove", {"epoch": 0, "path": "x", "recursive": 1}, 400, "bad_request",
     "field 'recursive' must be a boolean"),
    ("scan", {"epoch": 0, "exclude": "*.pyc"}, 400, "bad_request",
     "field 'exclude' must be a list of strings"),
    ("stat", {"epoch": 0, "path": "x", "colour": "red"}, 400, "bad_request",
     "unknown field(s) 'colour'"),
    ("write_file", {"epoch": 0, "path": "x", "data": "&&&"}, 400, "bad_request",
     "'data' must be base64"),
])
def test_bad_input_gets_a_clear_error_and_the_daemon_keeps_serving(
    daemon: Daemon, op: str, body, status: int, code: str, words: str
) -> None:
    got_status, got_code, message = daemon.error(op, body)
    assert (got_status, got_code) == (status, code)
    assert words in message
    assert daemon.serving()


@pytest.mark.parametrize("query, status, code, words", [
    ("id=c1", 400, "bad_request", "checkpoint_import: missing field 'epoch'"),
    ("id=c1&epoch=one", 400, "bad_request",
     "checkpoint_import: query parameter 'epoch' must be an integer"),
    ("id=c1&epoch=-1", 400, "bad_request", "field 'epoch' must be an integer >= 0"),
    ("id=c1&epoch=0&round=x", 400, "bad_request",
     "checkpoint_import: query parameter 'round' must be an integer"),
    ("id=c1&epoch=0&round=-2", 400, "bad_request", "field 'round' must be an integer >= 0"),
])
def test_a_checkpoint_import_with_a_bad_epoch_or_round_is_refused(
    daemon: Daemon, query: str, status: int, code: str, words: str
) -> None:
    """Its epoch and round come in the query, not a JSON body: judged the same way."""
    status_got, res = daemon.request("POST", f"/v1/checkpoint_import?{query}", b"not a tar")
    assert (status_got, res["error"]["code"]) == (status, code)
    assert words in res["error"]["message"]
    assert daemon.serving()


def test_a_huge_body_gets_413_and_the_daemon_keeps_serving(daemon: Daemon) -> None:
    big = json.dumps({"epoch": 0, "path": "big", "data": "A" * (4 * MAX_BODY)}).encode()
    status, code, message = daemon.error("write_file", big)
    assert (status, code) == (413, "too_large")
    assert str(MAX_BODY) in message
    assert not (daemon.work / "big").exists()
    assert daemon.serving()


def test_many_clients_at_once(daemon: Daemon) -> None:
    errors: list[BaseException] = []

    def work(n: int) -> None:
        try:
            client = HttpSpaceClient("d", 0, lambda: Endpoint("127.0.0.1", daemon.port, TOKEN))
            for i in range(10):
                client.write_file(f"t{n}/f{i}", b"x" * i)
                assert client.read_file(f"t{n}/f{i}") == b"x" * i
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
