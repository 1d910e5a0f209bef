"""Run a ``docker exec`` to its end and keep all of its output.

docker-py's ``exec_start`` reads the command's output from the raw socket under the HTTP
response, not through the response's buffered reader. The reader parsed the response's
headers and may have read past them: output the engine sent right behind the headers (a
short command, a loaded client) sits in that buffer and is lost, and ``exec_start`` returns
``b""`` for a command that printed (docker/docker-py#3332, open). Measured here: 7 of 900
``ps`` runs beside three busy CPUs came back empty with exit code 0. The Space's faults
read what their commands print (``pause_commands`` returns the keys it froze), so this
module reads the same stream through the buffered reader instead.
"""

from __future__ import annotations

import struct
from typing import Any

import docker
import docker.errors

#: The engine's multiplexed stream: each frame is a header (stream id, three zero bytes,
#: a big-endian length) followed by that many bytes.
_FRAME = struct.Struct(">BxxxL")


class ExecStreamError(docker.errors.DockerException):
    """The exec's output stream broke: the connection failed or ended inside a frame."""


def exec_output(api: docker.APIClient, exec_id: str) -> bytes:
    """Start the created exec ``exec_id`` (no TTY) and return its stdout and stderr as they
    came, once the stream ends (when the command closed them), however long that takes."""
    # The request exec_start makes, through the client's own (untyped, private) helpers so
    # the connection is configured as for every other call.
    client: Any = api
    response = client._post_json(client._url("/exec/{0}/start", exec_id),
                                 headers={"Connection": "Upgrade", "Upgrade": "tcp"},
                                 data={"Tty": False, "Detach": False}, stream=True)
    try:
        client._raise_for_status(response)
        # http.client's buffered reader over the hijacked connection: it holds whatever
        # the header parse read ahead.
        reader = response.raw._fp.fp
        # The command takes what it takes (a kill-daemon waits for the next daemon): as
        # docker-py's own read, no timeout of the API client's cuts it short.
        client._disable_socket_timeout(reader.raw)
        try:
            return _frames(exec_id, reader)
        except OSError as exc:
            raise ExecStreamError(f"exec {exec_id}: reading its output failed: {exc}") \
                from exc
    finally:
        response.close()


def _frames(exec_id: str, reader: Any) -> bytes:
    """The payloads of the frames ``reader`` holds, joined, up to its end."""
    out = bytearray()
    while header := reader.read(_FRAME.size):
        if len(header) < _FRAME.size:
            raise ExecStreamError(f"exec {exec_id}: the stream ended inside a frame "
                                  "header")
        _, size = _FRAME.unpack(header)
        data = reader.read(size)
        if len(data) < size:
            raise ExecStreamError(f"exec {exec_id}: the stream ended {size - len(data)} "
                                  "bytes short of its frame")
        out += data
    return bytes(out)

