"""The HTTP layer: authentication, body limits, JSON in and out, errors as JSON.

One thread per connection (``ThreadingHTTPServer``), HTTP/1.1. Bad input never stops the
server: malformed JSON, unknown operations and wrong types get a 4xx JSON error naming what
was wrong; anything unexpected gets a 500 with the exception's text (and a traceback in the
daemon's log), and the next request is served as usual.

A refused request's body is still read and discarded (up to ``_MAX_DRAIN``; up to
``_MAX_UNAUTH_DRAIN`` for a request without the token) before the answer: a client that is
still sending when the server closes would see a broken pipe instead of the 401 or 413
meant for it.

Resource limits (defaults in ``protocol``), so that no client can exhaust the host:
- connections: at most ``max_connections`` open (one thread each); beyond that a new
  connection gets a 503 at once and is closed;
- headers: a connection has ``header_timeout`` seconds to send its request line and headers
  (a watchdog thread shuts the reading side of a late one: a client that sends nothing, or
  a byte now and then, holds a thread for seconds, not minutes); only a connection that
  made an authenticated request gets the longer keep-alive idle time for its next one;
- authentication is checked on the headers, before any of the body is read;
- requests: at most ``max_requests`` handled at once, and the JSON bodies held at once fit a
  byte budget (``body_budget``, at least ``max_body``). A request waits up to ``busy_wait``
  seconds for both, then gets 503 ``busy`` with a message (and ``Retry-After``);
- bodies are parsed from text that is dropped before the operation runs, and a body nested
  deeper than ``protocol.MAX_JSON_DEPTH`` is refused.
"""

from __future__ import annotations

import contextlib
import errno
import hmac
import json
import socket
import sys
import threading
import time
import traceback
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, NoReturn
from urllib.parse import parse_qsl, urlsplit

from . import protocol
from .daemon import Daemon, Encoded
from .errors import BadRequest, NotFound, OpError, TooLarge, Unauthorized

_MAX_DRAIN = 1024 * 1024 * 1024
#: The most of an unauthenticated request's body read before its 401 (beyond: closed).
_MAX_UNAUTH_DRAIN = 64 * 1024
_CHUNK = 1024 * 1024
#: Default limit of a checkpoint_import body (streamed to disk, never held in memory).
DEFAULT_MAX_IMPORT = 64 * 1024 * 1024 * 1024
_BUSY_RESPONSE = (b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
                  b"Connection: close\r\nRetry-After: 1\r\nContent-Length: %d\r\n\r\n%s")


class Busy(OpError):
    """The daemon is at one of its limits; the request was not run: retry later."""

    code = protocol.ERR_BUSY
    status = protocol.BUSY_STATUS


class _Budget:
    """A byte budget: ``take(n)`` waits until ``n`` bytes are free (or gives up)."""

    def __init__(self, total: int) -> None:
        self.total = total
        self.free = total
        self._cond = threading.Condition()

    def take(self, n: int, deadline: float) -> bool:
        with self._cond:
            while self.free < n:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(left)
            self.free -= n
            return True

    def give(self, n: int) -> None:
        with self._cond:
            self.free += n
            self._cond.notify_all()


