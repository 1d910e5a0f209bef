"""The HTTP layer: authentication, body limits, JSON in and out, errors as JSON.

One thread per connection (``ThreadingHTTPServer``), HTTP/1.1. Bad input never stops the
server: malformed JSON, unknown operations and wrong types get a 4xx JSON error naming what
was wrong; anything unexpected gets a 500 with the exception's text (and a traceback in the
daemon's log), and the next request is served as usual.

A refused request's body is still read and discarded (up to ``_MAX_DRAIN``) before the
answer: a client that is still sending when the server closes would see a broken pipe
instead of the 401 or 413 meant for it.
"""

from __future__ import annotations

import hmac
import json
import sys
import time
import traceback
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, NoReturn
from urllib.parse import parse_qsl, urlsplit

from . import protocol
from .daemon import Daemon, Encoded
from .errors import BadRequest, NotFound, OpError, TooLarge, Unauthorized

_MAX_DRAIN = 1024 * 1024 * 1024
_CHUNK = 1024 * 1024
#: Default limit of a checkpoint_import body (streamed to disk, never held in memory).
DEFAULT_MAX_IMPORT = 64 * 1024 * 1024 * 1024


class SpacesServer(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 128

    def __init__(self, address: tuple[str, int], daemon: Daemon, token: str, *,
                 max_body: int = protocol.DEFAULT_MAX_BODY,
                 max_import: int = DEFAULT_MAX_IMPORT, verbose: bool = False) -> None:
        super().__init__(address, Handler)
        self.daemon = daemon
        self.token = token
        self.max_body = max_body
        self.max_import = max_import
        self.verbose = verbose
        self.started_ms = int(time.time() * 1000)


class _BodyReader:
    """The request body as a file: at most ``length`` bytes of the connection."""

    def __init__(self, rfile: Any, length: int) -> None:
        self._rfile = rfile
        self.left = length

    def read(self, n: int = -1) -> bytes:
        n = self.left if n is None or n < 0 else min(n, self.left)
        data = self._rfile.read(n) if n else b""
        self.left -= len(data)
        return data


class _ChunkedWriter:
    """Writes HTTP/1.1 chunked transfer encoding, in chunks of about ``_CHUNK`` bytes."""

    def __init__(self, wfile: Any) -> None:
        self._wfile = wfile
        self._buf = bytearray()

    def write(self, data: bytes) -> int:
        self._buf += data
        if len(self._buf) >= _CHUNK:
            self._flush()
        return len(data)

    def _flush(self) -> None:
        if self._buf:
            self._wfile.write(b"%x\r\n%s\r\n" % (len(self._buf), bytes(self._buf)))
            self._buf.clear()

    def close(self) -> None:
        self._flush()
        self._wfile.write(b"0\r\n\r\n")
        self._wfile.flush()


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: SpacesServer
    #: Idle keep-alive connections are dropped after this many seconds.
    timeout = 120

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib name
        if self.server.verbose:
            super().log_message(format, *args)

    def do_GET(self) -> None:
        if urlsplit(self.path).path == protocol.HEALTH_PATH:
            self._send_json(200, {"ok": True, "protocol": protocol.PROTOCOL_VERSION,
                                  "started_ms": self.server.started_ms})
        else:
            self._guard(lambda: self._refuse(NotFound(
                f"no GET {self.path}; operations are POST {protocol.API_PREFIX}<op>")))

    def do_POST(self) -> None:
        self._guard(self._post)

    def _guard(self, fn: Any) -> None:
        try:
            fn()
        except OpError as exc:
            self._send_json(exc.status, exc.to_json())
        except Exception as exc:  # noqa: BLE001 - keep serving, report it
            traceback.print_exc(file=sys.stderr)
            self._send_json(500, {"error": {"code": protocol.ERR_INTERNAL,
                                            "message": f"{type(exc).__name__}: {exc}"}})

    # ---------------------------------------------------------------- request parts

    def _length(self) -> int:
        if self.headers.get("Transfer-Encoding"):
            self.close_connection = True
            raise BadRequest("chunked request bodies are not supported; send Content-Length")
        raw = self.headers.get("Content-Length", "0")
        try:
            length = int(raw)
            if length < 0:
                raise ValueError
        except ValueError:
            self.close_connection = True
            raise BadRequest(f"bad Content-Length {raw!r}") from None
        return length

    def _drain(self, length: int) -> None:
        """Read and drop the body, or give up on the connection if it is absurdly large."""
        if length > _MAX_DRAIN:
            self.close_connection = True
            return
        while length > 0:
            got = self.rfile.read(min(length, _CHUNK))
            if not got:
                break
            length -= len(got)

    def _refuse(self, exc: OpError, length: int = 0) -> NoReturn:
        self._drain(length)
        raise exc

    def _authorized(self) -> bool:
        given = self.headers.get("Authorization", "")
        return hmac.compare_digest(given.encode(), f"Bearer {self.server.token}".encode())

    def _post(self) -> None:
        url = urlsplit(self.path)
        length = self._length()
        if not self._authorized():
            self._refuse(Unauthorized("missing or wrong bearer token: send 'Authorization: "
                                      "Bearer <token>' with this Space's token"), length)
        if not url.path.startswith(protocol.API_PREFIX):
            self._refuse(NotFound(f"no such path {url.path!r}; operations are POST "
                                  f"{protocol.API_PREFIX}<op>"), length)
        op = url.path[len(protocol.API_PREFIX):]
        if op == protocol.OP_CHECKPOINT_IMPORT:
            self._import(dict(parse_qsl(url.query)), length)
            return
        if length > self.server.max_body:
            self._refuse(TooLarge(f"request body of {length} bytes is over this daemon's limit "
                                  f"of {self.server.max_body} bytes; send less per request "
                                  "(e.g. write a large file in parts)",
                                  limit=self.server.max_body), length)
        raw = self.rfile.read(length)
        try:
            body = json.loads(raw) if raw else {}
        except ValueError as exc:
            raise BadRequest(f"{op}: the request body is not valid JSON ({exc})") from None
        if op == protocol.OP_CHECKPOINT_EXPORT:
            self._export(body)
        else:
            self._send_json(200, self.server.daemon.call(op, body))

    def _import(self, query: dict[str, str], length: int) -> None:
        if length > self.server.max_import:
            self._refuse(TooLarge(f"checkpoint of {length} bytes is over this daemon's import "
                                  f"limit of {self.server.max_import} bytes"), length)
        reader = _BodyReader(self.rfile, length)
        try:
            result = self.server.daemon.import_checkpoint(query, reader)
        finally:
            self._drain(reader.left)
        self._send_json(200, result)

    def _export(self, body: Any) -> None:
        manifest = self.server.daemon.export_manifest(body)
        self.send_response(200)
        self.send_header("Content-Type", "application/x-tar")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        out = _ChunkedWriter(self.wfile)
        try:
            self.server.daemon.checkpoints.export(manifest, out)  # type: ignore[arg-type]
        except Exception:
            # Headers are gone: the only way left to say "failed" is to cut the stream
            # short, which the client sees as an incomplete read.
            self.close_connection = True
            traceback.print_exc(file=sys.stderr)
            return
        out.close()

    def _send_json(self, status: int, obj: dict[str, Any] | Encoded) -> None:
        data = obj if isinstance(obj, Encoded) else json.dumps(obj, separators=(",", ":")).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(data)
