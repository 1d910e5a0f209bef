"""The host side of spacesd: a ``durable.spaces.SpaceClient`` over HTTP.

Connections (stdlib ``http.client``): a client keeps the connection of its last answered
idempotent request open and sends its next idempotent request on it (HTTP/1.1 keep-alive:
a new connection costs a TCP handshake and a daemon thread, about half of a small request),
if it is less than ``KEEP_IDLE_S`` old, in the same process; any other request, and one
that finds the kept connection taken by another thread, opens its own. A kept connection
that turns out dead (the daemon restarted, or dropped it) is replaced by a new one at once:
only idempotent requests travel on it, so sending one again is always safe.

Where the daemon is comes from a resolver, called again whenever the cached address fails,
because a restarted daemon listens on a new port. Retries are careful about effects (each
rule a method of ``RequestRetries``):
- the connection could not be made (the request never left): resolve again and retry until
  ``retry_for`` seconds have passed (a supervised daemon comes back within that), then
  ``SpaceUnavailable``;
- the connection broke after the request was sent: retried once if the operation is
  idempotent (all are except ``edit_file`` and ``checkpoint_import``), else
  ``SpaceUnavailable``: its outcome is unknown;
- 401: the port may now belong to another Space's daemon; resolve again and retry once if
  the address changed;
- 503 ``busy``: the daemon refused the request before it took effect (its request or body
  limits were full for ``protocol.BUSY_WAIT_SECONDS``), so any operation is sent again, after
  the ``Retry-After`` it gave, until ``busy_for`` seconds have passed; then the ``busy``
  ``SpaceError``. A body that cannot be rewound (a stream) is not sent again.
"""

from __future__ import annotations

import base64
import dataclasses
import http.client
import json
import os
import random
import shutil
import socket
import tempfile
import threading
import time
import uuid
import weakref
from collections import deque
from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass
from typing import IO, Any
from urllib.parse import urlencode

from durable.errors import EpochTaken, SpaceError, SpaceFull, SpaceUnavailable, StaleEpochError
from spacesd import protocol
from spacesd.protocol import CheckpointInfo, ExecInfo, ScanEntry, ScanResult, applied_scan

_CHUNK = 1024 * 1024
#: A kept connection idle longer than this is not reused (the daemon drops idle ones after
#: ``spacesd.server.Handler.timeout``, 120 s).
KEEP_IDLE_S = 30.0
#: How long a client waits for a daemon's answer (a request that gets none has an unknown
#: outcome: ``SpaceUnavailable``); checkpoints and transfers wait ``long_timeout``.
REQUEST_TIMEOUT_S = 60.0
#: The ``advance_epoch`` owner of every client of this process that names none.
PROCESS_OWNER = uuid.uuid4().hex


def new_process_owner() -> None:
    """A new ``PROCESS_OWNER``: in a process forked from one that imported this module
    (``chaos.run.driver_server``), which is another owner."""
    global PROCESS_OWNER
    PROCESS_OWNER = uuid.uuid4().hex


@dataclass(frozen=True)
class Endpoint:
    host: str
    port: int
    token: str
    #: Whether a connection to it may be kept between requests (see the module docstring).
    #: Not to a machine whose memory can be restored (a microVM started from a
    #: checkpoint): its TCP state goes back with it, and a kept connection would hang
    #: instead of failing.
    keep_alive: bool = True


#: Returns where the Space's daemon is now; raises ``SpaceNotFound`` if the Space is gone
#: and ``SpaceUnavailable`` if its daemon is not up (the client retries that).
Resolver = Callable[[], Endpoint]
#: A hook a provider routes its clients' endpoints through (a Space's name and its endpoint
#: in, the endpoint to dial out): the campaign's link proxies (``chaos.faults.link_proxy``).
Via = Callable[[str, Endpoint], Endpoint]


def routed(name: str, resolve: Resolver, via: Via | None) -> Resolver:
    """``resolve``, through ``via`` when there is one."""
    return resolve if via is None else (lambda: via(name, resolve()))


