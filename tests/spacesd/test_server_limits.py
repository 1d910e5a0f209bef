"""The daemon's resource limits, against real ``python -m spacesd`` processes.

- 50 parallel maximum-size requests: the daemon's peak RSS stays bounded (printed) and it
  keeps serving; the requests beyond its limits get 503 ``busy`` with a message.
- A client that connects and sends nothing, or trickles its headers, is cut off after the
  header timeout, and the connection limit answers 503 rather than starting threads.
"""

from __future__ import annotations

import base64
import http.client
import json
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from backends.space_client import Endpoint, HttpSpaceClient
from durable.errors import SpaceError
from spacesd import protocol
from tests.direct_spacesd import direct_spacesd

TOKEN = "limits-token"
MiB = 1024 * 1024


class Daemon:
    def __init__(self, port: int, proc: subprocess.Popen, work: Path) -> None:
        self.port = port
        self.proc = proc
        self.work = work

    def send(self, op: str, body: bytes, timeout: float = 120) -> tuple[int, dict]:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        try:
            conn.request("POST", f"/v1/{op}", body=body,
                         headers={"Authorization": f"Bearer {TOKEN}"})
            resp = conn.getresponse()
            return resp.status, json.loads(resp.read())
        finally:
            conn.close()

    def serving(self) -> bool:
        return self.send("capabilities", json.dumps({"epoch": 0}).encode())[0] == 200

    def peak_rss(self) -> int:
        """The daemon's peak resident set (``VmHWM``), in bytes."""
        with open(f"/proc/{self.proc.pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
        raise AssertionError("no VmHWM in /proc/<pid>/status")


@contextmanager
def running(tmp: Path, *args: str) -> Iterator[Daemon]:
    with direct_spacesd(tmp, TOKEN, *args) as (port, proc, work):
        yield Daemon(port, proc, work)


def test_fifty_parallel_maximum_size_requests_keep_memory_bounded(tmp_path) -> None:
    """Peak RSS bound: the body budget (default 2 maximum-size bodies, 128 MiB) times the
    cost of a body while it is handled (its text, then the parsed string, then the decoded
    file data: under 3x), plus the interpreter and the refused requests' 1 MiB drain
    buffers: about 500 MiB. 1 GiB leaves room for allocator slack. Without the limits,
    50 such requests held at once cost 50 x over 100 MB: several GB."""
    with running(tmp_path, "--busy-wait", "5") as daemon:
        # The largest write_file whose JSON body fits DEFAULT_MAX_BODY.
        raw_size = (protocol.DEFAULT_MAX_BODY - 200) // 4 * 3
        data = base64.b64encode(b"\xab" * raw_size).decode()

        # Four bodies, shared by the threads (fifty copies were 3 GiB in this process).
        bodies = [json.dumps({"epoch": 0, "path": f"big{k}", "data": data}).encode()
                  for k in range(4)]
        assert all(len(b) <= protocol.DEFAULT_MAX_BODY for b in bodies)
        ok, peak = _fifty_at_once(daemon, "write_file", lambda n: bodies[n % 4])
        print(f"\nspacesd peak RSS after 50 parallel {protocol.DEFAULT_MAX_BODY // MiB} MiB "
              f"requests: {peak / MiB:.0f} MiB ({ok} written, {50 - ok} refused busy)")
        assert ok >= 1
        assert daemon.serving()
        assert peak < 1024 * MiB


def _fifty_at_once(daemon: Daemon, op: str, body: Callable[[int], bytes]) -> tuple[int, int]:
    """Send ``op`` with ``body(n)`` for n < 50 from 50 threads at once; each must succeed or
    be refused ``busy``. Returns (successes, the daemon's peak RSS)."""
    results: list[tuple[int, str]] = []
    errors: list[BaseException] = []
    lock = threading.Lock()

    def one(n: int) -> None:
        try:
            status, res = daemon.send(op, body(n), timeout=300)
            with lock:
                results.append((status, res.get("error", {}).get("code", "")))
        except BaseException as exc:  # noqa: BLE001 - reported below
            with lock:
                errors.append(exc)

    threads = [threading.Thread(target=one, args=(n,)) for n in range(50)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    busy = sum(1 for s, c in results if (s, c) == (protocol.BUSY_STATUS, protocol.ERR_BUSY))
    ok = sum(1 for s, _ in results if s == 200)
    assert ok + busy == 50, results
    return ok, daemon.peak_rss()


def test_fifty_parallel_maximum_size_reads_keep_memory_bounded(tmp_path) -> None:
    """A read's answer holds its share of the body budget while it is built and sent, so
    50 reads of the most one answer carries cost what the budget allows, not 50 answers."""
    with running(tmp_path, "--busy-wait", "30") as daemon:
        (daemon.work / "big").write_bytes(b"\xcd" * protocol.MAX_READ_LIMIT)
        ok, peak = _fifty_at_once(daemon, "read_file", lambda n: json.dumps(
            {"epoch": 0, "path": "big", "limit": protocol.MAX_READ_LIMIT}).encode())
        print(f"\nspacesd peak RSS after 50 parallel {protocol.MAX_READ_LIMIT // MiB} MiB "
              f"reads: {peak / MiB:.0f} MiB ({ok} answered, {50 - ok} refused busy)")
        assert ok >= 1
        assert peak < 1024 * MiB


def test_a_read_past_one_answer_is_refused_and_the_client_reads_in_parts(tmp_path) -> None:
    with running(tmp_path) as daemon:
        data = bytes(range(256)) * (protocol.MAX_READ_LIMIT // 256 * 2 + 3)  # 2 parts + 768
        (daemon.work / "huge").write_bytes(data)
        status, res = daemon.send("read_file", json.dumps({"epoch": 0, "path": "huge"})
                                  .encode())
        assert (status, res["error"]["code"]) == (413, protocol.ERR_TOO_LARGE)
        assert "read it in parts with offset and limit" in res["error"]["message"]
        client = HttpSpaceClient("limits", 0, lambda: Endpoint("127.0.0.1", daemon.port, TOKEN))
        assert client.read_file("huge") == data
        assert client.read_file("huge", offset=5, limit=len(data)) == data[5:]
        assert client.read_file("huge", offset=7, limit=protocol.MAX_READ_LIMIT + 9) == \
            data[7:7 + protocol.MAX_READ_LIMIT + 9]
        assert client.read_file("huge", offset=len(data)) == b""


def _closed_within(sock: socket.socket, seconds: float) -> bool:
    """Whether the daemon closes ``sock`` (recv sees EOF, or a reset) within ``seconds``
    (a liveness bound, far above the header timeout, not a timing assertion)."""
    sock.settimeout(seconds)
    try:
        while sock.recv(4096):
            pass
    except (ConnectionResetError, BrokenPipeError):
        return True
    except TimeoutError:
        return False
    return True


def test_a_silent_or_slow_unauthenticated_client_is_cut_off(tmp_path) -> None:
    with running(tmp_path, "--header-timeout", "1") as daemon:
        silent = socket.create_connection(("127.0.0.1", daemon.port))
        trickle = socket.create_connection(("127.0.0.1", daemon.port))
        try:
            trickle.sendall(b"POST /v1/capabilities HTTP/1.1\r\n")
            stop = threading.Event()

            def drip() -> None:  # one header byte now and then: each read alone is quick
                try:
                    while not stop.wait(0.2):
                        trickle.sendall(b"X")
                except OSError:
                    pass

            dripper = threading.Thread(target=drip)
            dripper.start()
            assert daemon.serving()  # others are served meanwhile
            assert _closed_within(silent, 60)
            assert _closed_within(trickle, 60)
            stop.set()
            dripper.join()
            assert daemon.serving()
        finally:
            silent.close()
            trickle.close()


def test_connections_beyond_the_limit_get_503_and_the_daemon_recovers(tmp_path) -> None:
    # Idle connections hold their slots 30 s: a busy daemon may take seconds to reach the
    # extra one, which must find them all still held.
    with running(tmp_path, "--header-timeout", "30", "--max-connections", "8") as daemon:
        idle = [socket.create_connection(("127.0.0.1", daemon.port)) for _ in range(8)]
        try:
            with socket.create_connection(("127.0.0.1", daemon.port)) as extra:
                extra.settimeout(30)
                answer = b""
                while chunk := extra.recv(4096):
                    answer += chunk
            assert answer.startswith(b"HTTP/1.1 503"), answer
            assert json.loads(answer.split(b"\r\n\r\n", 1)[1])["error"]["code"] == "busy"
            for sock in idle:  # the header timeout frees their threads
                assert _closed_within(sock, 120)
            assert daemon.serving()
        finally:
            for sock in idle:
                sock.close()


def test_an_authenticated_client_keeps_its_connection_between_requests(tmp_path) -> None:
    """The header timeout is for new connections; one that made an authenticated request
    gets the keep-alive idle time for its next request."""
    with running(tmp_path, "--header-timeout", "3") as daemon:
        conn = http.client.HTTPConnection("127.0.0.1", daemon.port, timeout=30)
        try:
            for _ in range(2):
                conn.request("POST", "/v1/capabilities", body=b'{"epoch": 0}',
                             headers={"Authorization": f"Bearer {TOKEN}"})
                resp = conn.getresponse()
                assert resp.status == 200
                resp.read()
                time.sleep(4.5)  # longer than the header timeout
        finally:
            conn.close()


def test_an_unauthenticated_large_body_is_not_read(tmp_path) -> None:
    """A request without the token is refused on its headers: the daemon does not read
    (or wait for) a large body it announces."""
    with running(tmp_path) as daemon:
        sock = socket.create_connection(("127.0.0.1", daemon.port))
        try:
            sock.sendall(b"POST /v1/write_file HTTP/1.1\r\nHost: x\r\n"
                         b"Content-Length: 60000000\r\n\r\n")
            sock.settimeout(60)
            answer = b""
            while chunk := sock.recv(4096):
                answer += chunk
            assert answer.startswith(b"HTTP/1.1 401"), answer
        finally:
            sock.close()
        assert daemon.serving()


def test_the_client_sends_a_busy_request_again_until_it_gets_through(tmp_path) -> None:
    """503 ``busy`` means the request never took effect: the host client waits its
    ``Retry-After`` and sends it again, and gives up with the ``busy`` error only after
    ``busy_for`` seconds."""
    with running(tmp_path, "--max-requests", "1", "--busy-wait", "0.2") as daemon:
        def resolver() -> Endpoint:
            return Endpoint("127.0.0.1", daemon.port, TOKEN)

        client = HttpSpaceClient("limits", 0, resolver)
        client.exec_start("hold", "until [ -f go ]; do sleep 0.02; done")
        wait = json.dumps({"epoch": 0, "key": "hold", "wait": 30}).encode()

        def hold() -> None:  # a long poll that holds the one request slot until "go"
            while daemon.send("exec_wait", wait)[0] == protocol.BUSY_STATUS:
                pass  # the probe below had the slot at that instant

        holder = threading.Thread(target=hold)
        holder.start()
        try:
            deadline = time.monotonic() + 300  # only a hang takes this long
            while daemon.send("capabilities", b'{"epoch": 0}')[0] != protocol.BUSY_STATUS:
                assert time.monotonic() < deadline, "the long poll never held the slot"
                time.sleep(0.02)  # not held yet: the probe itself got through
            impatient = HttpSpaceClient("limits", 0, resolver, busy_for=1.0)
            started = time.monotonic()
            with pytest.raises(SpaceError) as refused:
                impatient.write_file("refused", b"x")
            assert refused.value.code == protocol.ERR_BUSY
            assert time.monotonic() - started >= 1.0  # sent again until busy_for was over
            assert not (daemon.work / "refused").exists()
            threading.Timer(1.5, (daemon.work / "go").touch).start()
            client.write_file("through", b"y")  # refused while held, then sent again
            assert (daemon.work / "through").read_bytes() == b"y"
        finally:
            (daemon.work / "go").touch()
            holder.join(60)