class _Watchdog:
    """Shuts the reading side of connections whose deadline passed (one thread for all).

    ``arm`` returns a ticket; ``disarm`` returns False if the deadline had already passed
    (the connection's reads then see end-of-file, and it must be closed)."""

    def __init__(self, tick: float = 0.2) -> None:
        self._tick = tick
        self._lock = threading.Lock()
        self._armed: dict[int, tuple[float, socket.socket]] = {}
        self._fired: set[int] = set()
        self._next = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="spacesd-watchdog", daemon=True)
        self._thread.start()

    def arm(self, sock: socket.socket, seconds: float) -> int:
        with self._lock:
            self._next += 1
            self._armed[self._next] = (time.monotonic() + seconds, sock)
            return self._next

    def disarm(self, ticket: int) -> bool:
        with self._lock:
            self._armed.pop(ticket, None)
            if ticket in self._fired:
                self._fired.discard(ticket)
                return False
            return True

    def close(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        while not self._stop.wait(self._tick):
            now = time.monotonic()
            # Under the lock: a handler closes its socket only after ``disarm``, so the
            # socket shut here is still the connection's own.
            with self._lock:
                late = [t for t, (when, _) in self._armed.items() if when <= now]
                for t in late:
                    sock = self._armed.pop(t)[1]
                    self._fired.add(t)
                    try:
                        sock.shutdown(socket.SHUT_RD)
                    except OSError:
                        pass  # already closed by its peer


class SpacesServer(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 128

    def __init__(self, address: tuple[str, int], daemon: Daemon, token: str, *,
                 max_body: int = protocol.DEFAULT_MAX_BODY,
                 max_import: int = DEFAULT_MAX_IMPORT, verbose: bool = False,
                 max_requests: int = protocol.DEFAULT_MAX_REQUESTS,
                 body_budget: int = protocol.DEFAULT_BODY_BUDGET,
                 max_connections: int = protocol.DEFAULT_MAX_CONNECTIONS,
                 header_timeout: float = protocol.HEADER_TIMEOUT_SECONDS,
                 busy_wait: float = protocol.BUSY_WAIT_SECONDS) -> None:
        super().__init__(address, Handler)
        self.daemon = daemon
        self.token = token
        self.max_body = max_body
        self.max_import = max_import
        self.verbose = verbose
        self.started_ms = int(time.time() * 1000)
        self.max_requests = max_requests
        self.slots = threading.BoundedSemaphore(max_requests)
        self.budget = _Budget(max(body_budget, max_body))
        self.max_connections = max_connections
        self.header_timeout = header_timeout
        self.busy_wait = busy_wait
        self.watchdog = _Watchdog(min(0.2, header_timeout / 4))
        self._conn_lock = threading.Lock()
        self.connections = 0

    def process_request(self, request: Any, client_address: Any) -> None:
        with self._conn_lock:
            full = self.connections >= self.max_connections
            if not full:
                self.connections += 1
        if full:
            body = json.dumps({"error": {
                "code": protocol.ERR_BUSY,
                "message": f"this daemon has {self.max_connections} connections open, its "
                           "limit; retry shortly"}}).encode()
            try:
                request.settimeout(1.0)
                request.sendall(_BUSY_RESPONSE % (len(body), body))
            except OSError:
                pass
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._connection_done()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._connection_done()

    def _connection_done(self) -> None:
        with self._conn_lock:
            self.connections -= 1

    def server_close(self) -> None:
        self.watchdog.close()
        super().server_close()


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


def _print_traceback() -> None:
    """The exception being handled, on stderr, unless stderr cannot take it (the daemon's
    log on a full disk): the request still gets its answer."""
    with contextlib.suppress(OSError):
        traceback.print_exc(file=sys.stderr)


def _internal(exc: BaseException) -> dict[str, Any]:
    return {"error": {"code": protocol.ERR_INTERNAL, "message": f"{type(exc).__name__}: {exc}"}}


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
    #: Idle keep-alive connections (after an authenticated request) are dropped after this
    #: many seconds; it is also the longest wait for one read of a body.
    timeout = 120
    #: Whether this connection made an authenticated request (it then gets ``timeout`` for
    #: its next request's headers rather than the server's ``header_timeout``).
    _trusted = False
    _ticket = 0

    def setup(self) -> None:
        super().setup()
        # An answer is written as headers, then body: without this, a kept-alive
        # connection waits for the client's delayed ACK (~40 ms) between the two.
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def handle_one_request(self) -> None:
        wait = self.timeout if self._trusted else self.server.header_timeout
        self._ticket = self.server.watchdog.arm(self.connection, wait)
        try:
            super().handle_one_request()
        finally:
            self.server.watchdog.disarm(self._ticket)

    def parse_request(self) -> bool:
        ok = super().parse_request()
        if not self.server.watchdog.disarm(self._ticket):
            # The request line and headers did not arrive in time: the reading side is shut.
            self.close_connection = True
            return False
        return ok

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base's name
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
        except MemoryError:
            self.close_connection = True
            self._send_json(protocol.BUSY_STATUS, Busy(
                "the daemon ran out of memory for this request; retry later, or send less "
                "per request").to_json())
        except OSError as exc:
            _print_traceback()
            if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
                self._send_json(500, _internal(exc))
                return
            self._send_json(protocol.ERROR_STATUS[protocol.ERR_NO_SPACE], {"error": {
                "code": protocol.ERR_NO_SPACE,
                "message": f"the Space's disk is full ({exc}): free space in the Space (its "
                           "workspace, or the daemon's state directory) and send the request "
                           "again; an exec key it recorded before the disk filled reads as "
                           "lost"}})
        except Exception as exc:  # noqa: BLE001 - keep serving, report it
            _print_traceback()
            self._send_json(500, _internal(exc))

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

    def _drain(self, length: int, most: int = _MAX_DRAIN) -> None:
        """Read and drop the body, or give up on the connection if it is too large."""
        if length > most:
            self.close_connection = True
            return
        try:
            while length > 0:
                got = self.rfile.read(min(length, _CHUNK))
                if not got:
                    break
                length -= len(got)
        except OSError:
            self.close_connection = True
        if length > 0:
            self.close_connection = True

    def _refuse(self, exc: OpError, length: int = 0, most: int = _MAX_DRAIN) -> NoReturn:
        self._drain(length, most)
        raise exc

    @contextlib.contextmanager
    def _admitted(self, op: str, length: int, body_bytes: int) -> Iterator[None]:
        """Hold a request slot and ``body_bytes`` of the body budget, or refuse with 503."""
        server = self.server
        deadline = time.monotonic() + server.busy_wait
        if not server.slots.acquire(timeout=server.busy_wait):
            self._refuse(Busy(f"{op}: this daemon is handling {server.max_requests} requests, "
                              f"its limit, and none ended within {server.busy_wait:g} s; "
                              "retry shortly", retry_after=1), length)
        if body_bytes and not server.budget.take(body_bytes, deadline):
            server.slots.release()  # before the drain: a refused body holds nothing
            self._refuse(Busy(f"{op}: the request bodies in progress fill this daemon's "
                              f"budget of {server.budget.total} bytes and no room for "
                              f"{body_bytes} more was made within {server.busy_wait:g} s; "
                              "retry shortly, or send less per request", retry_after=1), length)
        try:
            yield
        finally:
            if body_bytes:
                server.budget.give(body_bytes)
            server.slots.release()

    @contextlib.contextmanager
    def _answer_room(self, op: str, cost: int) -> Iterator[None]:
        """Hold ``cost`` bytes of the body budget (at most all of it) while a large answer
        is built and sent, or refuse with 503."""
        budget = self.server.budget
        cost = min(cost, budget.total)
        if cost and not budget.take(cost, time.monotonic() + self.server.busy_wait):
            raise Busy(f"{op}: the requests and answers in progress fill this daemon's budget "
                       f"of {budget.total} bytes and no room for this answer ({cost} bytes) "
                       f"was made within {self.server.busy_wait:g} s; retry shortly, or read "
                       "less per request", retry_after=1)
        try:
            yield
        finally:
            if cost:
                budget.give(cost)

    def _read_json(self, op: str, length: int) -> Any:
        """The body parsed; the raw bytes and the text are dropped before it returns."""
        try:
            raw: bytes | None = self.rfile.read(length) if length else b""
        except OSError:  # a read timed out, or the connection broke
            raw = None
        if raw is None or len(raw) != length:
            self.close_connection = True
            raise BadRequest(f"{op}: the request body ended (or stalled) before its "
                             "Content-Length; send the whole body")
        if not raw:
            return {}
        try:
            text = raw.decode(json.detect_encoding(raw), "surrogatepass")
            del raw
            body = json.loads(text)
        except ValueError as exc:
            raise BadRequest(f"{op}: the request body is not valid JSON ({exc})") from None
        except RecursionError:
            body = None
            depth = protocol.MAX_JSON_DEPTH + 1
        else:
            del text
            depth = _depth(body)
        if depth > protocol.MAX_JSON_DEPTH:
            raise BadRequest(f"{op}: the request body nests deeper than "
                             f"{protocol.MAX_JSON_DEPTH} levels; request fields are flat")
        return body

    def _authorized(self) -> bool:
        given = self.headers.get("Authorization", "")
        return hmac.compare_digest(given.encode(), f"Bearer {self.server.token}".encode())

    def _post(self) -> None:
        url = urlsplit(self.path)
        length = self._length()
        if not self._authorized():
            self._refuse(Unauthorized("missing or wrong bearer token: send 'Authorization: "
                                      "Bearer <token>' with this Space's token"), length,
                         _MAX_UNAUTH_DRAIN)
        self._trusted = True
        if not url.path.startswith(protocol.API_PREFIX):
            self._refuse(NotFound(f"no such path {url.path!r}; operations are POST "
                                  f"{protocol.API_PREFIX}<op>"), length)
        op = url.path[len(protocol.API_PREFIX):]
        if op == protocol.OP_CHECKPOINT_IMPORT:
            with self._admitted(op, length, 0):  # streamed to disk: no body budget
                self._import(dict(parse_qsl(url.query)), length)
            return
        if length > self.server.max_body:
            self._refuse(TooLarge(f"request body of {length} bytes is over this daemon's limit "
                                  f"of {self.server.max_body} bytes; send less per request "
                                  "(e.g. write a large file in parts)",
                                  limit=self.server.max_body), length)
        with self._admitted(op, length, length):
            body = self._read_json(op, length)
            if op == protocol.OP_CHECKPOINT_EXPORT:
                self._export(body)
            else:
                with self._answer_room(op, self.server.daemon.answer_bytes(op, body)):
                    result = self.server.daemon.call(op, body)
                    del body
                    self._send_json(200, result)
                    del result

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
        manifest, data, have = self.server.daemon.export_manifest(body)
        self.send_response(200)
        self.send_header("Content-Type", "application/x-tar")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        out = _ChunkedWriter(self.wfile)
        try:
            export = self.server.daemon.checkpoints.export
            export(manifest, data, out, skip=have)  # type: ignore[arg-type]  # "w|" only writes
        except Exception:  # noqa: BLE001 - reported below
            # Headers are gone: the only way left to say "failed" is to cut the stream
            # short, which the client sees as an incomplete read.
            self.close_connection = True
            _print_traceback()
            return
        out.close()

    def _send_json(self, status: int, obj: dict[str, Any] | Encoded) -> None:
        data = obj if isinstance(obj, Encoded) else json.dumps(obj, separators=(",", ":")).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        if status == protocol.BUSY_STATUS:
            self.send_header("Retry-After", "1")
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(data)


def _depth(value: Any) -> int:
    """How deep ``value`` nests (a scalar: 0), without recursion."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        v, d = stack.pop()
        if isinstance(v, dict):
            v = list(v.values())
        if isinstance(v, list):
            deepest = max(deepest, d)
            if d > protocol.MAX_JSON_DEPTH:
                break
            stack.extend((x, d + 1) for x in v if isinstance(x, (list, dict)))
    return deepest