def _busy_wait(resp: http.client.HTTPResponse, data: bytes) -> float | None:
    """Seconds to wait before sending a request refused ``busy`` again (its ``Retry-After``,
    from 0.05 to 5 s, with jitter so refused clients do not return together); None when the
    503 is not ``busy``."""
    try:
        if json.loads(data)["error"]["code"] != protocol.ERR_BUSY:
            return None
    except (ValueError, KeyError, TypeError):
        return None
    try:
        after = float(resp.getheader("Retry-After") or 1)
    except ValueError:
        after = 1.0
    return min(max(after, 0.05), 5.0) * random.uniform(0.5, 1.0)


class _KeptConnection:
    """The connection a client keeps between idempotent requests (see the module
    docstring): at most one, taken by one request at a time."""

    def __init__(self) -> None:
        #: (connection, the process that opened it, when it became idle)
        self._kept: tuple[http.client.HTTPConnection, int, float] | None = None
        self._lock = threading.Lock()

    def take(self, ep: Endpoint, timeout: float) -> http.client.HTTPConnection | None:
        """The kept connection, if it is fresh, to ``ep`` and this process's; nobody else
        gets it until it is ``put`` back."""
        with self._lock:
            kept, self._kept = self._kept, None
        if kept is None:
            return None
        conn, pid, idle_since = kept
        if pid != os.getpid():
            return None  # a forked child's copy of its parent's socket: never shared
        if (conn.host, conn.port) != (ep.host, ep.port) or conn.sock is None or \
                time.monotonic() - idle_since > KEEP_IDLE_S:
            conn.close()
            return None
        conn.sock.settimeout(timeout)
        return conn

    def put(self, conn: http.client.HTTPConnection) -> None:
        with self._lock:
            old, self._kept = self._kept, (conn, os.getpid(), time.monotonic())
        if old is not None and old[1] == os.getpid():
            old[0].close()

    def close(self) -> None:
        with self._lock:
            old, self._kept = self._kept, None
        if old is not None and old[1] == os.getpid():
            old[0].close()


@dataclass
class RequestRetries:
    """When one request is sent again (the module docstring says why each rule is safe):
    each ``after_*`` is asked when its failure happens and answers the seconds to wait
    before sending it again, or None: give up. Times are ``time.monotonic()``'s."""

    idempotent: bool
    #: Its body can be sent again (none, bytes, or a stream that seeks back).
    rewindable: bool
    #: Until when a daemon that cannot be reached is looked for again.
    reach_until: float
    #: Until when a request refused ``busy`` is sent again.
    busy_until: float
    resent: bool = False
    looked_again: bool = False

    def after_unreachable(self, now: float) -> float | None:
        """The connection could not be made (the request never left)."""
        return 0.05 if now < self.reach_until else None

    def after_break(self, *, kept: bool, timed_out: bool) -> str | None:
        """The connection broke once the request was sent: ``same_daemon`` (a kept
        connection the daemon had closed: the same request on a new one), ``resolve`` (an
        idempotent request, once, wherever the daemon now is), or None (its outcome is
        unknown)."""
        if kept and not timed_out:
            return "same_daemon"
        if self.idempotent and not self.resent:
            self.resent = True
            return "resolve"
        return None

    def look_again_after_refusal(self) -> bool:
        """A 401: the port may belong to another Space's daemon now; look once."""
        first, self.looked_again = not self.looked_again, True
        return first

    def after_busy(self, wait: float | None, now: float) -> float | None:
        """A 503: ``wait`` is its ``Retry-After`` when the daemon said ``busy`` (None: some
        other 503, never sent again)."""
        left = self.busy_until - now
        if wait is None or left <= 0 or not self.rewindable:
            return None
        return min(wait, left)


