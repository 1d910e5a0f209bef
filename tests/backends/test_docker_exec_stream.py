"""Reading a ``docker exec``'s output: what the engine sends right behind its response
headers is kept (docker-py's ``exec_start`` loses it: docker/docker-py#3332).

The engine here is a real HTTP server on a UNIX socket that sends the whole hijacked
response, headers and frames, in one write, which is what a loaded client meets when a short
command's output reaches the socket before the headers are read. Needs the docker SDK, not
an engine.
"""

from __future__ import annotations

import socket
import struct
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

docker = pytest.importorskip("docker")

from backends.docker.exec_stream import ExecStreamError, exec_output  # noqa: E402

HEADERS = (b"HTTP/1.1 101 UPGRADED\r\nContent-Type: application/vnd.docker.raw-stream\r\n"
           b"Connection: Upgrade\r\nUpgrade: tcp\r\n\r\n")


def frame(stream: int, data: bytes) -> bytes:
    return struct.pack(">BxxxL", stream, len(data)) + data


#: The API client's timeout: a command's output may come later than that.
API_TIMEOUT_S = 1


@pytest.fixture
def engine(tmp_path: Path) -> Iterator[tuple[docker.APIClient, list[bytes]]]:
    """An API client on a one-connection-at-a-time server that answers each request with
    the next reply of the list the test fills, in a single ``sendall``, then closes; a
    reply in parts (a tuple) is sent part by part, a float part being a pause of that many
    seconds."""
    path = tmp_path / "engine.sock"
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(path))
    server.listen(1)
    replies: list[bytes | tuple[bytes | float, ...]] = []

    def serve() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return  # closed: the test is over
            with conn:
                request = b""
                while b"\r\n\r\n" not in request:
                    request += conn.recv(4096)
                head, _, body = request.partition(b"\r\n\r\n")
                length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                               if line.lower().startswith(b"content-length:")), 0)
                while len(body) < length:
                    body += conn.recv(4096)
                reply = replies.pop(0)
                for part in reply if isinstance(reply, tuple) else (reply,):
                    if isinstance(part, float):
                        time.sleep(part)
                    else:
                        conn.sendall(part)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    api = docker.APIClient(base_url=f"unix://{path}", version="1.41", timeout=API_TIMEOUT_S)
    try:
        yield api, replies
    finally:
        api.close()
        server.shutdown(socket.SHUT_RDWR)
        server.close()
        thread.join(timeout=30)
        assert not thread.is_alive(), "the fake engine's thread did not end"


def test_output_sent_with_the_headers_is_kept_in_order(engine) -> None:
    api, replies = engine
    replies.append(HEADERS + frame(1, b"1 0 python3 -m spacesd.supervisor run\n")
                   + frame(2, b"a warning\n") + frame(1, b"7 1 python3 -m spacesd\n"))
    assert exec_output(api, "abc") == (b"1 0 python3 -m spacesd.supervisor run\n"
                                       b"a warning\n7 1 python3 -m spacesd\n")


def test_no_output_is_empty(engine) -> None:
    api, replies = engine
    replies.append(HEADERS)
    assert exec_output(api, "abc") == b""


@pytest.mark.parametrize(("cut", "message"), [(3, "ended inside a frame header"),
                                              (8 + 4, "ended 6 bytes short of its frame")],
                         ids=["inside-a-header", "inside-a-payload"])
def test_a_stream_that_ends_inside_a_frame_is_an_error_not_short_output(
        engine, cut, message) -> None:
    api, replies = engine
    replies.append(HEADERS + frame(1, b"whole\n") + frame(1, b"cut short\n")[:cut])
    with pytest.raises(ExecStreamError, match=f"exec abc: the stream {message}"):
        exec_output(api, "abc")


def test_output_later_than_the_api_timeout_is_waited_for(engine) -> None:
    """A command takes what it takes (a kill-daemon waits for the next daemon): the API
    client's timeout is for the engine's answer, not for the command's output."""
    api, replies = engine
    replies.append((HEADERS, 2.0 * API_TIMEOUT_S, frame(1, b"late\n")))
    assert exec_output(api, "abc") == b"late\n"


def test_an_engine_error_is_raised_as_the_engine_said_it(engine) -> None:
    api, replies = engine
    message = b'{"message": "No such exec instance: abc"}'
    replies.append(b"HTTP/1.1 404 Not Found\r\nContent-Type: application/json\r\n"
                   b"Content-Length: %d\r\n\r\n%s" % (len(message), message))
    with pytest.raises(docker.errors.NotFound, match="No such exec instance"):
        exec_output(api, "abc")