class HttpSpaceClient:
    def __init__(self, name: str, epoch: int, resolver: Resolver, *,
                 timeout: float = REQUEST_TIMEOUT_S,
                 retry_for: float = 5.0, long_timeout: float = 900.0,
                 busy_for: float = 120.0) -> None:
        self.name = name
        self.epoch = epoch
        self._resolver = resolver
        self._endpoint: Endpoint | None = None
        self.timeout = timeout
        self.retry_for = retry_for
        #: How long requests refused ``busy`` are sent again (see the module docstring).
        self.busy_for = busy_for
        #: For checkpoints and their transfers, which may take long on big workspaces.
        self.long_timeout = long_timeout
        self._kept = _KeptConnection()
        #: (token, state) of this client's last scan: the next one asks for the difference.
        self._scanned: tuple[str, dict[str, ScanEntry]] | None = None
        #: The round of ``epoch`` this client's last ``advance_epoch`` answered (spacesd's
        #: ``epoch_fence``), sent with every request from then on: one sent before its
        #: driver's next own fence and delivered after it is refused. None until then
        #: (and with a daemon older than rounds): requests carry no round.
        self.round: int | None = None
        # Closed with the client (a socket left to the collector warns, and stays open
        # until then); a copy of the client (``with_epoch``) keeps its own.
        weakref.finalize(self, self._kept.close)

    def with_epoch(self, epoch: int) -> HttpSpaceClient:
        other = HttpSpaceClient(self.name, epoch, self._resolver, timeout=self.timeout,
                            retry_for=self.retry_for, long_timeout=self.long_timeout,
                            busy_for=self.busy_for)
        other._endpoint = self._endpoint
        other._scanned = self._scanned  # never changed in place: a scan makes a new one
        if epoch == self.epoch:
            other.round = self.round
        return other

    def __repr__(self) -> str:
        return f"HttpSpaceClient({self.name!r}, epoch={self.epoch})"

    # ---------------------------------------------------------------- transport

    def _resolve(self, deadline: float) -> Endpoint:
        while True:
            try:
                self._endpoint = self._resolver()
                return self._endpoint
            except SpaceUnavailable:
                if time.monotonic() >= deadline:
                    raise
                time.sleep(0.05)

    def _open(self, method: str, path: str, body: bytes | IO[bytes] | None,
              headers: dict[str, str], *, idempotent: bool,
              timeout: float) -> tuple[http.client.HTTPConnection, http.client.HTTPResponse]:
        """Send one request and return the connection and its response (the caller reads
        the response and closes the connection); ``RequestRetries`` decides what is sent
        again."""
        rewind = body.tell() if body is not None and not isinstance(body, bytes) and \
            body.seekable() else None
        now = time.monotonic()
        retries = RequestRetries(idempotent=idempotent,
                                 rewindable=body is None or isinstance(body, bytes) or
                                 rewind is not None,
                                 reach_until=now + self.retry_for, busy_until=now + self.busy_for)
        while True:
            if rewind is not None:
                assert body is not None and not isinstance(body, bytes)
                body.seek(rewind)
            ep = self._endpoint or self._resolve(retries.reach_until)
            conn = self._kept.take(ep, timeout) if self._keeps(idempotent) else None
            kept = conn is not None
            if conn is None:
                conn = http.client.HTTPConnection(ep.host, ep.port, timeout=timeout,
                                                  blocksize=_CHUNK)
                try:
                    conn.connect()
                    conn.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                except OSError as exc:
                    conn.close()
                    self._endpoint = None
                    if (wait := retries.after_unreachable(time.monotonic())) is not None:
                        time.sleep(wait)
                        continue
                    raise SpaceUnavailable(
                        f"Space {self.name!r}: cannot reach its daemon at {ep.host}:{ep.port} "
                        f"({exc}); it is down, restarting or gone") from exc
            try:
                conn.request(method, path, body=body,
                             headers={"Authorization": f"Bearer {ep.token}", **headers})
                resp = conn.getresponse()
            except (OSError, http.client.HTTPException) as exc:
                conn.close()
                again = retries.after_break(kept=kept, timed_out=isinstance(exc, TimeoutError))
                if again != "same_daemon":
                    self._endpoint = None
                if again is not None:
                    continue
                raise SpaceUnavailable(
                    f"Space {self.name!r}: the connection broke during {method} {path} "
                    f"({exc!r}); whether it took effect is unknown") from exc
            if resp.status == 401 and retries.look_again_after_refusal():
                data = resp.read()
                conn.close()
                if self._resolve(retries.reach_until) != ep:
                    continue
                self._fail(401, data)
            if resp.status == protocol.BUSY_STATUS and retries.rewindable:
                data = resp.read()
                conn.close()
                busy = _busy_wait(resp, data)
                if (wait := retries.after_busy(busy, time.monotonic())) is not None:
                    time.sleep(wait)
                    continue
                try:
                    self._fail(resp.status, data)
                except SpaceError as exc:
                    if busy is None:
                        raise
                    raise SpaceError(f"{exc} (this client sent it again for {self.busy_for:g} "
                                     "s: the daemon is overloaded; send fewer requests at once "
                                     "or raise busy_for)", code=exc.code,
                                     status=exc.status) from None
            return conn, resp

    def _fail(self, status: int, data: bytes, epoch: int | None = None) -> None:
        """Raise the error an error response carries (``epoch``: the request's)."""
        try:
            err = json.loads(data)["error"]
            code, message = str(err["code"]), str(err["message"])
        except (ValueError, KeyError, TypeError):
            err, code = {}, protocol.ERR_INTERNAL
            message = f"HTTP {status} with an unreadable body {data[:200]!r}"
        if code == protocol.ERR_EPOCH_TAKEN:
            raise EpochTaken(f"Space {self.name!r}: {message}", epoch=int(err["epoch"]),
                             floor=int(err["floor"]))
        if code == protocol.ERR_STALE_EPOCH:
            raise StaleEpochError(f"Space {self.name!r}: {message}",
                                  epoch=self.epoch if epoch is None else epoch,
                                  floor=err.get("floor"))
        if code == protocol.ERR_NO_SPACE:
            raise SpaceFull(f"Space {self.name!r}: {message}", code=code, status=status)
        raise SpaceError(f"Space {self.name!r}: {message}", code=code, status=status)

    def _call(self, op: str, *, idempotent: bool = True, timeout: float | None = None,
              epoch: int | None = None, **fields: Any) -> dict[str, Any]:
        epoch = self.epoch if epoch is None else epoch
        body = json.dumps({"epoch": epoch, **self._round_for(epoch), **fields}).encode()
        conn, resp = self._open("POST", protocol.op_path(op), body,
                                {"Content-Type": "application/json"}, idempotent=idempotent,
                                timeout=timeout or self.timeout)
        answer: dict[str, Any] = json.loads(
            self._answer(conn, resp, op, epoch, keep=self._keeps(idempotent)))
        return answer

    def _round_for(self, epoch: int) -> dict[str, int]:
        """The ``round`` field of a request sent at ``epoch``: this client's, if it has
        one for that epoch."""
        return {"round": self.round} if self.round is not None and epoch == self.epoch else {}

    def _keeps(self, idempotent: bool) -> bool:
        """Whether a request's connection is kept for the next (see the module docstring):
        only an idempotent one's, to an endpoint that allows it."""
        return idempotent and self._endpoint is not None and self._endpoint.keep_alive

    def _answer(self, conn: http.client.HTTPConnection, resp: http.client.HTTPResponse,
                op: str, epoch: int | None = None, *, keep: bool = False) -> bytes:
        """The body of a 200 answer; closes the connection, or keeps it for the next
        idempotent request (``keep``, unless the daemon closes it). A body cut short raises
        ``SpaceUnavailable``; any other status raises what ``_fail`` maps it to."""
        try:
            data = resp.read()
        except (OSError, http.client.HTTPException) as exc:
            conn.close()
            raise SpaceUnavailable(f"Space {self.name!r}: the answer to {op} was cut short "
                                   f"({exc!r})") from exc
        if keep and not resp.will_close:
            self._kept.put(conn)
        else:
            conn.close()
        if resp.status != 200:
            self._fail(resp.status, data, epoch)
        return data

    # ---------------------------------------------------------------- daemon

    def health(self) -> dict[str, Any]:
        conn, resp = self._open("GET", protocol.HEALTH_PATH, None, {}, idempotent=True,
                                timeout=self.timeout)
        health: dict[str, Any] = json.loads(self._answer(conn, resp, "health"))
        return health

    def capabilities(self) -> set[str]:
        return set(self._call("capabilities")["capabilities"])

    def describe(self) -> dict[str, Any]:
        return self._call("describe")

    def advance_epoch(self, epoch: int, *, owner: str | None = None,
                      own: bool = False) -> dict[str, Any]:
        # ``own`` only when set: a daemon older than it refuses a field it does not know
        extra = {"own": True} if own else {}
        answer = self._call("advance_epoch", epoch=epoch, owner=owner or PROCESS_OWNER, **extra)
        if epoch == self.epoch and answer.get("floor") == epoch:
            # What is sent from now on is of this round (none to a daemon older than rounds,
            # which refuses the field: one that replaced a newer daemon under this client).
            self.round = int(answer["round"]) if "round" in answer else None
        return answer

    # ---------------------------------------------------------------- exec ledger

    def exec_start(self, key: str, command: str, *, cwd: str | None = None,
                   env: dict[str, str] | None = None) -> ExecInfo:
        return ExecInfo.from_json(self._call("exec_start", key=key, command=command, cwd=cwd,
                                             env=env))

    def exec_status(self, key: str) -> ExecInfo:
        return ExecInfo.from_json(self._call("exec_status", key=key))

    def exec_wait(self, key: str, *, offset: int = 0,
                  on_output: Callable[[str], None] | None = None,
                  timeout: float | None = None) -> ExecInfo:
        """Stream the output of ``key`` from byte ``offset`` to ``on_output`` until the
        command ends (or ``timeout`` seconds pass: then its ``running`` info).

        Long polls: each request waits up to ``EXEC_WAIT_SECONDS`` on the daemon for output
        or the end. An exception from ``on_output`` propagates (that is how a caller stops
        streaming). The returned info's ``output`` is what this call received, cut to about
        the last ``OUTPUT_TAIL_BYTES`` (``output_offset`` says where it starts).
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        kept: deque[tuple[int, str, int]] = deque()  # (offset, text, bytes) received
        kept_bytes = 0
        while True:
            wait = protocol.EXEC_WAIT_SECONDS
            if deadline is not None:
                wait = max(0.0, min(wait, deadline - time.monotonic()))
            res = self._call("exec_wait", key=key, offset=offset, wait=wait,
                             timeout=wait + self.timeout)
            info = ExecInfo.from_json(res["info"])
            if info.output:
                if on_output is not None:
                    on_output(info.output)
                n = res["next_offset"] - info.output_offset
                kept.append((info.output_offset, info.output, n))
                kept_bytes += n
                while len(kept) > 1 and kept_bytes - kept[0][2] >= protocol.OUTPUT_TAIL_BYTES:
                    kept_bytes -= kept.popleft()[2]
            offset = res["next_offset"]
            ended = info.state != "running"
            if ended or (deadline is not None and time.monotonic() >= deadline):
                return dataclasses.replace(
                    info, output="".join(t for _, t, _ in kept),
                    output_offset=kept[0][0] if kept else info.output_offset)

    def exec_kill(self, key: str) -> ExecInfo:
        return ExecInfo.from_json(self._call("exec_kill", key=key))

    # ---------------------------------------------------------------- files

    def read_file(self, path: str, *, offset: int = 0, limit: int | None = None) -> bytes:
        """``limit`` bytes from ``offset`` (all the rest without one), read in parts of at
        most ``protocol.MAX_READ_LIMIT``, one answer's most; a part shorter than asked is
        the end of the file."""
        parts: list[bytes] = []
        while limit is None or limit > 0:
            want = protocol.MAX_READ_LIMIT if limit is None else \
                min(limit, protocol.MAX_READ_LIMIT)
            part = base64.b64decode(self._call("read_file", path=path, offset=offset,
                                               limit=want)["data"])
            parts.append(part)
            if len(part) < want:
                break
            offset += len(part)
            if limit is not None:
                limit -= len(part)
        return b"".join(parts)

    def write_file(self, path: str, data: bytes, *, mode: int | None = None) -> None:
        self._call("write_file", path=path, data=base64.b64encode(data).decode("ascii"),
                   mode=mode)

    def edit_file(self, path: str, old: str, new: str) -> None:
        # Not idempotent: applied twice, an edit whose new text contains the old one would
        # apply twice. A broken connection after sending is reported, never retried.
        self._call("edit_file", idempotent=False, path=path, old=old, new=new)

    def stat(self, path: str) -> dict[str, Any] | None:
        found: dict[str, Any] | None = self._call("stat", path=path)["stat"]
        return found

    def list_dir(self, path: str) -> list[dict[str, Any]]:
        entries: list[dict[str, Any]] = self._call("list_dir", path=path)["entries"]
        return entries

    def remove(self, path: str, *, recursive: bool = False) -> None:
        self._call("remove", path=path, recursive=recursive)

    def mkdir(self, path: str) -> None:
        self._call("mkdir", path=path)

    def symlink(self, path: str, target: str) -> None:
        self._call("symlink", path=path, target=target)

    # ---------------------------------------------------------------- workspace

    def scan(self, *, exclude: list[str] | None = None) -> ScanResult:
        """The whole workspace state. The daemon answers it as the difference since this
        client's last scan when it still knows that one (``spacesd.watched_scan``), which
        is applied here: the result is the same either way."""
        last = self._scanned
        fields: dict[str, Any] = {"exclude": exclude}
        if last is not None:
            fields["since"] = last[0]
        raw = self._call("scan", timeout=self.long_timeout, **fields)
        try:
            state = applied_scan(None if last is None else last[1], raw.get("full", True),
                                 (ScanEntry.from_json(e) for e in raw["entries"]),
                                 raw.get("removed", []))
        except ValueError as exc:
            raise SpaceError(f"Space {self.name!r}: {exc}") from None
        token = raw.get("token")
        self._scanned = None if token is None else (token, state)
        return ScanResult(sorted(state.values(), key=lambda e: e.path),
                          refused=list(raw.get("refused", [])),
                          running=bool(raw.get("running", False)),
                          running_keys=list(raw.get("running_keys", [])))

    def checkpoint_create(self, checkpoint_id: str) -> CheckpointInfo:
        return CheckpointInfo.from_json(self._call("checkpoint_create", id=checkpoint_id,
                                                   timeout=self.long_timeout))

    def checkpoint_restore(self, checkpoint_id: str, *,
                           exclude: list[str] | None = None) -> CheckpointInfo:
        fields: dict[str, Any] = {"id": checkpoint_id}
        if exclude:
            fields["exclude"] = list(exclude)
        return CheckpointInfo.from_json(self._call("checkpoint_restore",
                                                   timeout=self.long_timeout, **fields))

    def checkpoint_list(self) -> list[CheckpointInfo]:
        return [CheckpointInfo.from_json(c) for c in self._call("checkpoint_list")["checkpoints"]]

    def checkpoint_delete(self, checkpoint_id: str) -> None:
        self._call("checkpoint_delete", id=checkpoint_id, timeout=self.long_timeout)

    def checkpoint_export(self, checkpoint_id: str, *,
                          have: Collection[str] = ()) -> Iterator[bytes]:
        """The checkpoint as a tar stream, in chunks, without the objects in ``have``.
        Errors (no such checkpoint) are raised here; a stream cut short raises
        ``SpaceUnavailable`` while iterating."""
        request: dict[str, Any] = {"epoch": self.epoch, "id": checkpoint_id}
        if have:
            request["have"] = sorted(have)
        body = json.dumps(request).encode()
        conn, resp = self._open("POST", protocol.op_path(protocol.OP_CHECKPOINT_EXPORT), body,
                                {"Content-Type": "application/json"}, idempotent=True,
                                timeout=self.long_timeout)
        if resp.status != 200:
            try:
                data = resp.read()
            finally:
                conn.close()
            self._fail(resp.status, data)
        return self._stream(conn, resp)

    def _stream(self, conn: http.client.HTTPConnection,
                resp: http.client.HTTPResponse) -> Iterator[bytes]:
        try:
            while chunk := resp.read(_CHUNK):
                yield chunk
        except (OSError, http.client.HTTPException) as exc:
            raise SpaceUnavailable(f"Space {self.name!r}: the checkpoint export was cut "
                                   f"short ({exc!r})") from exc
        finally:
            conn.close()

    def checkpoint_import(self, checkpoint_id: str, tar: IO[bytes]) -> CheckpointInfo:
        """Store the tar stream ``tar`` (as made by ``checkpoint_export``) as checkpoint
        ``checkpoint_id``. The stream is spooled to a temp file first: the daemon needs its
        length up front."""
        with tempfile.TemporaryFile() as spool:
            shutil.copyfileobj(tar, spool, _CHUNK)
            length = spool.tell()
            spool.seek(0)
            query = urlencode({"id": checkpoint_id, "epoch": self.epoch,
                               **self._round_for(self.epoch)})
            conn, resp = self._open(
                "POST", f"{protocol.op_path(protocol.OP_CHECKPOINT_IMPORT)}?{query}", spool,
                {"Content-Type": "application/x-tar", "Content-Length": str(length)},
                idempotent=False, timeout=self.long_timeout)
            data = self._answer(conn, resp, "checkpoint_import")
        return CheckpointInfo.from_json(json.loads(data))
